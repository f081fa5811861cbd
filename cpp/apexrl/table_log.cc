#include "apexrl/table_log.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "apexrl/crc32c.h"
#include "apexrl/errors.h"
#include "apexrl/log_tail_cache.h"

namespace apexrl {
namespace {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the log is little-endian; so must the host be");

std::string OsError(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void Store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

std::string Header(uint64_t number) {
  std::string h(kLogHeaderBytes, '\0');
  auto* p = reinterpret_cast<uint8_t*>(h.data());
  std::memcpy(p, kLogMagic, 4);
  Store<uint16_t>(p + 4, kLogVersion);
  Store<uint16_t>(p + 6, static_cast<uint16_t>(kLogHeaderBytes));
  Store<uint64_t>(p + 8, number);
  Store<uint32_t>(p + 20, Crc32cExtend(0, p, 20));
  return h;
}

void SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw IoError(OsError("cannot open the log directory", dir));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw IoError(OsError("cannot sync the log directory", dir));
}

// A segment file mapped read-only for recovery (nothing for an empty file).
class Mapped {
 public:
  explicit Mapped(const std::string& path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw IoError(OsError("cannot open log segment", path));
    struct stat st{};
    if (::fstat(fd, &st) != 0) {
      const std::string why = OsError("cannot stat log segment", path);
      ::close(fd);
      throw IoError(why);
    }
    size_ = static_cast<uint64_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        const std::string why = OsError("cannot map log segment", path);
        ::close(fd);
        throw IoError(why);
      }
      data_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
  }
  ~Mapped() {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  Mapped(const Mapped&) = delete;
  Mapped& operator=(const Mapped&) = delete;
  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

// The segments in `dir`, by number (files of other names are left alone).
std::vector<uint64_t> ListSegments(const std::string& dir) {
  namespace fs = std::filesystem;
  std::vector<uint64_t> numbers;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() != 24 || name.compare(0, 4, "seg-") != 0 || name.compare(20, 4, ".log") != 0) continue;
    const std::string hex = name.substr(4, 16);
    if (hex.find_first_not_of("0123456789abcdef") != std::string::npos) continue;
    numbers.push_back(std::stoull(hex, nullptr, 16));
  }
  if (ec) throw IoError("cannot list the log directory '" + dir + "': " + ec.message());
  std::sort(numbers.begin(), numbers.end());
  return numbers;
}

}  // namespace

std::string TableLog::SegmentName(uint64_t segment) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "seg-%016llx.log", static_cast<unsigned long long>(segment));
  return buf;
}

std::string TableLog::PathOf(uint64_t segment) const { return dir_ + "/" + SegmentName(segment); }

TableLog::TableLog(const std::string& dir, LogOptions options, const Visitor& visit) : dir_(dir), options_(options) {
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) throw IoError(OsError("cannot create log directory", dir_));
  const std::string lock = dir_ + "/LOCK";
  lock_fd_ = ::open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (lock_fd_ < 0) throw IoError(OsError("cannot open", lock));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0) {
    const std::string why =
        errno == EWOULDBLOCK ? "the log '" + dir_ + "' is open in another process" : OsError("cannot lock", lock);
    ::close(lock_fd_);
    throw IoError(why);
  }
  try {
    Recover(visit);
  } catch (...) {
    ::close(lock_fd_);
    throw;
  }
}

TableLog::~TableLog() {
  if (fd_ >= 0) ::close(fd_);
  if (lock_fd_ >= 0) ::close(lock_fd_);  // releases the flock
}

void TableLog::Recover(const Visitor& visit) {
  const std::vector<uint64_t> numbers = ListSegments(dir_);
  // Versions first: a segment of a version this build does not read is refused before anything changes.
  for (uint64_t n : numbers) {
    const Mapped m(PathOf(n));
    if (m.size() >= kLogHeaderBytes && std::memcmp(m.data(), kLogMagic, 4) == 0 &&
        Load<uint32_t>(m.data() + 20) == Crc32cExtend(0, m.data(), 20) && Load<uint16_t>(m.data() + 4) != kLogVersion) {
      throw IoError("log segment '" + PathOf(n) + "' has version " + std::to_string(Load<uint16_t>(m.data() + 4)) +
                    "; this build reads version " + std::to_string(kLogVersion) + " (nothing was changed)");
    }
  }
  size_t kept = 0;          // segments [0, kept) of `numbers` are kept whole or in part
  uint64_t keep_bytes = 0;  // of numbers[kept - 1]
  bool ended = false;
  for (size_t i = 0; i < numbers.size() && !ended; ++i) {
    const uint64_t n = numbers[i];
    const Mapped m(PathOf(n));
    const uint8_t* p = m.data();
    const std::string where = "segment " + SegmentName(n);
    if (i > 0 && n != numbers[i - 1] + 1) {
      recovery_.reason = where + " follows segment " + SegmentName(numbers[i - 1]) + " with a gap";
      break;
    }
    if (m.size() < kLogHeaderBytes || std::memcmp(p, kLogMagic, 4) != 0 ||
        Load<uint32_t>(p + 20) != Crc32cExtend(0, p, 20) || Load<uint16_t>(p + 6) != kLogHeaderBytes ||
        Load<uint64_t>(p + 8) != n) {
      recovery_.reason = where + ": its header is torn or corrupt";
      break;
    }
    uint64_t at = kLogHeaderBytes;
    while (at < m.size()) {
      if (m.size() - at < kLogRecordHeaderBytes) {
        recovery_.reason = where + ": a record header torn at byte " + std::to_string(at);
        ended = true;
        break;
      }
      const uint32_t crc = Load<uint32_t>(p + at), size = Load<uint32_t>(p + at + 4);
      if (size > kLogMaxBody || size > m.size() - at - kLogRecordHeaderBytes) {
        recovery_.reason =
            where + ": a record of " + std::to_string(size) + " bytes torn at byte " + std::to_string(at);
        ended = true;
        break;
      }
      if (Crc32cExtend(0, p + at + 4, 5 + size) != crc) {
        recovery_.reason = where + ": the record at byte " + std::to_string(at) + " fails its checksum";
        ended = true;
        break;
      }
      if (visit) visit(p[at + 8], p + at + kLogRecordHeaderBytes, size, LogPosition{n, at + kLogRecordHeaderBytes});
      ++recovery_.records;
      at += kLogRecordHeaderBytes + size;
    }
    kept = i + 1;
    keep_bytes = at;
    if (ended) recovery_.dropped_bytes += m.size() - at;
  }
  // Cut what follows the last consistent record: the rest of its segment and every later segment.
  bool changed = false;
  if (kept > 0 && ended) {
    if (::truncate(PathOf(numbers[kept - 1]).c_str(), static_cast<off_t>(keep_bytes)) != 0) {
      throw IoError(OsError("cannot truncate log segment", PathOf(numbers[kept - 1])));
    }
    changed = true;
  }
  for (size_t i = kept; i < numbers.size(); ++i) {
    std::error_code ec;
    recovery_.dropped_bytes += std::filesystem::file_size(PathOf(numbers[i]), ec);
    if (::unlink(PathOf(numbers[i]).c_str()) != 0)
      throw IoError(OsError("cannot delete log segment", PathOf(numbers[i])));
    ++recovery_.dropped_segments;
    changed = true;
  }
  // A last segment without records (a life that appended nothing) is started again rather than followed.
  uint64_t next = kept > 0 ? numbers[kept - 1] + 1 : 1;
  if (kept > 0 && keep_bytes == kLogHeaderBytes) {
    --kept;
    --next;
    if (::unlink(PathOf(next).c_str()) != 0) throw IoError(OsError("cannot delete log segment", PathOf(next)));
    changed = true;
  }
  recovery_.segments = kept;
  if (changed) SyncDirectory(dir_);
  StartSegment(next);
}

void TableLog::StartSegment(uint64_t number) {
  const std::string path = PathOf(number);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) throw IoError(OsError("cannot create log segment", path));
  const std::string h = Header(number);
  if (::write(fd, h.data(), h.size()) != static_cast<ssize_t>(h.size())) {
    const std::string why = OsError("cannot write the header of log segment", path);
    ::close(fd);
    ::unlink(path.c_str());
    throw IoError(why);
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
  segment_ = number;
  written_ = h.size();
  reserved_end_ = 0;
  new_segment_ = true;
}

LogPosition TableLog::Append(uint8_t type, const void* body, size_t size) {
  return Append(type, body, size, nullptr, 0);
}

LogPosition TableLog::Append(uint8_t type, const void* head, size_t head_size, const void* tail, size_t tail_size) {
  const size_t size = head_size + tail_size;
  if (size > kLogMaxBody) {
    throw InvalidArgument("a log record of " + std::to_string(size) + " bytes is over the " +
                          std::to_string(kLogMaxBody) + "-byte limit");
  }
  const uint64_t record = kLogRecordHeaderBytes + size;
  const uint64_t end = written_ + buffer_.size() + record;
  if (written_ + buffer_.size() > kLogHeaderBytes && end > options_.segment_bytes && end > reserved_end_) {
    Sync();  // the segment is closed durable, so a later one never holds records an earlier one lost
    StartSegment(segment_ + 1);
  }
  const size_t at = buffer_.size();
  buffer_.resize(at + record);
  uint8_t* p = buffer_.data() + at;
  Store<uint32_t>(p + 4, static_cast<uint32_t>(size));
  p[8] = type;
  if (head_size != 0) std::memcpy(p + kLogRecordHeaderBytes, head, head_size);
  if (tail_size != 0) std::memcpy(p + kLogRecordHeaderBytes + head_size, tail, tail_size);
  Store<uint32_t>(p, Crc32cExtend(0, p + 4, 5 + size));
  return LogPosition{segment_, written_ + at + kLogRecordHeaderBytes};
}

LogPosition TableLog::Reserve(uint64_t bytes) {
  const uint64_t end = written_ + buffer_.size() + bytes;
  if (written_ + buffer_.size() > kLogHeaderBytes && end > options_.segment_bytes) {
    Sync();
    StartSegment(segment_ + 1);
  }
  reserved_end_ = written_ + buffer_.size() + bytes;
  return LogPosition{segment_, written_ + buffer_.size()};
}

void TableLog::Flush() {
  size_t done = 0;
  while (done < buffer_.size()) {
    const ssize_t n = ::write(fd_, buffer_.data() + done, buffer_.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    const std::string why = OsError("cannot write log segment", PathOf(segment_));
    // Back to the last record written before: no half record may stay for a later one to follow.
    buffer_.clear();
    if (::ftruncate(fd_, static_cast<off_t>(written_)) != 0 ||
        ::lseek(fd_, static_cast<off_t>(written_), SEEK_SET) < 0) {
      throw IoError(why + "; and the segment cannot be cut back: " + std::strerror(errno));
    }
    throw IoError(why);
  }
  if (mirror_ != nullptr) mirror_->Append(segment_, written_, buffer_.data(), buffer_.size());
  written_ += buffer_.size();
  buffer_.clear();
}

void TableLog::Sync() {
  Flush();
  if (::fdatasync(fd_) != 0) throw IoError(OsError("cannot sync log segment", PathOf(segment_)));
  if (new_segment_) {
    SyncDirectory(dir_);
    new_segment_ = false;
  }
  ++syncs_;
}

void TableLog::Read(LogPosition at, size_t size, void* out) const {
  if (at.segment == segment_ && at.offset + size > written_) {
    if (at.offset < written_ || at.offset + size > written_ + buffer_.size()) {
      throw IoError("log read of " + std::to_string(size) + " bytes at " + SegmentName(at.segment) + ":" +
                    std::to_string(at.offset) + " is out of range");
    }
    std::memcpy(out, buffer_.data() + (at.offset - written_), size);
    return;
  }
  const std::string path = PathOf(at.segment);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(OsError("cannot open log segment", path));
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pread(fd, static_cast<uint8_t*>(out) + done, size - done, static_cast<off_t>(at.offset + done));
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      const std::string why =
          n == 0 ? "log segment '" + path + "' ends before the record read" : OsError("cannot read log segment", path);
      ::close(fd);
      throw IoError(why);
    }
  }
  ::close(fd);
}

void TableLog::Rotate() {
  Sync();
  StartSegment(segment_ + 1);
}

size_t TableLog::RemoveSegmentsBefore(uint64_t segment) {
  size_t removed = 0;
  for (uint64_t n : ListSegments(dir_)) {
    if (n >= segment || n >= segment_) break;
    if (::unlink(PathOf(n).c_str()) != 0) throw IoError(OsError("cannot delete log segment", PathOf(n)));
    ++removed;
  }
  if (removed != 0) SyncDirectory(dir_);
  return removed;
}

std::vector<uint64_t> TableLog::segments() const { return ListSegments(dir_); }

}  // namespace apexrl

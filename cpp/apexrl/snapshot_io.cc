#include "apexrl/snapshot_io.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "apexrl/crc32c.h"
#include "apexrl/errors.h"

namespace apexrl {
namespace {

std::string OsError(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

// Makes a rename inside `path`'s directory durable: without it a crash can lose the new directory entry.
void SyncDirectoryOf(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const std::string dir = target.has_parent_path() ? target.parent_path().string() : std::string(".");
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd < 0) throw SnapshotError(OsError("cannot open the directory of snapshot", path));
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw SnapshotError(OsError("cannot sync the directory of snapshot", path));
}

}  // namespace

namespace {

// Removes `<path>.tmp.<pid>.<n>` files left by writers that no longer run (a process killed mid-save never
// reaches its cleanup, and a restarted one has another pid, so nothing else would ever remove them).
// Temporaries of live processes, this one included, are left alone.
void RemoveOrphanedTemporaries(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  const std::string prefix = target.filename().string() + ".tmp.";
  std::error_code ec;
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const size_t dot = rest.find('.');
    const std::string pid_text = rest.substr(0, dot);
    if (pid_text.empty() || pid_text.find_first_not_of("0123456789") != std::string::npos || pid_text.size() > 9) {
      continue;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(pid_text));
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    std::error_code ignored;
    fs::remove(it->path(), ignored);
  }
}

std::string TemporaryName(const std::string& path) {
  static std::atomic<uint64_t> counter{0};  // distinct names for concurrent saves inside one process
  return path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter.fetch_add(1));
}

}  // namespace

SnapshotWriter::SnapshotWriter(const std::string& path) : path_(path), tmp_path_(TemporaryName(path)) {
  RemoveOrphanedTemporaries(path);
  // Created exclusively, never through a link planted at its name, readable by the owner alone: the snapshot
  // holds the run's experience.
  const int fd = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) throw SnapshotError(OsError("cannot create snapshot", tmp_path_));
  file_ = ::fdopen(fd, "wb");
  if (file_ == nullptr) {
    const std::string why = OsError("cannot open snapshot", tmp_path_);
    ::close(fd);
    std::remove(tmp_path_.c_str());
    throw SnapshotError(why);
  }
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
}

SnapshotWriter::~SnapshotWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) std::remove(tmp_path_.c_str());
}

void SnapshotWriter::Write(const void* data, size_t n) {
  if (n == 0) return;
  crc_ = Crc32cExtend(crc_, data, n);
  if (std::fwrite(data, 1, n, file_) != n) throw SnapshotError(OsError("cannot write snapshot", tmp_path_));
}

void SnapshotWriter::Commit() {
  const uint32_t crc = crc_;
  Write(&crc, sizeof(crc));
  if (std::fflush(file_) != 0 || ::fsync(::fileno(file_)) != 0) {
    throw SnapshotError(OsError("cannot flush snapshot", tmp_path_));
  }
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) throw SnapshotError(OsError("cannot close snapshot", tmp_path_));
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    throw SnapshotError(OsError("cannot rename snapshot onto", path_));
  }
  committed_ = true;  // the temporary is gone: from here on the new snapshot is the one at path_
  SyncDirectoryOf(path_);
}

SnapshotReader::SnapshotReader(const std::string& path) : path_(path) {
  file_ = std::fopen(path.c_str(), "rb");
  if (file_ == nullptr) throw IoError(OsError("cannot open snapshot", path));
  std::setvbuf(file_, nullptr, _IOFBF, 1 << 20);
  if (std::fseek(file_, 0, SEEK_END) != 0) throw IoError(OsError("cannot seek in snapshot", path));
  const long size = std::ftell(file_);
  if (size < 0) throw IoError(OsError("cannot size snapshot", path));
  size_ = static_cast<uint64_t>(size);
  std::rewind(file_);
}

SnapshotReader::~SnapshotReader() {
  if (file_ != nullptr) std::fclose(file_);
}

void SnapshotReader::Fail(const std::string& what) const {
  throw SnapshotError("snapshot '" + path_ + "' is not usable: " + what + " (at byte " + std::to_string(offset_) +
                      " of " + std::to_string(size_) + ")");
}

void SnapshotReader::Read(void* data, size_t n) {
  if (n > remaining()) Fail("truncated: the file ends early");
  if (n == 0) return;
  if (std::fread(data, 1, n, file_) != n) Fail("read error");
  offset_ += n;
  crc_ = Crc32cExtend(crc_, data, n);
}

void SnapshotReader::VerifyChecksum() {
  const uint32_t expected = crc_;
  uint32_t stored;
  if (remaining() < sizeof(stored)) Fail("truncated: the checksum is missing");
  if (std::fread(&stored, 1, sizeof(stored), file_) != sizeof(stored)) Fail("read error");
  offset_ += sizeof(stored);
  if (stored != expected) Fail("checksum mismatch: the file is corrupted");
  if (remaining() != 0) Fail("unexpected bytes after the checksum");
}

}  // namespace apexrl

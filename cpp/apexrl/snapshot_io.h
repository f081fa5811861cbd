// Checksummed binary streams for store snapshots: every byte written or read extends a CRC-32C, and every
// read that runs past the end of the file throws SnapshotError (so a truncated file is always detected).
#ifndef APEXRL_SNAPSHOT_IO_H_
#define APEXRL_SNAPSHOT_IO_H_

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace apexrl {

// Writes to `path`.tmp.<pid>.<n> and, on Commit(), flushes, fsyncs and renames it over `path`, then fsyncs
// the directory, so a crash mid-write never leaves a half-written file under the snapshot's name. Every
// failure throws SnapshotError with the OS reason (disk full, I/O error, missing directory). Without Commit()
// the temporary is removed, leaving an earlier file at `path` as it was; temporaries of writers killed
// mid-save (whose pid no longer runs) are removed by the next save.
class SnapshotWriter {
 public:
  explicit SnapshotWriter(const std::string& path);
  ~SnapshotWriter();
  SnapshotWriter(const SnapshotWriter&) = delete;
  SnapshotWriter& operator=(const SnapshotWriter&) = delete;

  void Write(const void* data, size_t n);
  template <typename T>
  void Put(T value) {
    static_assert(std::is_trivially_copyable_v<T>);
    Write(&value, sizeof(T));
  }
  uint32_t crc() const { return crc_; }
  // Appends the checksum of everything written so far and publishes the file.
  void Commit();

 private:
  std::string path_, tmp_path_;
  std::FILE* file_ = nullptr;
  uint32_t crc_ = 0;
  bool committed_ = false;
};

class SnapshotReader {
 public:
  explicit SnapshotReader(const std::string& path);
  ~SnapshotReader();
  SnapshotReader(const SnapshotReader&) = delete;
  SnapshotReader& operator=(const SnapshotReader&) = delete;

  void Read(void* data, size_t n);
  template <typename T>
  T Get() {
    static_assert(std::is_trivially_copyable_v<T>);
    T value;
    Read(&value, sizeof(T));
    return value;
  }
  // Bytes not yet read: bounds every length field, so a corrupt length cannot ask for absurd allocations.
  uint64_t remaining() const { return size_ - offset_; }
  // Reads the stored checksum and checks it against everything read before it and that the file ends there.
  void VerifyChecksum();
  [[noreturn]] void Fail(const std::string& what) const;

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  uint64_t size_ = 0, offset_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace apexrl

#endif  // APEXRL_SNAPSHOT_IO_H_

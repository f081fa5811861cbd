// TableLog: an append-only log of checksummed records in segment files, the on-disk form of a disk table
// (disk_table.h; one log per table; what each record type means is the table's business, not the log's;
// docs/architecture.md, "The table log").
//
// Files, in the log's directory:
//   LOCK                     held (flock) by the process that has the log open: a second one is refused
//   seg-<16 hex digits>.log  the segments, numbered from 1 up; records continue from one to the next
// A segment: a 24-byte header, then records back to back.
//   header  magic "APXL" | u16 version (1) | u16 header bytes (24) | u64 segment number | u32 0 |
//           u32 CRC-32C of the 20 bytes before it
//   record  u32 CRC-32C of the 5 + n bytes after it | u32 n | u8 type | n bytes of body
// Every integer is little-endian. A segment is closed (fdatasynced) once it passes LogOptions::segment_bytes,
// and the next one started; a log opened again starts a new segment after the last one holding records.
//
// Recovery (the constructor): the segments are read in order and every record whose header and checksum are
// whole is handed to the visitor. The first record that is cut short (a torn write: the process or the
// machine died inside it) or whose checksum fails (a corrupted block) ends the log: its segment is truncated
// there, the segments after it are deleted, and recovery() says how many bytes and segments were dropped and
// why. A segment whose header is torn or corrupt ends the log the same way; one of a version this build does
// not read is refused (IoError, nothing changed), never truncated. A gap in the numbering ends the log too.
//
// Durability: Append buffers, Flush writes what is buffered (a write failure -- disk full, EFBIG past
// RLIMIT_FSIZE, I/O error -- truncates the file back to the last record written before, drops the buffered
// records and throws IoError, so the log never holds half a record that a later one follows), Sync flushes and
// fdatasyncs (and syncs the directory after a new segment). A record is durable once a Sync after its Append
// has returned. Not thread-safe: one thread appends, flushes and syncs (the serving loop's).
#ifndef APEXRL_TABLE_LOG_H_
#define APEXRL_TABLE_LOG_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace apexrl {

class LogTailCache;

inline constexpr char kLogMagic[4] = {'A', 'P', 'X', 'L'};
inline constexpr uint16_t kLogVersion = 1;
inline constexpr size_t kLogHeaderBytes = 24;
inline constexpr size_t kLogRecordHeaderBytes = 9;  // crc, n, type
inline constexpr uint32_t kLogMaxBody = 1u << 30;   // a record body's bytes at most

// Where a record's body lies: its segment and the byte offset of the body in that segment's file.
struct LogPosition {
  uint64_t segment = 0;
  uint64_t offset = 0;
};

struct LogOptions {
  uint64_t segment_bytes = 64ull << 20;  // a segment is closed, and the next one started, past this size
};

// What the constructor's recovery read and what it dropped.
struct LogRecovery {
  uint64_t records = 0;           // records handed to the visitor
  uint64_t segments = 0;          // segments kept
  uint64_t dropped_bytes = 0;     // bytes cut from the end of the last segment kept, and of the segments deleted
  uint64_t dropped_segments = 0;  // segments deleted (after the end of the log)
  std::string reason;             // why the log ended before its files did; empty when it ended cleanly
};

class TableLog {
 public:
  using Visitor = std::function<void(uint8_t type, const uint8_t* body, size_t size, LogPosition at)>;

  // Opens the log in `dir` (created if missing; its parent must exist), replays it through `visit` (may be
  // empty) and starts a new segment. IoError when the directory cannot be used, another process holds the
  // log, or a segment is of an unknown version. An exception thrown by `visit` ends the constructor and is
  // passed on (nothing is truncated then).
  TableLog(const std::string& dir, LogOptions options, const Visitor& visit);
  ~TableLog();
  TableLog(const TableLog&) = delete;
  TableLog& operator=(const TableLog&) = delete;

  // Buffers a record (InvalidArgument for a body over kLogMaxBody); returns where its body will lie.
  LogPosition Append(uint8_t type, const void* body, size_t size);
  // The same for a body in two parts, `head` then `tail` (no copy of them joined first); returns where the
  // body (its head) will lie.
  LogPosition Append(uint8_t type, const void* head, size_t head_size, const void* tail, size_t tail_size);
  // Where the next record's header will lie, once `bytes` of records (headers included) are sure to fit in one
  // segment: it starts the next segment first when they would pass segment_bytes in this one (unless it holds
  // no record yet), and no Append of those bytes starts another. So a caller learns where each of a batch's
  // records will be before it appends them. IoError as Sync's.
  LogPosition Reserve(uint64_t bytes);
  // Writes the buffered records (see "Durability" above for a failure).
  void Flush();
  // Flush, then fdatasync: every record appended before is on disk when it returns.
  void Sync();
  // Reads `size` bytes at `at` (a position Append returned, or one recovery visited) into `out`, from the
  // buffer when they are not written yet. IoError when they cannot be read.
  void Read(LogPosition at, size_t size, void* out) const;
  // Syncs the segment being written and starts the next one (its number: segment()).
  void Rotate();
  // Deletes the segments numbered below `segment` (never the one being written): none of their records is
  // needed any more. Returns how many it deleted.
  size_t RemoveSegmentsBefore(uint64_t segment);

  // Every record written from now on is also appended to `cache` (null: none), after its write succeeded: the
  // cache holds only bytes that are in the file. The cache must outlive the log or be unset first.
  void MirrorTo(LogTailCache* cache) { mirror_ = cache; }

  const LogRecovery& recovery() const { return recovery_; }
  uint64_t segment() const { return segment_; }  // the one being written
  // Its file descriptor, for a thread that fdatasyncs it (a dup of it: the log closes this one when the next
  // segment starts, after syncing it).
  int fd() const { return fd_; }
  std::vector<uint64_t> segments() const;  // every segment on disk, oldest first
  uint64_t syncs() const { return syncs_; }
  uint64_t buffered_bytes() const { return buffer_.size(); }
  static std::string SegmentName(uint64_t segment);  // "seg-0000000000000001.log"

 private:
  void Recover(const Visitor& visit);
  void StartSegment(uint64_t number);
  std::string PathOf(uint64_t segment) const;

  const std::string dir_;
  const LogOptions options_;
  int lock_fd_ = -1;
  int fd_ = -1;                // the segment being written
  uint64_t segment_ = 0;       // its number
  uint64_t written_ = 0;       // its bytes in the file
  uint64_t reserved_end_ = 0;  // Reserve: records ending up to here stay in this segment
  bool new_segment_ = true;    // its directory entry not yet synced
  std::vector<uint8_t> buffer_;
  LogTailCache* mirror_ = nullptr;
  uint64_t syncs_ = 0;
  LogRecovery recovery_;
};

}  // namespace apexrl

#endif  // APEXRL_TABLE_LOG_H_

// TableLog (table_log.h): the record format read back as written, across segments and reopenings; recovery
// from a torn tail, a corrupt record, a torn segment header and a segment of an unknown version; a second
// opener refused; a write that fails (RLIMIT_FSIZE, as a full disk) cut back to the last whole record.
#include "apexrl/table_log.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "apexrl/crc32c.h"
#include "apexrl/errors.h"
#include "temp_dir.h"

namespace apexrl {
namespace {

using testing_util::TempDir;

TEST(Crc32c, KnownValuesAndBothComputationsAgree) {
  const std::string digits = "123456789";
  EXPECT_EQ(Crc32cExtend(0, digits.data(), digits.size()), 0xE3069283u);  // the standard check value
  EXPECT_EQ(Crc32cExtendPortable(0, digits.data(), digits.size()), 0xE3069283u);
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t n : {0, 1, 7, 8, 9, 63, 64, 65, 999, 1000}) {
    const uint32_t whole = Crc32cExtend(0, bytes.data(), n);
    EXPECT_EQ(whole, Crc32cExtendPortable(0, bytes.data(), n)) << n;
    EXPECT_EQ(whole, Crc32cExtend(Crc32cExtend(0, bytes.data(), n / 3), bytes.data() + n / 3, n - n / 3)) << n;
  }
}

struct Rec {
  uint8_t type;
  std::string body;
  LogPosition at;
};

std::vector<Rec> Replay(const std::string& dir, LogOptions options, LogRecovery* recovery = nullptr) {
  std::vector<Rec> out;
  TableLog log(dir, options, [&](uint8_t type, const uint8_t* body, size_t size, LogPosition at) {
    out.push_back({type, std::string(reinterpret_cast<const char*>(body), size), at});
  });
  if (recovery) *recovery = log.recovery();
  return out;
}

std::string Body(int i) { return "record " + std::to_string(i) + std::string(static_cast<size_t>(i % 7), 'x'); }

// Writes n records (type i % 5, Body(i)) and syncs; returns their positions.
std::vector<LogPosition> Fill(const std::string& dir, LogOptions options, int n) {
  TableLog log(dir, options, nullptr);
  std::vector<LogPosition> at;
  for (int i = 0; i < n; ++i) {
    const std::string b = Body(i);
    at.push_back(log.Append(static_cast<uint8_t>(i % 5), b.data(), b.size()));
  }
  log.Sync();
  return at;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

TEST(TableLogTest, RecordsComeBackInOrderWithTheirTypesBodiesAndPositions) {
  TempDir dir("table_log");
  const std::string d = dir.Path("t");
  std::vector<LogPosition> at;
  {
    TableLog log(d, LogOptions{}, nullptr);
    EXPECT_TRUE(log.recovery().reason.empty());
    EXPECT_EQ(log.recovery().records, 0u);
    for (int i = 0; i < 20; ++i) {
      const std::string b = Body(i);
      at.push_back(log.Append(static_cast<uint8_t>(i % 5), b.data(), b.size()));
    }
    at.push_back(log.Append(9, nullptr, 0));  // an empty body
    std::string back(Body(3).size(), '\0');
    log.Read(at[3], back.size(), back.data());  // from the buffer: not written yet
    EXPECT_EQ(back, Body(3));
    log.Sync();
    log.Read(at[3], back.size(), back.data());  // from the file
    EXPECT_EQ(back, Body(3));
    EXPECT_EQ(log.syncs(), 1u);
  }
  LogRecovery r;
  const std::vector<Rec> recs = Replay(d, LogOptions{}, &r);
  ASSERT_EQ(recs.size(), 21u);
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(recs[static_cast<size_t>(i)].type, i % 5);
    EXPECT_EQ(recs[static_cast<size_t>(i)].body, Body(i));
    EXPECT_EQ(recs[static_cast<size_t>(i)].at.segment, at[static_cast<size_t>(i)].segment);
    EXPECT_EQ(recs[static_cast<size_t>(i)].at.offset, at[static_cast<size_t>(i)].offset);
  }
  EXPECT_EQ(recs[20].type, 9);
  EXPECT_EQ(recs[20].body, "");
  EXPECT_EQ(r.records, 21u);
  EXPECT_EQ(r.dropped_bytes, 0u);
  EXPECT_TRUE(r.reason.empty()) << r.reason;

  // The format on disk, byte for byte: the segment header, then the first record.
  const std::string seg = ReadFile(d + "/" + TableLog::SegmentName(1));
  ASSERT_GE(seg.size(), kLogHeaderBytes + kLogRecordHeaderBytes);
  EXPECT_EQ(seg.substr(0, 4), "APXL");
  uint16_t version, header;
  uint64_t number;
  uint32_t crc;
  std::memcpy(&version, seg.data() + 4, 2);
  std::memcpy(&header, seg.data() + 6, 2);
  std::memcpy(&number, seg.data() + 8, 8);
  std::memcpy(&crc, seg.data() + 20, 4);
  EXPECT_EQ(version, 1);
  EXPECT_EQ(header, 24);
  EXPECT_EQ(number, 1u);
  EXPECT_EQ(crc, Crc32cExtend(0, seg.data(), 20));
  uint32_t rcrc, size;
  std::memcpy(&rcrc, seg.data() + 24, 4);
  std::memcpy(&size, seg.data() + 28, 4);
  EXPECT_EQ(size, Body(0).size());
  EXPECT_EQ(static_cast<uint8_t>(seg[32]), 0);
  EXPECT_EQ(seg.substr(33, size), Body(0));
  EXPECT_EQ(rcrc, Crc32cExtend(0, seg.data() + 28, 5 + size));
}

TEST(TableLogTest, SegmentsRollPastTheirSizeAndTheOldOnesCanBeRemoved) {
  TempDir dir("table_log");
  const std::string d = dir.Path("t");
  const LogOptions small{200};
  Fill(d, small, 60);
  std::vector<uint64_t> segs;
  {
    TableLog log(d, small, nullptr);
    segs = log.segments();
    ASSERT_GT(segs.size(), 3u);
    EXPECT_EQ(segs.back(), log.segment());  // the new one this life writes
    for (uint64_t s : segs) EXPECT_LE(std::filesystem::file_size(d + "/" + TableLog::SegmentName(s)), 200u);
  }
  std::vector<Rec> recs = Replay(d, small);
  ASSERT_EQ(recs.size(), 60u);
  for (size_t i = 0; i < recs.size(); ++i) EXPECT_EQ(recs[i].body, Body(static_cast<int>(i)));
  const uint64_t keep_from = recs[30].at.segment;
  size_t kept_records = 0;
  for (const Rec& r : recs) kept_records += r.at.segment >= keep_from;
  {
    TableLog log(d, small, nullptr);
    EXPECT_EQ(log.RemoveSegmentsBefore(keep_from), keep_from - segs.front());
    EXPECT_EQ(log.segments().front(), keep_from);
  }
  recs = Replay(d, small);
  ASSERT_EQ(recs.size(), kept_records);
  EXPECT_EQ(recs.back().body, Body(59));
  {
    TableLog log(d, small, nullptr);
    const size_t others = log.segments().size() - 1;
    EXPECT_EQ(log.RemoveSegmentsBefore(log.segment() + 10), others);  // never the one being written
    EXPECT_EQ(log.segments(), std::vector<uint64_t>{log.segment()});
  }
  EXPECT_EQ(Replay(d, small).size(), 0u);
}

TEST(TableLogTest, AReservationSaysWhereItsRecordsGoAndKeepsThemInOneSegment) {
  TempDir dir("table_log");
  const LogOptions small{200};
  TableLog log(dir.Path("t"), small, nullptr);
  for (int batch = 0; batch < 6; ++batch) {
    // Three records of 60 + 9 bytes: past a 200-byte segment with anything before them.
    const std::string b(60, static_cast<char>('a' + batch));
    LogPosition next = log.Reserve(3 * (kLogRecordHeaderBytes + b.size()));
    for (int i = 0; i < 3; ++i) {
      const LogPosition at = log.Append(1, b.data(), b.size());
      EXPECT_EQ(at.segment, next.segment);
      EXPECT_EQ(at.offset, next.offset + kLogRecordHeaderBytes);
      next.offset = at.offset + b.size();
    }
    log.Flush();
  }
  EXPECT_GE(log.segments().size(), 6u);  // each batch opened a segment of its own
}

TEST(TableLogTest, ATornTailEndsTheLogThereIsCutAndReported) {
  TempDir dir("table_log");
  const std::string d = dir.Path("t");
  Fill(d, LogOptions{}, 10);
  const std::string path = d + "/" + TableLog::SegmentName(1);
  const auto full = std::filesystem::file_size(path);
  const uint64_t last = kLogRecordHeaderBytes + Body(9).size();
  std::filesystem::resize_file(path, full - 3);  // the last record's body cut short
  LogRecovery r;
  std::vector<Rec> recs = Replay(d, LogOptions{}, &r);
  ASSERT_EQ(recs.size(), 9u);
  EXPECT_EQ(recs.back().body, Body(8));
  EXPECT_EQ(r.dropped_bytes, last - 3);
  EXPECT_NE(r.reason.find("torn"), std::string::npos) << r.reason;
  EXPECT_EQ(std::filesystem::file_size(path), full - last);  // cut at the last whole record

  // The log goes on from its last consistent state.
  {
    TableLog log(d, LogOptions{}, nullptr);
    EXPECT_TRUE(log.recovery().reason.empty()) << log.recovery().reason;
    log.Append(7, "after", 5);
    log.Sync();
  }
  recs = Replay(d, LogOptions{}, &r);
  ASSERT_EQ(recs.size(), 10u);
  EXPECT_EQ(recs[8].body, Body(8));
  EXPECT_EQ(recs.back().body, "after");
  EXPECT_TRUE(r.reason.empty()) << r.reason;

  // A record header cut short.
  const std::string d2 = dir.Path("t2");
  Fill(d2, LogOptions{}, 10);
  const std::string path2 = d2 + "/" + TableLog::SegmentName(1);
  std::filesystem::resize_file(path2, std::filesystem::file_size(path2) - last + 4);
  recs = Replay(d2, LogOptions{}, &r);
  ASSERT_EQ(recs.size(), 9u);
  EXPECT_EQ(r.dropped_bytes, 4u);
  EXPECT_NE(r.reason.find("record header torn"), std::string::npos) << r.reason;
}

TEST(TableLogTest, ACorruptRecordEndsTheLogAndTheSegmentsAfterItAreDeleted) {
  TempDir dir("table_log");
  const std::string d = dir.Path("t");
  const LogOptions small{200};
  const std::vector<LogPosition> at = Fill(d, small, 60);
  ASSERT_GT(at.back().segment, at[20].segment + 1);
  const std::string path = d + "/" + TableLog::SegmentName(at[20].segment);
  std::string bytes = ReadFile(path);
  bytes[at[20].offset + 2] ^= 0x10;  // one bit of record 20's body
  WriteFile(path, bytes);
  LogRecovery r;
  const std::vector<Rec> recs = Replay(d, small, &r);
  ASSERT_EQ(recs.size(), 20u);
  EXPECT_EQ(recs.back().body, Body(19));
  EXPECT_NE(r.reason.find("fails its checksum"), std::string::npos) << r.reason;
  EXPECT_EQ(r.dropped_segments, at.back().segment - at[20].segment);
  EXPECT_EQ(std::filesystem::file_size(path), at[20].offset - kLogRecordHeaderBytes);
}

TEST(TableLogTest, ATornSegmentHeaderEndsTheLogBeforeThatSegment) {
  TempDir dir("table_log");
  const std::string d = dir.Path("t");
  const LogOptions small{200};
  const std::vector<LogPosition> at = Fill(d, small, 30);
  const uint64_t second = at.front().segment + 1;
  std::filesystem::resize_file(d + "/" + TableLog::SegmentName(second), 10);
  LogRecovery r;
  const std::vector<Rec> recs = Replay(d, small, &r);
  size_t in_first = 0;
  for (const LogPosition& p : at) in_first += p.segment == at.front().segment;
  EXPECT_EQ(recs.size(), in_first);
  EXPECT_NE(r.reason.find("header is torn or corrupt"), std::string::npos) << r.reason;
  EXPECT_EQ(r.dropped_segments, at.back().segment - at.front().segment);
}

TEST(TableLogTest, ASegmentOfAnUnknownVersionIsRefusedAndNothingChanges) {
  TempDir dir("table_log");
  const std::string d = dir.Path("t");
  Fill(d, LogOptions{}, 5);
  const std::string path = d + "/" + TableLog::SegmentName(1);
  std::string bytes = ReadFile(path);
  const uint16_t v2 = 2;
  std::memcpy(bytes.data() + 4, &v2, 2);
  const uint32_t crc = Crc32cExtend(0, bytes.data(), 20);
  std::memcpy(bytes.data() + 20, &crc, 4);
  WriteFile(path, bytes);
  const auto files = dir.Files();
  try {
    TableLog log(d, LogOptions{}, nullptr);
    FAIL() << "opened a log of version 2";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("has version 2; this build reads version 1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(ReadFile(path), bytes);
  EXPECT_EQ(dir.Files(), files);
  EXPECT_EQ(std::filesystem::file_size(path), bytes.size());
}

TEST(TableLogTest, ASecondOpenerIsRefusedWhileTheFirstHoldsTheLog) {
  TempDir dir("table_log");
  const std::string d = dir.Path("t");
  {
    TableLog first(d, LogOptions{}, nullptr);
    EXPECT_THROW(TableLog(d, LogOptions{}, nullptr), IoError);
  }
  EXPECT_NO_THROW(TableLog(d, LogOptions{}, nullptr));  // released with the first
}

TEST(TableLogTest, AWriteThatFailsIsCutBackToTheLastWholeRecordAndTheLogGoesOn) {
  TempDir dir("table_log");
  const std::string d = dir.Path("t");
  struct rlimit old{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old), 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);  // writes past the limit then fail with EFBIG
  {
    TableLog log(d, LogOptions{}, nullptr);
    log.Append(1, "kept", 4);
    log.Sync();
    const auto synced = std::filesystem::file_size(d + "/" + TableLog::SegmentName(1));
    struct rlimit small = old;
    small.rlim_cur = synced + 40;
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
    const std::string big(100, 'b');
    log.Append(2, big.data(), big.size());  // crosses the limit: written in part, then EFBIG
    EXPECT_THROW(log.Flush(), IoError);
    EXPECT_EQ(std::filesystem::file_size(d + "/" + TableLog::SegmentName(1)), synced);
    EXPECT_EQ(log.buffered_bytes(), 0u);
    log.Append(3, "fits", 4);  // the log goes on after the failure
    log.Sync();
    ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &old), 0);
  }
  signal(SIGXFSZ, old_handler);
  LogRecovery r;
  const std::vector<Rec> recs = Replay(d, LogOptions{}, &r);
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].body, "kept");
  EXPECT_EQ(recs[1].body, "fits");
  EXPECT_TRUE(r.reason.empty()) << r.reason;
}

}  // namespace
}  // namespace apexrl

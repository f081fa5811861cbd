// SliceTable's invariants through a long run of inserts that wrap its step ring many times, windows copied out
// across chunk boundaries, and concurrent inserters, samplers and updaters (run under the sanitizers too).
#include "apexrl/slices/slice_table.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/slices/slice_decode.h"

namespace apexrl {
namespace {

// An episode of n steps, one byte per step (its step number), in chunks of `chunk` steps.
struct Episode {
  std::vector<std::vector<uint8_t>> chunks;
  std::vector<const uint8_t*> data;
  std::vector<uint64_t> sizes, steps;
  std::vector<uint64_t> columns;  // one raw field per chunk: the whole chunk
};

Episode MakeEpisode(uint32_t n, uint32_t chunk) {
  Episode e;
  for (uint32_t lo = 0; lo < n; lo += chunk) {
    std::vector<uint8_t> c;
    for (uint32_t j = lo; j < std::min(n, lo + chunk); ++j) c.push_back(static_cast<uint8_t>(j));
    e.chunks.push_back(c);
  }
  for (const auto& c : e.chunks) {
    e.data.push_back(c.data());
    e.sizes.push_back(c.size());
    e.steps.push_back(c.size());
    e.columns.insert(e.columns.end(), {0, c.size(), 0});
  }
  return e;
}

uint64_t Insert(SliceTable& t, uint32_t n, uint32_t chunk, const double* priorities = nullptr) {
  Episode e = MakeEpisode(n, chunk);
  return t.Insert(7, e.data.data(), e.sizes.data(), e.steps.data(), e.chunks.size(), priorities, e.columns.data(), 1);
}

SliceConfig Config(uint64_t capacity_steps, uint32_t length) {
  SliceConfig c;
  c.capacity_steps = capacity_steps;
  c.length = length;
  return c;
}

TEST(SliceTable, WrapsItsRingAndCopiesWindowsAcrossChunks) {
  SliceConfig c;
  c.capacity_steps = 37;
  c.length = 3;
  c.burn_in = 2;
  c.span = 2;
  c.seed = 1;
  SliceTable t(c);
  for (uint32_t i = 0; i < 200; ++i) {
    Insert(t, 1 + (i * 7) % 19, 1 + i % 4);
    t.Validate();
  }
  SliceSample s;
  t.Sample(500, 0.4, &s, /*copy_chunks=*/true);
  ASSERT_EQ(s.keys.size(), 500u);
  for (size_t i = 0; i < s.keys.size(); ++i) {
    const uint64_t start = s.keys[i] & kMaxEpisodeSteps;
    // The window's steps, read from its chunks (one byte per step = the step number), are start, start + 1, ...
    std::vector<uint8_t> steps;
    for (uint64_t r = s.window_chunk_offsets[i]; r < s.window_chunk_offsets[i + 1]; ++r) {
      const uint64_t ch = s.window_chunks[r];
      steps.insert(steps.end(), s.chunk_data.begin() + s.chunk_offsets[ch],
                   s.chunk_data.begin() + s.chunk_offsets[ch + 1]);
    }
    ASSERT_GE(steps.size(), s.first[i] + s.rows[i]);
    for (uint32_t r = 0; r < s.rows[i]; ++r) EXPECT_EQ(steps[s.first[i] + r], static_cast<uint8_t>(start + r));
    EXPECT_GE(s.rows[i], 2u + 1u);  // burn-in and at least L - span trained steps
  }
  // Decoded natively: each window's steps, then zeros and a mask of 0 past its episode's end.
  const size_t w = 5;
  std::vector<uint8_t> out(s.keys.size() * w, 0xAA), mask(s.keys.size() * w, 0xAA), ok(s.keys.size());
  const uint64_t row_bytes = 1;
  uint8_t* outs[] = {out.data()};
  ASSERT_EQ(DecodeSlices(s, &row_bytes, outs, w, mask.data(), ok.data()), 0u);
  for (size_t i = 0; i < s.keys.size(); ++i) {
    const uint64_t start = s.keys[i] & kMaxEpisodeSteps;
    EXPECT_EQ(ok[i], 1);
    for (size_t j = 0; j < w; ++j) {
      EXPECT_EQ(mask[i * w + j], j < s.rows[i] ? 1 : 0);
      EXPECT_EQ(out[i * w + j], j < s.rows[i] ? static_cast<uint8_t>(start + j) : 0);
    }
  }
  // The sample keeps the bytes it reads in place: its windows decode the same after their episodes are evicted.
  for (uint32_t i = 0; i < 50; ++i) Insert(t, 10, 3);
  std::vector<uint8_t> again(out.size(), 0xAA);
  uint8_t* again_outs[] = {again.data()};
  ASSERT_EQ(DecodeSlices(s, &row_bytes, again_outs, w, mask.data(), ok.data()), 0u);
  EXPECT_EQ(again, out);
  // A window longer than the outputs' rows fails, all zeros.
  ASSERT_EQ(DecodeSlices(s, &row_bytes, outs, 2, mask.data(), ok.data()), s.keys.size());
  EXPECT_TRUE(std::all_of(out.begin(), out.begin() + 2 * s.keys.size(), [](uint8_t b) { return b == 0; }));
}

TEST(SliceTable, RefusesBadInputAndChangesNothing) {
  SliceConfig c;
  c.capacity_steps = 10;
  c.length = 2;
  SliceTable t(c);
  Insert(t, 5, 2);
  EXPECT_THROW(Insert(t, 11, 2), InvalidArgument);
  const double bad[] = {1.0, -1.0, 1.0};
  EXPECT_THROW(Insert(t, 3, 2, bad), InvalidArgument);
  const uint64_t key = 0;
  const double nan = std::nan("");
  EXPECT_THROW(t.Update(&key, 1, &nan, false), InvalidArgument);
  EXPECT_EQ(t.Stats().episodes, 1u);
  EXPECT_EQ(t.Stats().windows, 4u);
  t.Validate();
  c.span = 2;
  EXPECT_THROW(SliceTable{c}, InvalidArgument);
}

TEST(SliceTable, ClearDropsEveryEpisodeAndKeysStayStale) {
  SliceConfig c;
  c.capacity_steps = 16;
  c.length = 2;
  SliceTable t(c);
  const double high[] = {5.0, 5.0, 5.0, 5.0};
  Insert(t, 4, 2, high);
  Insert(t, 6, 4);
  EXPECT_EQ(t.Clear(), 2u);
  t.Validate();
  EXPECT_EQ(t.NumWindows(), 0u);
  EXPECT_EQ(t.Stats().steps, 0u);
  EXPECT_EQ(t.Stats().chunk_bytes, 0u);
  SliceSample s;
  EXPECT_THROW(t.Sample(1, 0.4, &s), EmptyStore);
  const uint64_t old_key = 0;  // episode 0, start 0: dropped
  const double p = 2.0;
  EXPECT_EQ(t.Update(&old_key, 1, &p, false), 0u);
  // Episode numbers go on; new steps without priorities get 1 again, not the 5 set before the clear.
  EXPECT_EQ(Insert(t, 3, 3), 2u);
  EXPECT_EQ(t.StepPriorities(2), std::vector<double>(3, 1.0));
  EXPECT_EQ(t.NumWindows(), 2u);
  t.Validate();
}

TEST(SliceTable, ConcurrentInsertsSamplesAndUpdatesKeepItConsistent) {
  SliceConfig c;
  c.capacity_steps = 500;
  c.length = 4;
  c.burn_in = 1;
  SliceTable t(c);
  Insert(t, 50, 8);
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    for (uint32_t i = 0; i < 300; ++i) Insert(t, 10 + i % 40, 8);
  });
  for (int k = 0; k < 2; ++k) {
    threads.emplace_back([&] {
      SliceSample s;
      for (int i = 0; i < 200; ++i) {
        t.Sample(16, 0.5, &s);
        std::vector<double> p(s.keys.size(), 0.5 + i % 3);
        t.Update(s.keys.data(), s.keys.size(), p.data(), false);
      }
    });
  }
  for (auto& th : threads) th.join();
  t.Validate();
  const SliceStats st = t.Stats();
  EXPECT_EQ(st.inserted_episodes, 301u);
  EXPECT_LE(st.steps, 500u);
  EXPECT_EQ(st.sampled, 2u * 200 * 16);
}

std::string TempPath(const char* name) {
  const char* dir = std::getenv("TMPDIR");
  return std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp") + "/apexrl_slice_" + name + "_" +
         std::to_string(::getpid());
}

// Every window key and mass, and every held episode's step priorities, of two tables are equal.
void ExpectSameWindows(const SliceTable& a, const SliceTable& b) {
  std::vector<uint64_t> ka, kb;
  std::vector<double> ma, mb;
  a.Windows(&ka, &ma);
  b.Windows(&kb, &mb);
  EXPECT_EQ(ka, kb);
  EXPECT_EQ(ma, mb);
}

TEST(SliceTable, SaveAndLoadKeepEpisodesTheirNumbersAndTheirStepPriorities) {
  SliceConfig c = Config(60, 3);
  c.burn_in = 1;
  c.span = 1;
  SliceTable t(c);
  for (uint32_t i = 0; i < 30; ++i) Insert(t, 1 + (i * 5) % 13, 1 + i % 3);  // wraps the ring, evicts
  SliceSample s;
  t.Sample(40, 0.4, &s);
  std::vector<double> p(s.keys.size());
  for (size_t i = 0; i < p.size(); ++i) p[i] = 0.25 * static_cast<double>(i % 7);
  t.Update(s.keys.data(), s.keys.size(), p.data(), false);
  const std::string path = TempPath("roundtrip");
  const size_t saved = t.Save(path);
  EXPECT_EQ(saved, t.Stats().episodes);

  SliceTable u(c);
  EXPECT_EQ(u.Load(path), saved);
  u.Validate();
  ExpectSameWindows(t, u);
  const SliceStats st = t.Stats(), su = u.Stats();
  EXPECT_EQ(su.steps, st.steps);
  EXPECT_EQ(su.chunk_bytes, st.chunk_bytes);
  EXPECT_EQ(su.inserted_episodes, 0u);  // loading is not inserting
  for (uint64_t e = 30 - saved; e < 30; ++e) EXPECT_EQ(u.StepPriorities(e), t.StepPriorities(e)) << e;
  EXPECT_THROW(u.StepPriorities(30 - saved - 1), InvalidArgument);  // evicted before the save
  // Old keys update the same windows on both; the next episode gets the same number on both.
  EXPECT_EQ(u.Update(s.keys.data(), s.keys.size(), p.data(), false),
            t.Update(s.keys.data(), s.keys.size(), p.data(), false));
  EXPECT_EQ(Insert(u, 4, 2), Insert(t, 4, 2));
  ExpectSameWindows(t, u);

  // Another window configuration from the same episodes: its own windows, every step kept (capacity allowing).
  SliceConfig longer = c;
  longer.length = 5;
  longer.span = 0;
  SliceTable v(longer);
  v.Load(path);
  v.Validate();
  EXPECT_EQ(v.Stats().steps, st.steps);
  // A smaller capacity keeps the newest episodes that fit, evicting the oldest as inserts would.
  SliceConfig small = c;
  small.capacity_steps = 20;
  SliceTable w(small);
  w.Load(path);
  w.Validate();
  EXPECT_LE(w.Stats().steps, 20u);
  EXPECT_GT(w.Stats().evicted_episodes, 0u);
  // Only a new table loads.
  EXPECT_THROW(u.Load(path), InvalidArgument);
  std::remove(path.c_str());
}

TEST(SliceTable, SaveWhileInsertingWritesOneConsistentState) {
  const SliceConfig c = Config(400, 2);
  SliceTable t(c);
  Insert(t, 20, 4);
  const std::string path = TempPath("concurrent");
  std::thread writer([&] {
    for (uint32_t i = 0; i < 400; ++i) Insert(t, 5 + i % 30, 4);
  });
  for (int k = 0; k < 20; ++k) {
    t.Save(path);
    SliceTable u(c);
    u.Load(path);
    u.Validate();
  }
  writer.join();
  std::remove(path.c_str());
}

TEST(SliceTable, LoadRefusesTruncatedCorruptAndForeignFilesAndChangesNothing) {
  const SliceConfig c = Config(50, 2);
  SliceTable t(c);
  for (uint32_t i = 0; i < 6; ++i) Insert(t, 6, 4);
  const std::string path = TempPath("bad");
  t.Save(path);
  std::vector<char> bytes;
  {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    int ch;
    while ((ch = std::fgetc(f)) != EOF) bytes.push_back(static_cast<char>(ch));
    std::fclose(f);
  }
  const auto write = [&](const std::vector<char>& b) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    if (!b.empty()) std::fwrite(b.data(), 1, b.size(), f);
    std::fclose(f);
  };
  // Every truncation, and a flipped byte at many places: SnapshotError, the table still new and usable.
  for (size_t cut = 0; cut < bytes.size(); cut += 7) {
    write(std::vector<char>(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(cut)));
    SliceTable u(c);
    EXPECT_THROW(u.Load(path), SnapshotError) << "cut at " << cut;
    EXPECT_EQ(u.Stats().episodes, 0u);
    EXPECT_EQ(Insert(u, 3, 3), 0u);
  }
  for (size_t at = 0; at < bytes.size(); at += 11) {
    std::vector<char> b = bytes;
    b[at] = static_cast<char>(b[at] ^ 0x5A);
    write(b);
    SliceTable u(c);
    EXPECT_THROW(u.Load(path), SnapshotError) << "flipped at " << at;
    EXPECT_EQ(u.Stats().episodes, 0u);
  }
  write(bytes);
  SliceTable u(c);
  EXPECT_EQ(u.Load(path), 6u);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace apexrl

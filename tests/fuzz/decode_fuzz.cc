// Hostile-message fuzzing of the serving loop's decoder and item check, built with AddressSanitizer and
// UndefinedBehaviorSanitizer (CI: .ci/run). A seed corpus of valid requests of every op is mutated for a
// bounded time (bit flips, byte changes, truncation, extension, frame splits/merges/drops, header field
// overwrites with edge values); each mutant goes through Decode and, when it decodes, through FirstBadItem
// with a compressed and a fixed-size layout, and an INSERT that carries frame chunks into a real store (the
// loop's chunk check and the store must refuse the same ones), and an INSERT whose item is an episode record
// (a slices table's, serve/episode_record.h) through the record's check into a real SliceTable, whose windows are
// then sampled and their chunk bytes read. Any sanitizer report aborts the process: a
// failing test. No libzmq is involved: the decoder sees frames exactly as the loop hands them over.
//
//   decode_fuzz SECONDS [SEED]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/serve/episode_record.h"
#include "apexrl/serve/item_check.h"
#include "apexrl/serve/wire.h"
#include "apexrl/sharded_store.h"
#include "apexrl/slices/slice_table.h"

using apexrl::ItemLayout;
using apexrl::serve::Decode;
using apexrl::serve::FrameView;
using apexrl::serve::Message;
using apexrl::serve::Request;

namespace {

using Frames = std::vector<std::string>;

std::string Header(uint16_t op, uint32_t count, double param, uint32_t timeout_ms, uint32_t table = 0) {
  std::string h = apexrl::serve::EncodeHeader(op, 7, 0, count);
  std::memcpy(h.data() + 24, &param, 8);
  std::memcpy(h.data() + 32, &timeout_ms, 4);
  std::memcpy(h.data() + 36, &table, 4);  // the table field (protocol v5)
  return h;
}

template <typename T>
std::string Array(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

std::vector<Frames> Seeds() {
  std::vector<Frames> seeds;
  // INSERT of 3 items, laid out as the codec writes them (fingerprint 0x11223344, 8 raw bytes, one lz4 block).
  std::string data;
  std::vector<uint64_t> offsets{0};
  for (int i = 0; i < 3; ++i) {
    std::string item("\x44\x33\x22\x11", 4);
    item += std::string(8, static_cast<char>(i));
    const uint32_t len = 5 + i;
    item += std::string(reinterpret_cast<const char*>(&len), 4) + std::string(len, 'z');
    data += item;
    offsets.push_back(data.size());
  }
  // Without chunks (empty item_chunks, item_chunk_offsets all 0, chunk_offsets [0]) ...
  seeds.push_back({Header(1, 3, 0, 100), Array(std::vector<double>{1, 0.5, 2}), Array(offsets), data,
                   Array(std::vector<uint64_t>{9, 1}), std::string(), Array(std::vector<uint64_t>{0, 0, 0, 0}),
                   std::string(), Array(std::vector<uint64_t>{0})});
  // ... and with two chunks, items referencing {0}, {0, 1}, {1}.
  seeds.push_back({Header(1, 3, 0, 100), Array(std::vector<double>{1, 0.5, 2}), Array(offsets), data,
                   Array(std::vector<uint64_t>{9, 2}), Array(std::vector<uint64_t>{0, 0, 1, 1}),
                   Array(std::vector<uint64_t>{0, 1, 3, 4}), std::string(40, 'c'),
                   Array(std::vector<uint64_t>{0, 16, 40})});
  // An episode for a slices table: one record over two chunks (5 and 3 steps, two fields each, per-step
  // priorities).
  std::string record = "APXE";
  const uint16_t version = 1, flags = 1;
  const uint32_t chunks = 2, fields = 2;
  const uint64_t fingerprint = 0x55;
  record +=
      std::string(reinterpret_cast<const char*>(&version), 2) + std::string(reinterpret_cast<const char*>(&flags), 2);
  record +=
      std::string(reinterpret_cast<const char*>(&chunks), 4) + std::string(reinterpret_cast<const char*>(&fields), 4);
  record += std::string(reinterpret_cast<const char*>(&fingerprint), 8);
  record += Array(std::vector<uint64_t>{5, 3});
  record += Array(std::vector<uint64_t>{0, 10, 0, 10, 6, 1, 0, 6, 0, 6, 6, 1});
  record += Array(std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8});
  seeds.push_back({Header(1, 1, 0, 0), Array(std::vector<double>{1}), Array(std::vector<uint64_t>{0, record.size()}),
                   record, Array(std::vector<uint64_t>{0, 0}), Array(std::vector<uint64_t>{0, 1}),
                   Array(std::vector<uint64_t>{0, 2}), std::string(28, 'e'), Array(std::vector<uint64_t>{0, 16, 28})});
  seeds.push_back({Header(2, 512, 0.4, 1000)});
  seeds.push_back({Header(3, 2, 0, 0), Array(std::vector<uint64_t>{1, 2}), Array(std::vector<double>{0.1, 3})});
  seeds.push_back({Header(4, 0, 0, 0)});
  seeds.push_back({Header(5, 0, 0, 0)});
  seeds.push_back({Header(6, 0, 0, 0), std::string("{\"version\":1}")});
  seeds.push_back({Header(7, 1, 0, 0), Array(std::vector<uint64_t>{5})});
  seeds.push_back({Header(8, 0, 0, 0)});     // CHECKPOINT
  seeds.push_back({Header(9, 0, 0, 0, 1)});  // RESET of table 1
  // Data requests naming other tables (any index decodes; the loop checks it against its tables), and a
  // request that names none carrying a table (BAD_MESSAGE).
  seeds.push_back({Header(2, 8, 0.4, 0, 1)});
  seeds.push_back({Header(7, 1, 0, 0, 0xFFFFFFFFu), Array(std::vector<uint64_t>{5})});
  seeds.push_back({Header(5, 0, 0, 0, 3)});
  return seeds;
}

void Mutate(Frames* f, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % (n == 0 ? 1 : n)); };
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    if (f->empty()) f->push_back(std::string());
    std::string& fr = (*f)[pick(f->size())];
    switch (rng() % 10) {
      case 0:
        if (!fr.empty()) fr[pick(fr.size())] ^= static_cast<char>(1u << (rng() % 8));
        break;
      case 1:
        if (!fr.empty()) fr[pick(fr.size())] = static_cast<char>(rng());
        break;
      case 2:
        fr.resize(pick(fr.size() + 1));
        break;
      case 3:
        fr.append(pick(64), static_cast<char>(rng()));
        break;
      case 4:
        f->erase(f->begin() + static_cast<long>(pick(f->size())));
        break;
      case 5:
        f->insert(f->begin() + static_cast<long>(pick(f->size() + 1)), std::string(pick(48), '\0'));
        break;
      case 6: {  // a header field set to an edge value
        std::string& h = (*f)[0];
        if (h.size() >= 40) {
          const size_t at[] = {4, 6, 16, 18, 20, 24, 32, 36};
          const uint64_t edge[] = {0,
                                   1,
                                   0xFFFFFFFFFFFFFFFFull,
                                   0x7FF0000000000000ull,
                                   0xFFF8000000000000ull,
                                   1u << 20,
                                   (1u << 20) + 1,
                                   0x80000000u};
          const uint64_t v = edge[rng() % 8];
          const size_t pos = at[rng() % 8];
          std::memcpy(h.data() + pos, &v, std::min<size_t>(8, 40 - pos));
        }
        break;
      }
      case 7:
        if (f->size() > 1) {
          (*f)[0] += (*f)[1];
          f->erase(f->begin() + 1);
        }
        break;
      case 8:
        f->push_back(std::string(pick(16), 'x'));
        break;
      default: {  // u64 words of a frame overwritten with large, misaligned or edge values
        if (fr.size() >= 8) {
          // Edges of a count, offset or chunk reference: just past a small frame, and where 32-bit truncation
          // or a multiplication by 8 or 16 would wrap.
          const uint64_t edge[] = {2,          3,          0xFFFFFFFFull, 1ull << 32, (1ull << 32) + 1,
                                   1ull << 40, 1ull << 60, 1ull << 63,    ~0ull};
          const uint64_t kind = rng() % 4;
          const uint64_t v = kind == 0 ? rng() : kind == 1 ? edge[rng() % 9] : rng() % 4096;
          std::memcpy(fr.data() + 8 * pick(fr.size() / 8), &v, 8);
        }
      }
    }
  }
}

// An INSERT's frame chunks into a real store, as the loop reads them (Handlers::ServeInsert), with the
// references clamped to the store's u32: the loop's check when a request is decoded (FirstBadInsertContent)
// must refuse exactly what the store refuses, since the loop stores only what passed it.
void InsertWithChunks(const Request& q, apexrl::ShardedStore* store) {
  using apexrl::serve::LoadU64;
  std::vector<const uint8_t*> items(q.count), chunks(q.num_chunks);
  std::vector<uint64_t> sizes(q.count), chunk_sizes(q.num_chunks), ref_offsets(q.count + 1);
  std::vector<uint64_t> refs(q.num_refs);
  std::vector<double> priorities(q.count, 1.0);
  for (uint64_t i = 0; i < q.count; ++i) {
    items[i] = q.data + LoadU64(q.offsets, i);
    sizes[i] = LoadU64(q.offsets, i + 1) - LoadU64(q.offsets, i);
  }
  for (uint64_t c = 0; c < q.num_chunks; ++c) {
    chunks[c] = q.chunk_data + LoadU64(q.chunk_offsets, c);
    chunk_sizes[c] = LoadU64(q.chunk_offsets, c + 1) - LoadU64(q.chunk_offsets, c);
  }
  for (uint64_t j = 0; j < q.num_refs; ++j) {
    refs[j] = LoadU64(q.item_chunks, j);
  }
  for (uint64_t i = 0; i <= q.count; ++i) ref_offsets[i] = LoadU64(q.item_chunk_offsets, i);
  apexrl::ChunkBatch batch;
  batch.data = chunks.data();
  batch.sizes = chunk_sizes.data();
  batch.count = q.num_chunks;
  batch.item_chunks = refs.data();
  batch.item_chunk_offsets = ref_offsets.data();
  std::vector<apexrl::Key> keys(q.count);
  const auto why = apexrl::serve::FirstBadInsertContent(q);
  bool refused = false;
  try {
    store->Insert(priorities.data(), items.data(), sizes.data(), q.count, keys.data(), &batch);
  } catch (const apexrl::StaleChunks&) {
    refused = true;  // well-formed chunk keys of chunks this store does not hold: the store's check alone
  } catch (const apexrl::InvalidArgument& e) {
    refused = true;  // refused whole
    if (!why) {
      std::fprintf(stderr, "decode_fuzz: the store refused an INSERT the loop's check passed: %s\n", e.what());
      std::abort();
    }
  }
  if (why && !refused) {
    std::fprintf(stderr, "decode_fuzz: the store took an INSERT the loop's check refuses: %s\n", why->c_str());
    std::abort();
  }
  if (refused) return;
  if (store->Size() > 0) {
    apexrl::SampleResult r;
    store->Sample(4, 0.4, &r);
  }
}

// An INSERT's item as a slices table's episode record: the loop's checks (the generic one, then the record's), and
// when they pass, the episode into a real SliceTable and a sample of its windows, every chunk byte read.
void InsertEpisode(const Request& q, apexrl::SliceTable* slices) {
  using apexrl::serve::LoadU64;
  if (q.count != 1 || q.num_refs != q.num_chunks || apexrl::serve::FirstBadInsertContent(q)) return;
  for (uint64_t j = 0; j < q.num_refs; ++j) {
    if (LoadU64(q.item_chunks, j) != j) return;
  }
  std::vector<uint64_t> sizes(q.num_chunks);
  std::vector<const uint8_t*> data(q.num_chunks);
  for (uint64_t k = 0; k < q.num_chunks; ++k) {
    data[k] = q.chunk_data + LoadU64(q.chunk_offsets, k);
    sizes[k] = LoadU64(q.chunk_offsets, k + 1) - LoadU64(q.chunk_offsets, k);
  }
  apexrl::serve::EpisodeRecord record;
  if (apexrl::serve::ParseEpisodeRecord(q.data, LoadU64(q.offsets, 1), sizes.data(), q.num_chunks, &record)) return;
  try {
    slices->Insert(record.fingerprint, data.data(), sizes.data(), record.steps.data(), q.num_chunks,
                   record.step_priorities.empty() ? nullptr : record.step_priorities.data(), record.columns.data(),
                   record.num_fields);
  } catch (const apexrl::InvalidArgument&) {
    return;  // longer than the table, another field count than its episodes', a mass above the limit
  }
  apexrl::SliceSample s;
  try {
    slices->Sample(8, 0.4, &s);
  } catch (const apexrl::EmptyStore&) {
    return;  // an episode of burn-in only, in an empty table
  }
  uint64_t sum = 0;
  for (size_t c = 0; c < s.chunk_bases.size(); ++c) {
    for (uint64_t b = 0; b < s.chunk_sizes[c]; ++b) sum += s.chunk_bases[c][b];
  }
  volatile uint64_t sink = sum;
  (void)sink;
}

void Run(const Frames& f, const ItemLayout* layouts, size_t nlayouts, apexrl::ShardedStore* store,
         apexrl::SliceTable* slices) {
  std::vector<FrameView> views;
  Message m;
  for (size_t i = 0; i < f.size() && i < apexrl::serve::kMaxKeptFrames; ++i) {
    views.push_back({reinterpret_cast<const uint8_t*>(f[i].data()), f[i].size()});
  }
  for (const auto& s : f) m.total_bytes += s.size();
  m.frames = views.data();
  m.kept = views.size();
  m.count = f.size();
  Request q;
  const auto r = Decode(m, 1 << 20, &q);
  volatile size_t sink = r.message.size();
  (void)sink;
  if (r.ok() && q.table != 0 && !apexrl::serve::NamesTable(q.op)) {
    std::fprintf(stderr, "decode_fuzz: a request of op %u that names no table decoded with table %u\n", q.op, q.table);
    std::abort();
  }
  if (r.ok() && q.op == apexrl::serve::kInsert) {
    for (size_t k = 0; k < nlayouts; ++k) {
      auto why = apexrl::FirstBadItem(layouts[k], q.data, apexrl::ItemSpans::Offsets(q.offsets, q.count));
      sink = why ? why->size() : 0;
    }
    if (q.num_chunks > 0 || q.num_refs > 0) {
      InsertWithChunks(q, store);
      InsertEpisode(q, slices);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 10.0;
  std::mt19937_64 rng(argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1);
  ItemLayout layouts[2];
  layouts[0].fingerprint = 0x11223344;
  layouts[0].fields = {{"a", 8, false}, {"obs", 64, true}, {"empty", 0, true}};  // header: 12 bytes
  layouts[0].repr = "TransitionSpec(fuzz)";
  layouts[1].fingerprint = 0x11223344;
  layouts[1].fields = {{"a", 8, false}};
  layouts[1].repr = "TransitionSpec(fixed)";
  apexrl::StoreConfig config;
  config.capacity = 64;
  config.shards = 2;
  apexrl::ShardedStore store(config);
  apexrl::SliceConfig slice_config;
  slice_config.capacity_steps = 64;
  slice_config.length = 3;
  slice_config.burn_in = 1;
  slice_config.span = 2;
  slice_config.strict_length = false;
  apexrl::SliceTable slices(slice_config);
  const auto seeds = Seeds();
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t runs = 0;
  for (const auto& s : seeds) Run(s, layouts, 2, &store, &slices);
  while (std::chrono::steady_clock::now() < end) {
    for (int i = 0; i < 1000; ++i, ++runs) {
      Frames f = seeds[rng() % seeds.size()];
      Mutate(&f, rng);
      Run(f, layouts, 2, &store, &slices);
    }
  }
  std::printf("decode_fuzz: %llu mutated messages, no sanitizer report\n", static_cast<unsigned long long>(runs));
  return 0;
}

// Stateful fuzzing of the serving loop: sequences of requests against one live ServeLoop, through the
// in-memory ZmqApi of tests/cpp/fake_zmq.h (no socket), built with AddressSanitizer and UBSan (CI: .ci/run,
// ctest -L fuzz). decode_fuzz feeds one message at a time; the defects this finds need a request that
// depends on the server's state (a repeated insert id with a bad chunk reference; an invalid chunk
// reference under the rate limiter).
//
// Each episode starts a loop with a random configuration (rate limited or not, min size, short max_wait_s,
// small store that evicts, few workers, SAMPLEs past inline_sample_max going to the workers) and runs random
// steps from peers: two steady ones, one that sends mutants of valid requests (bit flips, 8-byte words set
// to edge values, cut / grown / dropped / added frames), and transient ones that send waiting requests and
// vanish (their replies then fail with EHOSTUNREACH, at the routing id or at the first data frame); a
// successor with the same identity retries their INSERTs with the same insert ids. Requests: valid INSERTs
// with fresh, repeated and no insert ids, chunked and not; INSERTs whose content is invalid (chunk references
// out of range, repeated, unused chunks) with fresh or repeated ids and timeouts; SAMPLE, UPDATE_PRIORITIES,
// ERASE, REMOVE_TO_FIT, STATS; pauses that let waits expire. The first two episodes replay the two defects it was
// written to find.
//
// Tables: half the episodes run the loop with a second table (its own store and key epoch, a MinSize
// or Queue limiter; with the Queue, a FIFO queue of max_times_sampled 1 whose SAMPLEs may come from peers that
// vanish, checked to hold every item it stored and did not deliver) beside the modelled table 0. A "foreign"
// step sends valid requests to table 1 (with table 0's keys: they must be stale there, counted 0) or to a table index
// the server lacks (INVALID_ARGUMENT naming the index); mutants may flip the header's table field too. None of them may
// change table 0: the model check below holds it to what table 0's own requests did. Half those episodes keep table 1
// on disk (storage="disk", sync or interval, small segments so that it compacts, a log tail cache of none, a few
// blocks or the default, so its SAMPLEs are served from memory, or drawn on the loop and read on a worker, or read
// on a worker): after every step each of its items
// reads back from its log, and at the end the log reopened holds exactly what the store held (keys, priorities,
// bytes, insertion order). Half of the two-table episodes add a slices table (index 2, kind slices: episodes in by
// record, windows out; serve/handlers_slices.cc) that the foreign step sends episodes (valid, or with a byte of their
// record changed), SAMPLEs, UPDATE_PRIORITIES, RESETs and the ERASE / REMOVE_TO_FIT it refuses, and that mutants
// reach through their table field; SliceTable::Validate holds it at the end.
//
// RESET: now and then table 0 is reset alone, when no vanished peer's INSERT is unresolved; the model drops every
// item, and the table's rate limiter counts only the items inserted since.
//
// After every step the harness waits until the loop is idle, then checks:
//  * every reply answers a request that had none yet (no reply twice, none unasked), with a status its kind
//    allows (never INTERNAL; an invalid INSERT is INVALID_ARGUMENT and never waits; valid requests never get
//    BAD_MESSAGE / INVALID_ARGUMENT); a wait ends by its deadline (plus slack);
//  * the store matches what was acknowledged: every acknowledged key is present unless erased or evicted
//    (probed one by one), size, bytes_held, chunks and chunk bytes equal the model's (bounded while a vanished
//    peer's INSERTs are unresolved), sampled items and their chunks hold the bytes that were inserted, ERASE
//    and UPDATE_PRIORITIES counts match, and ShardedStore::Validate passes;
// and at the end (after Stop) that every request of a peer that stayed was answered exactly once, and the
// loop logged no ERROR. Any failed check prints the seed and step and aborts.
//
//   loop_fuzz SECONDS [SEED [FIRST_EPISODE]]
#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "apexrl/disk_table.h"
#include "apexrl/serve/wire.h"
#include "live_loop.h"

using namespace apexrl;                  // NOLINT
using namespace apexrl::serve;           // NOLINT
using namespace apexrl::serve::testing;  // NOLINT

namespace {

uint64_t g_seed = 0;
uint64_t g_episode = 0;
uint64_t g_step = 0;
std::string g_action;
uint64_t g_episodes_stored = 0;  // episodes the slices tables held at their episodes' ends (all runs)

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "loop_fuzz: FAILED (seed %" PRIu64 ", episode %" PRIu64 ", step %" PRIu64 ", %s): %s\n", g_seed,
               g_episode, g_step, g_action.c_str(), what.c_str());
  std::fflush(stderr);
  std::abort();
}

#define CHECK(cond, msg)                                             \
  do {                                                               \
    if (!(cond)) Fail(std::string(#cond) + ": " + std::string(msg)); \
  } while (0)

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

constexpr double kSlackS = 10.0;  // a wait's answer may come this late (sanitizers, a loaded 2-core machine)

// What one request was, for matching its reply and updating the model.
struct Sent {
  std::string peer;
  uint16_t op = 0;
  uint64_t rid = 0;
  Frames frames;
  bool mutant = false;
  bool bad_content = false;  // an INSERT whose own content is invalid: INVALID_ARGUMENT at once
  double deadline = 0;       // when its answer is due at the latest
  bool answered = false;
  uint16_t status = 0;
  std::string user_id;
  uint64_t session = 0, sequence = 0;
  uint32_t table = 0;      // the header's table field: 0 the modelled table, 1 the other one, else none
  bool maybe_bad = false;  // a slices table's episode with a changed record byte: stored or INVALID_ARGUMENT
};

struct ModelItem {
  std::string data;
  std::vector<uint64_t> chunks;  // model chunk ids, in the item's order
  double priority = 0;
};
struct ModelChunk {
  std::string data;
  uint64_t refs = 0;
};

class Fuzz {
 public:
  Fuzz(uint64_t seed, int script) : rng_(seed), script_(script) {}

  void Run(int steps) {
    Configure();
    if (two_tables_) {
      std::vector<TableSpec> tables;
      LimiterConfig first;  // table 0's limiter, as the single-store loop builds it from config_
      first.kind = config_.samples_per_insert > 0 ? LimiterKind::kSampleToInsertRatio : LimiterKind::kMinSize;
      first.spi = config_.samples_per_insert;
      first.eb = config_.samples_per_insert > 0 ? config_.error_buffer : 0.0;
      first.min_size = config_.min_size_to_sample;
      tables.push_back(TableSpec{"default", std::make_shared<ShardedStore>(store_config_), first});
      StoreConfig other = store_config_;
      other.epoch = store_config_.epoch + 1;  // its own key epoch
      LimiterConfig second;
      if (Chance(0.5)) {  // a queue: every item handed out once, none lost to a reply not sent
        second.kind = LimiterKind::kQueue;
        second.queue_size = 6;
        other.sampler = SamplerKind::kFifo;
        other.eviction = EvictionKind::kFifo;
        other.max_times_sampled = 1;
        queue_ = true;
      }
      if (Chance(0.5)) {  // on disk: every change logged, its items read back from the log
        char dir[] = "/tmp/loop_fuzz_XXXXXX";
        CHECK(::mkdtemp(dir) != nullptr, "mkdtemp");
        disk_dir_ = dir;
        disk_options_.path = disk_dir_ + "/table";
        disk_options_.durability = Chance(0.5) ? Durability::kSync : Durability::kInterval;
        disk_options_.interval_s = 0.002;
        disk_options_.log.segment_bytes = 1024;  // many segments, compacted away while serving
        disk_options_.compact_min_bytes = 1024;
        // The log tail cache: none (every read from the files, on a worker), a few blocks (most batches miss it
        // and go from the loop to a worker as drawn), or the default (the loop serves them all from memory).
        disk_options_.cache_bytes = Pick({0, 8192, DiskTableOptions::kDefaultCacheBytes});
        disk_config_ = other;
        disk_ = std::make_shared<DiskTable>(other, disk_options_);
        other_ = disk_->store();
      } else {
        other_ = std::make_shared<ShardedStore>(other);
      }
      tables.push_back(TableSpec{"other", other_, second, disk_});
      if (slices_table_) {
        SliceConfig sc;
        sc.capacity_steps = 24;
        sc.length = 2;
        sc.burn_in = static_cast<uint32_t>(Pick({0, 1}));
        sc.span = static_cast<uint32_t>(Pick({0, 1}));
        sc.strict_length = Chance(0.5);
        sc.sampler = Chance(0.5) ? SliceSampling::kPrioritized : SliceSampling::kUniform;
        sc.seed = rng_();
        slices_ = std::make_shared<SliceTable>(sc);
        LimiterConfig third;
        third.min_size = Pick({1, 3});  // counted in windows
        tables.push_back(TableSpec{"slices", nullptr, third, nullptr, slices_});
      }
      live_ = std::make_unique<LiveLoop>(std::move(tables), config_);
    } else {
      live_ = std::make_unique<LiveLoop>(store_config_, config_);
    }
    if (script_ == 1) {
      ScriptDuplicateIdWithBadChunk();
    } else if (script_ == 2) {
      ScriptBadChunkUnderRateLimiter();
    }
    for (int i = 0; i < steps; ++i) {
      g_step = i;
      Step();
      Settle();
      Check();
    }
    Drain();
    live_->Stop();
    Collect();
    for (const auto& [key, s] : sent_) {
      if (gone_.count(s.peer)) continue;  // dropped with its peer (docs/protocol.md, Limits on waiting)
      CHECK(s.answered, "request " + std::to_string(s.rid) + " of " + s.peer + " was never answered");
    }
    CHECK(live_->Logs("ERROR").empty(), live_->Logs("ERROR").front());
    live_->store->Validate();
    if (slices_) {
      slices_->Validate();
      g_episodes_stored += slices_->Stats().inserted_episodes;
    }
    if (disk_) Reopen();
  }

  ~Fuzz() {
    if (!disk_dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(disk_dir_, ec);
    }
  }

  uint64_t requests() const { return sent_.size(); }

 private:
  // ------------------------------------------------------------------------------------------ configuration

  void Configure() {
    store_config_.capacity = Pick({12, 24, 40});
    store_config_.max_size = store_config_.capacity + Pick({4, 16});
    store_config_.shards = static_cast<uint32_t>(Pick({1, 2, 3}));
    store_config_.eviction = static_cast<EvictionKind>(Pick({0, 1, 2}));
    store_config_.alpha = Pick({0, 1}) ? 0.6 : 1.0;
    store_config_.seed = rng_();
    config_.workers = static_cast<uint32_t>(Pick({1, 2}));
    config_.inline_sample_max = 4;
    config_.max_wait_s = Pick({0, 1}) ? 0.02 : 0.1;  // short: waits expire within the run
    config_.max_waiting = Pick({8, 64});
    config_.max_waiting_per_peer = Pick({3, 16});
    config_.max_waiting_bytes = Pick({4096, 1 << 20});
    config_.min_size_to_sample = Pick({1, 3});
    config_.dedup_max_ids = 4096;  // a vanished peer's ids must outlive their retries (exactly-once)
    const bool limited = script_ == 2 || Pick({0, 1});
    config_.samples_per_insert = limited ? (Pick({0, 1}) ? 1.0 : 2.0) : 0.0;
    config_.error_buffer = limited ? 24.0 : 0.0;  // wide enough that no request here is never admitted
    if (script_ == 2) {
      config_.samples_per_insert = 1.0;
      config_.error_buffer = 24.0;
      config_.min_size_to_sample = 1;
    }
    two_tables_ = script_ == 0 && Chance(0.5);
    slices_table_ = two_tables_ && Chance(0.5);
  }

  uint64_t Pick(std::initializer_list<uint64_t> xs) {
    return *(xs.begin() + std::uniform_int_distribution<size_t>(0, xs.size() - 1)(rng_));
  }
  uint64_t Uniform(uint64_t lo, uint64_t hi) { return std::uniform_int_distribution<uint64_t>(lo, hi)(rng_); }
  bool Chance(double p) { return std::uniform_real_distribution<double>(0, 1)(rng_) < p; }
  std::string Bytes(size_t n) {
    std::string s(n, '\0');
    for (auto& c : s) c = static_cast<char>(rng_());
    return s;
  }

  // ------------------------------------------------------------------------------------------- requests

  struct InsertContent {
    std::vector<std::string> items;
    std::vector<double> priorities;
    std::vector<std::vector<uint64_t>> refs;
    std::vector<std::string> chunks;
  };

  InsertContent ValidContent() {
    InsertContent c;
    const size_t n = Uniform(0, 5);
    for (size_t i = 0; i < n; ++i) {
      c.items.push_back(Bytes(Uniform(0, 48)));
      c.priorities.push_back(Chance(0.1) ? 0.0 : std::uniform_real_distribution<double>(0.01, 10)(rng_));
    }
    if (n > 0 && Chance(0.5)) {
      const size_t m = Uniform(1, 4);
      for (size_t k = 0; k < m; ++k) c.chunks.push_back(Bytes(Uniform(0, 64)));
      c.refs.resize(n);
      for (size_t i = 0; i < n; ++i) {
        for (size_t k = 0; k < m; ++k) {
          if (Chance(0.4)) c.refs[i].push_back(k);
        }
        std::shuffle(c.refs[i].begin(), c.refs[i].end(), rng_);
      }
      for (size_t k = 0; k < m; ++k) {  // every chunk referenced by some item
        bool used = false;
        for (auto& r : c.refs) used |= std::find(r.begin(), r.end(), k) != r.end();
        if (!used) c.refs[Uniform(0, n - 1)].push_back(k);
      }
    }
    return c;
  }

  // Breaks the chunk references of `c` (which has items): out of range, repeated, or a chunk left unused.
  void BreakChunks(InsertContent* c) {
    if (c->chunks.empty()) {
      c->chunks.push_back(Bytes(Uniform(0, 16)));
      c->refs.assign(c->items.size(), {});
      c->refs[0].push_back(0);
    }
    const uint64_t m = c->chunks.size();
    auto& r = c->refs[Uniform(0, c->items.size() - 1)];
    switch (Uniform(0, 2)) {
      case 0:
        // Past the request's chunks and no chunk key either (a tag of generation 0 or epoch 0; ~0 would be a
        // well-formed chunk key, refused as STALE_CHUNKS by the store instead).
        r.push_back(Pick({m, m + 1, uint64_t{1} << 32, uint64_t{1} << 40, uint64_t{1} << 63, (uint64_t{1} << 32) + m}));
        break;
      case 1:
        if (!r.empty()) {
          r.push_back(r.front());
        } else {
          r.push_back(m + 7);
        }
        break;
      default:
        c->chunks.push_back(Bytes(3));  // referenced by no item
        break;
    }
  }

  void Send(Sent s) {
    s.rid = ++rid_;
    if (s.frames[0].size() >= 16) std::memcpy(s.frames[0].data() + 8, &s.rid, 8);
    const uint32_t timeout_ms = Timeout(s.frames[0]);
    const double wait = std::min(timeout_ms / 1000.0, config_.max_wait_s);
    s.deadline = Now() + wait + kSlackS;
    if (s.op == kInsert && (s.session != 0 || s.sequence != 0)) s.deadline += 1.0 + config_.max_wait_s;
    if (!composing_) FakeZmq::Get().Push(s.peer, s.frames, s.user_id);
    if (s.op == kErase || s.op == kRemoveToFit || s.mutant) ++removals_;
    const std::string key = SentKey(s.peer, s.rid);
    sent_[key] = std::move(s);
    order_.push_back(key);
  }
  static uint32_t Timeout(const std::string& h) {
    uint32_t t = 0;
    if (h.size() == kHeaderSize) std::memcpy(&t, h.data() + 32, 4);
    return t;
  }
  static std::string SentKey(const std::string& peer, uint64_t rid) { return peer + "#" + std::to_string(rid); }

  uint32_t RandomTimeout() { return Chance(0.5) ? 0 : static_cast<uint32_t>(Uniform(1, 300)); }

  void SendInsert(const std::string& peer, const std::string& user, InsertContent c, bool bad, uint64_t session,
                  uint64_t sequence, uint32_t timeout_ms) {
    Sent s;
    s.peer = peer;
    s.user_id = user;
    s.op = kInsert;
    s.bad_content = bad;
    s.session = session;
    s.sequence = sequence;
    s.frames = Insert(0, c.items, c.priorities, session, sequence, timeout_ms, c.refs, c.chunks);
    if (session != 0 || sequence != 0) ids_[{user, session, sequence}].push_back(c);
    Send(std::move(s));
  }

  // A valid INSERT: a fresh insert id, a repeat of one (same content: a retry), or none.
  void ValidInsert(const std::string& peer, const std::string& user, bool with_id = false) {
    double r = std::uniform_real_distribution<double>(0, 1)(rng_);
    if (with_id) r *= 0.8;
    uint64_t session = 0, sequence = 0;
    InsertContent c;
    auto& mine = seqs_[user];
    if (r < 0.3 && !mine.empty()) {
      sequence = mine[Uniform(0, mine.size() - 1)];
      session = SessionOf(user);
      c = ids_[{user, session, sequence}].front();
    } else {
      c = ValidContent();
      if (r < 0.8) {
        session = SessionOf(user);
        sequence = ++next_seq_[user];
        mine.push_back(sequence);
      }
    }
    SendInsert(peer, user, c, false, session, sequence, RandomTimeout());
  }

  // An INSERT with invalid chunk references: with a fresh id or one the server has answered (which
  // crashed the loop once), and with a timeout (once answered TIMEOUT under the rate limiter).
  void BadInsert(const std::string& peer, const std::string& user) {
    InsertContent c;
    uint64_t session = 0, sequence = 0;
    auto& mine = seqs_[user];
    if (!mine.empty() && Chance(0.6)) {
      session = SessionOf(user);
      sequence = mine[Uniform(0, mine.size() - 1)];
      c = ids_[{user, session, sequence}].front();
    } else {
      c = ValidContent();
    }
    if (c.items.empty()) c = InsertContent{{Bytes(4)}, {1.0}, {}, {}};
    BreakChunks(&c);
    Sent s;
    s.peer = peer;
    s.user_id = user;
    s.op = kInsert;
    s.bad_content = true;
    s.session = session;
    s.sequence = sequence;
    s.frames = Insert(0, c.items, c.priorities, session, sequence, RandomTimeout(), c.refs, c.chunks);
    Send(std::move(s));
  }

  uint64_t SessionOf(const std::string& user) {
    auto& s = sessions_[user];
    if (s == 0) s = rng_() | 1;
    return s;
  }

  std::vector<Key> SomeKeys(size_t n) {
    std::vector<Key> keys;
    std::vector<Key> live;
    for (const auto& [k, _] : live_items_) live.push_back(k);
    for (size_t i = 0; i < n; ++i) {
      if (!live.empty() && Chance(0.7)) {
        keys.push_back(live[Uniform(0, live.size() - 1)]);
      } else if (!dead_.empty() && Chance(0.5)) {
        keys.push_back(*std::next(dead_.begin(), static_cast<long>(Uniform(0, dead_.size() - 1))));
      } else {
        keys.push_back(rng_());
      }
    }
    return keys;
  }

  void Simple(const std::string& peer, const std::string& user, Frames frames, uint16_t op) {
    Sent s;
    s.peer = peer;
    s.user_id = user;
    s.op = op;
    s.frames = std::move(frames);
    Send(std::move(s));
  }

  void ValidRequest(const std::string& peer, const std::string& user) {
    switch (Uniform(0, 9)) {
      case 0:
      case 1:
      case 2:
        ValidInsert(peer, user);
        break;
      case 3:
      case 4:
        Simple(peer, user, Sample(0, static_cast<uint32_t>(Uniform(1, 8)), RandomTimeout(), Chance(0.5) ? 0.4 : 1),
               kSample);
        break;
      case 5: {
        const auto keys = SomeKeys(Uniform(0, 4));
        std::vector<double> p;
        for (size_t i = 0; i < keys.size(); ++i) p.push_back(std::uniform_real_distribution<double>(0, 5)(rng_));
        Simple(peer, user, Update(0, keys, p), kUpdatePriorities);
        break;
      }
      case 6:
        Simple(peer, user, Erase(0, SomeKeys(Uniform(0, 3))), kErase);
        break;
      case 7:
        Simple(peer, user, RemoveToFit(0), kRemoveToFit);
        break;
      case 8:
        Simple(peer, user, Stats(0), kStats);
        break;
      default:
        BadInsert(peer, user);
        break;
    }
  }

  // A mutant of a valid request (from the mutant peer, one at a time, its timeout set to 0 so that it never
  // waits and its reply is known to be its own).
  void Mutant() {
    const size_t before = order_.size();
    composing_ = true;  // built, not sent
    ValidRequest("mutant", "actor:mutant");
    composing_ = false;
    if (order_.size() == before) return;
    Sent s = std::move(sent_[order_.back()]);
    sent_.erase(order_.back());
    order_.pop_back();
    Frames& f = s.frames;
    for (uint64_t k = Uniform(1, 3); k > 0; --k) {
      const size_t i = Uniform(0, f.size() - 1);
      std::string& x = f[i];
      switch (Uniform(0, 6)) {
        case 0:
          if (!x.empty()) x[Uniform(0, x.size() - 1)] ^= static_cast<char>(Uniform(1, 255));
          break;
        case 1:
        case 2:  // an 8-byte word (a priority, offset, key, chunk reference) at an edge value
          if (x.size() >= 8 && i > 0) {
            // ... or the bits of inf, nan and 1e300 (a mass above MAX_MASS when alpha is 1).
            const uint64_t v = Pick({0, 1, 2, 3, 16, 17, 0xFFFFFFFFull, 1ull << 32, 1ull << 40, 1ull << 63, ~0ull,
                                     0x7FF0000000000000ull, 0x7FF8000000000000ull, 0x7E37E43C8800759Cull});
            std::memcpy(x.data() + 8 * Uniform(0, x.size() / 8 - 1), &v, 8);
          }
          break;
        case 3:
          x.resize(Uniform(0, x.size()));
          break;
        case 4:
          x += Bytes(Uniform(1, 16));
          break;
        case 5:
          if (f.size() > 1) f.erase(f.begin() + static_cast<long>(i));
          break;
        default:
          f.insert(f.begin() + static_cast<long>(i), Bytes(Uniform(0, 16)));
          break;
      }
    }
    if (!f.empty() && f[0].size() == kHeaderSize) {
      std::memset(f[0].data() + 32, 0, 4);
      // A flipped op byte may make a REMOVE_TO_FIT a RESET, which empties the table: the model follows
      // acknowledged items one by one, so such a mutant keeps its op (RESET is tested on its own).
      uint16_t op = 0;
      std::memcpy(&op, f[0].data() + 6, 2);
      if (op == kReset) std::memcpy(f[0].data() + 6, &s.op, 2);
      if (Chance(0.1)) {  // the table field: the other table, or one the server lacks
        const uint32_t t = static_cast<uint32_t>(Pick({1, 2, 7, 0xFFFFFFFFull}));
        std::memcpy(f[0].data() + 36, &t, 4);
      }
      std::memcpy(&s.table, f[0].data() + 36, 4);
      uint16_t sent_op = 0;
      std::memcpy(&sent_op, f[0].data() + 6, 2);
      // Insert ids are server-wide and modelled for table 0 only: a retry of an id first stored in another table
      // is answered with that table's keys, which the model would take for table 0's.
      if (s.table != 0 && sent_op == kInsert && f.size() > 4 && f[4].size() == 16) f[4].assign(16, '\0');
    }
    s.mutant = true;
    s.bad_content = false;
    if (f.empty()) f.push_back(std::string());
    Send(std::move(s));
  }

  // ---------------------------------------------------------------------------------------------- steps

  void Step() {
    removals_ = 0;
    reset_step_ = false;
    const uint64_t a = Uniform(0, 99);
    if (a < 40 && disk_ && Chance(0.3)) {
      g_action = "foreign (table 1 on disk)";  // enough traffic that its log rolls segments and compacts
      for (uint64_t k = Uniform(1, 6); k > 0; --k) Foreign();
    } else if (a < 40) {
      g_action = "steady";
      const std::string peer = Chance(0.5) ? "steady-a" : "steady-b";
      for (uint64_t k = Uniform(1, 3); k > 0; --k) ValidRequest(peer, "actor:" + peer);
    } else if (a < 55) {
      g_action = "mutant";
      Mutant();
    } else if (a < 60) {
      g_action = "foreign";
      Foreign();
    } else if (a < 75) {
      g_action = "transient";
      for (uint64_t k = Uniform(1, 3); k > 0; --k) {
        if (Chance(0.7)) {
          ValidInsert(Transient(), "actor:transient", true);  // an id: a successor can learn its keys
        } else {
          Simple(Transient(), "actor:transient", Sample(0, static_cast<uint32_t>(Uniform(1, 3)), 300), kSample);
        }
      }
    } else if (a < 82) {
      g_action = "vanish";
      FakeZmq::Get().Vanish(Transient(), Chance(0.5));
      gone_.insert(Transient());
      ++transient_;
    } else if (a < 94) {
      g_action = "retry";
      RetryLimbo();
    } else if (a < 96 && Limbo() == 0) {
      g_action = "reset";
      Simple("steady-a", "learner:steady-a", {Header(kReset, 0, 0)}, kReset);
      reset_step_ = true;
    } else {
      g_action = "pause";  // waits expire
      std::this_thread::sleep_for(std::chrono::duration<double>(Uniform(0, 2) * config_.max_wait_s));
    }
  }

  std::string Transient() const { return "transient-" + std::to_string(transient_); }

  // Valid requests for the other table (two tables) or for a table the server lacks, from their own peer,
  // without insert ids (those are server-wide and modelled for table 0 only).
  void Foreign() {
    if (slices_table_ && Chance(0.6)) {  // a burst, so that its episodes and windows build up
      for (uint64_t k = Uniform(2, 8); k > 0; --k) SlicesRequest();
      return;
    }
    const uint32_t table = two_tables_ && Chance(0.7) ? 1u
                           : slices_table_            ? static_cast<uint32_t>(Pick({3, 1000, 0xFFFFFFFFull}))
                                                      : static_cast<uint32_t>(Pick({1, 2, 3, 1000, 0xFFFFFFFFull}));
    Frames f;
    uint16_t op = 0;
    switch (Uniform(0, 4)) {
      case 0: {
        InsertContent c = ValidContent();
        if (disk_ && table == 1) {  // a disk table keeps items without chunks (it refuses the others)
          c.chunks.clear();
          c.refs.clear();
        }
        f = Insert(0, c.items, c.priorities, 0, 0, RandomTimeout(), c.refs, c.chunks);
        op = kInsert;
        break;
      }
      case 1:
        f = Sample(0, static_cast<uint32_t>(Uniform(1, 8)), RandomTimeout());
        op = kSample;
        break;
      case 2: {
        const auto keys = SomeKeys(Uniform(1, 4));
        f = Update(0, keys, std::vector<double>(keys.size(), 2.0));
        op = kUpdatePriorities;
        break;
      }
      case 3:
        f = Erase(0, SomeKeys(Uniform(1, 4)));
        op = kErase;
        break;
      default:
        f = RemoveToFit(0);
        op = kRemoveToFit;
        break;
    }
    Sent s;
    s.peer = "foreign";
    s.user_id = "actor:foreign";
    // A queue's SAMPLEs from a peer that may vanish while they wait: their replies then bounce, and the queue
    // must get the items back.
    if (queue_ && table == 1 && op == kSample && Chance(0.5)) s.peer = Transient();
    s.op = op;
    s.table = table;
    s.frames = ToTable(table, std::move(f));
    Send(std::move(s));
  }

  // A request for the slices table (index 2): an episode of 1..4 chunks of 1..5 steps (one raw field, the whole
  // chunk), sometimes with one byte of its record changed; a SAMPLE; an UPDATE of random window keys; a RESET; an
  // ERASE or REMOVE_TO_FIT (refused).
  void SlicesRequest() {
    Frames f;
    uint16_t op = 0;
    bool maybe_bad = false;
    switch (Uniform(0, 5)) {
      case 0:
      case 1: {
        const uint32_t k = static_cast<uint32_t>(Uniform(1, 4));
        std::vector<uint64_t> steps, columns, refs;
        std::vector<std::string> chunks;
        for (uint32_t c = 0; c < k; ++c) {
          steps.push_back(Uniform(1, 5));
          chunks.push_back(Bytes(steps.back() * 3));
          columns.insert(columns.end(), {0, chunks.back().size(), 0});
          refs.push_back(c);
        }
        std::string record = "APXE";
        const uint16_t version = 1, flags = 0;
        const uint32_t fields = 1;
        const uint64_t fingerprint = 0x5eed;
        record += std::string(reinterpret_cast<const char*>(&version), 2);
        record += std::string(reinterpret_cast<const char*>(&flags), 2);
        record += std::string(reinterpret_cast<const char*>(&k), 4);
        record += std::string(reinterpret_cast<const char*>(&fields), 4);
        record += std::string(reinterpret_cast<const char*>(&fingerprint), 8);
        record += Array(steps) + Array(columns);
        if (Chance(0.4)) {
          record[Uniform(0, record.size() - 1)] = static_cast<char>(rng_());
          maybe_bad = true;
        }
        f = Insert(0, {record}, {1.0}, 0, 0, 0, {refs}, chunks);
        op = kInsert;
        break;
      }
      case 2:
        f = Sample(0, static_cast<uint32_t>(Uniform(1, 8)), RandomTimeout());
        op = kSample;
        break;
      case 3: {
        std::vector<Key> keys;
        for (uint64_t i = Uniform(1, 4); i > 0; --i)
          keys.push_back((Uniform(0, 12) << kSliceStartBits) | Uniform(0, 6));
        f = Update(0, keys, std::vector<double>(keys.size(), 2.0));
        op = kUpdatePriorities;
        break;
      }
      case 4:
        f = {Header(kReset, 0, 0)};
        op = kReset;
        break;
      default:
        f = Chance(0.5) ? Erase(0, SomeKeys(Uniform(1, 3))) : RemoveToFit(0);
        std::memcpy(&op, f[0].data() + 6, 2);
        break;
    }
    Sent s;
    s.peer = "foreign";
    s.user_id = "actor:foreign";
    s.op = op;
    s.table = 2;
    s.maybe_bad = maybe_bad;
    s.frames = ToTable(2, std::move(f));
    Send(std::move(s));
  }

  // INSERTs of vanished peers that may be stored without the harness knowing their keys: retried by a
  // successor with the same identity and insert id (the exactly-once contract), which learns them.
  void RetryLimbo() {
    const std::vector<std::string> keys = order_;  // Send appends to order_
    for (const std::string& key : keys) {
      const Sent& s = sent_[key];
      if (s.op != kInsert || !gone_.count(s.peer) || s.bad_content || (s.session == 0 && s.sequence == 0)) continue;
      if (resolved_.count({s.user_id, s.session, s.sequence})) continue;
      if (retrying_.count({s.user_id, s.session, s.sequence})) continue;
      retrying_.insert({s.user_id, s.session, s.sequence});
      Sent r;
      r.peer = Transient();
      r.user_id = s.user_id;
      r.op = kInsert;
      r.session = s.session;
      r.sequence = s.sequence;
      r.frames = s.frames;
      std::memset(r.frames[0].data() + 32, 0, 4);  // timeout_ms 0: TIMEOUT at once if still held back
      Send(std::move(r));
    }
    retrying_.clear();
  }

  size_t Limbo() {
    size_t n = 0;
    for (const std::string& key : order_) {
      const Sent& s = sent_[key];
      if (s.op != kInsert || !gone_.count(s.peer) || s.bad_content) continue;
      if (s.session == 0 && s.sequence == 0) continue;  // transients always send ids
      if (!resolved_.count({s.user_id, s.session, s.sequence})) n += InsertCount(s.frames);
    }
    return n;
  }
  static size_t InsertCount(const Frames& f) {
    uint32_t n = 0;
    std::memcpy(&n, f[0].data() + 20, 4);
    return n;
  }

  // ------------------------------------------------------------------------------------------- settling

  // Waits until the loop is idle: nothing left to read, nothing with the workers or Python, and two trips
  // round its poll with nothing read or sent.
  void Settle() {
    FakeZmq& z = FakeZmq::Get();
    const double end = Now() + 60;
    while (true) {
      const uint64_t e0 = z.events();
      CHECK(z.WaitPolls(2, 30), "the loop stopped polling");
      if (z.inbox_empty() && z.events() == e0 && live_->Stat("requests_in_service") == 0) break;
      CHECK(Now() < end, "the loop did not settle in 60 s");
    }
    Collect();
  }

  void Collect() {
    for (SentReply& r : FakeZmq::Get().TakeSent()) Receive(std::move(r));
  }

  void Receive(SentReply r) {
    ReplyHeader h;
    if (!r.frames.empty()) h = ParseHeader(r.frames[0]);
    if (r.bounced) {
      CHECK(gone_.count(r.peer), "a reply bounced off " + r.peer + ", which never left");
      if (r.frames.empty()) return;  // refused at its routing id: which request is unknown
    }
    auto it = sent_.find(SentKey(r.peer, h.rid));
    if (it == sent_.end() && r.peer == "mutant") {  // a mutant whose header was broken: its echo is 0
      for (auto& [key, s] : sent_) {
        if (s.peer == "mutant" && !s.answered) it = sent_.find(key);
      }
    }
    CHECK(it != sent_.end(), "a reply to " + r.peer + " answers no request (request id " + std::to_string(h.rid) +
                                 ", status " + std::to_string(h.status) + ": " +
                                 (r.frames.size() > 1 ? r.frames[1] : std::string()) + ")");
    Sent& s = it->second;
    CHECK(!s.answered, "request " + std::to_string(s.rid) + " of " + s.peer + " answered twice");
    s.answered = true;
    s.status = h.status;
    CHECK(h.status != kInternal, "INTERNAL: " + (r.frames.size() > 1 ? r.frames[1] : std::string()));
    const std::string message = h.status != kOk && r.frames.size() > 1 ? r.frames[1] : std::string();
    if (s.bad_content) {
      CHECK(h.status == kInvalidArgument, "an invalid INSERT got status " + std::to_string(h.status) + ": " + message);
      CHECK(message.find("INSERT refused, nothing stored: ") == 0, message);
    } else if (!s.mutant && s.table != 0) {
      CHECK(h.op == s.op, "op " + std::to_string(h.op) + " answers op " + std::to_string(s.op));
      if (s.table == 2 && slices_table_) {
        if (s.op == kErase || s.op == kRemoveToFit) {
          CHECK(h.status == kInvalidArgument && message.find("this is a slices table") != std::string::npos,
                "a slices table's " + std::string(OpName(s.op)) + " got status " + std::to_string(h.status));
        } else if (s.maybe_bad && h.status == kInvalidArgument) {
          CHECK(message.find("INSERT refused, nothing stored: ") == 0, message);
        } else {
          CHECK(h.status == kOk || h.status == kTimeout || h.status == kShuttingDown,
                "a valid " + std::string(OpName(s.op)) + " of the slices table got status " + std::to_string(h.status) +
                    ": " + message);
          CHECK(s.op == kSample || h.status != kTimeout, "a slices table's " + std::string(OpName(s.op)) + " waited");
        }
        return;
      }
      if (s.table == 1 && two_tables_) {
        CHECK(h.status == kOk || h.status == kTimeout || h.status == kShuttingDown,
              "a valid " + std::string(OpName(s.op)) + " of table 1 got status " + std::to_string(h.status) + ": " +
                  message);
        if (h.status == kOk && (s.op == kErase || s.op == kUpdatePriorities)) {
          // Table 0's keys (and random ones) on table 1: stale there, never one of its items.
          CHECK(h.count == 0, std::to_string(h.count) + " of table 0's keys were present in table 1");
        }
        if (h.status == kOk && s.op == kInsert && r.frames.size() == 3) {
          for (Key k : KeysOf(r.frames[1])) CHECK(!live_items_.count(k), "table 1 issued a key of table 0");
        }
        if (h.status == kOk && s.op == kSample && !r.bounced) queue_delivered_ += h.count;
      } else {
        CHECK(h.status == kInvalidArgument, "a request for table " + std::to_string(s.table) + " got status " +
                                                std::to_string(h.status) + ": " + message);
        CHECK(message.find("unknown table index " + std::to_string(s.table)) != std::string::npos, message);
      }
      return;  // table 0 is untouched: the model stays as it is
    } else if (!s.mutant) {
      CHECK(h.op == s.op, "op " + std::to_string(h.op) + " answers op " + std::to_string(s.op));
      CHECK(h.status == kOk || h.status == kTimeout || h.status == kShuttingDown,
            "a valid " + std::string(OpName(s.op)) + " got status " + std::to_string(h.status) + ": " + message);
    }
    if (s.mutant && s.table != 0) {  // a mutant for another table: never served by table 0
      CHECK(h.status != kOk || (s.table == 1 && two_tables_) || (s.table == 2 && slices_table_),
            "a mutant for a table the server lacks was served");
      if (h.status == kOk && h.op == kSample && !r.bounced && s.table == 1) queue_delivered_ += h.count;
      return;
    }
    if (h.status == kOk && !r.bounced) Served(s, h, r.frames);
    if (h.status == kOk && r.bounced && s.op == kInsert) {
      // Stored, its keys unknown here: its insert id stays in limbo until a retry tells them.
    }
  }

  void Served(Sent& s, const ReplyHeader& h, const Frames& f) {
    switch (h.op) {
      case kInsert: {
        CHECK(f.size() == 3, "an INSERT reply has " + std::to_string(f.size()) + " frames");
        Request q;
        Message m;
        std::vector<FrameView> views;
        for (const auto& x : s.frames) views.push_back({reinterpret_cast<const uint8_t*>(x.data()), x.size()});
        m.frames = views.data();
        m.kept = m.count = views.size();
        for (const auto& x : s.frames) m.total_bytes += x.size();
        CHECK(Decode(m, 0, &q).ok(), "an INSERT that does not decode was stored");
        const std::vector<Key> keys = KeysOf(f[1]);
        CHECK(keys.size() == h.count, "count and keys differ");
        size_t fresh = 0;
        for (Key k : keys) fresh += acked_.count(k) == 0;
        if (s.session != 0 || s.sequence != 0) resolved_.insert({s.user_id, s.session, s.sequence});
        if (fresh == 0) break;  // a repeated insert id: nothing stored
        CHECK(fresh == keys.size(), "an INSERT reply mixes known and new keys");
        CHECK(keys.size() == q.count,
              "an INSERT of " + std::to_string(q.count) + " got " + std::to_string(keys.size()) + " keys");
        CHECK(KeysOf(f[2]).size() == q.num_chunks, "an INSERT's chunk keys differ from its chunks in number");
        std::vector<uint64_t> chunk_ids;
        for (uint64_t c = 0; c < q.num_chunks; ++c) {
          const uint64_t at = LoadU64(q.chunk_offsets, c);
          const uint64_t id = ++chunk_id_;
          model_chunks_[id] = ModelChunk{
              std::string(reinterpret_cast<const char*>(q.chunk_data) + at, LoadU64(q.chunk_offsets, c + 1) - at), 0};
          chunk_ids.push_back(id);
        }
        for (uint64_t i = 0; i < q.count; ++i) {
          ModelItem item;
          const uint64_t at = LoadU64(q.offsets, i);
          item.data.assign(reinterpret_cast<const char*>(q.data) + at, LoadU64(q.offsets, i + 1) - at);
          item.priority = LoadF64(q.priorities, i);
          if (q.num_chunks > 0) {
            for (uint64_t j = LoadU64(q.item_chunk_offsets, i); j < LoadU64(q.item_chunk_offsets, i + 1); ++j) {
              const uint64_t c = LoadU64(q.item_chunks, j);
              CHECK(c < q.num_chunks, "a stored item references chunk " + std::to_string(c));
              item.chunks.push_back(chunk_ids[c]);
              ++model_chunks_[chunk_ids[c]].refs;
            }
          }
          acked_.insert(keys[i]);
          live_items_[keys[i]] = std::move(item);
          ++inserted_since_reset_;
        }
        for (uint64_t id : chunk_ids) {
          if (model_chunks_[id].refs == 0) model_chunks_.erase(id);
        }
        break;
      }
      case kSample:
        CheckSample(h, f);
        break;
      case kReset:
        for (auto it = live_items_.begin(); it != live_items_.end();) Drop(it++);
        inserted_since_reset_ = 0;
        break;
      case kUpdatePriorities: {
        const Request q = DecodeSent(s);
        std::set<Key> seen;
        bool repeated = false;
        uint64_t present = 0;
        for (uint64_t i = 0; i < q.count; ++i) {
          const Key k = LoadU64(q.keys, i);
          repeated |= !seen.insert(k).second;
          auto it = live_items_.find(k);
          if (it == live_items_.end()) continue;
          ++present;
          it->second.priority = LoadF64(q.priorities, i);
        }
        // Exact unless a worker's ERASE or REMOVE_TO_FIT of this step may have run first (replies come in the
        // order they are sent, not the order the store saw the requests).
        if (!repeated && Limbo() == 0 && !EvictedSinceCheck() && removals_ == 0) {
          CHECK(h.count == present,
                "UPDATE_PRIORITIES found " + std::to_string(h.count) + " of " + std::to_string(present) + " live keys");
        }
        break;
      }
      case kErase: {
        const Request q = DecodeSent(s);
        std::set<Key> named;
        for (uint64_t i = 0; i < q.count; ++i) named.insert(LoadU64(q.keys, i));
        uint64_t present = 0;
        for (Key k : named) {
          auto it = live_items_.find(k);
          if (it == live_items_.end()) continue;
          ++present;
          Drop(it);
        }
        if (removals_ > 1) {  // another may have run first and taken keys the model gives to this one
          CHECK(h.count <= named.size(), "ERASE removed more than it named");
        } else if (EvictedSinceCheck()) {
          CHECK(h.count <= present + Limbo(), "ERASE removed more than were live");
        } else if (Limbo() == 0) {
          CHECK(h.count == present,
                "ERASE removed " + std::to_string(h.count) + ", " + std::to_string(present) + " were live");
        } else {
          CHECK(h.count >= present, "ERASE removed fewer than were live");
        }
        break;
      }
      default:
        break;
    }
  }

  // Whether the store evicted since the model was last reconciled (Check): counts may then fall short.
  bool EvictedSinceCheck() const { return live_->store->Stats().evicted != evicted_; }

  Request DecodeSent(const Sent& s) {
    static thread_local std::vector<FrameView> views;
    views.clear();
    uint64_t total = 0;
    for (const auto& x : s.frames) {
      views.push_back({reinterpret_cast<const uint8_t*>(x.data()), x.size()});
      total += x.size();
    }
    Request q;
    CHECK(Decode(Message{views.data(), views.size(), views.size(), total}, 0, &q).ok(), "served, but undecodable");
    return q;
  }

  void Drop(std::map<Key, ModelItem>::iterator it) {
    for (uint64_t c : it->second.chunks) {
      if (--model_chunks_[c].refs == 0) model_chunks_.erase(c);
    }
    dead_.insert(it->first);
    live_items_.erase(it);
  }

  // A SAMPLE reply's frames are consistent, and every sampled item (and its chunks) holds what was inserted.
  void CheckSample(const ReplyHeader& h, const Frames& f) {
    CHECK(f.size() == 12, "a SAMPLE reply has " + std::to_string(f.size()) + " frames");
    const uint64_t n = h.count;
    const auto keys = KeysOf(f[1]);
    CHECK(keys.size() == n && f[4].size() == 8 * (n + 1) && f[9].size() == 8 * (n + 1), "SAMPLE frame sizes");
    const auto offsets = KeysOf(f[4]), ref_offsets = KeysOf(f[9]), refs = KeysOf(f[8]), chunk_offsets = KeysOf(f[11]);
    CHECK(!chunk_offsets.empty() && chunk_offsets.back() == f[10].size(), "chunk_offsets");
    CHECK(offsets.back() == f[5].size() && ref_offsets.back() == refs.size(), "offsets");
    const bool limbo = Limbo() > 0;
    for (uint64_t i = 0; i < n; ++i) {
      auto it = live_items_.find(keys[i]);
      if (it == live_items_.end()) {
        // Sampled while its peer's INSERT was unresolved, or evicted / erased since (checked by the probe).
        CHECK(limbo || dead_.count(keys[i]),
              "SAMPLE returned key " + std::to_string(keys[i]) + ", which was never acknowledged");
        continue;
      }
      CHECK(offsets[i] <= offsets[i + 1] && offsets[i + 1] <= f[5].size(), "sample offsets");
      CHECK(f[5].compare(offsets[i], offsets[i + 1] - offsets[i], it->second.data) == 0,
            "a sampled item's bytes differ from those inserted");
      CHECK(ref_offsets[i + 1] - ref_offsets[i] == it->second.chunks.size(), "a sampled item's chunk count");
      for (uint64_t j = 0; j < it->second.chunks.size(); ++j) {
        const uint64_t c = refs[ref_offsets[i] + j];
        CHECK(c + 1 < chunk_offsets.size(), "a sampled item's chunk reference is out of range");
        CHECK(f[10].compare(chunk_offsets[c], chunk_offsets[c + 1] - chunk_offsets[c],
                            model_chunks_[it->second.chunks[j]].data) == 0,
              "a sampled chunk's bytes differ from those inserted");
      }
    }
  }

  // ------------------------------------------------------------------------------------------- checking

  void Check() {
    const double now = Now();
    for (const auto& [key, s] : sent_) {
      if (s.answered || gone_.count(s.peer)) continue;
      CHECK(now < s.deadline, "request " + std::to_string(s.rid) + " (" + OpName(s.op) + ") of " + s.peer +
                                  " is unanswered past its deadline");
      CHECK(!s.bad_content, "an invalid INSERT waits instead of being refused");
    }
    // Probe every acknowledged key: present, unless eviction took it.
    const StoreStats st = live_->store->Stats();
    uint64_t vanished = 0;
    for (auto it = live_items_.begin(); it != live_items_.end();) {
      const Key k = it->first;
      const double p = it->second.priority;
      if (live_->store->UpdatePriorities(&k, &p, 1) == 1) {
        ++it;
        continue;
      }
      ++vanished;
      auto gone = it++;
      Drop(gone);
    }
    // Evictions not yet matched to an acknowledged item (a vanished peer's item may be evicted before a retry
    // tells its key) stay in the budget.
    evict_budget_ += st.evicted - evicted_;
    evicted_ = st.evicted;
    CHECK(vanished <= evict_budget_, std::to_string(vanished) + " acknowledged items are gone, " +
                                         std::to_string(evict_budget_) + " evictions unaccounted for");
    evict_budget_ -= vanished;
    uint64_t bytes = 0, chunk_bytes = 0;
    for (const auto& [k, item] : live_items_) bytes += item.data.size();
    for (const auto& [c, chunk] : model_chunks_) chunk_bytes += chunk.data.size();
    const size_t limbo = Limbo();
    if (limbo == 0) {
      CHECK(st.size == live_items_.size(),
            "store size " + std::to_string(st.size) + ", acknowledged and live " + std::to_string(live_items_.size()));
      CHECK(st.bytes_held == bytes + chunk_bytes,
            "bytes_held " + std::to_string(st.bytes_held) + ", model " + std::to_string(bytes + chunk_bytes));
      CHECK(st.chunks == model_chunks_.size() && st.chunk_bytes == chunk_bytes, "chunks");
    } else {
      CHECK(st.size >= live_items_.size() && st.size <= live_items_.size() + limbo, "store size with limbo");
      CHECK(st.bytes_held >= bytes + chunk_bytes, "bytes_held with limbo");
    }
    live_->store->Validate();
    if (queue_) {  // the loop is idle: every SAMPLE reply of the queue was sent or given back
      other_->Validate();
      CHECK(other_->Held() == 0, std::to_string(other_->Held()) + " queue items still held");
      // Every item a sample removed went out in a reply (mutants' requests may insert, erase or evict too).
      const StoreStats q = other_->Stats();
      CHECK(q.removed_by_sampling == queue_delivered_, "queue: " + std::to_string(q.removed_by_sampling) +
                                                           " items removed by sampling, " +
                                                           std::to_string(queue_delivered_) + " delivered");
      CHECK(q.size + q.removed_by_sampling + q.evicted + q.erased == q.inserted,
            "queue: " + std::to_string(q.inserted) + " inserted, " + std::to_string(q.size) + " held, " +
                std::to_string(q.removed_by_sampling + q.evicted + q.erased) + " removed");
    }
    if (disk_) DiskContents();  // every item of table 1 reads back from its log
    if (reset_step_ && limbo == 0) {
      // The reset's table counts what was inserted since, and nothing from before it.
      const double inserted = live_->Stat("table.default.rate_limiter_inserted_items");
      CHECK(inserted == static_cast<double>(inserted_since_reset_),
            "after RESET the rate limiter counts " + std::to_string(inserted) + " items inserted, the model " +
                std::to_string(inserted_since_reset_));
    }
  }

  // Table 1 on disk: key -> (insertion number, priority, bytes) of its items, each read back from the log.
  std::map<Key, std::tuple<uint64_t, double, std::string>> DiskContents() {
    std::map<Key, std::tuple<uint64_t, double, std::string>> out;
    for (const Shard::Contents& c : disk_->store()->Dump()) {
      for (size_t i = 0; i < c.keys.size(); ++i) {
        try {
          out[c.keys[i]] = {
              c.seqs[i], c.priorities[i],
              disk_->ReadItem(c.keys[i], reinterpret_cast<const uint8_t*>(c.items[i].data()), c.items[i].size())};
        } catch (const std::exception& e) {
          Fail(std::string("an item of the disk table does not read back: ") + e.what());
        }
      }
    }
    return out;
  }

  // The loop stopped: the disk table's log, reopened, holds what its store held.
  void Reopen() {
    g_action = "reopen the disk table";
    const auto before = DiskContents();
    CHECK(!disk_->failed(), disk_->failure());
    live_.reset();  // the loop's tables let go of it
    other_.reset();
    disk_.reset();  // synced and closed (its LOCK released)
    disk_ = std::make_shared<DiskTable>(disk_config_, disk_options_);
    CHECK(disk_->opened().log.reason.empty(), disk_->opened().log.reason);
    const auto after = DiskContents();
    CHECK(after.size() == before.size(), "the reopened log holds " + std::to_string(after.size()) +
                                             " items, the store " + std::to_string(before.size()));
    for (const auto& [key, item] : before) {
      auto it = after.find(key);
      CHECK(it != after.end(), "item " + std::to_string(key) + " is not in the reopened log");
      CHECK(it->second == item, "item " + std::to_string(key) + " differs in the reopened log");
    }
    disk_->store()->Validate();
    disk_.reset();
  }

  // Ends every wait: retries of the vanished peers' INSERTs (sampling in between, so the limiter admits them)
  // until every one is resolved.
  void Drain() {
    g_action = "drain";
    for (int round = 0; Limbo() > 0; ++round) {
      CHECK(round < 400, std::to_string(Limbo()) + " items of vanished peers still unresolved");
      RetryLimbo();
      if (config_.samples_per_insert > 0) Simple("steady-a", "actor:steady-a", Sample(0, 8), kSample);
      Settle();
      Check();
      if (Limbo() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // ids held past deadlines
    }
  }

  // -------------------------------------------------------------------------------------------- scripts

  // The first defect: a repeated insert id whose chunk frames reference a chunk that does not exist.
  void ScriptDuplicateIdWithBadChunk() {
    g_action = "script: repeated insert id, bad chunk reference";
    const InsertContent c{{"x", "yy"}, {1, 1}, {{0}, {0, 1}}, {std::string(64, 'a'), std::string(64, 'b')}};
    SendInsert("steady-a", "actor:steady-a", c, false, SessionOf("actor:steady-a"), ++next_seq_["actor:steady-a"], 0);
    seqs_["actor:steady-a"].push_back(next_seq_["actor:steady-a"]);
    Settle();
    Check();
    for (uint64_t bad : {uint64_t{1} << 40, uint64_t{2}, ~uint64_t{0}}) {
      InsertContent b = c;
      b.refs[1].back() = bad;
      SendInsert("steady-a", "actor:steady-a", b, true, SessionOf("actor:steady-a"), next_seq_["actor:steady-a"], 0);
      Settle();
      Check();
    }
  }

  // The second defect: an invalid chunk reference under the rate limiter, with and without a timeout.
  void ScriptBadChunkUnderRateLimiter() {
    g_action = "script: bad chunk reference under the rate limiter";
    const InsertContent five{std::vector<std::string>(5, "i"), std::vector<double>(5, 1), {}, {}};
    for (int k = 0; k < 7; ++k) SendInsert("steady-a", "actor:steady-a", five, false, 0, 0, 0);  // the limiter fills
    Settle();
    Check();
    for (uint32_t timeout_ms : {0u, 1000u}) {
      const InsertContent b{{"a", "b"}, {1, 1}, {{0, 1}, {2}}, {"c0", "c1"}};
      SendInsert("steady-a", "actor:steady-a", b, true, 0, 0, timeout_ms);
      Settle();
      Check();
    }
  }

  std::mt19937_64 rng_;
  int script_;
  StoreConfig store_config_;
  LoopConfig config_;
  std::unique_ptr<LiveLoop> live_;
  uint64_t rid_ = 0;
  std::map<std::string, Sent> sent_;
  std::vector<std::string> order_;
  std::set<std::string> gone_;
  uint64_t transient_ = 0;
  std::map<std::string, uint64_t> sessions_, next_seq_;
  std::map<std::string, std::vector<uint64_t>> seqs_;
  std::map<std::tuple<std::string, uint64_t, uint64_t>, std::vector<InsertContent>> ids_;
  std::set<std::tuple<std::string, uint64_t, uint64_t>> resolved_, retrying_;
  std::map<Key, ModelItem> live_items_;
  std::map<uint64_t, ModelChunk> model_chunks_;
  std::set<Key> acked_, dead_;
  uint64_t chunk_id_ = 0;
  uint64_t evicted_ = 0;
  uint64_t evict_budget_ = 0;
  bool composing_ = false;
  bool two_tables_ = false;    // a second table beside the modelled one
  bool slices_table_ = false;  // and a third, a slices table (two-table episodes only)
  std::shared_ptr<SliceTable> slices_;
  // Table 1 as a queue: the items its SAMPLE replies delivered (not bounced). Whatever its consumers do, the
  // items sampling removed are exactly those, and nothing stays held once the loop is idle.
  bool queue_ = false;
  std::shared_ptr<ShardedStore> other_;
  uint64_t queue_delivered_ = 0;
  // Table 1 on disk (its store is other_), and where its log is.
  std::shared_ptr<DiskTable> disk_;
  std::string disk_dir_;
  DiskTableOptions disk_options_;
  StoreConfig disk_config_;
  bool reset_step_ = false;            // this step reset table 0
  uint64_t inserted_since_reset_ = 0;  // items of table 0 acknowledged since its last RESET (or ever)
  uint64_t removals_ = 0;              // ERASE and REMOVE_TO_FIT requests sent in this step
};

}  // namespace

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 10.0;
  g_seed = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1;
  const uint64_t first = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 0;
  const double end = Now() + seconds;
  uint64_t requests = 0;
  // The seed corpus (the two defects) first, then random episodes until the time is up. From episode
  // FIRST on: at least that one (a failure's replay).
  for (g_episode = first; g_episode == first || g_episode < 2 || Now() < end; ++g_episode) {
    Fuzz fuzz(g_seed * 1000003 + g_episode, g_episode < 2 ? static_cast<int>(g_episode) + 1 : 0);
    fuzz.Run(g_episode < 2 ? 40 : 150);
    requests += fuzz.requests();
  }
  std::printf("loop_fuzz: %" PRIu64 " episodes, %" PRIu64 " requests (%" PRIu64
              " episodes stored by slices tables), every check held\n",
              g_episode - first, requests, g_episodes_stored);
  return 0;
}

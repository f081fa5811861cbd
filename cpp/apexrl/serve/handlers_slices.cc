// The data ops of a slices table (Handlers with a SliceTable, no store): an INSERT stores one episode from its
// step chunks and episode record (episode_record.h); a SAMPLE draws windows and replies with the frames of a
// SAMPLE reply (one window item per window, slices/window_item.h, referencing the chunks that hold its steps and
// carrying their column places, so a client decodes it as the in-process table does); UPDATE_PRIORITIES addresses
// windows by key; RESET clears the table. ERASE and REMOVE_TO_FIT have no meaning for windows and are refused.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "apexrl/errors.h"
#include "apexrl/serve/episode_record.h"
#include "apexrl/serve/handlers.h"
#include "apexrl/slices/window_item.h"

namespace apexrl::serve {

std::optional<std::string> Handlers::EpisodeProblem(const Request& q) {
  if (q.count != 1) {
    return "a slices table takes one episode per INSERT (count 1: its episode record), got " + std::to_string(q.count);
  }
  if (q.num_refs != q.num_chunks) {
    return "the episode record must reference every chunk of its request once, in step order (0.." +
           std::to_string(q.num_chunks) + " - 1), it references " + std::to_string(q.num_refs);
  }
  for (uint64_t j = 0; j < q.num_refs; ++j) {
    if (LoadU64(q.item_chunks, j) != j) {
      return "the episode record's chunk reference " + std::to_string(j) + " is " +
             std::to_string(LoadU64(q.item_chunks, j)) +
             ": a slices table stores an episode with its own chunks, referenced 0..k-1 in step order (no chunk "
             "keys of earlier requests)";
    }
  }
  std::vector<uint64_t> sizes(q.num_chunks);
  for (uint64_t k = 0; k < q.num_chunks; ++k) sizes[k] = LoadU64(q.chunk_offsets, k + 1) - LoadU64(q.chunk_offsets, k);
  EpisodeRecord record;
  const uint64_t size = LoadU64(q.offsets, 1) - LoadU64(q.offsets, 0);
  if (auto why = ParseEpisodeRecord(q.data, size, sizes.data(), q.num_chunks, &record)) return why;
  const uint64_t capacity = slices_->config().capacity_steps;
  if (record.total_steps > capacity) {
    return "an episode of " + std::to_string(record.total_steps) + " steps does not fit in this table of " +
           std::to_string(capacity) + " steps";
  }
  return std::nullopt;
}

uint64_t Handlers::StoreEpisode(const Request& q, uint64_t* window_bytes) {
  std::vector<uint64_t> sizes(q.num_chunks);
  std::vector<const uint8_t*> data(q.num_chunks);
  uint64_t largest = 0, fewest = UINT64_MAX;
  for (uint64_t k = 0; k < q.num_chunks; ++k) {
    const uint64_t at = LoadU64(q.chunk_offsets, k);
    data[k] = q.chunk_data + at;
    sizes[k] = LoadU64(q.chunk_offsets, k + 1) - at;
    largest = std::max(largest, sizes[k]);
  }
  EpisodeRecord record;  // checked when the request arrived (EpisodeProblem): parsed again, not trusted blindly
  if (auto why = ParseEpisodeRecord(q.data, LoadU64(q.offsets, 1), sizes.data(), q.num_chunks, &record)) {
    throw InvalidArgument("INSERT refused, nothing stored: " + *why);
  }
  for (uint64_t s : record.steps) fewest = std::min(fewest, s);
  std::vector<double> priorities;
  if (!record.step_priorities.empty()) {
    priorities = std::move(record.step_priorities);
  } else if (!q.max_priority) {
    priorities.assign(record.total_steps, LoadF64(q.priorities, 0));
  }  // else none: the table's largest priority so far (SliceTable's rule)
  uint64_t number;
  try {  // what only the table knows: the field count of its episodes, the masses' limit
    number =
        slices_->Insert(record.fingerprint, data.data(), sizes.data(), record.steps.data(), q.num_chunks,
                        priorities.empty() ? nullptr : priorities.data(), record.columns.data(), record.num_fields);
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string("INSERT refused, nothing stored: ") + e.what());
  }
  // A window's share of a SAMPLE reply at most: its item (with each chunk's places), and the chunks its W steps
  // can span (each with its reference and offset), or the whole episode's if fewer.
  const uint64_t w = uint64_t{slices_->config().burn_in} + slices_->config().length;
  const uint64_t spans = std::min<uint64_t>(q.num_chunks, (w + fewest - 1) / fewest + 1);
  *window_bytes = 64 + WindowItemSize(spans, record.num_fields) + spans * (largest + 16);
  return number;
}

bool Handlers::ServeSlices(Call* c, bool can_wait, Reply* reply) {
  const Request& q = c->req;
  switch (q.op) {
    case kSample:
      return ServeSliceSample(c, can_wait, reply);
    case kUpdatePriorities: {
      std::vector<uint64_t> keys(q.count);
      std::vector<double> values(q.count);
      if (q.count != 0) {
        std::memcpy(keys.data(), q.keys, 8 * uint64_t{q.count});
        std::memcpy(values.data(), q.priorities, 8 * uint64_t{q.count});
      }
      *reply = CountReply(q.op, q.request_id, slices_->Update(keys.data(), keys.size(), values.data(), false));
      return true;
    }
    case kReset: {
      const size_t n = slices_->Clear();
      limiter_->Reset();
      resets_.fetch_add(1, std::memory_order_relaxed);
      *reply = CountReply(q.op, q.request_id, n);
      return true;
    }
    default:  // ERASE, REMOVE_TO_FIT
      *reply = ErrorReply(q.op, q.request_id, kInvalidArgument,
                          std::string(OpName(q.op)) +
                              " refused: this is a slices table (episodes sampled as windows), which evicts whole "
                              "episodes oldest first by itself and has no item keys to erase; RESET clears it");
      return true;
  }
}

bool Handlers::ServeSliceSample(Call* c, bool can_wait, Reply* reply) {
  const Request& q = c->req;
  SliceSample s;
  while (true) {  // the MinSize limiter counts windows
    const uint64_t windows = slices_->NumWindows();
    if (!limiter_->BigEnough(windows)) {
      if (can_wait) return false;
      *reply = ErrorReply(q.op, q.request_id, kTimeout,
                          "table holds " + std::to_string(windows) +
                              " windows, fewer than min_size_to_sample=" + std::to_string(limiter_->need()) +
                              ", after waiting " + std::to_string(q.timeout_ms) + " ms");
      return true;
    }
    if (!limiter_->TrySample(q.count, windows)) return RateLimited(c, can_wait, reply);
    try {
      slices_->Sample(q.count, q.beta, &s);
      break;
    } catch (const EmptyStore&) {  // a RESET between the count and the draw: wait or time out as on an empty table
      limiter_->Undo(0, q.count);
    } catch (...) {
      limiter_->Undo(0, q.count);
      throw;
    }
  }
  auto result = pool_->Take();
  const size_t n = s.keys.size();
  const uint64_t w = uint64_t{slices_->config().burn_in} + slices_->config().length;
  result->keys.assign(s.keys.begin(), s.keys.end());
  result->weights.assign(s.weights.begin(), s.weights.end());
  result->probabilities.assign(s.probabilities.begin(), s.probabilities.end());
  result->data.clear();
  result->offsets.assign(1, 0);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t refs = s.window_chunk_offsets[i + 1] - s.window_chunk_offsets[i];
    WriteWindowItem(s, i, w, result->data.Extend(WindowItemSize(refs, s.num_fields)));
    result->offsets.push_back(result->data.size());
  }
  result->total_mass = s.total_mass;
  result->min_mass = s.min_mass;
  result->size = s.windows;
  result->item_chunks.assign(s.window_chunks.begin(), s.window_chunks.end());
  result->item_chunk_offsets.assign(s.window_chunk_offsets.begin(), s.window_chunk_offsets.end());
  // The chunks' bytes where the table holds them (s.held keeps them alive until here), copied once.
  result->chunk_data.clear();
  result->chunk_offsets.assign(1, 0);
  for (size_t k = 0; k < s.chunk_bases.size(); ++k) {
    if (s.chunk_sizes[k] != 0)
      std::memcpy(result->chunk_data.Extend(s.chunk_sizes[k]), s.chunk_bases[k], s.chunk_sizes[k]);
    result->chunk_offsets.push_back(result->chunk_data.size());
  }
  result->held.clear();
  *reply = SampleReply(q.request_id, std::move(result));
  // The limiter's count goes back if the reply is not sent; no item is held (windows are drawn with replacement).
  reply->lease =
      std::make_unique<SampleLease>(store_, limiter_, &items_returned_, n, std::vector<Key>{}, std::vector<Key>{});
  return true;
}

}  // namespace apexrl::serve

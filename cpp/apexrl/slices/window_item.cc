#include "apexrl/slices/window_item.h"

#include <cstring>
#include <vector>

#include "apexrl/slices/slice_decode.h"

namespace apexrl {

namespace {

uint64_t Load(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

void Store(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

}  // namespace

void WriteWindowItem(const SliceSample& s, std::size_t i, uint64_t t, uint8_t* out) {
  const uint16_t version = kWindowItemVersion, flags = 0;
  const auto fields = static_cast<uint32_t>(s.num_fields);
  const auto refs = static_cast<uint32_t>(s.window_chunk_offsets[i + 1] - s.window_chunk_offsets[i]);
  std::memcpy(out, kWindowItemMagic, 4);
  std::memcpy(out + 4, &version, 2);
  std::memcpy(out + 6, &flags, 2);
  std::memcpy(out + 8, &fields, 4);
  std::memcpy(out + 12, &refs, 4);
  Store(out + 16, s.fingerprints[i]);
  Store(out + 24, s.first[i]);
  Store(out + 32, s.rows[i]);
  Store(out + 40, t);
  const uint64_t per_chunk = 3 * s.num_fields;
  uint8_t* at = out + kWindowItemHeader;
  for (uint64_t r = s.window_chunk_offsets[i]; r < s.window_chunk_offsets[i + 1]; ++r) {
    const uint64_t c = s.window_chunks[r];
    Store(at, s.chunk_steps[c]);
    std::memcpy(at + 8, s.columns.data() + c * per_chunk, 8 * per_chunk);
    at += 8 + 8 * per_chunk;
  }
}

std::size_t DecodeWindowItems(const WindowItemsReply& reply, uint64_t fingerprint, std::size_t num_fields,
                              const uint64_t* row_bytes, uint8_t* const* outs, std::size_t window, uint8_t* mask,
                              uint8_t* ok, uint64_t* rows) {
  const std::size_t n = reply.n;
  const uint64_t m = reply.num_chunks;
  const uint64_t per_chunk = 3 * uint64_t{num_fields};
  SliceSample s;
  s.num_fields = num_fields;
  s.rows.assign(n, 0);
  s.first.assign(n, 0);
  s.window_chunk_offsets.assign(1, 0);
  s.chunk_bases.assign(m, nullptr);
  s.chunk_sizes.assign(m, 0);
  s.chunk_steps.assign(m, 0);
  s.columns.assign(m * per_chunk, 0);
  // A chunk's state: 0 no window has placed it yet, 1 placed (its steps and columns set), 2 outside its frame.
  std::vector<uint8_t> state(m, 0);
  for (uint64_t c = 0; c < m; ++c) {
    const uint64_t lo = reply.chunk_offsets[c], hi = reply.chunk_offsets[c + 1];
    if (lo <= hi && hi <= reply.chunk_data_size) {
      s.chunk_bases[c] = reply.chunk_data + lo;
      s.chunk_sizes[c] = hi - lo;
    } else {
      state[c] = 2;
    }
  }
  std::vector<uint8_t> good(n, 0);
  std::vector<uint64_t> fresh;  // the chunks a window placed, taken back if it turns out bad
  auto parse = [&](std::size_t i) -> bool {
    const uint64_t lo = reply.offsets[i], hi = reply.offsets[i + 1];
    if (!(lo <= hi && hi <= reply.data_size) || hi - lo < kWindowItemHeader) return false;
    const uint8_t* p = reply.data + lo;
    uint16_t version, flags;
    uint32_t fields, refs;
    std::memcpy(&version, p + 4, 2);
    std::memcpy(&flags, p + 6, 2);
    std::memcpy(&fields, p + 8, 4);
    std::memcpy(&refs, p + 12, 4);
    const uint64_t first = Load(p + 24), steps = Load(p + 32), t = Load(p + 40);
    if (std::memcmp(p, kWindowItemMagic, 4) != 0 || version != kWindowItemVersion || flags != 0 ||
        fields != num_fields || Load(p + 16) != fingerprint || steps < 1 || steps > window || t != window) {
      return false;
    }
    const uint64_t rlo = reply.item_chunk_offsets[i], rhi = reply.item_chunk_offsets[i + 1];
    if (!(rlo <= rhi && rhi <= reply.num_item_chunks) || rhi - rlo != refs || refs < 1 ||
        hi - lo != WindowItemSize(refs, num_fields)) {
      return false;
    }
    uint64_t total = 0;
    const uint8_t* at = p + kWindowItemHeader;
    fresh.clear();
    bool fine = true;
    for (uint64_t r = rlo; r < rhi && fine; ++r, at += 8 + 8 * per_chunk) {
      const uint64_t c = reply.item_chunks[r], k = Load(at);
      if (c >= m || state[c] == 2 || k < 1 || k > kMaxEpisodeSteps) {
        fine = false;
      } else if (state[c] == 1) {
        fine = s.chunk_steps[c] == k && std::memcmp(s.columns.data() + c * per_chunk, at + 8, 8 * per_chunk) == 0;
      } else {
        state[c] = 1;
        fresh.push_back(c);
        s.chunk_steps[c] = k;
        std::memcpy(s.columns.data() + c * per_chunk, at + 8, 8 * per_chunk);
      }
      total += k;  // at most 2^32 refs of below 2^24 steps: no overflow
    }
    if (!fine || first > total || steps > total - first) {
      for (uint64_t c : fresh) state[c] = 0;
      return false;
    }
    s.first[i] = first;
    s.rows[i] = static_cast<uint32_t>(steps);
    s.window_chunks.insert(s.window_chunks.end(), reply.item_chunks + rlo, reply.item_chunks + rhi);
    return true;
  };
  for (std::size_t i = 0; i < n; ++i) {
    good[i] = parse(i) ? 1 : 0;
    s.window_chunk_offsets.push_back(s.window_chunks.size());
  }
  DecodeSlices(s, row_bytes, outs, window, mask, ok);  // a bad window has no rows: all zeros, mask 0
  std::size_t bad = 0;
  for (std::size_t i = 0; i < n; ++i) {
    ok[i] = ok[i] && good[i];
    rows[i] = ok[i] ? s.rows[i] : 0;
    bad += ok[i] ? 0 : 1;
  }
  return bad;
}

}  // namespace apexrl

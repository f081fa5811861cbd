#include "apexrl/serve/wire.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace apexrl::serve {
namespace {

struct RawHeader {
  uint16_t version, op;
  uint64_t request_id;
  uint16_t status, flags;
  uint32_t count;
  double param;
  uint32_t timeout_ms, table;
};

template <size_t kField, typename T>
void ReadField(const uint8_t* p, T* v) {
  static_assert(sizeof(T) == kHeaderFields[kField].size, "a header field's C++ type differs from its plan");
  std::memcpy(v, p + kHeaderFields[kField].offset, sizeof(T));
}

RawHeader ReadHeader(const uint8_t* p) {
  RawHeader h;
  ReadField<kFieldVersion>(p, &h.version);
  ReadField<kFieldOp>(p, &h.op);
  ReadField<kFieldRequestId>(p, &h.request_id);
  ReadField<kFieldStatus>(p, &h.status);
  ReadField<kFieldFlags>(p, &h.flags);
  ReadField<kFieldCount>(p, &h.count);
  ReadField<kFieldParam>(p, &h.param);
  ReadField<kFieldTimeoutMs>(p, &h.timeout_ms);
  ReadField<kFieldTable>(p, &h.table);
  return h;
}
static_assert(kHeaderFields[kNumHeaderFields - 1].offset + kHeaderFields[kNumHeaderFields - 1].size == kHeaderSize,
              "the header's fields fill kHeaderSize bytes");

using L = FramePlan;
constexpr FramePlan kInsertFrames[] = {
    {"priorities", "f64", L::kN, 0, "priorities"},
    {"offsets", "u64", L::kNPlus1, 0, "offsets:data"},
    {"data", "bytes", L::kUnsized, 0, nullptr},
    {"insert_id", "u64", L::kFixed, 2, nullptr},
    {"item_chunks", "u64", L::kAny, 0, nullptr},
    {"item_chunk_offsets", "u64", L::kNPlus1, 0, "offsets:item_chunks"},
    {"chunk_data", "bytes", L::kUnsized, 0, nullptr},
    {"chunk_offsets", "u64", L::kAny, 0, "offsets:chunk_data"},
};
constexpr FramePlan kUpdatePrioritiesFrames[] = {
    {"keys", "u64", L::kN, 0, nullptr},
    {"priorities", "f64", L::kN, 0, "priorities"},
};
constexpr FramePlan kEraseFrames[] = {{"keys", "u64", L::kN, 0, nullptr}};

template <size_t kN>
constexpr size_t Frames(const FramePlan (&)[kN]) {
  return kN + 1;
}

std::string Str(uint64_t v) { return std::to_string(v); }

Refusal Refuse(Status status, std::string message) {
  Refusal r;
  r.status = status;
  r.message = std::move(message);
  return r;
}

// frame `name` of `n` elements of 8 bytes (float64 or uint64)
bool FrameSizeOk(const FrameView& f, uint64_t n, const std::string& what, const char* name, const char* type,
                 Refusal* r) {
  if (f.size == n * 8) return true;
  *r = Refuse(kBadMessage, what + " frame " + name + " is " + Str(f.size) + " bytes, expected " + Str(n * 8) + " (" +
                               Str(n) + " x " + type + ")");
  return false;
}

// Every value finite and >= 0 (-0.0 included), as protocol._check_priorities.
bool PrioritiesOk(const uint8_t* p, uint64_t n, const std::string& what, Refusal* r) {
  for (uint64_t i = 0; i < n; ++i) {
    const double v = LoadF64(p, i);
    if (!(std::isfinite(v) && v >= 0.0)) {
      *r = Refuse(kInvalidArgument,
                  what + ": priorities[" + Str(i) + "] is " + FormatDouble(v) + ", priorities must be finite and >= 0");
      return false;
    }
  }
  return true;
}

// offsets start at 0, never decrease, end at the data frame's length (protocol._check_offsets' order).
bool OffsetsOk(const uint8_t* p, uint64_t n1, uint64_t data_len, const std::string& what, Refusal* r,
               const std::string& name = "offsets", const char* cut = "data") {
  if (n1 == 0) {
    *r = Refuse(kBadMessage, what + ": " + name + " has no entries, must hold at least one (" + name + "[0] = 0)");
    return false;
  }
  const uint64_t first = LoadU64(p, 0), last = LoadU64(p, n1 - 1);
  bool monotone = true;
  for (uint64_t i = 1; i < n1 && monotone; ++i) monotone = LoadU64(p, i) >= LoadU64(p, i - 1);
  if (first == 0 && last == data_len && monotone) return true;
  if (first != 0) {
    *r = Refuse(kBadMessage, what + ": " + name + "[0] is " + Str(first) + ", must be 0");
  } else if (!monotone) {
    uint64_t i = 1;
    while (LoadU64(p, i) >= LoadU64(p, i - 1)) ++i;
    *r = Refuse(kBadMessage, what + ": " + name + " must be non-decreasing, " + name + "[" + Str(i) + "]=" +
                                 Str(LoadU64(p, i)) + " < " + name + "[" + Str(i - 1) + "]=" + Str(LoadU64(p, i - 1)));
  } else {
    *r = Refuse(kBadMessage,
                what + ": " + name + "[-1] is " + Str(last) + ", must equal len(" + cut + ")=" + Str(data_len));
  }
  return false;
}

// An array frame of any length: a whole number of 8-byte elements.
bool WholeU64s(const FrameView& f, const std::string& what, const char* name, Refusal* r) {
  if (f.size % 8 == 0) return true;
  *r = Refuse(kBadMessage,
              what + " frame " + name + " is " + Str(f.size) + " bytes, not a whole number of 8-byte uint64 elements");
  return false;
}

// A frame's size against its plan: a whole number of elements ("any"), or exactly the elements its length
// says ("n", "n+1", fixed); a bytes frame has any size.
bool SizeOk(const FrameView& f, const FramePlan& p, uint64_t n, const std::string& what, Refusal* r) {
  const char* type = std::strcmp(p.type, "f64") == 0 ? "float64" : "uint64";
  switch (p.length) {
    case FramePlan::kN:
      return FrameSizeOk(f, n, what, p.name, type, r);
    case FramePlan::kNPlus1:
      return FrameSizeOk(f, n + 1, what, p.name, type, r);
    case FramePlan::kFixed:
      return FrameSizeOk(f, p.fixed, what, p.name, type, r);
    case FramePlan::kAny:
      return WholeU64s(f, what, p.name, r);
    case FramePlan::kUnsized:
      return true;
  }
  return true;
}

// Frame k's value rule (its plan's `rule`, already size-checked): "priorities" (every value finite and >= 0),
// or "offsets:NAME" (offsets start at 0, never decrease and end at the length of frame NAME: its bytes, or its
// elements for an array frame). An offsets frame holds n + 1 entries, or as many as it has ("any").
bool RuleOk(const Message& msg, const RequestPlan& plan, size_t k, uint64_t n, const std::string& what, Refusal* r) {
  const FramePlan& p = plan.frame[k - 1];
  const FrameView& f = msg.frames[k];
  if (std::strcmp(p.rule, "priorities") == 0) return PrioritiesOk(f.data, n, what, r);
  static constexpr char kOffsets[] = "offsets:";
  if (std::strncmp(p.rule, kOffsets, sizeof kOffsets - 1) == 0) {
    const char* cut = p.rule + sizeof kOffsets - 1;
    for (size_t c = 1; c < plan.frames; ++c) {
      const FramePlan& q = plan.frame[c - 1];
      if (std::strcmp(q.name, cut) != 0) continue;
      const uint64_t cut_len = q.length == FramePlan::kUnsized ? msg.frames[c].size : msg.frames[c].size / 8;
      const uint64_t entries = p.length == FramePlan::kNPlus1 ? n + 1 : f.size / 8;
      return OffsetsOk(f.data, entries, cut_len, what, r, p.name, q.name);
    }
  }
  *r = Refuse(kInternal, what + ": frame " + p.name + " has rule " + p.rule + ", which the decoder does not know");
  return false;
}

Refusal DecodeHeader(const FrameView& f, RawHeader* h) {
  if (f.size < 6 || std::memcmp(f.data, kMagic, 4) != 0) {
    return Refuse(kBadMessage, "header magic is " + HexBytes(f.data, f.size < 4 ? f.size : 4) + " (frame of " +
                                   Str(f.size) + " bytes), expected 41505852 (b'APXR')");
  }
  uint16_t version;
  std::memcpy(&version, f.data + kHeaderFields[kFieldVersion].offset, 2);
  if (version != kProtocolVersion) {
    return Refuse(kUnsupportedVersion, "protocol version " + Str(version) +
                                           " is not supported; supported versions: " + Str(kProtocolVersion));
  }
  if (f.size != kHeaderSize) {
    return Refuse(kBadMessage, "header frame is " + Str(f.size) + " bytes, expected " + Str(kHeaderSize));
  }
  *h = ReadHeader(f.data);
  if (h->flags != 0 && !(h->op == kInsert && h->flags == kFlagMaxPriority)) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%#06x", h->flags);
    return Refuse(kBadMessage,
                  std::string("header flags is ") + buf + (h->op == kInsert ? ", must be 0 or 0x0001" : ", must be 0"));
  }
  if (h->op < 1 || h->op > kMaxReplayOp) {
    return Refuse(kUnknownOp, "header op " + Str(h->op) + " is unknown; known ops: [1, 2, 3, 4, 5, 6, 7, 8, 9]");
  }
  if (h->status > kMaxStatus) {
    return Refuse(kBadMessage,
                  "header status " + Str(h->status) + " is unknown; known: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]");
  }
  if (h->table != 0 && !NamesTable(h->op)) {
    return Refuse(kBadMessage,
                  "header table is " + Str(h->table) + ", must be 0 (" + OpName(h->op) + " names no table)");
  }
  return Refusal{};
}

Refusal DecodeBody(const Message& msg, const RawHeader& h, Request* out) {
  const RequestPlan plan = PlanOf(h.op);
  const std::string what = std::string(OpName(h.op)) + " request";
  if (msg.count != plan.frames) {
    return Refuse(kBadMessage,
                  what + " must have " + Str(plan.frames) + " frames (header included), got " + Str(msg.count));
  }
  const uint64_t n = h.count;
  if (n != 0 && !plan.count_used) return Refuse(kBadMessage, what + " header count is " + Str(n) + ", must be 0");
  if (!plan.beta && h.param != 0.0) {
    return Refuse(kBadMessage, what + " header param is " + FormatDouble(h.param) + ", must be 0.0");
  }
  if (h.timeout_ms != 0 && !plan.timeout) {
    return Refuse(kBadMessage, what + " header timeout_ms is " + Str(h.timeout_ms) + ", must be 0");
  }
  if (plan.count_used) {
    if (n > kMaxBatch) return Refuse(kTooLarge, what + " count is " + Str(n) + ", exceeds MAX_BATCH=" + Str(kMaxBatch));
    if (n < plan.count_min) {
      return Refuse(kInvalidArgument, what + " count is " + Str(n) + ", must be >= " + Str(plan.count_min));
    }
  }
  if (plan.beta && !(std::isfinite(h.param) && h.param >= 0.0)) {
    return Refuse(kInvalidArgument,
                  what + " beta (header param) is " + FormatDouble(h.param) + ", must be finite and >= 0");
  }
  out->op = h.op;
  out->request_id = h.request_id;
  out->table = h.table;
  out->count = h.count;
  out->beta = plan.beta ? h.param : 0.0;
  out->timeout_ms = h.timeout_ms;
  out->max_priority = h.flags == kFlagMaxPriority;
  const FrameView* f = msg.frames;
  Refusal r;
  // Every frame against its plan, in wire order: its size, then its value rule (so the first broken rule is
  // the one Python's decoder names too). A rule names what it checks; the test of the plan against
  // schema.REQUESTS keeps every rule here one the schema declares, and RuleOk refuses one it does not know.
  for (size_t k = 1; k < plan.frames; ++k) {
    const FramePlan& p = plan.frame[k - 1];
    if (!SizeOk(f[k], p, n, what, &r)) return r;
    if (p.rule != nullptr && !RuleOk(msg, plan, k, n, what, &r)) return r;
  }
  switch (h.op) {
    case kInsert:
      out->priorities = f[1].data;
      out->offsets = f[2].data;
      out->data = f[3].data;
      out->data_size = f[3].size;
      out->insert_session = LoadU64(f[4].data, 0);
      out->insert_sequence = LoadU64(f[4].data, 1);
      out->item_chunks = f[5].data;
      out->num_refs = f[5].size / 8;
      out->item_chunk_offsets = f[6].data;
      out->chunk_data = f[7].data;
      out->chunk_data_size = f[7].size;
      out->chunk_offsets = f[8].data;
      out->num_chunks = f[8].size / 8 - 1;
      break;
    case kUpdatePriorities:
      out->keys = f[1].data;
      out->priorities = f[2].data;
      break;
    case kErase:
      out->keys = f[1].data;
      break;
    default:
      break;
  }
  return Refusal{};
}

}  // namespace

RequestPlan PlanOf(uint16_t op) {
  switch (op) {
    case kInsert:
      return {Frames(kInsertFrames), kInsertFrames, true, 0, false, true};
    case kSample:
      return {1, nullptr, true, 1, true, true};
    case kUpdatePriorities:
      return {Frames(kUpdatePrioritiesFrames), kUpdatePrioritiesFrames, true, 0, false, false};
    case kRemoveToFit:
    case kReset:
      return {1, nullptr, false, 0, false, false};
    case kErase:
      return {Frames(kEraseFrames), kEraseFrames, true, 0, false, false};
    default:
      return {};
  }
}

bool NamesTable(uint16_t op) {
  return op == kInsert || op == kSample || op == kUpdatePriorities || op == kRemoveToFit || op == kErase ||
         op == kReset || op == kHello;
}

bool ServedInPython(uint16_t op) { return op == kHello || op == kStats || op == kCheckpoint; }

const char* OpName(uint16_t op) {
  switch (op) {
    case kInsert:
      return "INSERT";
    case kSample:
      return "SAMPLE";
    case kUpdatePriorities:
      return "UPDATE_PRIORITIES";
    case kRemoveToFit:
      return "REMOVE_TO_FIT";
    case kStats:
      return "STATS";
    case kHello:
      return "HELLO";
    case kErase:
      return "ERASE";
    case kCheckpoint:
      return "CHECKPOINT";
    case kReset:
      return "RESET";
    default:
      return "UNKNOWN";
  }
}

Refusal Decode(const Message& msg, uint64_t max_bytes, Request* out) {
  Refusal r;
  RawHeader h{};
  if (msg.count == 0 || msg.kept == 0) {
    r = Refuse(kBadMessage, "message has no frames, expected at least the header");
  } else if (max_bytes != 0 && msg.total_bytes > max_bytes) {
    r = Refuse(kTooLarge, "message is " + Str(msg.total_bytes) + " bytes, exceeds max_bytes=" + Str(max_bytes));
  } else {
    r = DecodeHeader(msg.frames[0], &h);
    if (r.ok() && h.status != kOk) {
      r = Refuse(kBadMessage,
                 std::string(OpName(h.op)) + " request header status is " + Str(h.status) + ", must be OK (0)");
    }
    if (r.ok()) {
      if (ServedInPython(h.op)) {  // Python decodes the body
        out->op = h.op;
        out->request_id = h.request_id;
        out->table = h.table;  // HELLO: the table whose spec it declares (STATS, CHECKPOINT: 0, checked above)
        return r;
      }
      r = DecodeBody(msg, h, out);
    }
  }
  if (!r.ok() && msg.kept > 0) {  // echo op and request id when frame 0 starts like a header (schema.peek_ids)
    const FrameView& f0 = msg.frames[0];
    if (f0.size >= 16 && std::memcmp(f0.data, kMagic, 4) == 0) {
      std::memcpy(&r.op, f0.data + 6, 2);
      std::memcpy(&r.request_id, f0.data + 8, 8);
    }
  }
  return r;
}

std::string EncodeHeader(uint16_t op, uint64_t request_id, uint16_t status, uint32_t count) {
  std::string s(kHeaderSize, '\0');
  char* p = s.data();
  const uint16_t version = kProtocolVersion;
  std::memcpy(p, kMagic, 4);
  std::memcpy(p + 4, &version, 2);
  std::memcpy(p + 6, &op, 2);
  std::memcpy(p + 8, &request_id, 8);
  std::memcpy(p + 16, &status, 2);
  std::memcpy(p + 20, &count, 4);
  return s;  // flags, param, timeout_ms and table are 0
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[32];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  return std::string(buf, res.ptr);
}

std::string HexBytes(const uint8_t* p, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  s.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) s += {hex[p[i] >> 4], hex[p[i] & 15]};
  return s;
}

std::string ClipMessage(std::string message) {
  if (message.size() <= kMaxErrorMessage) return message;
  size_t cut = kMaxErrorMessage;
  while (cut > 0 && (static_cast<uint8_t>(message[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  message.resize(cut);
  return message;
}

}  // namespace apexrl::serve

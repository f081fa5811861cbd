// The replay service's wire protocol in C++: the 40-byte header, the statuses, the request decoder of the
// data ops and the reply encoders. The contract is python/apexrl/replay/wire/schema.py (docs/protocol.md prints it);
// tests/server/test_native_protocol.py holds these constants and the wire plan below to the schema, and this
// decoder to the Python decoder (same status, same echoed op and request id, same message) on valid and mutated
// messages.
#ifndef APEXRL_SERVE_WIRE_H_
#define APEXRL_SERVE_WIRE_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace apexrl::serve {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the wire is little-endian; so must the host be");

inline constexpr char kMagic[4] = {'A', 'P', 'X', 'R'};
inline constexpr uint16_t kProtocolVersion = 6;
inline constexpr size_t kHeaderSize = 40;
inline constexpr uint32_t kMaxBatch = 1u << 20;
inline constexpr size_t kMaxErrorMessage = 64 * 1024;

enum Op : uint16_t {
  kInsert = 1,
  kSample = 2,
  kUpdatePriorities = 3,
  kRemoveToFit = 4,
  kStats = 5,
  kHello = 6,
  kErase = 7,
  kCheckpoint = 8,
  kReset = 9,
};
inline constexpr uint16_t kMaxReplayOp = 9;  // the replay service answers ops 1..9
const char* OpName(uint16_t op);             // "INSERT", ...; "UNKNOWN" outside 1..9
// Whether the loop hands `op` to Python (HELLO, STATS, CHECKPOINT): it checks their header only, Python decodes
// the body and serves them.
bool ServedInPython(uint16_t op);

enum Status : uint16_t {
  kOk = 0,
  kBadMessage = 1,
  kUnsupportedVersion = 2,
  kUnknownOp = 3,
  kTooLarge = 4,
  kInvalidArgument = 5,
  kTimeout = 6,
  kShuttingDown = 7,
  kInternal = 8,
  kStaleChunks = 9,  // an INSERT referenced stored chunks that are gone (version 6); nothing stored
};
inline constexpr uint16_t kMaxStatus = 9;

// The header's fields in wire order: byte offset and size (schema.HEADER_FIELDS). The decoder reads the header
// through this table; tests/server/test_native_protocol.py holds it to the schema.
enum HeaderFieldIndex : size_t {
  kFieldMagic,
  kFieldVersion,
  kFieldOp,
  kFieldRequestId,
  kFieldStatus,
  kFieldFlags,
  kFieldCount,
  kFieldParam,
  kFieldTimeoutMs,
  kFieldTable,
  kNumHeaderFields,
};
struct HeaderFieldPlan {
  const char* name;
  size_t offset;
  size_t size;
};
inline constexpr HeaderFieldPlan kHeaderFields[kNumHeaderFields] = {
    {"magic", 0, 4},  {"version", 4, 2}, {"op", 6, 2},     {"request_id", 8, 8},  {"status", 16, 2},
    {"flags", 18, 2}, {"count", 20, 4},  {"param", 24, 8}, {"timeout_ms", 32, 4}, {"table", 36, 4},
};

// The wire plan of each data op's request (schema.REQUESTS): how it uses the header's count, param and
// timeout_ms, and its frames after the header. Decode checks every request against its op's plan (the frames'
// count, names, element types and lengths come from here); tests/server/test_native_protocol.py holds each
// plan to the schema, so a protocol change fails that test until both agree.
struct FramePlan {
  enum Length : uint8_t { kN, kNPlus1, kAny, kFixed, kUnsized };  // kUnsized: a bytes frame
  const char* name;
  const char* type;  // "u64", "f64" or "bytes"
  Length length;
  uint64_t fixed;    // the element count when length is kFixed
  const char* rule;  // the value rule the decoder applies (schema.FrameSpec.rule), or nullptr
};
struct RequestPlan {
  size_t frames = 0;                 // header included; 0: served in Python, which decodes it (ServedInPython)
  const FramePlan* frame = nullptr;  // frames - 1 of them, in wire order
  bool count_used = false;           // count is n (else must be 0)
  uint32_t count_min = 0;
  bool beta = false;     // param is beta (else must be 0.0)
  bool timeout = false;  // timeout_ms used (else must be 0)
};
RequestPlan PlanOf(uint16_t op);
// Whether `op`'s requests name a table in the header's `table` field (the data ops, RESET, and HELLO: the table
// whose item spec it declares); every other request must carry 0 there.
bool NamesTable(uint16_t op);

// The header's flags: 0 on every message, except this bit on an INSERT: each item gets the table's largest
// priority so far (its priorities frame is still sent, and checked, but not used).
inline constexpr uint16_t kFlagMaxPriority = 1;

struct FrameView {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

// A request as received: the frames kept (at most kMaxKeptFrames), how many it had, their total bytes.
inline constexpr size_t kMaxKeptFrames = 12;
struct Message {
  const FrameView* frames = nullptr;
  size_t kept = 0;
  size_t count = 0;
  uint64_t total_bytes = 0;
};

// A decoded request. Array pointers view the frames and may be unaligned: read them with Load*().
struct Request {
  uint16_t op = 0;
  uint64_t request_id = 0;
  uint32_t table = 0;  // the header's table index, not yet checked against the server's tables (the loop does)
  uint32_t count = 0;
  double beta = 0.0;
  uint32_t timeout_ms = 0;
  bool max_priority = false;            // INSERT with kFlagMaxPriority: priorities are the table's largest
  const uint8_t* priorities = nullptr;  // f64[count]: INSERT, UPDATE_PRIORITIES
  const uint8_t* offsets = nullptr;     // u64[count + 1]: INSERT
  const uint8_t* data = nullptr;        // INSERT items, concatenated
  uint64_t data_size = 0;
  const uint8_t* keys = nullptr;  // u64[count]: UPDATE_PRIORITIES, ERASE
  uint64_t insert_session = 0;    // INSERT insert_id; (0, 0): none
  uint64_t insert_sequence = 0;
  // INSERT frame chunks: item i references item_chunks[item_chunk_offsets[i] .. item_chunk_offsets[i + 1])
  // (u64 values, not yet range-checked: the store does), chunk c is chunk_data[chunk_offsets[c] ..
  // chunk_offsets[c + 1]).
  const uint8_t* item_chunks = nullptr;  // u64[num_refs]
  uint64_t num_refs = 0;
  const uint8_t* item_chunk_offsets = nullptr;  // u64[count + 1]
  const uint8_t* chunk_data = nullptr;
  uint64_t chunk_data_size = 0;
  const uint8_t* chunk_offsets = nullptr;  // u64[num_chunks + 1]
  uint64_t num_chunks = 0;
};

// Why a request was refused before it was served: the status, the message, and the op and request id to
// echo (those of frame 0 when its first 16 bytes are readable, else 0).
struct Refusal {
  Status status = kOk;
  std::string message;
  uint16_t op = 0;
  uint64_t request_id = 0;
  bool ok() const { return status == kOk; }
};

// Validates every header field and, for the ops the loop serves (INSERT, SAMPLE, UPDATE_PRIORITIES,
// REMOVE_TO_FIT, ERASE, RESET), every frame and value rule of the schema, in the Python decoder's order. HELLO,
// STATS and CHECKPOINT are checked up to their header only (their bodies are decoded in Python, which serves them).
// max_bytes caps the message's total size (0: none).
Refusal Decode(const Message& msg, uint64_t max_bytes, Request* out);

inline uint64_t LoadU64(const uint8_t* p, size_t i) {
  uint64_t v;
  __builtin_memcpy(&v, p + 8 * i, 8);
  return v;
}
inline double LoadF64(const uint8_t* p, size_t i) {
  double v;
  __builtin_memcpy(&v, p + 8 * i, 8);
  return v;
}

// Frame 0 of a reply (status OK unless given).
std::string EncodeHeader(uint16_t op, uint64_t request_id, uint16_t status, uint32_t count);

// A float in the fewest digits that read back as the same value ("1", "0.5", "1e+300", "nan", "-inf"), and
// bytes as lowercase hex ("41505852"), for error messages. Python's decoder writes the same values its own way
// (1.0 for 1): the differential test (tests/server/test_native_protocol.py) compares numbers by value.
std::string FormatDouble(double v);
std::string HexBytes(const uint8_t* p, size_t n);
// Cuts an error message to kMaxErrorMessage bytes at a UTF-8 character boundary.
std::string ClipMessage(std::string message);

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_WIRE_H_

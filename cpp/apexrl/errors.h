// Exception types of the core. The bindings map them to Python exceptions in one place
// (cpp/bindings/errors_bindings.cpp); every throwing call leaves the store unchanged.
#ifndef APEXRL_ERRORS_H_
#define APEXRL_ERRORS_H_

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace apexrl {

// Bad input from the caller: a NaN priority, a length mismatch, sampling an empty store... -> ValueError.
class InvalidArgument : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// Sampling a store that holds no items. An InvalidArgument for a direct caller; the serving loop catches it
// apart, since its store can empty between its size check and the sample (an ERASE on another worker).
class EmptyStore : public InvalidArgument {
 public:
  EmptyStore() : InvalidArgument("cannot sample from an empty store") {}
};

// An insert referenced stored chunks (by chunk key) that are gone: every item referencing them was removed, or
// the key is of another life of the store. Nothing was stored; `keys` lists the stale chunk keys (the sender
// still has the data and sends those chunks again) -> apexrl.StaleChunksError, a subclass of ValueError.
class StaleChunks : public InvalidArgument {
 public:
  explicit StaleChunks(std::vector<uint64_t> keys) : InvalidArgument(Message(keys)), keys_(std::move(keys)) {}
  const std::vector<uint64_t>& keys() const { return keys_; }

 private:
  static std::string Message(const std::vector<uint64_t>& keys) {
    std::string s = "stale chunks (stored earlier, now gone; send them again):";
    for (size_t i = 0; i < keys.size() && i < 64; ++i) s += " " + std::to_string(keys[i]);
    if (keys.size() > 64) s += " ... (" + std::to_string(keys.size()) + " in all)";
    return s;
  }
  std::vector<uint64_t> keys_;
};

// A snapshot file that is truncated, corrupted, of an unknown version or not a snapshot, or a snapshot that
// could not be written (disk full, I/O error, missing directory) -> SnapshotError.
class SnapshotError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The operating system refused a file operation (open, write, rename) -> OSError.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace apexrl

#endif  // APEXRL_ERRORS_H_

// ByteBuffer: a growable byte array that, unlike std::vector<uint8_t>, does not zero what it grows into
// (sampled item bytes are memcpy'd over it at once, so zeroing would double the writes).
#ifndef APEXRL_BYTE_BUFFER_H_
#define APEXRL_BYTE_BUFFER_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <utility>

namespace apexrl {

class ByteBuffer {
 public:
  ByteBuffer() = default;
  ByteBuffer(const ByteBuffer&) = delete;
  ByteBuffer& operator=(const ByteBuffer&) = delete;
  ByteBuffer(ByteBuffer&& o) noexcept { *this = std::move(o); }
  ByteBuffer& operator=(ByteBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    std::swap(capacity_, o.capacity_);
    return *this;
  }
  ~ByteBuffer() { std::free(data_); }

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  void clear() { size_ = 0; }

  void reserve(size_t n) {
    if (n <= capacity_) return;
    void* p = std::realloc(data_, n);
    if (p == nullptr) throw std::bad_alloc();
    data_ = static_cast<uint8_t*>(p);
    capacity_ = n;
  }
  // Grows by n uninitialised bytes and returns where they start.
  uint8_t* Extend(size_t n) {
    if (size_ + n > capacity_) reserve(std::max(size_ + n, capacity_ * 2));
    uint8_t* at = data_ + size_;
    size_ += n;
    return at;
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t capacity_ = 0;
};

}  // namespace apexrl

#endif  // APEXRL_BYTE_BUFFER_H_

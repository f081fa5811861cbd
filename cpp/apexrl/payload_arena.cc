#include "apexrl/payload_arena.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace apexrl {
namespace {

constexpr uint32_t kSmallStep = 16;
constexpr uint32_t kSmallLimit = 1024;                      // classes 0..63: 16, 32, ..., 1024
constexpr size_t kSmallClasses = kSmallLimit / kSmallStep;  // 64
constexpr int kStepsPerDoubling = 8;                        // 1024 < size <= 1 MiB: 10 doublings x 8
constexpr size_t kNumClasses = kSmallClasses + 10 * kStepsPerDoubling;
constexpr size_t kMinSlab = SlabReserve::kSlabBytes;  // a block above this gets a slab of its own

int Log2Floor(uint32_t v) { return 31 - __builtin_clz(v); }

}  // namespace

size_t PayloadArena::ClassOf(uint32_t size) {
  if (size <= kSmallLimit) return size == 0 ? 0 : (size - 1) / kSmallStep;
  // size in (2^k, 2^(k+1)] -> one of 8 equal steps of 2^k / 8.
  const uint32_t s = size - 1;
  const int k = Log2Floor(s);  // 10..19
  const uint32_t step = (s >> (k - 3)) & (kStepsPerDoubling - 1);
  return kSmallClasses + static_cast<size_t>(k - 10) * kStepsPerDoubling + step;
}

uint32_t PayloadArena::BlockSize(size_t size_class) {
  if (size_class < kSmallClasses) return static_cast<uint32_t>((size_class + 1) * kSmallStep);
  const size_t c = size_class - kSmallClasses;
  const int k = static_cast<int>(c / kStepsPerDoubling) + 10;
  const uint32_t step = static_cast<uint32_t>(c % kStepsPerDoubling);
  return (1u << k) + (step + 1) * (1u << (k - 3));
}

PayloadArena::~PayloadArena() {
  for (void* slab : slabs_) std::free(slab);
}

uint8_t* PayloadArena::Refill(size_t size_class) {
  const size_t block = BlockSize(size_class);
  const size_t slab_bytes = std::max(kMinSlab, block) / block * block;
  slabs_.reserve(slabs_.size() + 1);  // so push_back below cannot throw after the malloc
  void* slab = reserve_ != nullptr && slab_bytes <= SlabReserve::kSlabBytes ? reserve_->Take() : nullptr;
  if (slab != nullptr) {
    reserved_ += SlabReserve::kSlabBytes;  // the whole reserve slab is held, its tail past slab_bytes unused
  } else {
    slab = std::malloc(slab_bytes);
    if (slab == nullptr) throw std::bad_alloc();
    reserved_ += slab_bytes;
  }
  slabs_.push_back(slab);
  SizeClass& c = classes_[size_class];
  c.bump = static_cast<uint8_t*>(slab) + block;
  c.bump_end = static_cast<uint8_t*>(slab) + slab_bytes;
  return static_cast<uint8_t*>(slab);
}

uint8_t* PayloadArena::Allocate(uint32_t size) {
  if (size > kLargeItem) {
    void* p = std::malloc(size);
    if (p == nullptr) throw std::bad_alloc();
    reserved_ += size;
    return static_cast<uint8_t*>(p);
  }
  if (classes_.empty()) classes_.resize(kNumClasses);
  const size_t k = ClassOf(size);
  SizeClass& c = classes_[k];
  if (c.free_list != nullptr) {
    uint8_t* block = c.free_list;
    std::memcpy(&c.free_list, block, sizeof(uint8_t*));
    return block;
  }
  if (c.bump != c.bump_end) {
    uint8_t* block = c.bump;
    c.bump += BlockSize(k);
    return block;
  }
  return Refill(k);
}

void PayloadArena::Free(uint8_t* block, uint32_t size) {
  if (size > kLargeItem) {
    std::free(block);
    reserved_ -= size;
    return;
  }
  SizeClass& c = classes_[ClassOf(size)];
  std::memcpy(block, &c.free_list, sizeof(uint8_t*));
  c.free_list = block;
}

}  // namespace apexrl

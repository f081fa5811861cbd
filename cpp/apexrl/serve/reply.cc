#include "apexrl/serve/reply.h"

#include <algorithm>

namespace apexrl::serve {

FrameView Reply::Frame(size_t i) const {
  const auto [src, k] = layout[i];
  auto bytes = [](const auto& v) {
    return FrameView{reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(v[0])};
  };
  switch (src) {
    case kPart:
      return FrameView{reinterpret_cast<const uint8_t*>(parts[k].data()), parts[k].size()};
    case kSampleKeys:
      return bytes(sample->keys);
    case kWeights:
      return bytes(sample->weights);
    case kProbabilities:
      return bytes(sample->probabilities);
    case kOffsets:
      return bytes(sample->offsets);
    case kData:
      return FrameView{sample->data.data(), sample->data.size()};
    case kKeys:
      return bytes(keys);
    case kItemChunks:
      return bytes(sample->item_chunks);
    case kItemChunkOffsets:
      return bytes(sample->item_chunk_offsets);
    case kChunkData:
      return FrameView{sample->chunk_data.data(), sample->chunk_data.size()};
    case kChunkOffsets:
      return bytes(sample->chunk_offsets);
    case kChunkKeys:
      return bytes(chunk_keys);
  }
  return FrameView{};
}

uint64_t Reply::Bytes() const {
  uint64_t n = 0;
  for (size_t i = 0; i < layout.size(); ++i) n += Frame(i).size;
  return n;
}

Reply ErrorReply(uint16_t op, uint64_t rid, uint16_t status, const std::string& message) {
  Reply r;
  r.op = op;
  r.status = status;
  r.Add(EncodeHeader(op, rid, status, 0));
  r.Add(ClipMessage(message));
  return r;
}

Reply CountReply(uint16_t op, uint64_t rid, uint64_t count) {
  Reply r;
  r.op = op;
  r.Add(EncodeHeader(op, rid, kOk, static_cast<uint32_t>(std::min<uint64_t>(count, 0xFFFFFFFFu))));
  return r;
}

Reply LogRefusal(uint16_t op, uint64_t rid, const std::string& why) {
  return ErrorReply(op, rid, kInternal,
                    std::string(OpName(op)) + " refused, nothing changed: the table's log on disk: " + why);
}

Reply InsertReply(uint64_t rid, std::vector<Key> keys, std::vector<Key> chunk_keys) {
  Reply r;
  r.op = kInsert;
  r.Add(EncodeHeader(kInsert, rid, kOk, static_cast<uint32_t>(keys.size())));
  r.keys = std::move(keys);
  r.chunk_keys = std::move(chunk_keys);
  r.layout.emplace_back(Reply::kKeys, 0);
  r.layout.emplace_back(Reply::kChunkKeys, 0);
  return r;
}

void SampleLease::Keep() {
  if (settled_) return;
  settled_ = true;
  if (!held_.empty()) store_->Release(held_.data(), held_.size());
}

uint64_t SampleLease::GiveBack() {
  if (settled_) return 0;
  settled_ = true;
  limiter_->Undo(0, counted_);
  if (held_.empty() && drawn_.empty()) return 0;
  const uint64_t back = store_->GiveBack(held_.data(), held_.size(), drawn_.data(), drawn_.size());
  returned_->fetch_add(back, std::memory_order_relaxed);
  // Their pops were logged when the batch was drawn: back in the store, they are logged again (and synced).
  if (disk_ != nullptr && back != 0) disk_->Restored(held_.data(), held_.size());
  return back;
}

Reply SampleReply(uint64_t rid, std::unique_ptr<SampleResult> s) {
  Reply r;
  r.op = kSample;
  r.Add(EncodeHeader(kSample, rid, kOk, static_cast<uint32_t>(s->keys.size())));
  for (auto src : {Reply::kSampleKeys, Reply::kWeights, Reply::kProbabilities, Reply::kOffsets, Reply::kData}) {
    r.layout.emplace_back(src, 0);
  }
  const double totals[2] = {s->total_mass, s->min_mass};
  r.Add(std::string(reinterpret_cast<const char*>(totals), sizeof totals));
  const uint64_t size = s->size;
  r.Add(std::string(reinterpret_cast<const char*>(&size), sizeof size));
  for (auto src : {Reply::kItemChunks, Reply::kItemChunkOffsets, Reply::kChunkData, Reply::kChunkOffsets}) {
    r.layout.emplace_back(src, 0);
  }
  r.sample = std::move(s);
  return r;
}

std::unique_ptr<SampleResult> SamplePool::Take() {
  ScopedLock lock(mu_);
  if (free_.empty()) return std::make_unique<SampleResult>();
  auto r = std::move(free_.back());
  free_.pop_back();
  bytes_ -= Footprint(*r);
  return r;
}

void SamplePool::Give(std::unique_ptr<SampleResult> r) {
  const size_t b = Footprint(*r);
  ScopedLock lock(mu_);
  if (bytes_ + b > kMaxBytes) return;  // freed: a peer's large replies do not stay after it left
  bytes_ += b;
  free_.push_back(std::move(r));
}

size_t SamplePool::Footprint(const SampleResult& r) {
  return r.data.capacity() + r.keys.capacity() * sizeof(Key) + r.weights.capacity() * sizeof(float) +
         r.probabilities.capacity() * sizeof(double) + r.offsets.capacity() * sizeof(uint64_t) +
         r.chunk_data.capacity() +
         (r.item_chunks.capacity() + r.item_chunk_offsets.capacity() + r.chunk_offsets.capacity()) * sizeof(uint64_t);
}

void FreeFrame(void* /*data*/, void* hint) {
  auto* hold = static_cast<Hold*>(hint);
  if (hold->refs.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    hold->peer->fetch_sub(hold->bytes, std::memory_order_relaxed);
    hold->total->fetch_sub(hold->bytes, std::memory_order_relaxed);
    if (hold->reply.sample) hold->pool->Give(std::move(hold->reply.sample));
    delete hold;
  }
}

}  // namespace apexrl::serve

#include "apexrl/serve/rate_limiter.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "apexrl/errors.h"
#include "apexrl/serve/wire.h"

namespace apexrl::serve {
namespace {

constexpr double kEps = 1e-9;

std::string G(double v) {  // Python's format(v, "g")
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

}  // namespace

std::optional<std::string> DeadlockReason(double n, double m, double spi, double eb) {
  const double need = n + m * spi;
  if (need <= 2 * eb + kEps) return std::nullopt;
  std::string what;
  if (n != 0) what = "a sample of " + G(n);
  if (m != 0)
    what += std::string(what.empty() ? "" : " plus ") + "an insert of " + G(m) + " x samples_per_insert " + G(spi);
  return "rate limiter deadlock: " + what + " = " + G(need) + " exceeds 2 x error_buffer = " + G(2 * eb) + ", so " +
         (n != 0 && m != 0 ? "samples and inserts can both be blocked for good" : "it could never be admitted") +
         " (samples_per_insert=" + G(spi) + ", error_buffer=" + G(eb) + "); raise the error buffer to at least " +
         G(need / 2) + " or use smaller batches";
}

RateLimiter::RateLimiter(double spi, double eb, uint64_t min_size)
    : kind_(spi > 0 ? LimiterKind::kSampleToInsertRatio : LimiterKind::kMinSize),
      queue_size_(0),
      spi_(spi > 0 ? spi : 0.0),
      eb_(spi > 0 ? eb : 0.0),
      need_(std::max<uint64_t>(min_size, 1)) {}

namespace {

const LimiterConfig& Checked(const LimiterConfig& c) {
  switch (c.kind) {
    case LimiterKind::kQueue:
      if (c.queue_size == 0) throw InvalidArgument("a Queue rate limiter needs size >= 1");
      break;
    case LimiterKind::kSampleToInsertRatio:
      if (!(c.spi > 0) || !std::isfinite(c.spi)) {
        throw InvalidArgument("SampleToInsertRatio needs a finite samples_per_insert > 0, got " + G(c.spi));
      }
      if (!(c.eb >= 0) || !std::isfinite(c.eb)) {
        throw InvalidArgument("SampleToInsertRatio needs a finite error_buffer >= 0, got " + G(c.eb));
      }
      break;
    case LimiterKind::kMinSize:
      break;
  }
  return c;
}

}  // namespace

RateLimiter::RateLimiter(const LimiterConfig& config)
    : kind_(Checked(config).kind),
      queue_size_(config.kind == LimiterKind::kQueue ? config.queue_size : 0),
      spi_(config.kind == LimiterKind::kSampleToInsertRatio ? config.spi : 0.0),
      eb_(config.kind == LimiterKind::kSampleToInsertRatio ? config.eb : 0.0),
      // A queue's samples wait only while it is empty.
      need_(config.kind == LimiterKind::kQueue ? 1 : std::max<uint64_t>(config.min_size, 1)) {}

bool RateLimiter::InsertOk(uint64_t n, uint64_t size, uint64_t inserted, uint64_t sampled) const {
  if (kind_ == LimiterKind::kQueue) return n == 0 || size + n <= queue_size_;
  if (!limited() || n == 0 || size < need_) return true;
  return (static_cast<double>(inserted + n) - static_cast<double>(need_)) * spi_ - static_cast<double>(sampled) <=
         eb_ + kEps;
}

bool RateLimiter::SampleOk(uint64_t n, uint64_t size, uint64_t inserted, uint64_t sampled) const {
  if (size < need_) return false;
  return !limited() || static_cast<double>(sampled + n) <=
                           (static_cast<double>(inserted) - static_cast<double>(need_)) * spi_ + eb_ + kEps;
}

bool RateLimiter::TryInsert(uint64_t n, uint64_t size) {
  ScopedLock<Mutex> lock(mu_);
  if (!InsertOk(n, size, inserted_, sampled_)) return false;
  inserted_ += n;
  return true;
}

bool RateLimiter::TrySample(uint64_t n, uint64_t size) {
  ScopedLock<Mutex> lock(mu_);
  if (!SampleOk(n, size, inserted_, sampled_)) return false;
  sampled_ += n;
  return true;
}

void RateLimiter::Undo(uint64_t inserted, uint64_t sampled) {
  ScopedLock<Mutex> lock(mu_);
  // Not below 0: a SAMPLE admitted before a Reset may give its count back after it.
  inserted_ -= std::min(inserted_, inserted);
  sampled_ -= std::min(sampled_, sampled);
}

void RateLimiter::Reset() {
  ScopedLock<Mutex> lock(mu_);
  inserted_ = 0;
  sampled_ = 0;
}

std::optional<std::string> RateLimiter::NeverAdmitted(uint16_t op, uint64_t n, uint64_t size) const {
  if (kind_ == LimiterKind::kQueue) {
    if (op != kInsert || n <= queue_size_) return std::nullopt;
    return "a queue of size " + std::to_string(queue_size_) + " never holds " + std::to_string(n) +
           " items, so this insert could never be admitted (Queue(size=" + std::to_string(queue_size_) +
           ")); insert at most " + std::to_string(queue_size_) + " items per request";
  }
  if (!limited() || n == 0) return std::nullopt;
  uint64_t inserted, sampled;
  Counts(&inserted, &sampled);
  if (op == kInsert) {
    if (InsertOk(n, size, inserted, sampled)) return std::nullopt;
    return DeadlockReason(0, static_cast<double>(n), spi_, eb_);
  }
  if (!BigEnough(size) || SampleOk(n, size, inserted, sampled)) return std::nullopt;
  return DeadlockReason(static_cast<double>(n), 0, spi_, eb_);
}

void RateLimiter::CountWait(uint16_t op) {
  ScopedLock<Mutex> lock(mu_);
  (op == kInsert ? waits_insert_ : waits_sample_) += 1;
}

void RateLimiter::Counts(uint64_t* inserted, uint64_t* sampled) const {
  ScopedLock<Mutex> lock(mu_);
  *inserted = inserted_;
  *sampled = sampled_;
}

void RateLimiter::Waits(uint64_t* inserts, uint64_t* samples) const {
  ScopedLock<Mutex> lock(mu_);
  *inserts = waits_insert_;
  *samples = waits_sample_;
}

std::string RateLimiter::Describe() const {
  uint64_t inserted, sampled;
  Counts(&inserted, &sampled);
  if (kind_ == LimiterKind::kQueue) {
    return std::to_string(inserted) + " items inserted and " + std::to_string(sampled) +
           " sampled, Queue(size=" + std::to_string(queue_size_) + ")";
  }
  return std::to_string(inserted) + " items inserted and " + std::to_string(sampled) +
         " sampled, samples_per_insert=" + (limited() ? FormatDouble(spi_) : "None") +
         ", error_buffer=" + FormatDouble(eb_);
}

}  // namespace apexrl::serve

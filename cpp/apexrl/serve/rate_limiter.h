// The replay server's admission rules, one limiter per table, of one of three kinds (Reverb's):
//   * MinSize(m): a SAMPLE waits while the table holds fewer than m items; INSERTs are never limited;
//   * SampleToInsertRatio(spi, m, eb): below;
//   * Queue(size): an INSERT of n waits while the table would then hold more than `size` items (an INSERT of
//     more than `size` items can never be admitted and is refused), a SAMPLE waits while the table is empty.
//
// SampleToInsertRatio:
// With samples_per_insert (spi) set, the limiter counts the items inserted (I) and sampled (S) since the
// server started. As Reverb's limiter does, it measures the ratio from the minimum size on: with
// m = min_size_to_sample (at least 1), eb = error_buffer and the offset d = (I - m) * spi - S,
//   * a SAMPLE of n may be served when the store holds >= m items and S + n <= (I - m) * spi + eb
//     (d - n >= -eb);
//   * an INSERT of n may be served when the store holds fewer than m items (filling up is never limited),
//     or when (I + n - m) * spi - S <= eb (d + n * spi <= eb).
// So the m items of the fill-up give the learner no head start: at min size d = 0 and the learner may sample
// eb items ahead of the ratio, not m * spi + eb. Without spi only the minimum size applies (to SAMPLEs).
// Deadlock freedom: a SAMPLE of n is blocked iff d < n - eb and an INSERT of m' iff d > eb - m' * spi; both
// at once needs n + m' * spi > 2 * eb (DeadlockReason; the offset shifts d, not this bound). The run plan
// checks batches with the Python twin of DeadlockReason (apexrl.replay.server.rate_limiter.deadlock_reason);
// tests/server/test_rate_limiter.py holds the two to the same answers.
#ifndef APEXRL_SERVE_RATE_LIMITER_H_
#define APEXRL_SERVE_RATE_LIMITER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "apexrl/mutex.h"
#include "apexrl/thread_annotations.h"

namespace apexrl::serve {

enum class LimiterKind : uint8_t { kMinSize, kSampleToInsertRatio, kQueue };

// A limiter's configuration (a table's `rate_limiter`). spi/eb: SampleToInsertRatio only; min_size: MinSize and
// SampleToInsertRatio; queue_size: Queue only.
struct LimiterConfig {
  LimiterKind kind = LimiterKind::kMinSize;
  double spi = 0.0;
  double eb = 0.0;
  uint64_t min_size = 1;
  uint64_t queue_size = 0;
};

// None when SAMPLEs of n items and INSERTs of m items can always make progress together, else why not.
std::optional<std::string> DeadlockReason(double n, double m, double spi, double eb);

class RateLimiter {
 public:
  // spi <= 0: no ratio limit. min_size is raised to 1; it is also the offset of the ratio (see above).
  RateLimiter(double spi, double eb, uint64_t min_size);
  // Any kind; InvalidArgument for a Queue of size 0, a SampleToInsertRatio without a positive spi, or a negative
  // error buffer.
  explicit RateLimiter(const LimiterConfig& config);

  LimiterKind kind() const { return kind_; }
  bool limited() const { return spi_ > 0; }
  uint64_t queue_size() const { return queue_size_; }
  double spi() const { return spi_; }
  double eb() const { return eb_; }
  uint64_t need() const { return need_; }
  bool BigEnough(uint64_t size) const { return size >= need_; }
  // The size an INSERT is admitted against: a queue's bound counts `held` too (items a SAMPLE took whose reply
  // is not sent yet: they come back if it is not), the other kinds the items in the table.
  uint64_t InsertSize(uint64_t size, uint64_t held) const { return kind_ == LimiterKind::kQueue ? size + held : size; }

  // The two rules, for given counts (size: items in the store before the request).
  bool InsertOk(uint64_t n, uint64_t size, uint64_t inserted, uint64_t sampled) const;
  bool SampleOk(uint64_t n, uint64_t size, uint64_t inserted, uint64_t sampled) const;

  // Admit (and count) a request if its rule allows it now; Undo takes an admission back.
  bool TryInsert(uint64_t n, uint64_t size) EXCLUDES(mu_);
  bool TrySample(uint64_t n, uint64_t size) EXCLUDES(mu_);
  void Undo(uint64_t inserted, uint64_t sampled) EXCLUDES(mu_);
  // The table was emptied (RESET): the inserted and sampled counts start again from 0 (the waits counted stay).
  void Reset() EXCLUDES(mu_);

  // Why a request (op kInsert or kSample) of n items, not admitted now, could never be admitted; or none.
  std::optional<std::string> NeverAdmitted(uint16_t op, uint64_t n, uint64_t size) const EXCLUDES(mu_);

  void CountWait(uint16_t op) EXCLUDES(mu_);
  void Counts(uint64_t* inserted, uint64_t* sampled) const EXCLUDES(mu_);
  void Waits(uint64_t* inserts, uint64_t* samples) const EXCLUDES(mu_);
  std::string Describe() const EXCLUDES(mu_);

 private:
  const LimiterKind kind_;
  const uint64_t queue_size_;  // kQueue only
  const double spi_;
  const double eb_;
  const uint64_t need_;
  mutable Mutex mu_;
  uint64_t inserted_ GUARDED_BY(mu_) = 0;
  uint64_t sampled_ GUARDED_BY(mu_) = 0;
  uint64_t waits_insert_ GUARDED_BY(mu_) = 0;
  uint64_t waits_sample_ GUARDED_BY(mu_) = 0;
};

}  // namespace apexrl::serve

#endif  // APEXRL_SERVE_RATE_LIMITER_H_

"""The replay server's admission rules: the minimum size to sample and Reverb's SampleToInsertRatio.

With ``samples_per_insert`` (spi) set, the limiter counts the items inserted (I) and sampled (S) since the
server started (items, not calls). As Reverb's limiter does, it measures the ratio from the minimum size on:
with ``m = min_size_to_sample`` (at least 1) and ``eb = error_buffer``:

* a SAMPLE of n may be served when the store holds >= m items and ``S + n <= (I - m) * spi + eb``;
* an INSERT of n may be served when the store holds fewer than m items (filling up is never limited), or
  when ``(I + n - m) * spi - S <= eb``.

So the m items inserted while filling up give the learner no head start: at min size the learner may sample
``eb`` items ahead of the ratio, not ``m * spi + eb`` (without the offset, a run that starts learning at 50 000
items with spi 1.57 first sampled ~78 000 items with no insert to match, and its first metrics rows showed a
replay ratio far above the target). Without spi only the minimum size applies (to SAMPLEs). The server
applies these rules in its native serving loop (cpp/apexrl/serve/rate_limiter.h: admission checks and counts
under one lock, so concurrent workers never overshoot; waiting requests are released through the same
rules). What stays here is the deadlock arithmetic that ``apexrl run`` checks before it starts anything;
tests/server/test_rate_limiter.py holds it to the native copy (``apexrl._core.serve_deadlock_reason``) and the
native limiter to these rules.

Deadlock freedom: with the store at min size, let ``d = (I - m) * spi - S``. A SAMPLE of n is blocked iff
``d < n - eb``, an INSERT of k iff ``d > eb - k * spi``; both at once needs ``n + k * spi > 2 * eb``. The
offset shifts d, not this bound, so whenever every sample batch n and insert batch k satisfy
``n + k * spi <= 2 * eb``, at least one side can always proceed. Hence ``error_buffer >= max(1, spi)`` is
required (SampleToInsertRatio validates it; single-item calls on both sides can always move, the same rule as
Reverb) and larger batches need a proportionally larger buffer.
"""

from __future__ import annotations

__all__ = ["deadlock_reason"]

_EPS = 1e-9


def deadlock_reason(
    n: float,
    m: float,
    spi: float,
    eb: float,
    *,
    sample: str = "a sample",
    insert: str = "an insert",
    flag: str = "the error buffer",
) -> str | None:
    """None when SAMPLEs of n items and INSERTs of m items can always make progress together, else why not.

    With the store at min size and ``d = (I - min_size_to_sample) * spi - S``, a SAMPLE of n is blocked iff
    ``d < n - eb`` and an INSERT of m iff ``d > eb - m * spi``; both at once needs ``n + m * spi > 2 * eb`` (the
    offset moves d, not the bound). Written twice, here and in the native loop (``DeadlockReason``, held to
    this by the tests): ``apexrl run`` (:func:`apexrl.launch.plan.check_rules`) checks the learner's batch
    against the actors' inserts with it, and the server refuses a single request that could never be admitted
    (m or n 0).
    """
    need = n + m * spi
    if need <= 2 * eb + _EPS:
        return None
    parts = [f"{sample} of {n:g}" if n else "", f"{insert} of {m:g} x samples_per_insert {spi:g}" if m else ""]
    what = " plus ".join(p for p in parts if p)
    return (
        f"rate limiter deadlock: {what} = {need:g} exceeds 2 x error_buffer = {2 * eb:g}, so "
        f"{'samples and inserts can both be blocked for good' if n and m else 'it could never be admitted'}"
        f" (samples_per_insert={spi:g}, error_buffer={eb:g}); raise {flag} to at least {need / 2:g} or use "
        f"smaller batches"
    )

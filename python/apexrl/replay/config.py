"""Settings of the replay server, validated in one place (the CLI, the run plan and tests build the same class)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = ["ServerConfig"]


@dataclass
class ServerConfig:
    """Settings of a :class:`ReplayServer` (the CLI flags of ``apexrl-replay-server`` map 1:1)."""

    bind: str = "127.0.0.1"
    port: int = 0  # 0 = ephemeral; the real one is ReplayServer.endpoint
    capacity: int = 1_000_000
    alpha: float = 0.6
    eviction: str = "fifo"
    alpha_evict: float = -0.4
    shards: int = 8
    seed: int = 0
    min_size_to_sample: int = 1
    snapshot: str | os.PathLike[str] | None = None
    snapshot_every: float | None = None  # seconds; None = only on stop()
    max_message_mb: float = 256
    workers: int = 2
    inline_sample_max: int = 1024  # SAMPLEs of at most this many items are served by the receiving thread
    samples_per_insert: float | None = None  # None = no rate limiting (Reverb's SampleToInsertRatio)
    error_buffer: float | None = None  # None = max(1, samples_per_insert) * 100

    def validate(self) -> None:
        if self.samples_per_insert is None:
            if self.error_buffer is not None:
                raise ValueError("error_buffer needs samples_per_insert")
        else:
            spi = self.samples_per_insert
            if not (spi > 0 and math.isfinite(spi)):
                raise ValueError(f"samples_per_insert must be finite and > 0, got {spi}")
            eb = self.effective_error_buffer
            assert eb is not None
            if not (math.isfinite(eb) and eb >= max(1.0, spi)):
                raise ValueError(
                    f"error_buffer must be finite and >= max(1, samples_per_insert) = {max(1.0, spi)}, "
                    f"got {eb} (a smaller buffer could block both inserts and samples for good)"
                )
        if not 0 <= int(self.port) <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port}")
        if self.capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {self.capacity}")
        if self.min_size_to_sample < 0:
            raise ValueError(f"min_size_to_sample must be >= 0, got {self.min_size_to_sample}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.inline_sample_max < 0:
            raise ValueError(f"inline_sample_max must be >= 0, got {self.inline_sample_max}")
        if not (self.max_message_mb > 0 and math.isfinite(self.max_message_mb)):
            raise ValueError(f"max_message_mb must be > 0, got {self.max_message_mb}")
        if self.snapshot_every is not None:
            if not (self.snapshot_every > 0 and math.isfinite(self.snapshot_every)):
                raise ValueError(f"snapshot_every must be > 0 seconds, got {self.snapshot_every}")
            if self.snapshot is None:
                raise ValueError("snapshot_every needs a snapshot path")
        if self.eviction not in ("fifo", "prioritized"):
            raise ValueError(f"eviction must be 'fifo' or 'prioritized', got {self.eviction!r}")

    @property
    def effective_error_buffer(self) -> float | None:
        """error_buffer, or its default max(1, samples_per_insert) * 100; None without rate limiting."""
        if self.samples_per_insert is None:
            return None
        if self.error_buffer is None:
            return max(1.0, float(self.samples_per_insert)) * 100.0
        return float(self.error_buffer)

    @property
    def max_bytes(self) -> int:
        return int(self.max_message_mb * (1 << 20))

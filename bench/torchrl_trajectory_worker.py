"""TorchRL's side of bench_trajectory.py; run with an interpreter that imports torchrl (a venv with torch 2.13.0
and torchrl). Imports nothing from apexrl.

    PY torchrl_trajectory_worker.py --steps NPZ --length 121 --batch 32 --sample-rounds 20 [--total-steps N]

Loads the bench's steps, prints "ready", then runs one window per line read on stdin and prints one JSON line per
window. A window builds an in-process ``ReplayBuffer(storage=LazyTensorStorage(N), sampler=SliceSampler(
slice_len=length, traj_key="episode", strict_length=True), batch_size=batch * length)`` (no server: TorchRL's
buffer lives in the learner's process), extends it one episode at a time (a TensorDict of the episode's steps:
TorchRL's batched path, as a collector hands over its rollouts), ``--total-steps`` steps in all (the bench's
episodes cycled, each copy a new episode id), then samples ``sample_rounds`` batches and reshapes each to
(batch, length, ...). A SliceSampler has no items: a slice may start at any step, so the recurrent state is a
per-step column (2 x 512 float32 at every step, 4 KiB per step) and the sample carries it at every step; the
learner uses the first. Storage bytes are the storage tensors' sizes (no compression).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", required=True)
    p.add_argument("--length", type=int, default=121)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--sample-rounds", type=int, default=20)
    p.add_argument("--total-steps", type=int, default=0, help="0: the bench's steps once")
    args = p.parse_args()
    import torch
    import torchrl
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers.samplers import SliceSampler

    z = np.load(args.steps)
    episodes, episode_length = int(z["episodes"]), int(z["episode_length"])
    cols = {k: torch.from_numpy(np.ascontiguousarray(z[k])) for k in ("observation", "action", "reward", "discount")}
    eps = []
    for e in range(episodes):
        sl = slice(e * episode_length, (e + 1) * episode_length)
        eps.append({k: v[sl] for k, v in cols.items()})
    total = args.total_steps or episodes * episode_length
    n_eps = -(-total // episode_length)
    state = torch.zeros(episode_length, 512, dtype=torch.float32)
    print(f"ready torchrl {torchrl.__version__} torch {torch.__version__}", flush=True)
    for _line in sys.stdin:
        rb = ReplayBuffer(
            storage=LazyTensorStorage(n_eps * episode_length),
            sampler=SliceSampler(slice_len=args.length, traj_key="episode", strict_length=True),
            batch_size=args.batch * args.length,
        )
        t0 = time.perf_counter()
        for i in range(n_eps):
            ep = eps[i % episodes]
            td = TensorDict(
                {
                    **ep,
                    "h": state,
                    "c": state,
                    "episode": torch.full((episode_length,), i, dtype=torch.int64),
                },
                batch_size=[episode_length],
            )
            rb.extend(td)
        appended_s = time.perf_counter() - t0
        storage_bytes = sum(v.numel() * v.element_size() for v in rb.storage._storage.values(True, True))
        t1 = time.perf_counter()
        for _ in range(args.sample_rounds):
            s = rb.sample().reshape(args.batch, args.length)
            obs = s["observation"].numpy()
            assert obs.shape[:2] == (args.batch, args.length)
            _ = (s["action"].numpy(), s["reward"].numpy(), s["h"][:, 0].numpy(), s["c"][:, 0].numpy())
        sampled_s = time.perf_counter() - t1
        out = {
            "steps": n_eps * episode_length,
            "appended_s": appended_s,
            "sampled": args.sample_rounds * args.batch,
            "sampled_s": sampled_s,
            "storage_bytes": int(storage_bytes),
            "sample_shape": list(obs.shape),
        }
        del rb, s, td, obs
        gc.collect()  # the buffer holds reference cycles: without this the next window's storage comes on top
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()

"""TorchRL's side of ``bench_trajectory.py --slices``; run with an interpreter that imports torchrl (a venv with
torch 2.13.0 and torchrl). Imports nothing from apexrl.

    PY torchrl_slices_worker.py --steps NPZ --length 121 --batch 32 --sample-rounds 20 --sizes 1600 100000
        [--sampler uniform|prioritized]

Loads the bench's steps and builds one in-process ``ReplayBuffer`` per size, all held at once: a
``LazyTensorStorage`` of the size's steps (whole episodes: the bench's cycled, each copy a new ``episode`` id),
extended one episode at a time, the recurrent state a per-step column (2 x 512 float32 zeros at every step: a
slice may start at any step), sampled by ``SliceSampler(slice_len=length, traj_key="episode",
strict_length=True)`` or ``PrioritizedSliceSampler`` (the same, ``max_capacity`` the size's steps, alpha 0.6,
beta 0.4). Prints "ready" and one JSON line of the sizes' storage bytes (the storage tensors, uncompressed; a
prioritized sampler's sum and min trees come on top), then runs one window per line read on stdin: each size in
turn samples ``sample_rounds`` batches of ``batch`` slices, reshaped to (batch, length, ...) and read out as
numpy (the first step's state), one JSON line of seconds per size. ``PrioritizedSliceSampler`` keeps its
priorities in TorchRL's C++ sum and min trees (``torchrl._torchrl``): that extension must load with the torch in
use (it is built against one torch version), else the worker stops with TorchRL's own error.
"""

from __future__ import annotations

import argparse
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
    p.add_argument("--sizes", type=int, nargs="+", required=True)
    p.add_argument("--sampler", choices=("uniform", "prioritized"), default="uniform")
    args = p.parse_args()
    import torch
    import torchrl
    from tensordict import TensorDict
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler, SliceSampler

    z = np.load(args.steps)
    episodes, episode_length = int(z["episodes"]), int(z["episode_length"])
    cols = {k: torch.from_numpy(np.ascontiguousarray(z[k])) for k in ("observation", "action", "reward", "discount")}
    eps = [{k: v[e * episode_length : (e + 1) * episode_length] for k, v in cols.items()} for e in range(episodes)]
    state = torch.zeros(episode_length, 512, dtype=torch.float32)
    buffers, held = [], []
    for size in args.sizes:
        n_eps = -(-size // episode_length)
        common = {"slice_len": args.length, "traj_key": "episode", "strict_length": True}
        if args.sampler == "prioritized":
            sampler = PrioritizedSliceSampler(max_capacity=n_eps * episode_length, alpha=0.6, beta=0.4, **common)
        else:
            sampler = SliceSampler(**common)
        rb = ReplayBuffer(
            storage=LazyTensorStorage(n_eps * episode_length), sampler=sampler, batch_size=args.batch * args.length
        )
        for i in range(n_eps):
            episode = torch.full((episode_length,), i, dtype=torch.int64)
            rb.extend(
                TensorDict(
                    {**eps[i % episodes], "h": state, "c": state, "episode": episode}, batch_size=[episode_length]
                )
            )
        buffers.append(rb)
        held.append(int(sum(v.numel() * v.element_size() for v in rb.storage._storage.values(True, True))))
    print(f"ready torchrl {torchrl.__version__} torch {torch.__version__}", flush=True)
    print(json.dumps({"storage_bytes": held, "steps": [len(rb) for rb in buffers]}), flush=True)
    for _line in sys.stdin:
        seconds = []
        for rb in buffers:
            t0 = time.perf_counter()
            for _ in range(args.sample_rounds):
                s = rb.sample().reshape(args.batch, args.length)
                obs = s["observation"].numpy()
                assert obs.shape[:2] == (args.batch, args.length)
                _ = (s["action"].numpy(), s["reward"].numpy(), s["h"][:, 0].numpy(), s["c"][:, 0].numpy())
            seconds.append(time.perf_counter() - t0)
        print(json.dumps({"sampled": args.sample_rounds * args.batch, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    main()

"""Evaluation of the learner's weights: greedy / noiseless episodes in a low-priority child process."""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np
import torch

from apexrl.apex.config import LearnerConfig

__all__ = ["Evaluator"]

log = logging.getLogger("apexrl.learner")


def _evaluate(conn: Any, agent: str, env: str, agent_config: Any, seed: int, episodes: int, nice: int) -> None:
    """The evaluation process: for each weights message, play ``episodes`` greedy/noiseless episodes and send
    back ``(mean, std, episodes)``; exits on ``None`` or when the learner's end of the pipe closes."""
    import signal as _signal

    from apexrl.agents import get_agent
    from apexrl.envs import make_env
    from apexrl.params.service import deserialize_tensors

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # a terminal's Ctrl-C is the learner's to handle
    if nice:
        os.nice(nice)
    torch.set_num_threads(1)
    # A seed far from the actors' (seed * 10007 + index): evaluation episodes are not theirs.
    environment = make_env(env, seed=seed * 10007 + 5003)
    policy = get_agent(agent).make_policy(environment.spec, agent_config, 0, 1, seed + 7919)
    try:
        while True:
            try:
                blob = conn.recv()
            except EOFError:
                return
            if blob is None:
                return
            policy.load_policy_state_dict(deserialize_tensors(blob))
            returns = []
            for _ in range(episodes):
                obs, ret, done = environment.reset(), 0.0, False
                while not done:
                    step = environment.step(policy.act(obs, explore=False))
                    ret += step.raw_reward
                    obs, done = step.obs, step.terminated or step.truncated
                returns.append(ret)
            conn.send((float(np.mean(returns)), float(np.std(returns)), len(returns)))
    finally:
        environment.close()


class Evaluator:
    """Greedy (DQN) / noiseless (DPG) evaluation episodes in a child process, one evaluation at a time.

    A process, not a thread: an environment stepped from Python holds the GIL for most of each step, and a
    thread doing that starved the training loop (DPG on cartpole-swingup: 65 -> 17 learner steps/s while an
    evaluation ran). The child runs at a lower priority (``nice``), gets the weights as safetensors bytes over
    a pipe (no pickle of tensors), and exits when the learner closes the pipe or dies.
    """

    def __init__(self, config: LearnerConfig, nice: int = 5):
        import multiprocessing

        self.config = config
        self.nice = nice
        self._ctx = multiprocessing.get_context("spawn")  # no fork of a process with threads and sockets
        self._conn: Any = None
        self._proc: Any = None
        self._busy = False
        self.runs = 0

    @property
    def busy(self) -> bool:
        return self._busy

    def start(self, weights: dict[str, torch.Tensor]) -> None:
        from apexrl.params.service import serialize_tensors

        if self._busy:
            return
        if self._proc is None:
            ours, theirs = self._ctx.Pipe()
            c = self.config
            self._proc = self._ctx.Process(
                target=_evaluate, name="apexrl-eval", daemon=True,
                args=(theirs, c.agent, c.env, c.agent_config, c.seed, c.eval_episodes, self.nice),
            )
            self._proc.start()
            theirs.close()
            self._conn = ours
        self._conn.send(serialize_tensors(weights))
        self._busy = True
        self.runs += 1

    def pop_result(self) -> tuple[float, float, int] | None:
        """The finished evaluation's ``(mean, std, episodes)``, or None while none finished since the last call."""
        if not self._busy or self._conn is None or not self._conn.poll():
            return None
        self._busy = False
        try:
            return self._conn.recv()
        except EOFError:  # the evaluator died: start a new one next time
            log.warning("the evaluation process exited (code %s); starting a new one", self._proc.exitcode)
            self._conn.close()
            self._conn, self._proc = None, None
            return None

    def close(self, timeout: float = 5.0) -> None:
        """Ask the evaluation process to exit; after ``timeout`` seconds (mid-episode) terminate it."""
        if self._proc is None:
            return
        try:
            self._conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self._proc.join(timeout=timeout)
        if self._proc.is_alive():  # mid-episode: its result is not needed any more
            self._proc.terminate()
            self._proc.join(timeout=5)
        self._conn.close()
        self._conn, self._proc, self._busy = None, None, False

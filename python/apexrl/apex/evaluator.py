"""Evaluation of the learner's weights: greedy / noiseless episodes in a low-priority child process.

The protocol (Ape-X, after Rainbow): DQN acts with epsilon 0.001 (``DQNConfig.eval_epsilon``), DPG without
noise; Atari episodes start with up to 30 no-op frames and are capped at 108,000 frames
(``make_env(..., evaluation=True)``). Each evaluation is credited to the learner step, env frames and time
at which its weights were taken (:class:`EvalResult`), not to the moment its episodes finished.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from apexrl.apex.config import LearnerConfig

__all__ = ["EvalResult", "Evaluator", "play_episodes"]

log = logging.getLogger("apexrl.learner")


def play_episodes(
    environment: Any, policy: Any, episodes: int, on_frame: Callable[[Any], None] | None = None
) -> list[float]:
    """Play ``episodes`` whole evaluation episodes (``policy.act(obs, explore=False)``) and return their
    unclipped returns. ``on_frame(environment)`` is called after every reset and step (video recording). A
    recurrent policy (one with ``reset``, R2D2's) has its state zeroed at each episode's start."""
    returns = []
    reset_state = getattr(policy, "reset", None)
    for _ in range(episodes):
        obs, ret, done = environment.reset(), 0.0, False
        if reset_state is not None:
            reset_state()
        if on_frame is not None:
            on_frame(environment)
        while not done:
            step = environment.step(policy.act(obs, explore=False))
            if on_frame is not None:
                on_frame(environment)
            ret += step.raw_reward
            obs, done = step.obs, step.terminated or step.truncated
        returns.append(ret)
    return returns


@dataclass(frozen=True)
class EvalResult:
    """One evaluation: its returns' statistics, credited to the weights it scored."""

    mean: float
    std: float
    """Population standard deviation of the episode returns."""
    se: float
    """Standard error of the mean, std(ddof=1) / sqrt(episodes) (0 for one episode)."""
    episodes: int
    learner_steps: int
    """Learner updates done when the weights were taken."""
    env_frames: int
    """Env frames the replay had received when the weights were taken."""
    time_s: float
    """Run wall time (seconds) when the weights were taken."""

    @classmethod
    def of(cls, returns: Sequence[float], learner_steps: int, env_frames: int, time_s: float) -> EvalResult:
        r = np.asarray(returns, dtype=np.float64)
        if r.size == 0:
            raise ValueError("an evaluation needs at least one episode")
        se = float(r.std(ddof=1) / math.sqrt(r.size)) if r.size > 1 else 0.0
        return cls(float(r.mean()), float(r.std()), se, int(r.size), int(learner_steps), int(env_frames), float(time_s))


def _evaluate(conn: Any, agent: str, env: str, agent_config: Any, seed: int, episodes: int, nice: int) -> None:
    """The evaluation process: for each weights message, play ``episodes`` evaluation episodes and send back
    their returns; exits on ``None`` or when the learner's end of the pipe closes."""
    import signal as _signal

    from apexrl.agents import get_agent
    from apexrl.envs import make_env
    from apexrl.params.service import deserialize_tensors

    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)  # a terminal's Ctrl-C is the learner's to handle
    if nice:
        os.nice(nice)
    torch.set_num_threads(1)
    # A seed far from the actors' (seed * 10007 + index): evaluation episodes are not theirs.
    environment = make_env(env, seed=seed * 10007 + 5003, evaluation=True)
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
            conn.send([float(r) for r in play_episodes(environment, policy, episodes)])
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
        self._credit: tuple[int, int, float] = (0, 0, 0.0)
        self.runs = 0

    @property
    def pid(self) -> int | None:
        """The evaluation process's pid while it runs (its CPU share goes to metrics.csv), else None."""
        proc = self._proc
        return None if proc is None or not proc.is_alive() else proc.pid

    @property
    def busy(self) -> bool:
        return self._busy

    def start(self, weights: dict[str, torch.Tensor], learner_steps: int, env_frames: int, time_s: float) -> None:
        """Evaluate ``weights``, taken at ``learner_steps`` / ``env_frames`` / ``time_s`` (the result is credited
        to them); does nothing while an evaluation runs."""
        from apexrl.params.service import serialize_tensors

        if self._busy:
            return
        if self._proc is None:
            ours, theirs = self._ctx.Pipe()
            c = self.config
            self._proc = self._ctx.Process(
                target=_evaluate,
                name="apexrl-eval",
                daemon=True,
                args=(theirs, c.agent, c.env, c.agent_config, c.seed, c.eval_episodes, self.nice),
            )
            self._proc.start()
            theirs.close()
            self._conn = ours
        self._conn.send(serialize_tensors(weights))
        self._credit = (int(learner_steps), int(env_frames), float(time_s))
        self._busy = True
        self.runs += 1

    def pop_result(self) -> EvalResult | None:
        """The finished evaluation, or None while none finished since the last call."""
        if not self._busy or self._conn is None or not self._conn.poll():
            return None
        self._busy = False
        # The evaluator died: start a new one next time. A death with the weights message still unread (killed
        # while importing, as a run's SIGTERM to the learner's process group can) resets the pipe's socket rather
        # than closing it: ConnectionResetError, not EOFError.
        try:
            return EvalResult.of(self._conn.recv(), *self._credit)
        except (EOFError, ConnectionError):
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

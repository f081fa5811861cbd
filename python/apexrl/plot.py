"""PNG learning curves of run directories (``apexrl plot``).

Two panels: return against env frames and against wall time. Each run contributes the learner's evaluation
return (``metrics.csv``, ``eval_return_mean``: greedy/noiseless episodes) and, when ``episodes.csv`` exists,
the actors' training-episode returns as a moving mean (exploring policies, so below the evaluation curve).

Actors write their own time and frame counters, which restart with a restarted actor; the run-wide frame
count of an episode is therefore the sum of every actor's frame increments up to that row (rows are appended
in completion order), and its wall time is read off the learner's (env_frames, time_s) rows. Both axes then
agree with the evaluation curve, across actor restarts and ``--resume``.

matplotlib (the ``plot`` extra) is imported only here, with the Agg backend: no display is needed.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence

import numpy as np

from apexrl.apex.metrics import read_csv

__all__ = ["PlotError", "episode_curve", "plot_runs"]

METRICS = "metrics.csv"
EPISODES = "episodes.csv"


class PlotError(Exception):
    """A run directory cannot be plotted (the message says why), or matplotlib is missing."""


def _load_metrics(run_dir: str) -> dict[str, np.ndarray]:
    if not os.path.isdir(run_dir):
        raise PlotError(f"{run_dir} is not a directory")
    path = os.path.join(run_dir, METRICS)
    if not os.path.exists(path):
        raise PlotError(f"{run_dir} has no {METRICS} (the learner writes it once it trains; is this a run "
                        "directory?)")
    try:
        cols = read_csv(path)
    except (OSError, ValueError) as e:
        raise PlotError(f"cannot read {path}: {e}") from None
    for name in ("time_s", "env_frames", "eval_return_mean"):
        if name not in cols:
            raise PlotError(f"{path} has no {name} column")
    if not cols["time_s"]:
        raise PlotError(f"{path} has no rows yet")
    return {k: np.asarray(v, dtype=np.float64) for k, v in cols.items()}


def episode_curve(path: str, metrics: dict[str, np.ndarray], smooth: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(run-wide env frames, wall time, moving-mean return) per episode of ``episodes.csv``; None if absent
    or empty."""
    if not os.path.exists(path):
        return None
    with open(path, newline="", encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r.get("return") not in (None, "")]
    if not rows:
        return None
    last: dict[str, int] = {}
    total, frames, returns = 0, [], []
    for r in rows:
        try:
            actor, f_now, ret = r["actor"], int(r["env_frames"]), float(r["return"])
        except (KeyError, TypeError, ValueError):  # a row torn by a kill
            continue
        prev = last.get(actor, 0)
        total += f_now - prev if f_now >= prev else f_now  # a restarted actor counts from 0 again
        last[actor] = f_now
        frames.append(total)
        returns.append(ret)
    if not frames:
        return None
    x = np.asarray(frames, dtype=np.float64)
    y = np.asarray(returns, dtype=np.float64)
    k = min(smooth, len(y))
    mean = np.convolve(y, np.ones(k) / k, mode="valid")  # mean of the last k episodes
    x = x[k - 1:]
    order = np.argsort(metrics["env_frames"], kind="stable")
    # Outside the learner's rows (before its first, after its last) the time is unknown: NaN, not drawn.
    t = np.interp(x, metrics["env_frames"][order], metrics["time_s"][order], left=np.nan, right=np.nan)
    return x, t, mean


def _labels(run_dirs: Sequence[str]) -> list[str]:
    """The part of each path that tells the runs apart (the whole path for a single run)."""
    paths = [os.path.normpath(d) for d in run_dirs]
    if len(paths) == 1:
        return paths
    common = os.path.commonpath([os.path.abspath(p) for p in paths])
    labels = [os.path.relpath(os.path.abspath(p), common) for p in paths]
    return paths if len(set(labels)) < len(labels) or "." in labels else labels


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotError("matplotlib is needed for plots: pip install 'apexrl[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_runs(run_dirs: Sequence[str], out: str | None = None, smooth: int = 20) -> str:
    """Write the curves of ``run_dirs`` to ``out`` (default RUN_DIR/curves.png for one run, curves.png for
    several); returns the path written. Raises :class:`PlotError`."""
    if not run_dirs:
        raise PlotError("give at least one run directory")
    data = [(d, _load_metrics(d)) for d in run_dirs]  # every directory is checked before drawing
    plt = _pyplot()
    out = out or (os.path.join(run_dirs[0], "curves.png") if len(run_dirs) == 1 else "curves.png")
    fig, (ax_frames, ax_time) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = 0
    for i, ((run_dir, m), label) in enumerate(zip(data, _labels(run_dirs))):
        color = colors[i % len(colors)]
        name = "" if len(run_dirs) == 1 else f"{label}: "
        ok = ~np.isnan(m["eval_return_mean"])
        if ok.any():
            for ax, x in ((ax_frames, m["env_frames"]), (ax_time, m["time_s"] / 60.0)):
                ax.plot(x[ok], m["eval_return_mean"][ok], "o-", color=color, markersize=3,
                        label=f"{name}evaluation")
            drawn += 1
        curve = episode_curve(os.path.join(run_dir, EPISODES), m, smooth)
        if curve is not None:
            frames, time_s, mean = curve
            for ax, x in ((ax_frames, frames), (ax_time, time_s / 60.0)):
                ax.plot(x, mean, "-", color=color, alpha=0.45, linewidth=1.2,
                        label=f"{name}actors (moving mean of {smooth} episodes)")
            drawn += 1
    if not drawn:
        ax_frames.text(0.5, 0.5, "no evaluation or episode yet", ha="center", transform=ax_frames.transAxes)
    ax_frames.set_xlabel("env frames")
    ax_time.set_xlabel("wall time (minutes)")
    ax_frames.set_ylabel("episode return")
    for ax in (ax_frames, ax_time):
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize=8, loc="best")
    title = os.path.normpath(run_dirs[0]) if len(run_dirs) == 1 else f"{len(run_dirs)} runs"
    fig.suptitle(f"Ape-X learning curves: {title}")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise PlotError(f"cannot write {out}: {e}") from None
    finally:
        plt.close(fig)
    return out


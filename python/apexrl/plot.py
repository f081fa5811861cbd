"""PNG learning curves of run directories (``apexrl plot``).

Two panels: return against env frames and against wall time. Each run contributes the learner's evaluation
return (``metrics.csv``, ``eval_return_mean``: greedy/noiseless episodes, placed at the frames and time their
weights were taken, ``eval_env_frames``/``eval_time_s``, or the row's own in files without them), the greediest
actor's training-episode returns as a moving mean (``episodes.csv``: the actor with the smallest
``exploration``; files without that column: the highest actor index, the greediest of DQN's epsilon ladder),
and ``final_eval.json`` (``apexrl evaluate --json``) as a marker with its standard error. Runs whose metrics
report a policy lag (the on-policy agents: ``policy_lag_mean``, ``policy_lag_max``) get a lag panel under each
return panel, so that a curve is read beside how stale its batches were.

Runs of one configuration (same agent, env and preset, from ``plan.json`` or the checkpoint) are seeds: they are
drawn as one mean ± standard-error band across seeds (:func:`seed_band`: each seed interpolated onto a common
grid spanning the range every seed covers).

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

__all__ = ["PlotError", "draw_runs", "episode_curve", "eval_curve", "greediest_actor", "plot_runs", "seed_band"]

METRICS = "metrics.csv"
EPISODES = "episodes.csv"


class PlotError(Exception):
    """A run directory cannot be plotted (the message says why), or matplotlib is missing."""


def _load_metrics(run_dir: str) -> dict[str, np.ndarray]:
    if not os.path.isdir(run_dir):
        raise PlotError(f"{run_dir} is not a directory")
    path = os.path.join(run_dir, METRICS)
    if not os.path.exists(path):
        raise PlotError(f"{run_dir} has no {METRICS} (the learner writes it once it trains; is this a run directory?)")
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


def eval_curve(metrics: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(env frames, wall time, return) of each evaluation in ``metrics.csv``, at the frames and time its weights
    were taken (``eval_env_frames``/``eval_time_s``; the row's own where those are empty)."""
    ok = ~np.isnan(metrics["eval_return_mean"])

    def credited(name: str, fallback: str) -> np.ndarray:
        own = metrics[fallback][ok]
        if name not in metrics:
            return own
        x = metrics[name][ok]
        return np.where(np.isnan(x), own, x)

    return credited("eval_env_frames", "env_frames"), credited("eval_time_s", "time_s"), metrics["eval_return_mean"][ok]


def _episode_rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return [r for r in csv.DictReader(f) if r.get("return") not in (None, "")]


def _slot(r: dict[str, str]) -> str:
    """The row's actor, and with a non-empty ``env`` column (vectorised actors) its environment: "3/1"."""
    env = r.get("env") or ""
    return f"{r['actor']}/{env}" if env else r["actor"]


def greediest_actor(rows: Sequence[dict[str, str]]) -> str | None:
    """The actor (with vectorised actors, the actor's environment, "ACTOR/ENV") whose latest ``exploration`` is
    smallest (ties: the higher index); without that column the highest actor index (DQN's epsilon ladder falls
    with the index). None without rows."""
    latest: dict[str, float] = {}
    for r in rows:
        try:
            latest[_slot(r)] = float(r.get("exploration") or "nan")
        except (KeyError, TypeError, ValueError):
            continue
    if not latest:
        return None

    def index(a: str) -> tuple[float, float]:
        try:
            return tuple(float(x) for x in (a.split("/") + ["0"])[:2])  # type: ignore[return-value]
        except ValueError:
            return (-1.0, -1.0)

    known = {a: e for a, e in latest.items() if not np.isnan(e)}
    if known:
        return min(known, key=lambda a: (known[a], tuple(-x for x in index(a))))
    return max(latest, key=index)


def episode_curve(
    path: str, metrics: dict[str, np.ndarray], smooth: int, greediest: bool = False
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(run-wide env frames, wall time, moving-mean return) per episode of ``episodes.csv`` (``greediest``:
    only the greediest actor's episodes, still at run-wide frames); None if absent or empty."""
    if not os.path.exists(path):
        return None
    rows = _episode_rows(path)
    if not rows:
        return None
    keep = greediest_actor(rows) if greediest else None
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
        if keep is None or _slot(r) == keep:
            frames.append(total)
            returns.append(ret)
    if not frames:
        return None
    x = np.asarray(frames, dtype=np.float64)
    y = np.asarray(returns, dtype=np.float64)
    k = min(smooth, len(y))
    mean = np.convolve(y, np.ones(k) / k, mode="valid")  # mean of the last k episodes
    x = x[k - 1 :]
    order = np.argsort(metrics["env_frames"], kind="stable")
    # Outside the learner's rows (before its first, after its last) the time is unknown: NaN, not drawn.
    t = np.interp(x, metrics["env_frames"][order], metrics["time_s"][order], left=np.nan, right=np.nan)
    return x, t, mean


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise PlotError("matplotlib is needed for plots: pip install 'apexrl[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def seed_band(
    curves: Sequence[tuple[np.ndarray, np.ndarray]], points: int = 100
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(grid, mean, standard error) across seeds of the curves ``(x, y)``: each is interpolated linearly onto
    ``points`` x values spanning the range every curve covers; SE = std(ddof=1) / sqrt(seeds) (0 for one seed).
    Empty arrays when the curves share no range."""
    curves = [(np.asarray(x, np.float64), np.asarray(y, np.float64)) for x, y in curves if len(x)]
    if not curves:
        return np.empty(0), np.empty(0), np.empty(0)
    lo, hi = max(x.min() for x, _ in curves), min(x.max() for x, _ in curves)
    if lo > hi:
        return np.empty(0), np.empty(0), np.empty(0)
    grid = np.linspace(lo, hi, points if hi > lo else 1)
    ys = np.stack(
        [np.interp(grid, x[np.argsort(x, kind="stable")], y[np.argsort(x, kind="stable")]) for x, y in curves]
    )
    se = ys.std(axis=0, ddof=1) / np.sqrt(len(ys)) if len(ys) > 1 else np.zeros_like(grid)
    return grid, ys.mean(axis=0), se


def _groups(run_dirs: Sequence[str]) -> list[tuple[str, list[str]]]:
    """Run directories grouped by configuration (agent, env, preset), in order of first appearance; a run whose
    configuration is unknown is a group of its own."""
    from apexrl.rundir import RunDirError, identity

    groups: dict[object, list[str]] = {}
    names: dict[object, str] = {}
    envs: dict[object, str] = {}
    for d in run_dirs:
        try:
            ident = identity(d)
            key: object = ident.config_key()
            names[key] = f"{ident.agent}" + (f" ({ident.preset})" if ident.preset else "")
            envs[key] = ident.env
        except RunDirError:
            key = ("dir", d)
            names[key] = os.path.normpath(d)
        groups.setdefault(key, []).append(d)
    # The environment names a group only where the groups' environments differ (the figure's title says it
    # otherwise): labels stay short enough for the legend with long gym: entry points.
    if len(set(envs.values())) > 1:
        names = {k: f"{envs[k]} {n}" if k in envs else n for k, n in names.items()}
    out: list[tuple[str, list[str]]] = []
    for k, dirs in groups.items():
        out.extend(_split_by_settings(names[k], dirs))
    return out


_NOT_SETTINGS = frozenset(
    {"run_dir", "replay", "params_port", "params_bind", "progress_path", "snapshot", "curve_dir", "tensorboard", "seed"}
)
"""plan.json learner entries that say where a run ran, not how it learned."""


def _split_by_settings(name: str, dirs: list[str]) -> list[tuple[str, list[str]]]:
    """One configuration's runs are its seeds unless two share a seed: then they ran with different settings
    (``--learner-args``, ``--vtrace on|off``, say), and the runs are grouped by the learner settings that differ,
    each group named by them and banded over its seeds. Runs that still share a seed within a group (nothing in
    their plans tells them apart: another version of the code, say) are a group each, named by their directory."""
    import json

    from apexrl.rundir import run_seed

    seeds = [run_seed(d) for d in dirs]
    if len(set(seeds)) == len(seeds):
        return [(name, dirs)]
    settings = [_learner_settings(d) for d in dirs]
    # Only settings every plan has: a field a newer version added is not a difference of how the runs learned.
    common = set.intersection(*(set(s) for s in settings))
    differing = sorted(k for k in common if len({json.dumps(s[k]) for s in settings}) > 1)
    by_setting: dict[str, list[tuple[str, object]]] = {}
    for d, s, seed in zip(dirs, settings, seeds, strict=True):
        by_setting.setdefault(", ".join(f"{k}={s.get(k)}" for k in differing), []).append((d, seed))
    out: list[tuple[str, list[str]]] = []
    for label, runs in by_setting.items():
        if label and len({seed for _, seed in runs}) == len(runs):
            out.append((f"{name} [{label}]", [d for d, _ in runs]))
        else:
            out.extend((f"{name} [{', '.join(filter(None, [label, os.path.normpath(d)]))}]", [d]) for d, _ in runs)
    return out


def _learner_settings(run_dir: str) -> dict[str, object]:
    import json

    try:
        with open(os.path.join(run_dir, "plan.json"), encoding="utf-8") as f:
            learner = json.load(f).get("learner") or {}
    except (OSError, ValueError, AttributeError):
        return {}
    flat: dict[str, object] = {}
    for k, v in learner.items():
        if k in _NOT_SETTINGS:
            continue
        for kk, vv in v.items() if isinstance(v, dict) else [(None, v)]:
            flat[k if kk is None else kk] = json.dumps(vv) if isinstance(vv, (list, dict)) else vv
    return flat


def _envs(run_dirs: Sequence[str]) -> list[str]:
    """The distinct environments of the runs whose configuration is known, in order."""
    from apexrl.rundir import RunDirError, identity

    out: list[str] = []
    for d in run_dirs:
        try:
            env = identity(d).env
        except RunDirError:
            continue
        if env not in out:
            out.append(env)
    return out


def _final(run_dir: str) -> dict | None:
    from apexrl.rundir import RunDirError, final_eval

    try:
        return final_eval(run_dir)
    except RunDirError as e:
        raise PlotError(str(e)) from None


# Sizes for a figure shown at 800-1000 px wide (bench/README.md, the README): it is drawn 1200 px wide, so text
# and markers shrink by a quarter there.
_FONT = 11
_LEGEND_FONT = 10


def draw_runs(run_dirs: Sequence[str], smooth: int = 20):
    """The matplotlib figure of ``run_dirs`` (see :func:`plot_runs`), not yet saved; the caller closes it. Its
    legend is one figure legend below both panels, never over the curves. Raises :class:`PlotError`."""
    if not run_dirs:
        raise PlotError("give at least one run directory")
    metrics = {d: _load_metrics(d) for d in run_dirs}  # every directory is checked before drawing
    plt = _pyplot()
    with plt.rc_context({"font.size": _FONT, "axes.titlesize": _FONT, "axes.labelsize": _FONT}):
        groups = _groups(run_dirs)
        lagged = [d for d in run_dirs if _lag_rows(metrics[d])[0].size]
        if lagged:
            # On-policy runs report how stale their batches were: a lag panel under each return panel.
            fig, ((ax_frames, ax_time), (lag_frames, lag_time)) = plt.subplots(
                2, 2, figsize=(12, 7.5), sharex="col", height_ratios=(3, 1), layout="constrained"
            )
            ax_time.sharey(ax_frames)
            _draw_lag(plt, groups, metrics, (lag_frames, lag_time))
        else:
            fig, (ax_frames, ax_time) = plt.subplots(1, 2, figsize=(12, 5.5), sharey=True, layout="constrained")
        drawn = _draw_groups(plt, groups, metrics, (ax_frames, ax_time), smooth)
        if not drawn:
            ax_frames.text(0.5, 0.5, "no evaluation or episode yet", ha="center", transform=ax_frames.transAxes)
        bottom = (lag_frames, lag_time) if lagged else (ax_frames, ax_time)
        bottom[0].set_xlabel("env frames")
        bottom[1].set_xlabel("wall time (minutes)")
        ax_frames.set_ylabel("episode return")
        for ax in (ax_frames, ax_time, *((lag_frames, lag_time) if lagged else ())):
            ax.grid(alpha=0.3)
        if drawn:
            # Both panels carry the same series: one legend below them (constrained layout makes room), so
            # long labels and several configurations never cover a curve or an axis label.
            handles, labels = ax_frames.get_legend_handles_labels()
            more, more_labels = [], []
            for ax in (ax_time, *((lag_frames,) if lagged else ())):
                h_more, l_more = ax.get_legend_handles_labels()
                more += h_more
                more_labels += l_more
            for h, lab in zip(more, more_labels):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
            fig.legend(
                handles,
                labels,
                loc="outside lower center",
                ncol=_legend_columns(labels),
                fontsize=_LEGEND_FONT,
                frameon=False,
            )
        title = os.path.normpath(run_dirs[0]) if len(run_dirs) == 1 else f"{len(run_dirs)} runs"
        envs = _envs(run_dirs)
        if len(run_dirs) > 1 and len(envs) == 1:
            title += f" on {envs[0]}"
        fig.suptitle(f"apexrl learning curves: {title}")  # every agent, not only Ape-X's
    return fig


def _lag_rows(metrics: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(frames, time_s, policy_lag_mean, policy_lag_max) of the rows that report a policy lag (on-policy agents'
    metrics.csv: the learner's version minus the version that acted, over each row's batches); empty without."""
    mean = metrics.get("policy_lag_mean")
    if mean is None:
        empty = np.zeros(0)
        return empty, empty, empty, empty
    keep = ~np.isnan(mean)
    lag_max = metrics.get("policy_lag_max", np.full_like(mean, np.nan))
    return metrics["env_frames"][keep], metrics["time_s"][keep], mean[keep], lag_max[keep]


def _draw_lag(plt, groups: list[tuple[str, list[str]]], metrics: dict, axes) -> None:
    """Each run's policy lag (mean solid, max dotted) on the (frames, time) lag axes, in its group's colour."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for gi, (name, dirs) in enumerate(groups):
        color = colors[gi % len(colors)]
        prefix = "" if len(groups) == 1 else f"{name}: "
        for k, d in enumerate(dirs):
            frames, time_s, mean, lag_max = _lag_rows(metrics[d])
            if not mean.size:
                continue
            for axis, (ax, scale) in enumerate(zip(axes, (1.0, 60.0))):
                x = (frames, time_s)[axis] / scale
                first = k == 0 and axis == 0
                ax.plot(x, mean, "-", color=color, linewidth=1.2, label=f"{prefix}policy lag, mean" if first else None)
                ax.plot(
                    x, lag_max, ":", color=color, linewidth=1.0, label=f"{prefix}policy lag, max" if first else None
                )
    axes[0].set_ylabel("policy lag (updates)")


def _legend_columns(labels: list[str]) -> int:
    """Columns of the legend below a 1200 px figure: one for long labels, up to three for short ones."""
    longest = max(len(lab) for lab in labels)
    return 1 if longest > 60 else 2 if longest > 40 else min(3, len(labels))


def _draw_groups(plt, groups: list[tuple[str, list[str]]], metrics: dict, axes, smooth: int) -> int:
    """Draw every configuration's curves on the (frames, time) axes; returns how many series were drawn."""
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    drawn = 0
    for gi, (name, dirs) in enumerate(groups):
        color = colors[gi % len(colors)]
        prefix = "" if len(groups) == 1 else f"{name}: "
        seeds = f", mean ± SE of {len(dirs)} seeds" if len(dirs) > 1 else ""
        evals = [eval_curve(metrics[d]) for d in dirs]
        episodes = [
            c
            for c in (episode_curve(os.path.join(d, EPISODES), metrics[d], smooth, greediest=True) for d in dirs)
            if c is not None
        ]
        for axis, (ax, scale) in enumerate(zip(axes, (1.0, 60.0))):
            label_eval = f"{prefix}evaluation{seeds}"
            if len(dirs) == 1:
                f, t, y = evals[0]
                if len(y):
                    ax.plot((f, t)[axis] / scale, y, "o-", color=color, markersize=3.5, linewidth=1.8, label=label_eval)
                    drawn += 1
            else:
                grid, mean, se = seed_band([((f, t)[axis], y) for f, t, y in evals])
                if len(grid):
                    ax.plot(grid / scale, mean, "-", color=color, linewidth=1.8, label=label_eval)
                    ax.fill_between(grid / scale, mean - se, mean + se, color=color, alpha=0.3, linewidth=0)
                    drawn += 1
            label_act = f"{prefix}greediest actor, mean of last {smooth} episodes{seeds}"
            grid, mean, se = seed_band([(c[axis][~np.isnan(c[axis])], c[2][~np.isnan(c[axis])]) for c in episodes])
            if len(grid):
                ax.plot(grid / scale, mean, "--", color=color, alpha=0.7, linewidth=1.4, label=label_act)
                if len(episodes) > 1:
                    ax.fill_between(grid / scale, mean - se, mean + se, color=color, alpha=0.12, linewidth=0)
                drawn += 1
            for k, d in enumerate(dirs):
                fe = _final(d)
                if fe is None:
                    continue
                x = float(fe.get(("env_frames", "time_s")[axis]) or 0.0) / scale
                # Large, black-edged and on top: the final evaluation stays visible over a band at 800 px.
                ax.errorbar(
                    [x],
                    [fe["mean"]],
                    yerr=[fe["se"]],
                    fmt="s",
                    color=color,
                    markeredgecolor="black",
                    ecolor="black",
                    elinewidth=1.5,
                    capsize=5,
                    markersize=9,
                    zorder=5,
                    label=f"{prefix}final evaluation ({int(fe['episodes'])} episodes)" if k == 0 else None,
                )
                drawn += 1
    return drawn


def plot_runs(run_dirs: Sequence[str], out: str | None = None, smooth: int = 20) -> str:
    """Write the curves of ``run_dirs`` to ``out`` (default RUN_DIR/curves.png for one run, curves.png for
    several); runs of one configuration are drawn as a mean ± SE band across seeds. Returns the path written.
    Raises :class:`PlotError`."""
    fig = draw_runs(run_dirs, smooth)
    out = out or (os.path.join(run_dirs[0], "curves.png") if len(run_dirs) == 1 else "curves.png")
    plt = _pyplot()
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    try:
        fig.savefig(out, dpi=100)
    except OSError as e:
        raise PlotError(f"cannot write {out}: {e}") from None
    finally:
        plt.close(fig)
    return out

"""The episodes.csv that a run's actors share: one header however many actors start together, and a file
from elsewhere refused untouched."""

from __future__ import annotations

import csv
import multiprocessing as mp

import pytest

from apexrl.apex.actor import _start_episodes_file
from apexrl.apex.config import EPISODE_COLUMNS
from apexrl.durable import append_private


def _actor_start(path: str, barrier, index: int) -> None:
    with append_private(path, newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        barrier.wait(60)  # every process opens the empty file before any of them looks at it
        _start_episodes_file(f, writer, path)
        writer.writerow([f"actor{index}"] + [""] * (len(EPISODE_COLUMNS) - 1))
        f.flush()


def test_actors_starting_together_write_one_header(tmp_path):
    ctx = mp.get_context("fork")
    n = 6
    for attempt in range(8):
        path = str(tmp_path / f"episodes{attempt}.csv")
        barrier = ctx.Barrier(n)
        procs = [ctx.Process(target=_actor_start, args=(path, barrier, i)) for i in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        with open(path, encoding="utf-8") as f:
            rows = list(csv.reader(f))
        assert rows[0] == list(EPISODE_COLUMNS)
        assert rows.count(list(EPISODE_COLUMNS)) == 1, rows
        assert sorted(r[0] for r in rows[1:]) == [f"actor{i}" for i in range(n)]


def test_a_file_with_other_columns_is_refused_and_left_as_it_was(tmp_path):
    path = tmp_path / "episodes.csv"
    path.write_text("time,return\n1,2\n", encoding="utf-8")
    with append_private(path, newline="", encoding="utf-8") as f:
        with pytest.raises(ValueError, match="has columns 'time,return'"):
            _start_episodes_file(f, csv.writer(f, lineterminator="\n"), str(path))
    assert path.read_text(encoding="utf-8") == "time,return\n1,2\n"

"""The scripts of examples/ run as a user runs them, with tiny step counts: each starts its own in-process replay
server on 127.0.0.1, writes with an adder from its environment loop, samples, trains, and must exit 0 having
printed its progress lines. A few seconds of CPU each: they check that the examples work against the package as it
is, not that they learn (their docstrings say how to see that). docs/own_learner.md takes its code from them, and
the last test holds it to them."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
TIMEOUT = 300  # generous on a loaded 2-core machine; each takes seconds

pytestmark = pytest.mark.examples


def run_example(script: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, script), *args],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=EXAMPLES,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    return out


def test_uniform_sac():
    out = run_example("uniform_sac.py", "--env", "Pendulum-v1", "--steps", "500", "--learning-starts", "300",
                      "--batch-size", "32", "--seed", "1")  # fmt: skip
    episodes = re.findall(r"^episode (\d+)  step (\d+)  return (-?\d+\.\d)$", out, re.M)
    assert [(int(e), int(s)) for e, s, _ in episodes] == [(1, 200), (2, 400)]  # Pendulum: 200 steps each
    assert re.search(r"^done: 500 steps, 2 episodes, 500 transitions stored$", out, re.M), out


def test_sequence_learner():
    out = run_example("sequence_learner.py", "--steps", "600", "--learning-starts", "200", "--batch-size", "8",
                      "--length", "10", "--period", "5", "--seed", "2")  # fmt: skip
    episodes = re.findall(r"^episode (\d+)  step (\d+)  return (\d+)$", out, re.M)
    assert episodes and [int(e) for e, _, _ in episodes] == list(range(1, len(episodes) + 1))
    assert sum(int(r) for _, _, r in episodes) <= 600  # CartPole: reward 1 per step
    done = re.search(r"^done: 600 steps, (\d+) episodes, (\d+) updates$", out, re.M)
    assert done and int(done.group(1)) == len(episodes) and int(done.group(2)) == 100, out


def test_slice_learner():
    out = run_example("slice_learner.py", "--steps", "600", "--learning-starts", "200", "--batch-size", "8",
                      "--burn-in", "3", "--length", "6", "--seed", "2")  # fmt: skip
    episodes = re.findall(r"^episode (\d+)  step (\d+)  return (\d+)$", out, re.M)
    assert episodes and [int(e) for e, _, _ in episodes] == list(range(1, len(episodes) + 1))
    done = re.search(r"^done: 600 steps, (\d+) episodes, (\d+) updates, (\d+) steps held$", out, re.M)
    # Every finished episode is held (600 steps fit), each with its last observation as a step of its own.
    assert done and int(done.group(1)) == len(episodes) and int(done.group(2)) == 100, out
    assert int(done.group(3)) == int(episodes[-1][1]) + len(episodes), out


def test_slice_learner_on_a_replay_servers_slices_table():
    out = run_example("slice_learner.py", "--server", "--steps", "600", "--learning-starts", "200", "--batch-size",
                      "8", "--burn-in", "3", "--length", "6", "--seed", "2")  # fmt: skip
    episodes = re.findall(r"^episode (\d+)  step (\d+)  return (\d+)$", out, re.M)
    done = re.search(r"^done: 600 steps, (\d+) episodes, (\d+) updates, (\d+) steps held$", out, re.M)
    # The server's table holds every finished episode with its last observation, and the learner trained on it.
    assert done and int(done.group(1)) == len(episodes) > 0 and int(done.group(2)) == 100, out
    assert int(done.group(3)) == int(episodes[-1][1]) + len(episodes), out


def test_onpolicy_learner():
    out = run_example("onpolicy_learner.py", "--steps", "1500", "--rollout", "128", "--length", "16",
                      "--epochs", "2", "--seed", "1")  # fmt: skip
    episodes = re.findall(r"^episode (\d+)  step (\d+)  return (\d+)$", out, re.M)
    assert episodes and [int(e) for e, _, _ in episodes] == list(range(1, len(episodes) + 1))
    done = re.search(r"^done: (\d+) frames, (\d+) decisions, (\d+) episodes, (\d+) updates$", out, re.M)
    assert done and int(done.group(1)) >= 1500 and int(done.group(3)) == len(episodes), out
    # action repeat 2: about two frames per decision; updates: 4 minibatches x 2 epochs per rollout of 128
    assert int(done.group(2)) < int(done.group(1)) and int(done.group(4)) > 0, out


def test_two_process_dqn():
    """The learner process starts the actor process; the actor acts with weights the learner published after
    training began, and both stop cleanly when the learner is done."""
    out = run_example("two_process_dqn.py", "--updates", "200", "--min-size", "200", "--batch-size", "32",
                      "--publish-every", "20", "--log-every", "100", "--seed", "1")  # fmt: skip
    assert re.findall(r"^learner update (\d+)  weights (\d+)  ", out, re.M) == [("100", "6"), ("200", "11")], out
    assert re.findall(r"^actor episode \d+  step \d+  return \d+  weights \d+$", out, re.M), out
    actor = re.search(r"^actor done: (\d+) steps, (\d+) episodes, weights version (\d+)$", out, re.M)
    assert actor and int(actor.group(3)) >= 2, out  # it fetched weights the learner published while training
    learner = re.search(r"^learner done: 200 updates, weights version 11, (\d+) items held$", out, re.M)
    # SampleToInsertRatio(8): 200 x 32 sampled items allow about 800 inserts beyond the first 200, plus the
    # error buffer (200); an actor left alone would have inserted many thousands meanwhile
    assert learner and 200 <= int(learner.group(1)) <= min(1300, int(actor.group(1))), out


def test_the_docs_code_is_the_examples_code():
    """docs/own_learner.md takes its Python from the examples: every line of its python blocks (but ``...`` and
    comments) is a line of one of the scripts, so the page cannot drift from code that CI runs."""
    sources = set()
    scripts = ("uniform_sac.py", "sequence_learner.py", "slice_learner.py", "onpolicy_learner.py", "two_process_dqn.py")
    for script in scripts:
        with open(os.path.join(EXAMPLES, script), encoding="utf-8") as f:
            sources |= {line.strip() for line in f}
    with open(os.path.join(os.path.dirname(EXAMPLES), "docs", "own_learner.md"), encoding="utf-8") as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
    assert len(blocks) >= 5
    missing = []
    for block in blocks:
        for line in block.splitlines():
            code = line.split("  # ")[0].strip() if not line.strip().startswith("#") else ""
            if code and not code.startswith("...") and not any(code == s.split("  # ")[0].strip() for s in sources):
                missing.append(code)
    assert not missing, f"lines of docs/own_learner.md's python blocks that no example has: {missing}"

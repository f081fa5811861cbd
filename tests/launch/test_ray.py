"""``apexrl run --ray``: the run on a real local Ray cluster of three raylets, all on 127.0.0.1.

One cluster (a head with the ``apexrl_replay`` resource and exactly the CPUs of two replay servers and the
learner, and two worker nodes for the actors) and one run of the cartpole preset over two replay servers serve the
tests in file order: placement,
learning, a ``ray.kill`` of an actor's host (it comes back and makes progress again), a crashed learner
process (its host starts it again with ``--resume``), the removal of a worker
node (its actor comes back on the other node, reconnects and makes progress), and the clean stop on SIGINT.
The first test needs no Ray: without it, ``--ray`` exits 2 naming the extra to install.

The module is one ``xdist_group``: with ``--dist loadgroup`` (.ci/run) one worker runs all of it, in file order
(tests/conftest.py keeps a group's order), so one cluster and one run exist at a time. The run's fixture
waits for the run to be up (:meth:`Run.wait_up`), so no test depends on an earlier one for that.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import Proc
from tests.helpers import csv_columns, wait_until
from tests.launch.test_launch import _alive

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before Ray's import: it keeps Ray on 127.0.0.1

FAST_LEARNER = "--min-replay-size 300 --eval-every 3 --eval-episodes 1 --metrics-every 1 --checkpoint-every 100"
OBJECT_STORE = 80 * 2**20
NAMESPACE = "apexrl"
RUN_UP_TIMEOUT = 300  # the cluster's three raylets and five children starting on a loaded 2-core machine

pytestmark = pytest.mark.xdist_group("ray_cluster")


def test_ray_missing_is_a_clear_error(tmp_path):
    run_dir = tmp_path / "run"
    code = (
        "import sys; sys.modules['ray'] = None; from apexrl.cli.main import main; "
        f"sys.exit(main(['run', '--ray', 'local', '--run-dir', {str(run_dir)!r}]))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "pip install 'apexrl[ray]'" in r.stderr
    assert not run_dir.exists()


def test_joining_a_cluster_beyond_loopback_needs_ray_token_authentication(tmp_path):
    """The decision (no cluster needed): loopback and ``local`` are fine; beyond loopback RAY_AUTH_MODE=token
    with a token at hand is needed, else a refusal, or with --insecure a loud warning."""
    from apexrl.launch.ray_launcher import ray_auth_problem

    home, nowhere = str(tmp_path / "home"), str(tmp_path / "no-cluster")
    check = lambda address, env, insecure=False: ray_auth_problem(address, insecure, env, home, nowhere)  # noqa: E731
    for address in ("local", "127.0.0.1:6379", "localhost:6379", "[::1]:6379"):
        assert check(address, {}) is None, address
    assert check("auto", {"RAY_ADDRESS": "127.0.0.1:6379"}) is None
    verdict, message = check("10.0.0.5:6379", {})
    assert verdict == "refuse" and "token authentication is off (RAY_AUTH_MODE=unset)" in message
    assert "refusing to join the Ray cluster at 10.0.0.5:6379" in message and "--insecure" in message
    verdict, message = check("10.0.0.5:6379", {"RAY_AUTH_MODE": "disabled"}, insecure=True)
    assert verdict == "warn"
    assert message.startswith("WARNING: joining the Ray cluster at 10.0.0.5:6379 although it is not on loopback")
    verdict, message = check("auto", {})  # no address to be found: not known to be loopback
    assert verdict == "refuse" and "the Ray cluster at auto" in message
    verdict, message = check("auto", {"RAY_ADDRESS": "ray://10.0.0.5:10001"})
    assert verdict == "refuse" and "(10.0.0.5:10001)" in message
    verdict, message = check("10.0.0.5:6379", {"RAY_AUTH_MODE": "token"})
    assert verdict == "refuse" and "RAY_AUTH_MODE=token but no token here" in message
    assert check("10.0.0.5:6379", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t0k3n"}) is None
    token = tmp_path / "token"
    token.write_text("t0k3n")
    assert check("10.0.0.5:6379", {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}) is None
    os.makedirs(os.path.join(home, ".ray"))
    with open(os.path.join(home, ".ray", "auth_token"), "w", encoding="utf-8") as f:
        f.write("t0k3n")
    assert check("10.0.0.5:6379", {"RAY_AUTH_MODE": "token"}) is None
    with open(nowhere, "w", encoding="utf-8") as f:  # what `auto` joins when RAY_ADDRESS is unset
        f.write("127.0.0.1:6380\n")
    assert check("auto", {}) is None


def test_apexrl_run_refuses_a_cluster_beyond_loopback_without_token_auth_before_contacting_it(tmp_path):
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    # 192.0.2.1 (TEST-NET-1) is never contacted: the refusal comes first
    r = subprocess.run(
        [sys.executable, "-m", "apexrl", "run", "--ray", "192.0.2.1:6379", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "refusing to join the Ray cluster at 192.0.2.1:6379: it is not on loopback" in r.stdout
    assert "RAY_AUTH_MODE=token" in r.stdout and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------------------------- one cluster, one run


def _pids(run_dir: str) -> dict:
    try:
        with open(os.path.join(run_dir, "pids.json"), encoding="utf-8") as f:
            return json.load(f)
    except (FileNotFoundError, ValueError):
        return {}


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _records(path: str) -> list[dict]:
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


@pytest.fixture(scope="module")
def cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'apexrl[ray]')")
    from ray.cluster_utils import Cluster

    node = dict(object_store_memory=OBJECT_STORE, node_ip_address="127.0.0.1")
    c = Cluster(
        initialize_head=True,
        head_node_args=dict(num_cpus=3, resources={"apexrl_replay": 1}, include_dashboard=False, **node),
    )
    try:
        workers = [c.add_node(num_cpus=2, **node) for _ in range(2)]
        c.wait_for_nodes()
        ray.init(address=c.address, _node_ip_address="127.0.0.1", namespace=NAMESPACE, log_to_driver=False)
        yield c, workers
    finally:
        ray.shutdown()
        c.shutdown()


class Run:
    def __init__(self, proc: Proc, run_dir: str, cluster, workers):
        self.proc, self.run_dir, self.cluster, self.workers = proc, run_dir, cluster, workers
        self.seen_pids: set[int] = set()
        self.nodes: dict = {}

    def pids(self) -> dict:
        p = _pids(self.run_dir)
        self.seen_pids.update(p.get("children", {}).values())
        return p

    def wait_up(self) -> None:
        """Until the learner serves weights and all five children are placed (their nodes: ``self.nodes``)."""
        self.proc.wait_for(
            r"learner \(pid \d+ on 127\.0\.0\.1\) serving weights on tcp://127\.0\.0\.1:\d+", RUN_UP_TIMEOUT
        )
        self.nodes = wait_until(
            lambda: self.pids().get("nodes") if len(self.pids().get("nodes", {})) == 5 else None,
            120,
            "every child's node in pids.json",
            interval=0.5,
        )

    def node_of(self, child: str) -> str | None:
        return self.pids().get("nodes", {}).get(child)

    def progress(self, child: str) -> list[dict]:
        return _records(os.path.join(self.run_dir, "logs", f"{child}.progress.jsonl"))

    def host(self, child: str):
        import ray

        from apexrl.launch.ray_launcher import host_name

        return ray.get_actor(host_name(self.proc.proc.pid, child), namespace=NAMESPACE)

    def comes_back(self, child: str, log_from: int, records_before: int, timeout: float = 150) -> None:
        """The child's loss is noticed, it restarts, and its new process sends progress records again."""
        self.proc.wait_for(rf"{child} exited unexpectedly \(its Ray actor was lost", timeout=timeout, start=log_from)
        self.proc.wait_for(rf"{child} restarted \(.*, restart \d+\)", timeout=timeout, start=log_from)
        wait_until(
            lambda: len(self.progress(child)) >= records_before + 2,
            timeout,
            f"progress records of the restarted {child}",
            interval=0.5,
        )
        wait_until(lambda: self.pids().get("children", {}).get(child), 30, f"{child} in pids.json", interval=0.5)


@pytest.fixture(scope="module")
def ray_run(cluster, tmp_path_factory):
    c, workers = cluster
    tmp = tmp_path_factory.mktemp("ray_run")
    run_dir = str(tmp / "run")
    log_path = str(tmp / "launcher.log")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-u",
                "-m",
                "apexrl",
                "run",
                "--ray",
                c.address,
                "--run-dir",
                run_dir,
                "--minutes",
                "0",
                "--final-eval",
                "0",
                "--progress-every",
                "2",
                "--actors",
                "2",
                "--replay-servers",
                "2",
                f"--learner-args={FAST_LEARNER}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    run = Run(Proc("launcher", proc, log_path), run_dir, c, workers)
    try:
        run.wait_up()  # here, not in a test: a run that never comes up fails the setup once, not each test again
        yield run
    finally:
        run.proc.kill9()


@pytest.mark.ray
def test_replay_and_learner_on_the_head_actors_on_the_workers(ray_run):
    nodes = ray_run.nodes
    head = ray_run.cluster.head_node.node_id
    workers = {w.node_id for w in ray_run.workers}
    assert nodes["server0"] == nodes["server1"] == nodes["learner"] == head
    assert nodes["actor0"] in workers and nodes["actor1"] in workers


@pytest.mark.ray
def test_the_run_learns_and_reports_like_a_local_run(ray_run):
    ray_run.proc.wait_for(r"steps [1-9]\d* \(.* episodes [1-9]", timeout=180)  # the live progress line
    metrics = os.path.join(ray_run.run_dir, "metrics.csv")
    wait_until(
        lambda: max((csv_columns(metrics, "learner_steps") or {}).get("learner_steps", []), default=0) > 0,
        60,
        "learner steps in metrics.csv",
        interval=0.5,
    )
    episodes = os.path.join(ray_run.run_dir, "episodes.csv")  # the actors' rows, shipped back from their nodes
    wait_until(
        lambda: set((csv_columns(episodes, "actor") or {}).get("actor", [])) == {0.0, 1.0},
        60,
        "both actors' episodes in episodes.csv",
        interval=0.5,
    )
    for server in ("server0", "server1"):  # their logs, shipped from their host
        assert "listening on" in _read(os.path.join(ray_run.run_dir, "logs", f"{server}.log"))


@pytest.mark.ray
def test_a_killed_actor_host_comes_back_and_the_run_goes_on(ray_run):
    import ray

    wait_until(lambda: ray_run.progress("actor0"), 120, "actor0's progress", interval=0.5)
    log_from, before = len(ray_run.proc.log()), len(ray_run.progress("actor0"))
    ray.kill(ray_run.host("actor0"), no_restart=False)
    ray_run.comes_back("actor0", log_from, before)
    assert ray_run.proc.alive()


@pytest.mark.ray
def test_a_crashed_learner_restarts_in_its_host_with_resume(ray_run):
    pid = wait_until(lambda: ray_run.pids().get("children", {}).get("learner"), 60, "the learner's pid", interval=0.5)
    wait_until(
        lambda: os.path.exists(os.path.join(ray_run.run_dir, "checkpoint.safetensors")),
        120,
        "a checkpoint",
        interval=0.5,
    )
    log_from = len(ray_run.proc.log())
    os.kill(pid, signal.SIGKILL)  # the process, not its host (every node of this cluster is this machine)
    ray_run.proc.wait_for(r"learner exited unexpectedly \(killed by SIGKILL\); restarting", 60, start=log_from)
    ray_run.proc.wait_for(r"learner restarted \(.*, restart \d+\)", 60, start=log_from)
    learner_log = os.path.join(ray_run.run_dir, "logs", "learner.log")
    wait_until(
        lambda: "learner resumed from" in _read(learner_log),
        120,
        "the learner to resume from its checkpoint",
        interval=0.5,
    )
    before = len(ray_run.progress("learner"))
    wait_until(
        lambda: len(ray_run.progress("learner")) > before + 1, 120, "the resumed learner's progress", interval=0.5
    )


@pytest.mark.slow
@pytest.mark.ray
def test_removing_a_worker_node_moves_its_actor_which_reconnects(ray_run):
    wait_until(lambda: ray_run.node_of("actor1"), 60, "actor1's node", interval=0.5)
    lost = ray_run.node_of("actor1")
    node = next(w for w in ray_run.workers if w.node_id == lost)
    log_from, before = len(ray_run.proc.log()), len(ray_run.progress("actor1"))
    ray_run.cluster.remove_node(node)
    ray_run.comes_back("actor1", log_from, before)
    moved = wait_until(lambda: ray_run.node_of("actor1"), 30, "actor1's new node", interval=0.5)
    assert moved != lost and moved != ray_run.cluster.head_node.node_id
    last = ray_run.progress("actor1")[-1]
    wait_until(
        lambda: ray_run.progress("actor1")[-1]["inserted"] > last["inserted"],
        60,
        "the moved actor1 to insert into the replay",
        interval=0.5,
    )


@pytest.mark.ray
def test_sigint_stops_every_process_and_every_host(ray_run):
    import ray

    steps = wait_until(
        lambda: [r for r in ray_run.progress("learner") if r.get("learner_steps")],
        120,
        "learner progress",
        interval=0.5,
    )
    ray_run.proc.signal(signal.SIGINT)
    assert ray_run.proc.proc.wait(180) == 0, ray_run.proc.log()[-3000:]
    log = ray_run.proc.log()
    assert "stopping: received SIGINT" in log and "run finished after" in log
    assert os.path.exists(os.path.join(ray_run.run_dir, "checkpoint.safetensors"))
    assert steps
    for pid in ray_run.seen_pids:  # every process any host started (all on this machine here) is gone
        wait_until(lambda: not _alive(pid), 30, f"process {pid} to be gone", interval=0.5)
    for child in ("server0", "server1", "learner", "actor0", "actor1"):
        with pytest.raises(ValueError):
            ray_run.host(child)
    assert ray.is_initialized()

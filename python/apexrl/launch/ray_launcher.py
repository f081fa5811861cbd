"""The Ray launcher (``apexrl run --ray ADDRESS``): the same run as the local launcher, its processes on a Ray
cluster.

Ray Core places, starts and restarts processes; ZeroMQ carries all data, as locally. The supervisor is the
local launcher's own loop (:class:`~apexrl.launch.local.Launcher`: start order, back-off, crash-loop
detection, progress line, ordered shutdown, summary); only the child differs: a :class:`RayChild` whose process
runs in a :class:`~apexrl.launch.ray_host.ProcessHost` actor on a node Ray picks, and whose log lines, progress
records and episode rows come back through the host's polls into ``RUN_DIR`` on this machine.

Placement:

* The replay server(s) and the learner run on the node with the custom resource ``apexrl_replay`` (the head:
  ``ray start --head --resources '{"apexrl_replay": 1}'``), each taking ``HEAD_SHARE`` of it, one CPU, and the
  learner one GPU when its config asks for CUDA (or ``auto`` on a cluster that has GPUs). Their ports are picked
  once, by a small task on that node, and kept: a restarted host gets the same plan, so the actors reconnect to
  the same endpoints. The learner restarts with ``--resume``, a server restores its snapshot.
* The actors spread over the nodes (``SPREAD``) with ``num_cpus`` each (``--ray-actor-cpus``); one whose node
  dies comes back on another and reconnects.
* The services bind the head's IP (127.0.0.1 for ``--ray local`` and a test cluster); beyond loopback they need
  the CURVE keys (``--curve-dir``, the same path on every node) unless ``--insecure``.
* Joining a cluster beyond loopback needs Ray's token authentication (``RAY_AUTH_MODE=token`` and a token):
  without it the launcher refuses (:func:`ray_auth_problem`), or with ``--insecure`` warns loudly and goes on.
* This launcher runs on the head: the learner writes ``metrics.csv`` and checkpoints to ``RUN_DIR`` there, the
  servers their snapshots. The actors' ``episodes.csv`` rows come back with their polls, into
  ``RUN_DIR/episodes.csv``.

``--ray auto`` joins the running cluster, ``--ray HOST:PORT`` the given one, and ``--ray local`` starts a
private one-node cluster on 127.0.0.1 for the run. Ray is imported only here, so plain ``apexrl run`` never
needs it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from apexrl.apex.config import EPISODE_COLUMNS
from apexrl.launch.local import (
    Launcher,
    PlacementError,
    SupervisedChild,
    child_specs,
    describe_exit,
)
from apexrl.launch.plan import PLAN_NAME, RunPlan
from apexrl.launch.ray_host import PLAN_ARG, ProcessHost

__all__ = [
    "HEAD_SHARE",
    "NAMESPACE",
    "REPLAY_RESOURCE",
    "PlacementError",
    "RayChild",
    "RayLauncher",
    "host_name",
    "require_ray",
]

REPLAY_RESOURCE = "apexrl_replay"
"""The custom resource that marks the node of the replay server(s) and the learner."""
HEAD_SHARE = 0.01
"""How much of REPLAY_RESOURCE each server and the learner take (so any number of them fit in 1)."""
NAMESPACE = "apexrl"
POLL_EVERY_S = 0.5
"""Seconds between polls of one host."""
PLACE_TIMEOUT_S = 120.0
"""How long the start-up waits for Ray to place and start the hosts."""
STOP_WAIT_S = 10.0
LOST = -signal.SIGKILL
"""The exit status a child reports when its host was lost (killed, or its node died)."""
LOCAL_OBJECT_STORE = 100 * 2**20
"""Bytes of Ray's object store for ``--ray local``: only the launcher's small polls use it (Ray's default takes
30% of the memory)."""
RAY_MISSING = "--ray needs Ray on this machine: pip install 'apexrl[ray]'"


def is_loopback(address: str) -> bool:
    """``local``, or HOST:PORT with a loopback HOST."""
    host = address.rsplit(":", 1)[0].strip("[]")
    return address == "local" or host in ("localhost", "::1") or host.startswith("127.")


def require_ray(address: str | None = None):
    """The ``ray`` module; PlacementError naming the extra to install when it is missing. For a loopback
    ``address``, Ray is told before its import to stay on 127.0.0.1 (it would put its own address on the
    machine's outward IP otherwise)."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if address is not None and is_loopback(address):
        os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    try:
        import ray
    except ImportError as e:
        raise PlacementError(f"{RAY_MISSING} ({e})") from None
    return ray


RAY_CURRENT_CLUSTER = "/tmp/ray/ray_current_cluster"
"""Where Ray records the address of the cluster started last on this machine (what ``auto`` joins without
RAY_ADDRESS)."""


def resolve_address(
    address: str, environ: Mapping[str, str] | None = None, current_cluster: str = RAY_CURRENT_CLUSTER
) -> str | None:
    """The HOST:PORT ``address`` stands for: itself, or for ``auto`` RAY_ADDRESS or the cluster Ray recorded on
    this machine; None when ``auto`` names none we can read."""
    if address != "auto":
        return address
    env = os.environ if environ is None else environ
    if env.get("RAY_ADDRESS"):
        return env["RAY_ADDRESS"].removeprefix("ray://")
    try:
        with open(current_cluster, encoding="utf-8") as f:
            return f.readline().strip() or None
    except OSError:
        return None


def ray_auth_problem(
    address: str,
    insecure: bool,
    environ: Mapping[str, str] | None = None,
    home: str | None = None,
    current_cluster: str = RAY_CURRENT_CLUSTER,
) -> tuple[str, str] | None:
    """Whether joining the Ray cluster at ``address`` is safe: None (``local``, a loopback cluster, or token
    authentication on with a token at hand), else ``(verdict, message)`` with verdict ``refuse``, or ``warn``
    when ``insecure`` (``--insecure``) accepts the risk. Whoever can reach a Ray cluster without authentication
    can run any code on every node, the learner's included (its keys, checkpoints and run directory): a cluster
    beyond loopback needs RAY_AUTH_MODE=token and a token (RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH or
    ~/.ray/auth_token) on every node and here."""
    env = os.environ if environ is None else environ
    resolved = resolve_address(address, env, current_cluster)
    if address == "local" or (resolved is not None and is_loopback(resolved)):
        return None
    where = f"the Ray cluster at {address}" + (f" ({resolved})" if resolved not in (None, address) else "")
    if env.get("RAY_AUTH_MODE", "").strip().lower() == "token":
        token_path = env.get("RAY_AUTH_TOKEN_PATH") or os.path.join(
            home if home is not None else os.path.expanduser("~"), ".ray", "auth_token"
        )
        if env.get("RAY_AUTH_TOKEN") or os.path.isfile(token_path):
            return None
        problem = (
            f"RAY_AUTH_MODE=token but no token here (set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH, or write {token_path})"
        )
    else:
        problem = (
            f"it is not on loopback and token authentication is off (RAY_AUTH_MODE="
            f"{env.get('RAY_AUTH_MODE', 'unset')!s}): whoever can reach it can run any code on every node, "
            "the learner's included. Start the cluster and this launcher with RAY_AUTH_MODE=token and a "
            'token (docs/running.md, "Security")'
        )
    if insecure:
        return "warn", f"WARNING: joining {where} although {problem} (--insecure)"
    return "refuse", f"refusing to join {where}: {problem}; or pass --insecure to accept the risk"


def host_name(launcher_pid: int, child: str) -> str:
    """The Ray actor name of a child's host (namespace NAMESPACE), for tools and tests: ``PID.CHILD``."""
    return f"{launcher_pid}.{child}"


def connect(address: str, num_cpus: int) -> None:
    """Join the cluster at ``address`` (auto, HOST:PORT) or start a private one (local; ``ray.shutdown()``
    stops it)."""
    ray = require_ray(address)
    common: dict[str, Any] = dict(namespace=NAMESPACE, log_to_driver=False, configure_logging=False)
    if address == "local":
        ray.init(
            num_cpus=num_cpus,
            resources={REPLAY_RESOURCE: 1.0},
            include_dashboard=False,
            object_store_memory=LOCAL_OBJECT_STORE,
            _node_ip_address="127.0.0.1",
            **common,
        )
        return
    if is_loopback(address):
        common["_node_ip_address"] = "127.0.0.1"
    try:
        ray.init(address=address, **common)
    except ConnectionError as e:
        raise PlacementError(f"cannot join the Ray cluster at {address}: {e}") from None


def _pick_ports(n: int, base: int = 0) -> dict[str, Any]:
    """On the head: its IP, node id and ``n`` free ports there (``base ..`` when given), or ``error``."""
    import ray

    from apexrl.launch.local import free_ports

    ip = ray.util.get_node_ip_address()
    try:
        ports = free_ports(n, ip, base)
    except PlacementError as e:  # a plain message: the exception class need not travel back through Ray
        return {"error": str(e)}
    return {"ip": ip, "node_id": ray.get_runtime_context().get_node_id(), "ports": ports}


class RayChild(SupervisedChild):
    """A child whose process runs in a :class:`ProcessHost` actor. Never blocks: :meth:`pump` (called by the
    launcher's loop) collects what the last poll brought and sends the next, and signals wait for it too (so
    :meth:`send` is safe in a signal handler). Results of an earlier start of the process are ignored."""

    def __init__(self, spec, log_path: str, host, episodes_path: str | None):
        super().__init__(spec, log_path)
        self.host = host
        self.paths = {"log": log_path, "progress": spec.progress_path, "episodes": episodes_path}
        self._code: int | None = None
        self._state = "idle"  # idle, starting, running, exited
        self._lost: str | None = None
        self._info: dict[str, Any] = {}
        self._start_ref = None
        self._start_args: list[str] | None = None  # of a start not yet confirmed by the host
        self._retry_start_at = 0.0
        self._poll: tuple[Any, int] | None = None  # (ref, start it belongs to)
        self._next_poll = 0.0
        self._signal: int | None = None

    def start(self) -> None:
        args = self.spec.restart_args if self.starts and self.spec.restart_args is not None else self.spec.args
        if self.starts:
            self._append("log", f"=== apexrl run: restart {self.starts} at {time.strftime('%H:%M:%S')} ===\n")
        self._code, self._lost, self._info, self._signal = None, None, {}, None
        self._state = "starting"
        self._start_args = list(args)
        self._start_ref = self.host.start.remote(self.spec.module, self._start_args)
        self.starts += 1
        self.restart_at = None
        self._next_poll = 0.0

    def poll(self) -> int | None:
        return self._code

    @property
    def running(self) -> bool:
        return self._state in ("starting", "running")

    def send(self, sig: int) -> None:
        self._signal = sig  # the next pump delivers it

    def wait(self) -> None:
        deadline = time.monotonic() + STOP_WAIT_S
        while self.running and time.monotonic() < deadline:
            self.pump()
            time.sleep(0.1)
        if self.running:
            self._exited(LOST, "its Ray actor did not answer")

    @property
    def pid(self) -> int | None:
        return self._info.get("pid")

    @property
    def node(self) -> str | None:
        return self._info.get("node_id")

    @property
    def where(self) -> str:
        return f"pid {self.pid} on {self._info['ip']}" if self._info.get("pid") else "starting on Ray"

    def describe_exit(self, code: int) -> str:
        return f"its Ray actor was lost: {self._lost}" if self._lost else describe_exit(code)

    def started(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the host to have started the process; True once it has."""
        import ray

        deadline = time.monotonic() + timeout
        while self.pid is None and self.running and time.monotonic() < deadline:
            if self._start_ref is not None:
                ray.wait([self._start_ref], timeout=min(POLL_EVERY_S, max(deadline - time.monotonic(), 0)))
            else:
                time.sleep(0.1)
            self.pump()
        return self.pid is not None or not self.running

    # ------------------------------------------------------------------------------------------ polls

    def pump(self) -> bool:
        import ray

        started = False
        if self._signal is not None and self.running:
            self.host.signal.remote(self._signal)
        self._signal = None
        if self._start_ref is not None and ray.wait([self._start_ref], timeout=0)[0]:
            ref, self._start_ref = self._start_ref, None
            try:
                self._info = ray.get(ref)
                started, self._start_args = True, None
                if self._state == "starting":
                    self._state = "running"
            except ray.exceptions.ActorUnavailableError:  # Ray is still restarting the host: ask again soon
                self._retry_start_at = time.monotonic() + POLL_EVERY_S
            except ray.exceptions.RayError as e:
                self._exited(LOST, type(e).__name__)
        if (
            self._start_args is not None
            and self._start_ref is None
            and self._state == "starting"
            and time.monotonic() >= self._retry_start_at
        ):  # start is idempotent: safe to send again
            self._start_ref = self.host.start.remote(self.spec.module, self._start_args)
        if self._poll is not None and ray.wait([self._poll[0]], timeout=0)[0]:
            (ref, start), self._poll = self._poll, None
            try:
                self._take(ray.get(ref), start)
            except ray.exceptions.RayError as e:
                if start == self.starts:
                    self._exited(LOST, type(e).__name__)
        if self._poll is None and time.monotonic() >= self._next_poll and self._state != "idle":
            self._poll = (self.host.report.remote(), self.starts)
            self._next_poll = time.monotonic() + POLL_EVERY_S
        return started

    def _take(self, report: dict[str, Any], start: int) -> None:
        for kind, text in report["lines"].items():
            if text:
                self._append(kind, text)
        if start != self.starts or not self.running:
            return  # about an earlier start of the process
        if report["state"] == "exited":
            self._exited(int(report["code"]), None)
        elif report["state"] == "none" and self._start_args is None:
            self._exited(LOST, "Ray restarted it, without the process")

    def _exited(self, code: int, lost: str | None) -> None:
        if self.running:
            self._code, self._lost, self._state = code, lost, "exited"
            self._start_args = self._start_ref = None

    def _append(self, kind: str, text: str) -> None:
        path = self.paths[kind]
        if path is None:
            return
        if kind == "episodes":
            text = "".join(ln for ln in text.splitlines(keepends=True) if not ln.startswith("time_s,"))
            if not os.path.exists(path) or os.path.getsize(path) == 0:
                text = ",".join(EPISODE_COLUMNS) + "\n" + text
        with open(path, "a", encoding="utf-8") as f:
            f.write(text)

    def close(self) -> None:
        """After the run: last lines, then the host goes (for good) and its node-local folder with it."""
        import ray

        try:
            report = ray.get(self.host.report.remote(), timeout=STOP_WAIT_S)
            for kind, text in report["lines"].items():
                if text:
                    self._append(kind, text)
            ray.get(self.host.close.remote(), timeout=STOP_WAIT_S)
        except (ray.exceptions.RayError, TimeoutError):
            pass
        ray.kill(self.host, no_restart=True)
        self._state, self._start_ref, self._poll = "idle", None, None


class RayLauncher(Launcher):
    """Runs one Ape-X system on a Ray cluster; :meth:`run` returns the exit status (2: it could not be
    placed)."""

    def __init__(
        self,
        plan: RunPlan,
        address: str,
        *,
        actor_cpus: float = 1.0,
        server_log_level: str = "WARNING",
        out: TextIO | None = None,
        tensorboard: str | None = None,
    ):
        super().__init__(plan, server_log_level=server_log_level, out=out, tensorboard=tensorboard)
        self.address = address
        self.actor_cpus = actor_cpus

    def run(self) -> int:
        ray = None
        try:
            verdict = ray_auth_problem(self.address, self.plan.server.insecure)
            if verdict is not None and verdict[0] == "refuse":
                raise PlacementError(verdict[1])
            if verdict is not None:
                self._print(verdict[1])
                print(f"apexrl run: {verdict[1]}", file=sys.stderr, flush=True)
            ray = require_ray(self.address)
            needed = len(self.plan.servers) + 1 + math.ceil(len(self.plan.actors) * self.actor_cpus)
            connect(self.address, max(needed, os.cpu_count() or 1))
            return super().run()
        except PlacementError as e:
            self._print(f"apexrl run: error: {e}")
            return 2
        finally:
            if ray is not None and ray.is_initialized():
                ray.shutdown()  # leaves a joined cluster, stops a private one

    def _place(self) -> list[SupervisedChild]:
        ray = require_ray()
        if ray.cluster_resources().get(REPLAY_RESOURCE, 0) < HEAD_SHARE * (len(self.plan.servers) + 1):
            raise PlacementError(
                f"no node of the cluster offers the resource {REPLAY_RESOURCE} for the replay "
                f"server(s) and the learner: start the head with ray start --head --resources "
                f"'{{\"{REPLAY_RESOURCE}\": 1}}'"
            )
        head = self._head_options(num_cpus=0)
        try:
            where = ray.get(
                ray.remote(_pick_ports).options(**head).remote(len(self.plan.servers) + 1, self.plan.run.port_base),
                timeout=PLACE_TIMEOUT_S,
            )
        except ray.exceptions.GetTimeoutError:
            raise PlacementError(
                f"Ray did not place a task on the {REPLAY_RESOURCE} node within {PLACE_TIMEOUT_S:.0f} s"
            ) from None
        if "error" in where:
            raise PlacementError(where["error"])
        here = ray.util.get_node_ip_address()
        if where["ip"] != here:
            raise PlacementError(
                f"run apexrl run --ray on the head node ({where['ip']}, the one with "
                f"{REPLAY_RESOURCE}; this is {here}): the learner writes {self.run_dir} there"
            )
        placed = self._placed(where["ip"], where["ports"])
        path = os.path.join(self.run_dir, PLAN_NAME)
        placed.save(path)  # the record of the run; each host writes its own copy on its node
        plan_json = placed.to_json()
        episodes = os.path.join(self.run_dir, "episodes.csv")
        children: list[SupervisedChild] = []
        host_cls = ray.remote(max_restarts=-1, max_task_retries=0)(ProcessHost)
        for spec in child_specs(placed, PLAN_ARG, self.server_log_level):
            index = int(spec.args[spec.args.index("--index") + 1]) if "--index" in spec.args else 0
            host = host_cls.options(name=host_name(os.getpid(), spec.name), **self._options(spec.role)).remote(
                spec.name, spec.role, index, plan_json
            )
            children.append(
                RayChild(
                    spec,
                    os.path.join(self.log_dir, f"{spec.name}.log"),
                    host,
                    episodes if spec.role == "actor" else None,
                )
            )
        return children

    def _placed(self, ip: str, ports: list[int]) -> RunPlan:
        """The plan on the head at ``ip``: the services bind it and everyone reaches them there."""
        *server_ports, params_port = ports
        self.server_endpoints = [f"tcp://{ip}:{port}" for port in server_ports]
        self.params_endpoint = f"tcp://{ip}:{params_port}"
        placed = self.plan.placed(
            replay=self.server_endpoints,
            server_port=server_ports,
            params=self.params_endpoint,
            params_port=params_port,
            logs=self.log_dir,
        )
        try:
            return dataclasses.replace(
                placed,
                servers=[dataclasses.replace(s, bind=ip) for s in placed.servers],
                learner=dataclasses.replace(placed.learner, params_bind=ip),
            )
        except ValueError as e:  # beyond loopback without keys (apexrl.security.check_exposure)
            raise PlacementError(str(e)) from None

    def _head_options(self, num_cpus: float) -> dict[str, Any]:
        return {"resources": {REPLAY_RESOURCE: HEAD_SHARE}, "num_cpus": num_cpus}

    def _options(self, role: str) -> dict[str, Any]:
        if role == "actor":
            return {"num_cpus": self.actor_cpus, "scheduling_strategy": "SPREAD"}
        options = self._head_options(num_cpus=1)
        if role == "learner" and self._learner_gpus():
            options["num_gpus"] = 1
        return options

    def _learner_gpus(self) -> bool:
        """Whether the learner gets a GPU: it asks for CUDA, or for ``auto`` on a cluster that has GPUs (Ray
        hides the GPUs from an actor without one)."""
        import ray

        device = self.plan.learner.device
        return device.startswith("cuda") or (device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)

    def _await_started(self, children: list[SupervisedChild]) -> None:
        deadline = time.monotonic() + PLACE_TIMEOUT_S
        for child in children:
            assert isinstance(child, RayChild)
            if not child.started(max(deadline - time.monotonic(), 0.1)):
                self._print(
                    f"{child.spec.name} is still waiting for Ray to place it (too few CPUs in the "
                    f"cluster?); it starts when it can"
                )
        self._write_pids()

    def _close(self) -> None:
        for child in self.children:
            assert isinstance(child, RayChild)
            child.close()

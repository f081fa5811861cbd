"""Authenticated, encrypted transport (CURVE + a ZAP allow-list) on both services, with real processes on
127.0.0.1: keys from `apexrl keygen`, clients with the wrong key or none get nothing and change nothing, binding
beyond loopback without keys is refused, and `apexrl run` trains with CURVE on."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from apexrl.apex.metrics import read_csv
from apexrl.errors import AuthenticationError, ReplayTimeout
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.server.config import ServerConfig
from apexrl.security import (
    ENV_VAR,
    ClientKeys,
    CurveKeyError,
    check_exposure,
    is_loopback,
    load_client_keys,
    load_server_keys,
)

INTRUDER_TIMEOUT = 3.0
FAST_LEARNER = "--min-replay-size 300 --eval-every 0 --metrics-every 1 --checkpoint-every 100"


def _apexrl(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexrl", *args], capture_output=True, text=True, timeout=timeout, env=env
    )


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


@pytest.fixture
def keys(tmp_path):
    """A key directory written by the real `apexrl keygen`."""
    out = _apexrl("keygen", str(tmp_path / "keys"))
    assert out.returncode == 0, out.stderr
    return str(tmp_path / "keys")


@pytest.fixture
def other_keys(tmp_path):
    out = _apexrl("keygen", str(tmp_path / "other"))
    assert out.returncode == 0, out.stderr
    return str(tmp_path / "other")


def _intruders(keys: str, other_keys: str) -> dict[str, ClientKeys | None]:
    """Clients the server must refuse: a key pair not on its allow-list, no keys, and the right client key
    with another server's public key."""
    mine, theirs = load_client_keys(keys), load_client_keys(other_keys)
    return {
        "unauthorized key": ClientKeys(theirs.public, theirs.secret, mine.server_public, other_keys),
        "no key": None,
        "wrong server key": ClientKeys(mine.public, mine.secret, theirs.server_public, keys),
    }


def _expect_refused(kind: str, call, t0: float) -> None:
    """The refusal each intruder gets: at once for a refused key, else a timeout that says why."""
    if kind == "unauthorized key":
        with pytest.raises(AuthenticationError, match="refused this .* CURVE key .* authorized/"):
            call()
        assert time.monotonic() - t0 < INTRUDER_TIMEOUT  # detected from the handshake, not by waiting out
    elif kind == "no key":
        with pytest.raises(ReplayTimeout, match="handshake failed .* probably requires CURVE: give --curve-dir"):
            call()
    else:
        with pytest.raises(ReplayTimeout, match="handshake failed .* server public key in .* is not this"):
            call()


# ------------------------------------------------------------------------------------------ keys


def test_keygen_writes_two_key_pairs_with_private_secrets_and_never_overwrites(keys):
    names = sorted(os.listdir(keys))
    assert names == ["authorized", "client.key", "client.key_secret", "server.key", "server.key_secret"]
    for name in ("client.key_secret", "server.key_secret"):
        assert stat.S_IMODE(os.stat(os.path.join(keys, name)).st_mode) == 0o600, name
    server, client = load_server_keys(keys), load_client_keys(keys)
    assert server.allowed == {client.public}  # the client is on the allow-list
    assert client.server_public == server.public and client.public != server.public
    assert len(server.secret) == len(client.secret) == 40

    before = {n: _bytes(os.path.join(keys, n)) for n in names if n != "authorized"}
    out = _apexrl("keygen", keys)
    assert out.returncode == 1
    assert "already holds keys" in out.stderr and "never overwritten" in out.stderr
    assert {n: _bytes(os.path.join(keys, n)) for n in before} == before


def test_a_secret_key_readable_by_others_or_a_missing_key_is_refused_with_the_reason(keys, tmp_path):
    secret = os.path.join(keys, "server.key_secret")
    os.chmod(secret, 0o644)
    with pytest.raises(CurveKeyError, match=r"accessible by group or others \(mode 0644\): run `chmod 600"):
        load_server_keys(keys)
    with pytest.raises(ValueError, match="accessible by group or others"):
        ServerConfig(curve_dir=keys)
    os.chmod(secret, 0o600)
    load_server_keys(keys)

    with pytest.raises(CurveKeyError, match="client.key_secret: No such file .*apexrl keygen"):
        load_client_keys(tmp_path / "nowhere")
    for key in os.listdir(os.path.join(keys, "authorized")):
        os.remove(os.path.join(keys, "authorized", key))
    with pytest.raises(CurveKeyError, match="holds no client key"):
        load_server_keys(keys)


# ------------------------------------------------------------------------------------------ replay service


@pytest.mark.parametrize("kind", ["unauthorized key", "no key", "wrong server key"])
def test_replay_server_with_curve_gives_a_client_without_the_right_keys_nothing(start_server, keys, other_keys, kind):
    server = start_server("--curve-dir", keys)
    with ReplayClient(server.endpoint, timeout=30, curve=keys) as good:
        inserted = good.insert(np.ones(5), [b"item%d" % i for i in range(5)])
        before = good.stats()
        with ReplayClient(server.endpoint, timeout=INTRUDER_TIMEOUT, curve=_intruders(keys, other_keys)[kind]) as bad:
            for call in (
                lambda: bad.insert(np.ones(2), [b"evil", b"evil"]),
                lambda: bad.update_priorities(inserted, np.full(5, 100.0)),
                lambda: bad.sample(1),
                bad.stats,
            ):
                _expect_refused(kind, call, time.monotonic())
        after = good.stats()
        # The server saw none of the intruder's requests: only the authorized client's own STATS counts.
        assert after["requests_total"] == before["requests_total"] + 1
        assert after["errors_total"] == before["errors_total"]
        assert after["size"] == before["size"] == 5
        assert after["requests_update_priorities"] == before["requests_update_priorities"] == 0
        got = good.sample(64)
        assert {bytes(item) for item in got.items} <= {b"item%d" % i for i in range(5)}
    assert server.alive()


def test_an_actor_whose_key_is_not_authorized_exits_with_the_reason(start_server, keys, other_keys):
    server = start_server("--curve-dir", keys)
    shutil.copy(os.path.join(keys, "server.key"), os.path.join(other_keys, "server.key"))  # right server, own key
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.cli.actor",
            "--preset",
            "cartpole",
            "--replay",
            server.endpoint,
            "--params",
            server.endpoint,
            "--index",
            "0",
            "--num-actors",
            "1",
            "--curve-dir",
            other_keys,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "apexrl-actor: error: " in out.stderr and "refused this " in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    with ReplayClient(server.endpoint, timeout=30, curve=keys) as good:
        assert good.stats()["requests_total"] == 1  # this STATS: nothing of the actor's got through


def test_a_plain_server_names_the_mismatch_to_a_curve_client(start_server, keys):
    server = start_server()
    with ReplayClient(server.endpoint, timeout=INTRUDER_TIMEOUT, curve=keys) as c:
        with pytest.raises(ReplayTimeout, match="handshake failed .* or the server does not use CURVE"):
            c.stats()


# ------------------------------------------------------------------------------------------ parameter service


@pytest.mark.parametrize("kind", ["unauthorized key", "no key", "wrong server key"])
def test_parameter_service_with_curve_gives_a_client_without_the_right_keys_nothing(keys, other_keys, kind):
    torch = pytest.importorskip("torch")
    from apexrl.params.service import ParamClient, ParamServer

    with ParamServer(curve=keys) as server:
        server.publish({"w": torch.arange(4, dtype=torch.float32)})
        with ParamClient(server.endpoint, timeout=30, curve=keys) as good:
            version, tensors = good.fetch(0)
            assert version == 1 and tensors["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
        before = server.stats()
        with ParamClient(server.endpoint, timeout=INTRUDER_TIMEOUT, curve=_intruders(keys, other_keys)[kind]) as bad:
            _expect_refused(kind, lambda: bad.fetch(0), time.monotonic())
        assert server.stats() == before  # no request reached the service
    # close() returned: the ZAP handler thread ended with the context


# ------------------------------------------------------------------------------------------ exposure


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("*", False),
        ("10.0.0.5", False),
        ("::", False),
        ("eth0", False),
        ("example.org", False),
    ],
)
def test_loopback_is_127_8_localhost_and_ipv6_one(host, loopback):
    assert is_loopback(host) is loopback
    if not loopback:
        with pytest.raises(ValueError, match="not a loopback address and no CURVE keys"):
            check_exposure(host, None, False, "bind")
        check_exposure(host, None, True, "bind")  # --insecure
        check_exposure(host, "/some/keys", False, "bind")


def test_binding_beyond_loopback_without_keys_is_refused_unless_insecure(keys):
    out = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--bind", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "bind '0.0.0.0' is not a loopback address and no CURVE keys are given" in out.stderr
    assert "apexrl keygen DIR" in out.stderr and "--insecure" in out.stderr
    # The learner's parameter service: the same rule, the same function.
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl.cli.learner",
            "--agent",
            "dqn",
            "--env",
            "gym:CartPole-v1",
            "--replay",
            "tcp://127.0.0.1:9",
            "--params-port",
            "0",
            "--params-bind",
            "0.0.0.0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "params_bind '0.0.0.0' is not a loopback address and no CURVE keys are given" in out.stderr
    out = _apexrl("run", "--server-args", "--bind 0.0.0.0")
    assert out.returncode == 2 and "bind '0.0.0.0' is not a loopback address" in out.stderr
    # Keys or --insecure lift the refusal (validated only: tests never bind beyond loopback).
    ServerConfig(bind="0.0.0.0", curve_dir=keys)
    ServerConfig(bind="0.0.0.0", insecure=True)


# ------------------------------------------------------------------------------------------ apexrl run


def test_apexrl_run_with_curve_from_the_environment_trains(keys, tmp_path):
    run_dir = str(tmp_path / "run")
    env = {**os.environ, ENV_VAR: keys}
    out = _apexrl(
        "run",
        "--run-dir",
        run_dir,
        "--minutes",
        "4",
        "--steps",
        "100",
        "--final-eval",
        "0",
        "--actors",
        "1",
        "--quiet",
        f"--learner-args={FAST_LEARNER}",
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"CURVE on both services (keys in {keys})" in out.stdout
    assert "stopping: reached --steps 100" in out.stdout
    assert read_csv(os.path.join(run_dir, "metrics.csv"))["learner_steps"][-1] == 100
    with open(os.path.join(run_dir, "plan.json"), encoding="utf-8") as f:
        plan = json.load(f)
    assert plan["servers"][0]["curve_dir"] == plan["learner"]["curve_dir"] == keys
    # the actors got their own key (role actor: insert, not sample or evict), issued by apexrl run
    assert plan["actors"][0]["curve_dir"] == os.path.join(keys, "actors", "run")
    assert "issued the actors' own key (role actor)" in out.stdout
    assert sorted(os.listdir(os.path.join(keys, "authorized"))) == ["actor.run.key", "learner.key"]
    assert sorted(os.listdir(os.path.join(keys, "actors", "run"))) == ["client.key", "client.key_secret", "server.key"]
    episodes = read_csv(os.path.join(run_dir, "episodes.csv"))
    assert len(episodes["return"]) > 0  # the actor's inserts reached the server through CURVE


# ------------------------------------------------------------------------------------------ ZAP fails closed


def _wait_event(monitor, wanted: set[int], timeout: float = 30.0) -> int:
    """The first socket-monitor event in ``wanted`` (others are skipped); fails after ``timeout`` seconds."""
    from zmq.utils.monitor import recv_monitor_message

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if monitor.poll(200):
            event = recv_monitor_message(monitor)["event"]
            if event in wanted:
                return event
    raise AssertionError(f"no monitor event in {wanted} within {timeout}s")


def _crash_zap_handler(ctx, endpoint: str, keys: str, monkeypatch):
    """Make the ZAP handler of ``ctx`` die as a bug would (its next answer raises; a throwaway client's handshake
    asks it one); returns (the dead handler, that client's socket) once its thread is gone."""
    import zmq

    from apexrl.security import ZapHandler

    handler = ZapHandler.of(ctx)
    assert handler is not None and handler.alive()

    def boom(msg):
        raise RuntimeError("injected ZAP handler fault")

    monkeypatch.setattr(handler, "_answer", boom)
    trigger = ctx.socket(zmq.DEALER)
    trigger.setsockopt(zmq.LINGER, 0)
    trigger.curve_publickey, trigger.curve_secretkey = zmq.curve_keypair()
    trigger.curve_serverkey = load_client_keys(keys).server_public
    trigger.connect(endpoint)
    deadline = time.monotonic() + 30
    while handler.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not handler.alive(), "the ZAP handler did not die"
    return handler, trigger


@pytest.mark.parametrize("enforce", [True, False], ids=["enforced", "libzmq-default"])
def test_a_dead_zap_handler_refuses_even_an_authorized_key(keys, monkeypatch, caplog, enforce):
    """secure_server_socket sets ZMQ_ZAP_ENFORCE_DOMAIN: once its ZAP handler is gone a fresh connection with an
    authorized key is refused. The control case (the option turned back off) shows libzmq's default, which
    lets every key in: the failure this option exists for."""
    import zmq

    from apexrl.security import secure_client_socket, secure_server_socket

    ctx = zmq.Context()
    failures: list[str] = []
    server = ctx.socket(zmq.ROUTER)
    try:
        secure_server_socket(server, keys, on_zap_failure=failures.append)
        assert server.getsockopt(zmq.ZAP_ENFORCE_DOMAIN) == 1
        if not enforce:
            server.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 0)
        server.setsockopt(zmq.LINGER, 0)
        server.bind("tcp://127.0.0.1:0")
        endpoint = server.getsockopt_string(zmq.LAST_ENDPOINT)
        monitor = server.get_monitor_socket()

        _, _trigger = _crash_zap_handler(ctx, endpoint, keys, monkeypatch)
        assert len(failures) == 1 and "injected ZAP handler fault" in failures[0]
        assert any(r.levelname == "CRITICAL" and "ZAP handler crashed" in r.getMessage() for r in caplog.records)

        client = ctx.socket(zmq.DEALER)  # the right keys, a fresh connection
        client.setsockopt(zmq.LINGER, 0)
        secure_client_socket(client, keys)
        client.connect(endpoint)
        client.send(b"hello")
        event = _wait_event(
            monitor,
            {
                zmq.EVENT_HANDSHAKE_SUCCEEDED,
                zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL,
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL,
                zmq.EVENT_HANDSHAKE_FAILED_AUTH,
            },
        )
        if enforce:
            assert event != zmq.EVENT_HANDSHAKE_SUCCEEDED
            assert not server.poll(500)  # and nothing of the client's arrives
        else:
            assert event == zmq.EVENT_HANDSHAKE_SUCCEEDED
            assert server.poll(30_000) and server.recv_multipart()[-1] == b"hello"
        server.disable_monitor()
    finally:
        ctx.destroy(linger=0)  # closes every socket left open, so a failed assertion fails instead of hanging


def test_the_parameter_service_stops_with_a_critical_line_when_its_zap_handler_dies(keys, monkeypatch, caplog):
    torch = pytest.importorskip("torch")
    import threading

    from apexrl.params.service import ParamClient, ParamServer

    told = threading.Event()
    with ParamServer(curve=keys, on_failure=lambda reason: told.set()) as server:
        server.publish({"w": torch.zeros(2)})
        with ParamClient(server.endpoint, timeout=30, curve=keys) as good:
            assert good.fetch(0)[0] == 1
        _, trigger = _crash_zap_handler(server._ctx, server.endpoint, keys, monkeypatch)
        assert told.wait(30), "the service was not told that its ZAP handler died"
        assert "ZAP handler is gone" in server.failure and "injected ZAP handler fault" in server.failure
        deadline = time.monotonic() + 30
        while server._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not server._thread.is_alive()  # the serving thread ended by itself
        assert any(
            r.levelname == "CRITICAL" and r.name == "apexrl.params.service" and "stops" in r.getMessage()
            for r in caplog.records
        )
        trigger.close(linger=0)


# ------------------------------------------------------------------------------------------ key files


def test_key_directories_are_private_and_loaders_refuse_ones_others_could_change(keys):
    """keygen makes DIR and DIR/authorized 0700; a key directory or key file writable by group or others, or owned
    by another user, is refused with the reason (nothing is loaded), as ssh refuses such files."""
    auth = os.path.join(keys, "authorized")
    for d in (keys, auth):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d
    for path, loader in ((keys, load_server_keys), (keys, load_client_keys), (auth, load_server_keys)):
        os.chmod(path, 0o770)
        with pytest.raises(
            CurveKeyError,
            match=rf"{path} is writable by group or others \(mode 0770\): run "
            rf"`chmod go-w {path}`",
        ):
            loader(keys)
        os.chmod(path, 0o700)
    for name, loader in (("server.key", load_client_keys), ("authorized/learner.key", load_server_keys)):
        path = os.path.join(keys, name)
        os.chmod(path, 0o646)
        with pytest.raises(CurveKeyError, match="writable by group or others"):
            loader(keys)
        os.chmod(path, 0o644)
    if os.geteuid() == 0:  # only root can give a file to another user
        for name, loader in (
            ("client.key_secret", load_client_keys),
            ("server.key", load_client_keys),
            ("authorized/learner.key", load_server_keys),
            ("", load_server_keys),
        ):
            path = os.path.join(keys, name) if name else keys
            os.chown(path, 65534, -1)
            with pytest.raises(CurveKeyError, match=r"is owned by uid 65534, not by this user \(uid 0\) or root"):
                loader(keys)
            os.chown(path, 0, -1)
    load_server_keys(keys), load_client_keys(keys)  # restored: loads again


# ------------------------------------------------------------------------------------------ identities and roles


def test_keygen_issues_one_key_per_actor_host_that_holds_no_server_secret(keys, start_server):
    out = _apexrl("keygen", keys, "--role", "actor", "--name", "host3")
    assert out.returncode == 0, out.stderr
    node = os.path.join(keys, "actors", "host3")
    assert sorted(os.listdir(node)) == ["client.key", "client.key_secret", "server.key"]  # never a server secret
    assert stat.S_IMODE(os.stat(node).st_mode) == 0o700
    assert f"copy {node} to the actor's host" in out.stdout
    assert sorted(os.listdir(os.path.join(keys, "authorized"))) == ["actor.host3.key", "learner.key"]
    server, actor, learner = load_server_keys(keys), load_client_keys(node), load_client_keys(keys)
    assert dict(server.identities) == {learner.public: "learner", actor.public: "actor:host3"}
    assert actor.server_public == server.public and actor.public != learner.public

    before = sorted(os.listdir(os.path.join(keys, "authorized")))
    for args, message in (
        (("--role", "actor", "--name", "host3"), "already holds keys"),
        (("--role", "actor"), "an actor key needs --name"),
        (("--role", "actor", "--name", "../evil"), "an actor key needs --name"),
        (("--role", "learner", "--name", "x"), "has no --name"),
    ):
        out = _apexrl("keygen", keys, *args)
        assert out.returncode == 1 and message in out.stderr, (args, out.stderr)
    assert sorted(os.listdir(os.path.join(keys, "authorized"))) == before  # nothing written
    out = _apexrl("keygen", os.path.join(os.path.dirname(keys), "empty"), "--role", "actor", "--name", "a")
    assert out.returncode == 1 and "holds no server keys: create them first" in out.stderr

    srv = start_server("--curve-dir", keys)  # the actor's directory is all an actor host needs
    with ReplayClient(srv.endpoint, timeout=30, curve=node) as client:
        assert len(client.insert(np.ones(2), [b"a", b"b"])) == 2 and client.stats()["size"] == 2


def test_roles_name_the_ops_each_client_may_send():
    from apexrl.replay.wire.schema import Op
    from apexrl.security import ROLE_OPS, may, role_of, user_id_of_file

    assert ROLE_OPS["actor"] == {Op.HELLO, Op.INSERT, Op.STATS, Op.GET_PARAMS}
    assert ROLE_OPS["learner"] == set(Op)
    assert [role_of(u) for u in ("learner", "actor:host3", "client")] == ["learner", "actor", "learner"]
    for bad in ("actor", "actor:", "guest:x", "learner:x", ""):
        with pytest.raises(ValueError, match="unknown client identity"):
            role_of(bad)
        assert not may(bad, Op.GET_PARAMS)
    assert may("actor:h", Op.INSERT) and not may("actor:h", Op.SAMPLE) and not may("actor:h", Op.ERASE)
    assert may("learner", Op.SAMPLE) and may("client", Op.UPDATE_PRIORITIES)
    assert [
        user_id_of_file(n)
        for n in (
            "learner.key",
            "actor.h.example.org.key",
            "client.key",
            "alice.key",
            "actor..key",
            "learner.key_secret",
        )
    ] == ["learner", "actor:h.example.org", "client", None, None, None]


def test_an_allow_list_file_without_a_role_is_refused_and_an_old_client_key_keeps_working(keys):
    auth = os.path.join(keys, "authorized")
    os.rename(os.path.join(auth, "learner.key"), os.path.join(auth, "client.key"))  # a directory made before roles
    assert set(load_server_keys(keys).identities.values()) == {"client"}
    shutil.copy(os.path.join(auth, "client.key"), os.path.join(auth, "alice.key"))
    with pytest.raises(CurveKeyError, match=r"alice.key: an allow-list file is named learner.key, actor.NAME.key"):
        load_server_keys(keys)


def test_the_parameter_service_reads_the_user_id_and_refuses_an_identity_without_the_right(keys):
    """An actor's key fetches weights; an identity whose role may not (here one the ZAP handler was given
    directly: the loader refuses such file names) gets a clear error and nothing else."""
    torch = pytest.importorskip("torch")
    import dataclasses

    import zmq

    from apexrl.errors import ServerError
    from apexrl.params.service import ParamClient, ParamServer

    assert _apexrl("keygen", keys, "--role", "actor", "--name", "a1").returncode == 0
    server_keys = load_server_keys(keys)
    guest_public, guest_secret = zmq.curve_keypair()
    with_guest = dataclasses.replace(
        server_keys,
        allowed=server_keys.allowed | {guest_public},
        identities={**server_keys.identities, guest_public: "guest:x"},
    )
    guest = ClientKeys(guest_public, guest_secret, server_keys.public, keys)
    with ParamServer(curve=with_guest) as server:
        server.publish({"w": torch.ones(3)})
        with ParamClient(server.endpoint, timeout=30, curve=os.path.join(keys, "actors", "a1")) as actor:
            assert actor.fetch(0)[0] == 1
        with ParamClient(server.endpoint, timeout=30, curve=guest) as intruder:
            with pytest.raises(ServerError, match=r"permission denied: client 'guest:x' may not send GET_PARAMS"):
                intruder.fetch(0)
        stats = server.stats()
        assert stats["forbidden"] == 1 and stats["params"] == 1


# ------------------------------------------------------------------------------------------ connections


def test_the_parameter_service_closes_a_connection_that_never_completes_its_handshake():
    """limit_idle_connections (the replay server's settings) on the parameter service: a raw TCP peer that
    never speaks ZMTP is disconnected after the handshake interval (5 s) instead of holding a descriptor."""
    pytest.importorskip("torch")
    import socket

    from apexrl.params.service import ParamServer

    with ParamServer() as server:
        host, port = server.endpoint.removeprefix("tcp://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=30) as s:
            t0 = time.monotonic()
            while s.recv(4096):  # libzmq's greeting, then EOF when it gives up on us
                pass
            assert 3 < time.monotonic() - t0 < 30


def test_exposure_without_curve_is_warned_and_the_open_file_limit_is_raised(caplog):
    import logging

    from apexrl.security import warn_if_exposed

    with caplog.at_level(logging.INFO, logger="apexrl.security"):
        assert warn_if_exposed("0.0.0.0", None, "the replay server")
        assert not warn_if_exposed("127.0.0.1", None, "x") and not warn_if_exposed("0.0.0.0", "/keys", "x")
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "the replay server listens on 0.0.0.0 WITHOUT CURVE" in warned[0].getMessage()
    code = (
        "import resource, logging; from apexrl.security import raise_nofile_limit as r; "
        "h = resource.getrlimit(resource.RLIMIT_NOFILE)[1]; "
        "resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, h), h)); soft, hard = r('test'); "
        "assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == soft and (soft == hard or hard == -1), soft; "
        "print('ok', soft)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("ok"), out.stdout + out.stderr

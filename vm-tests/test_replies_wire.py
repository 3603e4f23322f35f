"""The helper's typed replies put on the wire exactly the objects it sent before they were typed.

Each op runs through the real Dispatcher and CapsuleManager on a real capsule; the
result must equal the dict the manager used to build by hand (written out here from its
parts), and read back by the op's reply class it must give the same object again.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import egress, in_force, mountinfo, namespaces, syscalls
from sandbox.errors import CcwError
from sandbox.manager import CapsuleManager
from sandbox.ops import OPS, REQUESTS
from sandbox.opsurface import SURFACE
from sandbox.protocol import PROTOCOL_VERSION, Request, encode_reply
from sandbox.server import Dispatcher, Peer

ROOT_PEER = Peer(pid=1, uid=0, gid=0)
USAGE_KEYS = {"cpu_ms", "rss_max_kb", "rss_max_process_kb", "io_read_kb", "io_write_kb"}


@pytest.fixture
def served(root_required: None, tmp_path: Path) -> Iterator[tuple[CapsuleManager, Dispatcher, Path]]:
    state, ws = tmp_path / "state", tmp_path / "ws"
    state.mkdir()
    ws.mkdir()
    (ws / "old.txt").write_text("old\n")
    manager = CapsuleManager(str(state), rootless=False)
    manager.recover()
    mechanisms = in_force.mechanisms(False, manager.disks, manager.disk_reason)
    yield manager, Dispatcher(manager, "privileged", mechanisms), ws
    for item in reversed(manager.list(0).capsules):
        manager.destroy(item.capsule_id, 0)
    manager.close()
    if manager.disks is not None:
        manager.disks.close()
    assert mountinfo.mounts_under(str(state)) == []


def call(dispatcher: Dispatcher, op: str, args: dict[str, Any]) -> tuple[dict[str, Any], list[int]]:
    """One op through the dispatcher; the result also survives the JSON of a frame unchanged."""
    result, fds = dispatcher.handle(Request(1, op, args), ROOT_PEER)
    assert json.loads(json.dumps(result)) == result
    reply_class = REQUESTS[op].reply
    assert reply_class.from_args(result).to_args() == result
    assert encode_reply(1, result) == encode_reply(1, reply_class.from_args(result).to_args())
    return result, fds


def described(manager: CapsuleManager, result: dict[str, Any]) -> dict[str, Any]:
    """A create reply as registry.create built it by hand."""
    capsule = manager._capsules[result["capsule_id"]]
    datetime.datetime.fromisoformat(result["clock"])  # now, in the capsule's clock
    return {
        "capsule_id": capsule.capsule_id,
        "mount": capsule.path("merged"),
        "workspace": capsule.spec.workspace,
        "created_at": capsule.meta["created_at"],
        "clock": result["clock"],
        "isolation": manager.isolation(capsule),
    }


def _service_ops(manager: CapsuleManager, dispatcher: Dispatcher, capsule_id: str) -> None:
    """signal, freeze, net_connect and run_reads on a capsule running a service (an exec held open on a thread)."""
    script = "cat old.txt >/dev/null; : > ready; exec sleep 30"
    service = {"capsule_id": capsule_id, "argv": ["/bin/sh", "-c", script], "timeout_ms": 0, "service": "svc"}
    ended: list[dict[str, Any]] = []
    runner = threading.Thread(target=lambda: ended.append(dispatcher.handle(Request(2, "exec", service), ROOT_PEER)[0]))
    runner.start()
    deadline = time.monotonic() + 20
    while (not manager._capsules[capsule_id].services.get("svc")
           or not manager._capsules[capsule_id].services["svc"].handle):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert call(dispatcher, "freeze", {"capsule_id": capsule_id, "frozen": True})[0] == {
        "capsule_id": capsule_id, "frozen": True, "runs": ["svc"]}
    assert call(dispatcher, "freeze", {"capsule_id": capsule_id, "frozen": False})[0]["frozen"] is False
    netns = manager.nets.descriptor(capsule_id, "none")
    try:
        def listen() -> socket.socket:
            syscalls.setns(netns, syscalls.CLONE_NEWNET)
            server = socket.create_server(("127.0.0.1", 7000))
            return server

        with namespaces.on_own_thread(listen):
            connected, fds = call(dispatcher, "net_connect", {"capsule_id": capsule_id, "port": 7000})
            assert connected == {"port": 7000} and len(fds) == 1
            os.close(fds[0])
            _net_forward(dispatcher, capsule_id)
    finally:
        os.close(netns)
    _run_reads(manager, dispatcher, capsule_id)
    assert call(dispatcher, "signal", {"capsule_id": capsule_id, "service": "svc", "signal": "SIGTERM"})[0] == {
        "service": "svc", "sent": True}
    runner.join(20)
    assert ended and ended[0]["signal"] == "SIGTERM"


def _net_forward(dispatcher: Dispatcher, capsule_id: str) -> None:
    """The kernel path to the capsule's port 7000, proved by a host listener sent with ``open``."""
    with socket.create_server(("127.0.0.1", 0)) as held:
        host_port = held.getsockname()[1]
        args = {"capsule_id": capsule_id, "port": 7000, "host_port": host_port}
        opened, fds = dispatcher.handle(Request(1, "net_forward", {**args, "action": "open"}), ROOT_PEER, None,
                                        [os.dup(held.fileno())])
        assert (opened, fds) == ({"host_port": host_port, "open": True, "connections": 0}, [])
        with socket.create_connection(("127.0.0.1", host_port), timeout=5):
            pass  # led into the capsule: its listener takes it (the backlog), and nothing reads it
        assert call(dispatcher, "net_forward", {**args, "action": "count"})[0]["connections"] == 1
        assert call(dispatcher, "net_forward", {**args, "action": "close"})[0] == {
            "host_port": host_port, "open": False, "connections": 0}


def _run_reads(manager: CapsuleManager, dispatcher: Dispatcher, capsule_id: str) -> None:
    """What the service read so far: once ``ready`` exists, its cat of old.txt has ended, so one call
    names old.txt (its event read from the queue by the call itself if the reader had not yet); only
    for the capsule's owner."""
    deadline = time.monotonic() + 20
    while not os.path.exists(os.path.join(manager._capsules[capsule_id].path("merged"), "ready")):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    reads, fds = call(dispatcher, "run_reads", {"capsule_id": capsule_id, "service": "svc"})
    assert fds == [] and reads["service"] == "svc" and "unavailable" not in reads
    assert set(reads["touched"]) == {"read", "written", "listed", "executed"} and "old.txt" in reads["touched"]["read"]
    for peer, args, code in ((Peer(pid=1, uid=1000, gid=1000), {"service": "svc"}, "PERMISSION_DENIED"),
                             (ROOT_PEER, {"service": "other"}, "NOT_FOUND")):
        with pytest.raises(CcwError) as refused:
            dispatcher.handle(Request(1, "run_reads", {"capsule_id": capsule_id, **args}), peer)
        assert refused.value.code == code


def test_each_op_sends_the_shape_it_always_sent(served: tuple[CapsuleManager, Dispatcher, Path]) -> None:
    manager, dispatcher, ws = served
    seen = set()

    hello, _ = call(dispatcher, "hello", {"version": PROTOCOL_VERSION})
    assert hello == {"version": PROTOCOL_VERSION, "mode": "privileged", "mechanisms": dispatcher.mechanisms,
                     "ops": sorted(OPS), "surface": SURFACE}
    seen.add("hello")

    created, _ = call(dispatcher, "create", {"workspace": str(ws)})
    cid = created["capsule_id"]
    assert created == described(manager, created) and created["workspace"] == str(ws)
    seen.add("create")

    ran, _ = call(dispatcher, "exec", {"capsule_id": cid, "argv": ["/bin/sh", "-c", "cat old.txt; echo new > new.txt"]})
    assert set(ran) == {"exit_code", "signal", "timed_out", "oom_killed", "duration_ms", "stdout_b64", "stderr_b64",
                        "stdout_bytes", "stderr_bytes", "truncated", "usage", "usage_unavailable", "usage_sources",
                        "disk", "touched", "touched_unavailable"}
    assert (ran["exit_code"], ran["signal"], ran["timed_out"], ran["oom_killed"]) == (0, None, False, False)
    assert base64.b64decode(ran["stdout_b64"]) == b"old\n" and ran["stderr_b64"] == ""
    assert (ran["stdout_bytes"], ran["stderr_bytes"]) == (4, 0)
    assert ran["truncated"] == {"stdout": False, "stderr": False}
    assert set(ran["usage"]) == USAGE_KEYS and isinstance(ran["duration_ms"], int)
    assert isinstance(ran["usage_unavailable"], dict) and isinstance(ran["usage_sources"], dict)
    assert set(ran["touched"]) == {"read", "written", "listed", "executed"}
    assert ran["touched"]["written"] == ["new.txt"]
    if manager.disks is not None:
        assert set(ran["disk"]) == {"limit_mb", "used_kb", "free_kb", "full"} and ran["disk"]["full"] is False
    seen.add("exec")

    changes, _ = call(dispatcher, "changes", {"capsule_id": cid})
    assert changes == {"changes": [{"path": "new.txt", "kind": "added", "type": "file", "mode": 0o644, "size": 4}]}
    seen.add("changes")

    forked, _ = call(dispatcher, "fork", {"capsule_id": cid})
    assert forked == {**described(manager, forked), "parent": cid}
    seen.add("fork")

    rooted, fds = call(dispatcher, "open_root", {"capsule_id": forked["capsule_id"]})
    assert len(fds) == 1
    fd = fds[0]
    try:
        assert rooted == {"capsule_id": forked["capsule_id"]}
        assert os.path.samestat(os.fstat(fd), os.stat(forked["mount"]))
    finally:
        os.close(fd)
    seen.add("open_root")

    egress_capsule, _ = call(dispatcher, "create", {"workspace": str(ws), "network": "egress"})
    assert egress_capsule["isolation"]["network"] == "egress"
    opened, fds = call(dispatcher, "net_open", {"capsule_id": egress_capsule["capsule_id"]})
    for fd in fds:
        os.close(fd)
    assert len(fds) == 3 and opened == {
        "http_proxy": "10.99.0.1:3128", "socks_proxy": "10.99.0.1:1080",
        "jail_addresses": ["10.99.0.2", "fd63:6377::2"],
        "env": dict(egress.PROXY_ENV), "mechanism": egress.MECHANISM}
    call(dispatcher, "destroy", {"capsule_id": egress_capsule["capsule_id"]})
    seen.add("net_open")

    _service_ops(manager, dispatcher, forked["capsule_id"])
    seen.update(("signal", "freeze", "net_connect", "net_forward", "run_reads"))

    listed, _ = call(dispatcher, "list", {})
    parent, child = (manager._capsules[c] for c in (cid, forked["capsule_id"]))
    assert listed == {"capsules": [
        {"capsule_id": cid, "workspace": str(ws), "parent": None, "created_at": parent.meta["created_at"],
         "state": "frozen", "held_by": [forked["capsule_id"]]},
        {"capsule_id": forked["capsule_id"], "workspace": str(ws), "parent": cid,
         "created_at": child.meta["created_at"], "state": "ready"},
    ]}
    seen.add("list")

    for capsule_id in (forked["capsule_id"], cid):
        destroyed, _ = call(dispatcher, "destroy", {"capsule_id": capsule_id})
        assert destroyed == {"capsule_id": capsule_id, "destroyed": True}
    assert call(dispatcher, "list", {})[0] == {"capsules": []}
    seen.add("destroy")

    assert seen == set(OPS)

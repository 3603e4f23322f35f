"""The jail's own /etc/hosts names its hostname (``ccw``), so a lookup of it works, as git,
sudo, ``hostname -f``, Python's ``getfqdn`` and Java's ``getLocalHost`` expect: before, the
jail showed the host's hosts file, which names no ``ccw``, and ``gethostbyname(gethostname())``
failed.  The same file in every jail: a capsule's as root (the root tree built ahead by the
helper) and a rootless one (the first jail builds its root itself, in C, the next take the
helper's tree); the host's own /etc/hosts is untouched.  A service bound to the hostname
(127.0.1.1 alone) is ready by its port and reached through ``capsule_port``: the helper's
connect tries that address after loopback's, and the forward takes the relay there, since the
kernel's NAT leads to 127.0.0.1."""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Any

import trio

from sandbox import mounts
from tests.support.rootless_jail import run_rootless

LOOKUPS = ("cat /etc/hosts; echo --; getent hosts ccw; "
           "/usr/bin/python3 -c 'import socket; print(socket.gethostbyname(socket.gethostname()), socket.getfqdn())'")
# A server bound to the hostname and a client reaching it by that name (a dev server's habit).
SERVE = ("/usr/bin/python3 -c 'import socket; s = socket.create_server((socket.gethostname(), 0)); "
         "c = socket.create_connection((\"ccw\", s.getsockname()[1])); a, _ = s.accept(); c.sendall(b\"hi\"); "
         "print(a.recv(2).decode(), s.getsockname()[0])'")


def _expected(stdout: str) -> None:
    hosts, lookups = stdout.split("--\n")
    assert hosts == mounts.ETC_HOSTS
    first, names = lookups.splitlines()
    assert first.split()[0] == "127.0.1.1" and names == "127.0.1.1 ccw"


def test_a_capsules_jail_resolves_its_own_hostname(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    host_hosts = Path("/etc/hosts").read_bytes()

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        looked = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", LOOKUPS]})
        served = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", SERVE]})
        return looked, served

    looked, served = tools.run(scenario)
    assert looked["exit_code"] == 0, looked["stderr"]
    _expected(looked["stdout"])
    assert served["exit_code"] == 0 and served["stdout"] == "hi 127.0.1.1\n", served
    assert Path("/etc/hosts").read_bytes() == host_hosts


def test_a_rootless_jail_resolves_its_own_hostname_built_either_way(base: Path) -> None:
    result = run_rootless(base, LOOKUPS, runs=2)
    stdouts = result["stdouts"]
    assert isinstance(stdouts, list) and len(stdouts) == 2
    for stdout in stdouts:  # the launcher's root, then the helper's
        _expected(stdout)


def test_a_service_bound_to_the_hostname_is_ready_and_forwarded(tools: Any, tmp_path: Path) -> None:
    # Found in a trial: python3 -m http.server --bind ccw ran, but its ready port never came
    # ("not ready after 30000 ms") and capsule_port said nothing listened there.
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("by name\n")
    serve = ["python3", "-m", "http.server", "8766", "--bind", "ccw"]

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any], str, dict[str, Any]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        started = await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": serve,
                                                         "ready": {"port": 8766, "timeout_ms": 20000}})
        port = await t.call("capsule_port", {"capsule_id": cap, "port": 8766})
        url = port["url"] + "index.txt"
        page = await trio.to_thread.run_sync(lambda: urllib.request.urlopen(url, timeout=20).read().decode())
        listed = (await t.call("capsule_service_list", {"capsule_id": cap}))["ports"][0]
        return started, port, page, listed

    started, port, page, listed = tools.run(scenario)
    assert started["ready"] is True, started
    assert port["listening"] is True and "note" not in port, port
    assert page == "by name\n"
    assert (listed["listening"], listed["path"], listed["accepted"]) == (True, "relay", 1), listed

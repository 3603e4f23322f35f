"""Kill -9 of the front end, then of the helper, while a capsule's services run, all through
the ``ccw`` command (issue 36: "a service the helper lost is ``lost``, never silently gone").

``ccw`` starts a detached helper and a front end daemon on its state dir; the services
run in that front end.  Three web servers in one capsule, one for each restart setting:
``web`` (``no``), ``keeper`` (``always``) and ``fragile`` (``on-failure``).  After each
kill, ``ccw capsule service list`` lists ``web`` as ``lost`` and the other two as back
and answering (``keeper`` at once, ``fragile`` by the capsule's next use at the latest:
after a front end's restart it starts with the capsule's next exec), a new exec works
and reaches them on the capsule's loopback, and none of the old servers' processes is
left.  Each kill is counted with ``record_property("faults_tried", 1)``.

A front end brings the kept services back as it starts, not at the next call about them:
after each kill the next front end is started by ``ccw capsule diff``, which asks nothing
about services, and ``keeper`` answers on the capsule's loopback (asked of the helper
itself) before any such call; the first list shows ``web`` lost.  After the front end's
kill it starts at once, while the helper may still be ending the old ``keeper``: one
``keeper`` runs, never two, and it did not fail.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import trio

from mcp_server.launcher import HelperPaths
from sandbox.client import HelperClient
from sandbox.errors import CcwError
from tests.support.cli_process import ccw
from tests.support.processes import running_pids

PORTS = {"web": 18731, "keeper": 18732, "fragile": 18733}
RESTART = {"web": "no", "keeper": "always", "fragile": "on-failure"}
UP = ("running", "ready")


def server(name: str) -> list[str]:
    return ["python3", "-m", "http.server", str(PORTS[name]), "--bind", "127.0.0.1"]


FETCH = ("import sys, urllib.request as u\n"
         "for port in sys.argv[1:]:\n"
         "    print(u.urlopen(f'http://127.0.0.1:{port}/index.txt', timeout=10).read().decode().strip())\n")


def _wait_until(condition: Callable[[], Any], what: str, timeout: float = 60) -> Any:
    """Poll ``condition`` until truthy; its value (a liveness bound, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _settled(state: Path, cap: str, want: dict[str, tuple[str, ...]],
             as_json: bool = False) -> Callable[[], dict[str, Any] | None]:
    """A condition: ``ccw capsule service list`` shows each service in one of the states
    wanted; then its services by name (from ``--json``), or their states (from the text a
    person reads, each service's line checked: name, state and command, tab-separated)."""
    def check() -> dict[str, Any] | None:
        if as_json:
            listed = json.loads(ccw(state, "capsule", "service", "list", cap, "--json").stdout)["services"]
            found: dict[str, Any] = {one["name"]: one for one in listed}
            states = {name: one["state"] for name, one in found.items()}
        else:
            rows = [line.split("\t") for line in ccw(state, "capsule", "service", "list", cap).stdout.splitlines()
                    if not line.startswith("  ")]  # beneath a row: why it is lost or pending
            assert all(command == " ".join(server(name)) for name, _, command in rows), rows
            found = states = {name: status for name, status, _ in rows}
        return found if all(states[name] in allowed for name, allowed in want.items()) else None
    return check


def _fetch(state: Path, cap: str, *names: str) -> str:
    done = ccw(state, "capsule", "exec", cap, "--", "python3", "-c", FETCH, *(str(PORTS[n]) for n in names))
    return done.stdout


def _kill(pid: int, what: str) -> None:
    os.kill(pid, signal.SIGKILL)
    _wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE,
                f"the {what} to die")


def _servers() -> dict[str, list[int]]:
    return {name: running_pids(server(name)) for name in PORTS}


def test_services_after_kill_9_of_the_front_end_and_of_the_helper(
        cli_state: Path, tmp_path: Path, record_property: Callable[[str, Any], None]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("served from the capsule\n")
    cap = ccw(cli_state, "capsule", "create", str(ws)).stdout.strip()
    for name, port in PORTS.items():
        started = ccw(cli_state, "capsule", "service", "start", cap, name, "--restart", RESTART[name],
                      "--ready-port", str(port), "--", *server(name))
        assert started.stdout == f"{name}: ready\n", started.stdout
    before = _servers()
    assert all(len(pids) == 1 for pids in before.values()), before
    status = json.loads(ccw(cli_state, "helper", "status", "--json").stdout)

    # The front end dies; the helper ends the services whose connection closed with it.
    _kill(status["frontend_pid"], "front end")
    record_property("faults_tried", 1)
    _wait_until(lambda: not any(_servers().values()), "the services to end with their front end")
    # The next command starts a new front end, which finds the specs it did not start:
    # keeper at once, fragile with the capsule's next use (this exec) at the latest.
    _wait_until(_settled(cli_state, cap, {"web": ("lost",), "keeper": UP, "fragile": ("pending", *UP)}),
                "web lost, keeper back")
    assert _fetch(cli_state, cap, "keeper", "fragile") == "served from the capsule\n" * 2
    after_front = _servers()
    assert after_front["web"] == [] and all(after_front[n] and after_front[n] != before[n] for n in ("keeper",
                                                                                                    "fragile"))

    # The helper dies, its jails with it; the front end brings back what their settings say
    # once a helper answers again (the next ``ccw`` command starts one: the detached helper
    # survived the front end's death, and is the one killed now).
    _kill(status["pid"], "helper")
    record_property("faults_tried", 1)
    _wait_until(lambda: not any(_servers().values()), "the services to end with their helper")
    listed = _wait_until(_settled(cli_state, cap, {"web": ("lost",), "keeper": UP, "fragile": UP}, as_json=True),
                         "keeper and fragile back")
    # One start for the one loss: while no helper answered, no restart was tried (each would
    # have counted as a quick failure, and five make a service "failed" for good).
    assert {name: one["restarts"] for name, one in listed.items()} == {"fragile": 1, "keeper": 1, "web": 0}, listed
    assert _fetch(cli_state, cap, "keeper", "fragile") == "served from the capsule\n" * 2
    after_helper = _servers()
    assert after_helper["web"] == [] and all(after_helper[n] and after_helper[n] != after_front[n]
                                             for n in ("keeper", "fragile")), (after_front, after_helper)
    stopped = json.loads(ccw(cli_state, "capsule", "service", "stop", cap, "web", "--json").stdout)
    assert stopped["state"] == "lost" and "stopped" in stopped["reason"], stopped  # forgotten as it was: lost


def _answers(state: Path, cap: str, port: int) -> bool:
    """Whether ``port`` accepts on the capsule's loopback, asked of the helper (no front end call)."""
    async def connect() -> bool:
        client = HelperClient(str(HelperPaths.of(str(state)).socket))
        try:
            (await client.net_connect(cap, port)).close()
            return True
        except CcwError:  # nothing listens yet (CONFLICT), or no helper answers yet (UNAVAILABLE)
            return False
        finally:
            await client.aclose()
    return trio.run(connect)


def _first_list(state: Path, cap: str) -> dict[str, dict[str, Any]]:
    listed = json.loads(ccw(state, "capsule", "service", "list", cap, "--json").stdout)["services"]
    return {one["name"]: one for one in listed}


def test_a_starting_front_end_brings_back_the_kept_services(
        cli_state: Path, tmp_path: Path, record_property: Callable[[str, Any], None]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("served from the capsule\n")
    cap = ccw(cli_state, "capsule", "create", str(ws)).stdout.strip()
    for name in ("web", "keeper"):
        ccw(cli_state, "capsule", "service", "start", cap, name, "--restart", RESTART[name],
            "--ready-port", str(PORTS[name]), "--", *server(name))
    status = json.loads(ccw(cli_state, "helper", "status", "--json").stdout)
    old = _servers()["keeper"]

    # The front end alone dies, and a new one starts at once: the helper may still hold keeper.
    _kill(status["frontend_pid"], "front end")
    record_property("faults_tried", 1)
    ccw(cli_state, "capsule", "diff", cap)
    _wait_until(lambda: _servers()["keeper"] not in ([], old) and _answers(cli_state, cap, PORTS["keeper"]),
                "a new keeper answering after the front end's death")
    first = _first_list(cli_state, cap)
    assert first["web"]["state"] == "lost" and first["keeper"]["state"] in ("starting", *UP), first
    _wait_until(_settled(cli_state, cap, {"web": ("lost",), "keeper": UP}), "keeper listed up")
    assert len(_servers()["keeper"]) == 1 and _servers()["web"] == []

    # Both die; the next command starts a helper and a front end, and asks nothing about services.
    status = json.loads(ccw(cli_state, "helper", "status", "--json").stdout)
    _kill(status["pid"], "helper")
    _kill(status["frontend_pid"], "front end")
    record_property("faults_tried", 2)
    _wait_until(lambda: not any(_servers().values()), "the services to end with their helper")
    ccw(cli_state, "capsule", "diff", cap)
    _wait_until(lambda: _answers(cli_state, cap, PORTS["keeper"]), "keeper back after both deaths")
    first = _first_list(cli_state, cap)
    assert first["web"]["state"] == "lost" and first["keeper"]["state"] in ("starting", *UP), first
    assert first["keeper"]["restarts"] == 0, first  # a start by a new front end, not a restart of a failed run
    assert _fetch(cli_state, cap, "keeper") == "served from the capsule\n"
    assert len(_servers()["keeper"]) == 1
    # web's log ends by saying it was lost, said once for the two front ends that found it so.
    logs = ccw(cli_state, "capsule", "service", "logs", cap, "web").stdout
    said = "[ccw: web lost: the front end or helper that ran it stopped]\n"
    assert logs.endswith(said) and logs.count(said) == 1, logs

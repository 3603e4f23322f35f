"""The service tools end to end, through a real Runtime and an embedded helper (issue 36).

An agent's loop: start a web server as a service, reach it from an exec, read its logs,
pause and resume the capsule, stop the service; the journal holds the service's run with
its reads, and the exec's row names the service that ran beside it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from mcp_server.journal import Journal
from sandbox.errors import CcwError
from tests.support.pages import page
from tests.support.users import OTHER_UID

SERVER = ["python3", "-u", "-m", "http.server", "8765", "--bind", "127.0.0.1"]
FETCH = ["python3", "-c", "import urllib.request as u, sys; "
         "sys.stdout.write(u.urlopen('http://127.0.0.1:8765/index.txt', timeout=5).read().decode())"]


_STRANGER = """
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
s.sendall(b"GET /index.txt HTTP/1.0\\r\\n\\r\\n")
try:
    print("closed" if s.recv(100) == b"" else "answered")
except ConnectionResetError:
    print("closed")
"""


def _connects(port: int) -> bool:
    import socket

    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return False
    return True


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("served from the capsule\n")
    return ws


def test_an_agent_starts_a_server_tests_against_it_and_stops_it(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        out: dict[str, Any] = {"cap": cap}
        out["start"] = await t.call("capsule_service_start", {
            "capsule_id": cap, "name": "web", "cmd": SERVER, "ready": {"port": 8765, "timeout_ms": 20000}})
        out["fetch"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": FETCH})
        out["port"] = await t.call("capsule_port", {"capsule_id": cap, "port": 8765})
        out["host_fetch"] = (await trio.to_thread.run_sync(page, out["port"]["url"] + "index.txt")).decode()
        out["stranger"] = await trio.run_process(
            ["setpriv", f"--reuid={OTHER_UID}", f"--regid={OTHER_UID}", "--clear-groups", "/usr/bin/python3", "-c",
             _STRANGER, str(out["port"]["host_port"])], capture_stdout=True, check=False)
        out["list"] = await t.call("capsule_service_list", {"capsule_id": cap})
        out["capsules"] = (await t.call("capsule_list", {}))["capsules"]
        out["stranger_refused"] = out["list"]["ports"][0]["refused"]
        out["logs"] = await _logs_with(t, cap, "GET /index.txt")  # output comes in a few times a second
        later = await t.call("capsule_service_logs", {"capsule_id": cap, "name": "web", "since": out["logs"]["cursor"]})
        out["later"] = later
        out["pause"] = await t.call("capsule_pause", {"capsule_id": cap})
        try:
            await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["true"]})
        except CcwError as exc:
            out["paused_exec"] = exc.code
        out["paused_list"] = (await t.call("capsule_service_list", {"capsule_id": cap}))["services"]
        out["paused_capsules"] = (await t.call("capsule_list", {}))["capsules"]
        out["resume"] = await t.call("capsule_resume", {"capsule_id": cap})
        out["resumed_list"] = (await t.call("capsule_service_list", {"capsule_id": cap}))["services"]
        out["again"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": FETCH})
        out["stop"] = await t.call("capsule_service_stop", {"capsule_id": cap, "name": "web", "grace_ms": 3000})
        out["after_stop"] = await t.call("capsule_service_list", {"capsule_id": cap})
        out["rows"] = Journal(t.runtime.state).execs(cap)
        out["bad_ready"] = await t.call("capsule_service_start", {
            "capsule_id": cap, "name": "broken", "cmd": ["sh", "-c", "echo about to fail; exit 3"],
            "ready": {"port": 9999, "timeout_ms": 5000}})
        await t.call("capsule_destroy", {"capsule_id": cap})
        out["port_after_destroy"] = _connects(out["port"]["host_port"])
        return out

    out = tools.run(scenario)
    assert out["start"]["ready"] is True and out["start"]["state"] == "ready", out["start"]
    assert out["fetch"]["exit_code"] == 0 and out["fetch"]["stdout"] == "served from the capsule\n"
    assert [s["name"] for s in out["list"]["services"]] == ["web"]
    assert [c.get("services") for c in out["capsules"]] == [{"web": "ready"}]
    # The forwarded port: the owner (root here) reads the page; another uid gets a closed connection.
    assert out["port"]["url"].startswith("http://127.0.0.1:") and out["host_fetch"] == "served from the capsule\n"
    assert out["stranger"].stdout == b"closed\n" and out["stranger_refused"] == 1
    assert '"GET /index.txt HTTP/1.1" 200' in out["logs"]["text"]
    assert out["later"]["text"] == "" and out["later"]["start"] == out["logs"]["cursor"]
    assert out["pause"]["paused"] is True and out["pause"]["runs"] == ["web"]
    assert out["paused_exec"] == "CONFLICT"
    # Paused, it accepts connections and answers none: listed so, with what it was and what thaws it.
    assert [(one["state"], one["reason"]) for one in out["paused_list"]] == [(
        "paused", "its capsule is paused: it was ready, and runs nothing (a connection to it waits) until "
        "capsule_resume")]
    assert [c.get("services") for c in out["paused_capsules"]] == [{"web": "paused"}]
    assert [(one["state"], one.get("reason")) for one in out["resumed_list"]] == [("ready", None)]
    assert out["resume"]["paused"] is False and out["again"]["stdout"] == "served from the capsule\n"
    assert out["stop"]["state"] == "stopped" and out["after_stop"]["services"] == []
    rows = out["rows"]
    service_rows = [row for row in rows if row.get("service") == "web"]
    assert len(service_rows) == 1 and service_rows[0]["argv"] == SERVER
    assert "index.txt" in service_rows[0]["touched"]["read"]  # the server read the file it served
    fetch_rows = [row for row in rows if row["argv"] == FETCH]
    assert len(fetch_rows) == 2 and all(json.loads(row["services"])[0]["name"] == "web" for row in fetch_rows)
    bad = out["bad_ready"]
    assert bad["ready"] is False and bad["state"] == "exited" and bad["exit_code"] == 3
    assert "about to fail" in bad["log_tail"]
    assert subprocess.run(["pgrep", "-f", "http.server 8765"], capture_output=True).stdout == b""
    assert out["port_after_destroy"] is False  # the forward ended with its capsule


async def _logs_with(t: Any, cap: str, text: str) -> dict[str, Any]:
    with trio.move_on_after(10):
        while True:
            logs: dict[str, Any] = await t.call("capsule_service_logs", {"capsule_id": cap, "name": "web"})
            if text in logs["text"]:
                break
            await trio.sleep(0.1)
    return logs


FAST = ["sh", "-c", "echo fast-out-1; echo fast-err-1 >&2; exit 3"]
CRASHY = ["sh", "-c", "echo started; sleep 1; echo Traceback-last-words >&2; exit 1"]


def test_what_a_service_printed_before_it_ended_or_was_stopped_stays_in_its_logs(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        out: dict[str, Any] = {}
        # Ends before the helper's first report: its lines come in the last one, before the reply.
        out["fast"] = await t.call("capsule_service_start", {"capsule_id": cap, "name": "fast1", "cmd": FAST,
                                                             "ready": {"port": 8005, "timeout_ms": 10000}})
        out["fast_logs"] = await t.call("capsule_service_logs", {"capsule_id": cap, "name": "fast1"})
        out["crashy"] = await t.call("capsule_service_start", {"capsule_id": cap, "name": "crashy", "cmd": CRASHY,
                                                               "ready": {"line": "started"}})
        with trio.move_on_after(20):
            while True:  # polled: it ends a second after it is ready
                out["crashy_logs"] = await t.call("capsule_service_logs", {"capsule_id": cap, "name": "crashy"})
                if out["crashy_logs"]["state"] == "exited":
                    break
                await trio.sleep(0.1)
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": SERVER,
                                               "ready": {"port": 8765, "timeout_ms": 20000}})
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": FETCH})
        out["stop"] = await t.call("capsule_service_stop", {"capsule_id": cap, "name": "web", "grace_ms": 3000})
        out["web_logs"] = await t.call("capsule_service_logs", {"capsule_id": cap, "name": "web"})
        try:
            await t.call("capsule_service_logs", {"capsule_id": cap, "name": "nope"})
        except CcwError as exc:
            out["never"] = exc
        await t.call("capsule_destroy", {"capsule_id": cap})
        out["log_dir"] = (t.runtime.state.root / "services" / cap).exists()
        return out

    out = tools.run(scenario)
    fast = out["fast"]
    assert fast["ready"] is False and fast["why"] == "it exited before it was ready", fast
    assert fast["log_tail"].splitlines()[1:] == ["fast-out-1", "fast-err-1", "[ccw: fast1 ended: exit 3]"]
    assert out["fast_logs"]["text"] == fast["log_tail"]
    assert out["crashy"]["ready"] is True
    assert out["crashy_logs"]["text"].splitlines()[1:] == [
        "started", "Traceback-last-words", "[ccw: crashy ended: exit 1]"], out["crashy_logs"]
    assert out["stop"]["state"] == "stopped"
    web = out["web_logs"]
    assert web["state"] == "stopped" and '"GET /index.txt HTTP/1.1" 200' in web["text"], web
    assert web["text"].splitlines()[-1].startswith("[ccw: web ended:")
    assert out["never"].code == "NOT_FOUND" and out["never"].details["services"] == ["crashy", "fast1"]
    assert out["never"].details["stopped"] == ["web"]
    assert out["log_dir"] is False


def test_a_service_name_is_checked_and_env_must_be_whitelisted(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> list[str]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        codes = []
        try:
            await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": ["true"],
                                                   "env": {"SECRET": "x"}})
        except CcwError as exc:
            codes.append(exc.code)
        try:
            await t.call("capsule_service_logs", {"capsule_id": cap, "name": "nope"})
        except CcwError as exc:
            codes.append(exc.code)
        await t.call("capsule_destroy", {"capsule_id": cap})
        return codes

    assert tools.run(scenario) == ["INVALID_ARGUMENT", "NOT_FOUND"]
    with pytest.raises(jsonschema.ValidationError):  # the schema refuses a bad name before any handler runs
        tools.run(lambda t: t.call("capsule_service_start", {"capsule_id": "cap_1", "name": "Web!", "cmd": ["x"]}))


TICKER = ["python3", "-u", "-c", "import time\nprint('ticking', flush=True)\nwhile True:\n    time.sleep(0.05)"]


def test_a_fork_inherits_services_and_the_parent_is_frozen_meanwhile(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        out: dict[str, Any] = {}
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": SERVER,
                                               "ready": {"port": 8765}})
        fork = (await t.call("capsule_fork", {"capsule_id": cap}))["capsule_id"]
        out["fork_before"] = (await t.call("capsule_service_list", {"capsule_id": fork}))["services"]
        try:
            await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["true"]})
        except CcwError as exc:
            out["parent_refused"] = exc.message
        out["fork_fetch"] = await t.call("capsule_exec", {"capsule_id": fork, "cmd": FETCH})
        out["fork_after"] = (await t.call("capsule_service_list", {"capsule_id": fork}))["services"]
        await t.call("capsule_destroy", {"capsule_id": fork})
        out["parent_fetch"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": FETCH})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    assert [(s["name"], s["state"]) for s in out["fork_before"]] == [("web", "pending")]
    assert "frozen" in out["parent_refused"] and "services" in out["parent_refused"]
    assert out["fork_fetch"]["stdout"] == "served from the capsule\n"  # its own copy of the service
    assert [(s["name"], s["state"]) for s in out["fork_after"]] == [("web", "ready")]
    assert out["parent_fetch"]["stdout"] == "served from the capsule\n"  # thawed with its last fork gone


def test_promotion_freezes_a_running_service_and_reports_it(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "tick", "cmd": TICKER,
                                               "ready": {"line": "ticking"}})
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "echo new > added.txt"]})
        promoted = await t.call("capsule_promote", {"capsule_id": cap})
        listed = await t.call("capsule_service_list", {"capsule_id": cap})
        paused = await t.call("capsule_resume", {"capsule_id": cap})  # idempotent: it was not left paused
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"promoted": promoted, "listed": listed, "paused": paused}

    out = tools.run(scenario)
    assert out["promoted"]["promoted"] is True and out["promoted"]["applied"] == ["added.txt"]
    assert [s["name"] for s in out["promoted"]["policy_report"]["services"]] == ["tick"]
    assert (ws / "added.txt").read_text() == "new\n"
    assert [s["state"] for s in out["listed"]["services"]] == ["ready"]
    assert out["paused"]["paused"] is False


# Writes its ready file a second after it starts (each run its own word), then keeps running.
def _late_writer(word: str) -> list[str]:
    return ["sh", "-c", f"sleep 1; echo {word} > run/ready.txt; exec sleep 300"]


def test_a_ready_path_an_earlier_run_left_waits_for_the_new_run(tools: Any, tmp_path: Path) -> None:
    # A pid file or socket a killed server left behind is no sign that the next one is up.
    ws = _workspace(tmp_path)
    (ws / "run").mkdir()

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        out: dict[str, Any] = {}
        ready = {"path": "run/ready.txt", "timeout_ms": 20000}
        for word in ("first", "second"):  # the second finds the first's file there
            out[word] = await t.call("capsule_service_start", {"capsule_id": cap, "name": "late",
                                                               "cmd": _late_writer(word), "ready": ready})
            seen = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["cat", "run/ready.txt"]})
            out[f"{word}_seen"] = seen["stdout"]
            await t.call("capsule_service_stop", {"capsule_id": cap, "name": "late", "grace_ms": 1000})
        # A path that is there and never made again never makes the service ready.
        out["stale"] = await t.call("capsule_service_start", {
            "capsule_id": cap, "name": "idle", "cmd": ["sleep", "300"],
            "ready": {"path": "run/ready.txt", "timeout_ms": 1500}})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    assert out["first"]["ready"] is True and out["first_seen"] == "first\n", out
    assert out["second"]["ready"] is True and out["second_seen"] == "second\n", out
    stale = out["stale"]
    assert stale["ready"] is False and stale["state"] == "starting", stale
    assert stale["why"].startswith("not ready after 1500 ms (run/ready.txt made or changed since the start)"), stale

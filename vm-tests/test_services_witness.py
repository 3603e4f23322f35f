"""Services in witnesses, replays and deltamin (issue 36), through a real Runtime and an embedded
helper: "the test passed against the running app" is replayable, and a failing test that needs
the app is minimised with the app running beside every trial.

The workspace holds a tiny HTTP server and a test that fetches from it; the test passes only
with the server's own answer.  A replay of a witness edited to drop the services fails, which
shows the replay passed because it started the server, not by chance.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from mcp_server.fs import witness as wfmt
from tests.support import witness_craft as craft

PORT = 8765
ANSWER = "hello from the app"
SERVER = f"""
import http.server

class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = {ANSWER!r}.encode() + b"\\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

http.server.HTTPServer(("127.0.0.1", {PORT}), Answer).serve_forever()
"""
TEST = f"""
import sys, urllib.request
try:
    got = urllib.request.urlopen("http://127.0.0.1:{PORT}/greeting", timeout=5).read().decode()
except OSError as exc:
    print("no answer:", exc)
    sys.exit(2)
print("got:", got.strip())
sys.exit(0 if got == {ANSWER!r} + "\\n" else 1)
"""
SERVE = ["python3", "-u", "server.py"]
CHECK = ["python3", "test_app.py"]
START = {"name": "app", "cmd": SERVE, "ready": {"port": PORT, "timeout_ms": 20000}}


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "server.py").write_text(SERVER)
    (ws / "test_app.py").write_text(TEST)
    (ws / "notes.txt").write_text("notes\n")
    return ws


def _without_services(path: Path, into: Path) -> Path:
    """The witness at ``path`` with every exec's services dropped (unsigned: it was edited)."""
    with open(path, "rb") as f:
        archive = wfmt.read_archive(f, None, keep_blobs=True)
    manifest = archive.manifest
    for entry in manifest["execs"]:
        entry.pop("services", None)
    return craft.write(into, manifest, archive.blobs)


def _no_server_left() -> bool:
    return subprocess.run(["pgrep", "-f", "python3 -u server.py"], capture_output=True).stdout == b""


def test_a_witness_of_a_test_against_a_running_app_replays_with_the_app(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        out: dict[str, Any] = {"start": await t.call("capsule_service_start", {"capsule_id": cap, **START})}
        out["test"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": CHECK})
        out["stop"] = await t.call("capsule_service_stop", {"capsule_id": cap, "name": "app"})
        made = await t.call("capsule_witness", {"capsule_id": cap})
        out["replay"] = await t.call("capsule_replay", {"witness_id": made["witness_id"], "wait_ms": 300_000})
        edited = _without_services(Path(made["path"]), tmp_path / "edited.tar.zst")
        out["without"] = await t.call("capsule_replay", {"path": str(edited), "allow_untrusted": True,
                                                         "wait_ms": 300_000})
        out["path"] = made["path"]
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    with open(out["path"], "rb") as f:
        manifest = wfmt.read_archive(f, None, keep_blobs=False).manifest
    assert out["start"]["ready"] is True
    assert out["test"]["exit_code"] == 0 and out["test"]["stdout"] == f"got: {ANSWER}\n"
    # The witness: the test's entry names the app's spec; the app's run is there, marked.
    tested = [e for e in manifest["execs"] if e["argv"] == CHECK]
    ran = [e for e in manifest["execs"] if e.get("service") == "app"]
    assert len(tested) == 1 and [s["name"] for s in tested[0]["services"]] == ["app"]
    assert tested[0]["services"][0]["argv"] == SERVE and tested[0]["services"][0]["ready"]["port"] == PORT
    assert len(ran) == 1 and ran[0]["argv"] == SERVE and ran[0]["seq"] > tested[0]["seq"]
    assert "server.py" in ran[0]["touched"]["read"]  # so the witness carries the script it served from
    replay = out["replay"]
    assert replay["replay_ok"] is True, replay["mismatches"]
    # The replayed test printed the app's own answer again: same bytes as recorded.
    assert replay["output_identical"] is True and replay["execs"] == 1
    assert replay["services"] == {"started": [{"services": ["app"], "execs": [tested[0]["seq"]]}],
                                  "not_compared": [{"exec": ran[0]["seq"], "service": "app", "argv": SERVE}]}
    # The same witness without its services: the test finds nothing listening, and says so.
    without = out["without"]
    assert without["replay_ok"] is False and without["signature"] == "unsigned" and "services" in without
    assert without["services"]["started"] == []
    [failed] = [m for m in without["mismatches"] if m["kind"] == "exec"]
    assert (failed["exec"], failed["field"], failed["expected"], failed["actual"]) == (
        tested[0]["seq"], "exit_code", 0, 2)
    [diff] = without["output_diffs"]
    assert any(line.startswith("+no answer:") for line in diff["lines"]), diff
    assert _no_server_left()


def test_deltamin_finds_the_change_that_breaks_the_app_with_the_app_beside_each_trial(
        tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        out: dict[str, Any] = {}
        await t.call("workspace_write_file", {"capsule_id": cap, "path": "notes.txt", "content": "notes, edited\n"})
        await t.call("workspace_write_file", {"capsule_id": cap, "path": "server.py",
                                              "content": SERVER.replace(ANSWER, "goodbye from the app")})
        out["start"] = await t.call("capsule_service_start", {"capsule_id": cap, **START})
        out["test"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": CHECK})
        out["deltamin"] = await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": CHECK,
                                                            "wait_ms": 600_000})
        # The final check's witness replays with the app too.
        [made] = [w for w in (await t.call("witness_list", {}))["witnesses"]
                  if w["root_hash"] == out["deltamin"]["root_hash"]]
        out["replay"] = await t.call("capsule_replay", {"witness_id": made["witness_id"], "wait_ms": 300_000})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    assert out["start"]["ready"] is True
    assert out["test"]["exit_code"] == 1 and out["test"]["stdout"] == "got: goodbye from the app\n"
    found = out["deltamin"]
    assert found["units"] == ["server.py"] and found["replay_ok"] is True, found
    assert "goodbye from the app" in found["minimal_patch"] and "notes" not in found["minimal_patch"]
    # Had a trial run without the app, the test would have failed for want of an answer (exit 2)
    # with or without the change, and the empty change would not have passed: deltamin would refuse.
    replay = out["replay"]
    assert replay["replay_ok"] is True and [s["services"] for s in replay["services"]["started"]] == [["app"]]
    assert _no_server_left()


def test_a_replay_ends_the_app_before_the_exec_that_ran_after_it_was_stopped(tools: Any, tmp_path: Path) -> None:
    # The exec after the stop found nothing listening; so must its replay, which once still
    # reached the replay's app, ended only when the helper next looked at its closed connection.
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, **START})
        out: dict[str, Any] = {"with": await t.call("capsule_exec", {"capsule_id": cap, "cmd": CHECK})}
        await t.call("capsule_service_stop", {"capsule_id": cap, "name": "app"})
        out["without"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": CHECK})
        made = await t.call("capsule_witness", {"capsule_id": cap})
        out["replay"] = await t.call("capsule_replay", {"witness_id": made["witness_id"], "wait_ms": 300_000})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    assert (out["with"]["exit_code"], out["without"]["exit_code"]) == (0, 2)
    replay = out["replay"]
    assert replay["replay_ok"] is True and replay["output_identical"] is True, replay
    [started] = replay["services"]["started"]
    assert started["services"] == ["app"] and len(started["execs"]) == 1  # the first test's alone
    assert _no_server_left()

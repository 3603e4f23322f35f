"""Services beside the runs that commutativity's trials run again, and in a witness made while they
still run (issue 36), through a real Runtime and an embedded helper.

The workspace is served by ``python3 -m http.server`` as a service, and a client fetches two
of its files over HTTP: it fails only when both are the new versions.  Nothing but the
service reads those files, so only a run with the service beside it sees how they interact.

- capsule_commutativity with ``verify`` measures the pair linked (each alone passes, both
  together fail) because each trial starts the service; once the service is stopped, the
  client's newest run had none beside it, every trial finds nothing listening, and no
  measured link is left: the first answer depended on the service.
- A witness made while the service still runs carries what the client and the service
  read (the service's so far, asked of the helper: capsules/witness.py, the ``run_reads``
  op), not the whole base, and it replays with the service started: the files the service
  served are there.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

from mcp_server.fs import witness as wfmt

PORT = 8766
SERVE = ["python3", "-m", "http.server", str(PORT), "--bind", "127.0.0.1"]
START = {"name": "files", "cmd": SERVE, "ready": {"port": PORT, "timeout_ms": 20000}}
CLIENT_PY = f"""
import sys, urllib.request
try:
    got = [urllib.request.urlopen(f"http://127.0.0.1:{PORT}/{{name}}", timeout=5).read().decode().strip()
           for name in ("a.txt", "b.txt")]
except OSError as exc:
    print("no answer:", exc)
    sys.exit(2)
print("got:", got)
sys.exit(1 if got == ["new", "new"] else 0)
"""
CLIENT = ["python3", "client.py"]
BULK_FILES = 200  # nobody reads these: a witness that carries the whole base carries them


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "bulk").mkdir(parents=True)
    (ws / "a.txt").write_text("old\n")
    (ws / "b.txt").write_text("old\n")
    (ws / "client.py").write_text(CLIENT_PY)
    for i in range(BULK_FILES):
        (ws / "bulk" / f"blob{i:03}.bin").write_bytes(os.urandom(4096))
    return ws


def _no_server_left() -> bool:
    return subprocess.run(["pgrep", "-f", f"http.server {PORT}"], capture_output=True).stdout == b""


def _measured(answer: dict[str, Any]) -> list[tuple[list[str], str]]:
    return [(e["pair"], d["detail"]) for e in answer["evidence"] for d in e["details"] if d["kind"] == "measured"]


def test_commutativity_trials_start_the_services_the_command_ran_beside(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        for name in ("a.txt", "b.txt"):
            await t.call("workspace_write_file", {"capsule_id": cap, "path": name, "content": "new\n"})
        out: dict[str, Any] = {"start": await t.call("capsule_service_start", {"capsule_id": cap, **START})}
        out["with"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": CLIENT})
        question = {"capsule_id": cap, "target_cmd": CLIENT, "verify": True}
        out["beside"] = await t.call("capsule_commutativity", question)
        await t.call("capsule_service_stop", {"capsule_id": cap, "name": "files"})
        out["without"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": CLIENT})
        out["alone"] = await t.call("capsule_commutativity", question)
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    assert out["start"]["ready"] is True
    assert out["with"]["exit_code"] == 1 and out["with"]["stdout"] == "got: ['new', 'new']\n"
    # Each trial had the server: a and b each alone pass, together they fail.
    assert _measured(out["beside"]) == [(["a.txt", "b.txt"], "alone: pass, pass; together: fail")]
    assert out["beside"]["independent_sets"] == [["a.txt", "b.txt"]]
    # Without the server the client cannot answer at all, so every trial fails alike and the
    # interaction is invisible: what the first answer measured was the service's.
    assert out["without"]["exit_code"] == 2 and out["without"]["stdout"].startswith("no answer:")
    assert _measured(out["alone"]) == []
    assert out["alone"]["independent_sets"] == [["a.txt"], ["b.txt"]]
    assert _no_server_left()


def test_a_witness_made_while_the_service_runs_carries_what_it_read_and_replays(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("workspace_write_file", {"capsule_id": cap, "path": "a.txt", "content": "new\n"})
        out: dict[str, Any] = {"start": await t.call("capsule_service_start", {"capsule_id": cap, **START})}
        out["test"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": CLIENT})
        out["used"] = await t.call("capsule_witness", {"capsule_id": cap})  # the service still runs
        out["all"] = await t.call("capsule_witness", {"capsule_id": cap, "carry": "all"})
        out["listed"] = await t.call("capsule_service_list", {"capsule_id": cap})
        out["replay"] = await t.call("capsule_replay", {"witness_id": out["used"]["witness_id"], "wait_ms": 300_000})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    assert out["test"]["exit_code"] == 0 and out["test"]["stdout"] == "got: ['new', 'old']\n"
    assert [s["state"] for s in out["listed"]["services"]] == ["ready"]  # the witness left it running
    with open(out["used"]["path"], "rb") as f:
        manifest = wfmt.read_archive(f, None, keep_blobs=False).manifest
    carried = {entry["path"] for entry in manifest["base"]["files"]}
    # What the client read and what the server served (b.txt: only the service opened it).
    assert {"client.py", "b.txt"} <= carried and not any(path.startswith("bulk/") for path in carried)
    assert out["used"]["base"]["carried"] == "used" and out["used"]["base"]["read_sets_complete"] is True
    assert out["all"]["base"]["carried"] == "all" and out["all"]["base"]["files"] > BULK_FILES
    assert out["used"]["size_bytes"] * 10 < out["all"]["size_bytes"]
    # Only the capsule's own runs are entries: the service's reads so far are not one.
    assert [e["argv"] for e in manifest["execs"]] == [CLIENT]
    replay = out["replay"]
    assert replay["replay_ok"] is True, replay["mismatches"]
    assert replay["output_identical"] is True
    assert [s["services"] for s in replay["services"]["started"]] == [["files"]]
    assert _no_server_left()

"""Forwarded ports (mcp_server/capsules/ports.py) outlive their front end: a front end that
starts opens the kept forwards again, before any call about ports, on the same host port
when it is free and on another, said in the ``port`` event, when it is not."""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

from mcp_server import frontdaemon
from tests.support.cli_process import CCW, ROOT, ccw, cli_env
from tests.support.workspaces import make_workspace


def listening(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:``port``."""
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    """Poll ``condition()`` until it holds (a sequencing wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def opened(state: Path, capsule_id: str) -> list[dict[str, Any]]:
    """The capsule's ``port`` events of forwards opened (the probes above are refused ones)."""
    db = sqlite3.connect(f"file:{state / 'ccw.sqlite3'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT data FROM events WHERE capsule_id = ? AND kind = 'port' ORDER BY id",
                          (capsule_id,)).fetchall()
    finally:
        db.close()
    return [event for event in (json.loads(row[0]) for row in rows) if event["state"] == "open"]


def test_a_starting_front_end_reopens_the_kept_forwards(tmp_path: Path, root_required: None) -> None:
    state = tmp_path / "state"
    workspace = make_workspace(tmp_path / "ws", {"f": ""})
    try:
        cap = ccw(state, "capsule", "create", "--no-auto-expose", str(workspace)).stdout.strip()
        kept = json.loads(ccw(state, "capsule", "port", cap, "9000", "--json").stdout)
        moved = json.loads(ccw(state, "capsule", "port", cap, "9001", "--json").stdout)
        assert listening(kept["host_port"]) and listening(moved["host_port"])
        ccw(state, "helper", "stop")
        assert not listening(kept["host_port"]) and not listening(moved["host_port"])
        with socket.socket() as squatter:  # another program takes one forward's host port meanwhile
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the probes' TIME_WAIT
            squatter.bind(("127.0.0.1", moved["host_port"]))
            squatter.listen()
            ccw(state, "capsule", "list")  # starts a front end; nothing here asks about ports
            wait_for(lambda: listening(kept["host_port"]), "the kept forward to be opened again")
            wait_for(lambda: len(opened(state, cap)) == 4, "both forwards' reopening")
            listed = json.loads(ccw(state, "capsule", "service", "list", cap, "--json").stdout)["ports"]
        assert (listed[0]["port"], listed[0]["host_port"], listed[0]["url"]) == (9000, kept["host_port"], kept["url"])
        assert listed[1]["port"] == 9001 and listed[1]["host_port"] != moved["host_port"]
        assert listening(listed[1]["host_port"])
        reopened = [(e["port"], e["host_port"], e.get("moved_from")) for e in opened(state, cap)[2:]]
        assert reopened == [(9000, kept["host_port"], None), (9001, listed[1]["host_port"], moved["host_port"])]
    finally:
        ccw(state, "helper", "stop", check=False)


def test_a_forward_says_whether_anything_listens_behind_it(tmp_path: Path, root_required: None) -> None:
    # The trial: a lost service's forward was listed as its live URL, and `ccw capsule port`
    # printed an http:// URL for any port.
    state = tmp_path / "state"
    workspace = make_workspace(tmp_path / "ws", {"f": ""})
    try:
        cap = ccw(state, "capsule", "create", "--no-auto-expose", str(workspace)).stdout.strip()
        opened_now = ccw(state, "capsule", "port", cap, "9100")
        address = opened_now.stdout.strip()
        assert address.startswith("127.0.0.1:") and "http" not in opened_now.stdout, opened_now.stdout
        assert f"if it speaks HTTP: http://{address}/" in opened_now.stderr, opened_now.stderr
        assert f"nothing listens on port 9100 in capsule {cap} now" in opened_now.stderr, opened_now.stderr

        def listed() -> list[str]:
            lines = ccw(state, "capsule", "service", "list", cap).stdout.splitlines()
            return [line for line in lines if line.startswith("port ")]

        counts = "\t0 accepted, 0 refused"  # nothing connected through the forward
        assert listed() == [f"port 9100\t{address}\tnothing listens there now\trelay{counts}"]
        ccw(state, "capsule", "service", "start", cap, "web", "--ready-port", "9100", "--",
            "python3", "-m", "http.server", "9100", "--bind", "127.0.0.1")
        assert listed() == [f"port 9100\t{address}\tlistening\tkernel{counts}"]  # a privileged helper's NAT now
        assert json.loads(ccw(state, "capsule", "port", cap, "9100", "--json").stdout)["listening"] is True
        ccw(state, "capsule", "service", "stop", cap, "web")
        assert listed() == [f"port 9100\t{address}\tnothing listens there now\tkernel{counts}"]  # kept: the capsule's
    finally:
        ccw(state, "helper", "stop", "--force", check=False)


def test_a_forward_of_a_capsule_its_helper_does_not_know_is_kept_closed(tmp_path: Path, root_required: None) -> None:
    # Found in a trial: after a state dir moved to another helper (CCW_HELPER_SOCKET), its front
    # end opened the kept forward of a capsule that helper did not know, logged "not found" at
    # each refill, and stayed "busy" for good: no other front end could take the state dir.
    state, other = tmp_path / "state", tmp_path / "other"
    workspace = make_workspace(tmp_path / "ws", {"f": ""})
    try:
        cap = ccw(state, "capsule", "create", "--no-auto-expose", str(workspace)).stdout.strip()
        kept = json.loads(ccw(state, "capsule", "port", cap, "9200", "--json").stdout)
        ccw(state, "helper", "stop")
        ccw(other, "capsule", "list")  # another state dir's helper, which has no such capsule
        env = {**cli_env(state), "CCW_HELPER_SOCKET": str(other / "helper" / "helper.sock")}
        listed = subprocess.run([*CCW, "capsule", "list"], capture_output=True, text=True, env=env, cwd=ROOT,
                                timeout=120)
        assert listed.returncode == 0, listed.stderr
        log = state / "frontend.log"
        wait_for(lambda: f"mcp:port {cap}:9200 not reopened" in log.read_text(errors="replace"),
                 "the kept forward's reopening to be tried")
        assert not listening(kept["host_port"])
        assert frontdaemon.ask_to_yield(str(state)) == "now"  # nothing held: it yields
    finally:
        ccw(state, "helper", "stop", "--force", check=False)
        ccw(other, "helper", "stop", "--force", check=False)

"""Faults, each followed by a restart: kill -9 of the helper during an exec and of the
front end during a promotion and during a witness; stale socket files at start; a full
disk under the state dir; a corrupt SQLite database.

Each test runs a real ``ccw-mcp`` on a unix socket (``MCP_ENDPOINT=socket``) with its
embedded helper, injects the fault, restarts what died, and checks that no data is lost,
no half-promoted tree or partial witness is visible, no mount, cgroup or jail process
leaks, and that a request that could not complete got a structured error.  Each
injection is counted with ``record_property("faults_tried", 1)``.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from mcp_server.capsules.witness import CRASH_ENV as WITNESS_CRASH_ENV
from mcp_server.config import TOOLSETS
from mcp_server.fs.promote import CRASH_ENV, STEPS
from tests.support.mcp_process import ServerProcess, server_env

Props = Any  # pytest's record_property


class ToolFailed(Exception):
    """A JSON-RPC error answer; ``code`` is ccw's error code when the tool sent one."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.error = answer["error"]
        self.code = (self.error.get("data") or {}).get("error", {}).get("code", str(self.error["code"]))
        super().__init__(f"{self.code}: {self.error['message']}")


class Client:
    """One NDJSON connection; direct-method calls, one at a time."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.reader = self.sock.makefile("rb")
        self.next_id = 0

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        """The result, or ToolFailed; ConnectionError when the server went away."""
        self.next_id += 1
        frame = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params or {}}
        self.sock.sendall(json.dumps(frame).encode() + b"\n")
        line = self.reader.readline()
        if not line:
            raise ConnectionError("ccw-mcp closed the connection")
        answer = json.loads(line)
        assert answer["id"] == self.next_id, answer
        if "error" in answer:
            raise ToolFailed(answer)
        result: dict[str, Any] = answer["result"]
        return result

    def close(self) -> None:
        self.reader.close()
        self.sock.close()


class Front:
    """A ccw-mcp on a unix socket over ``tmp``'s state dir; restartable."""

    def __init__(self, tmp: Path, workspace: Path) -> None:
        self.tmp = tmp
        self.workspace = workspace
        self.state = tmp / "state"
        self.server: ServerProcess | None = None
        self.clients: list[Client] = []

    def start(self, **env: str) -> ServerProcess:
        extra = {"MCP_ENDPOINT": "socket", "CCW_TOOLSETS": ",".join(TOOLSETS), "CCW_WORKSPACE": str(self.workspace)}
        self.server = ServerProcess(server_env(self.tmp, **{**extra, **env}))
        self.server.wait_ready()
        return self.server

    def client(self) -> Client:
        assert self.server is not None
        client = Client(self.server.path)
        self.clients.append(client)
        return client

    def helper_pids(self) -> list[int]:
        """Pids of embedded helpers serving this state dir."""
        wanted = str(self.state / "helper")
        pids = []
        for proc in psutil.process_iter(["cmdline"]):
            cmdline = proc.info["cmdline"] or []
            if "sandbox" in cmdline and "--state-dir" in cmdline and wanted in cmdline:
                pids.append(proc.pid)
        return pids

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()
        if self.server is not None and self.server.proc.poll() is None:
            # Destroy what is left so the helper's mounts and dirs go with it.
            with _quiet():
                client = Client(self.server.path)
                for capsule in client.call("capsule_list", {}).get("capsules", []):
                    client.call("capsule_destroy", {"capsule_id": capsule["capsule_id"]})
                client.close()
            assert self.server.stop() == 0, self.server.log
        self.server = None
        wait_until(lambda: not self.helper_pids(), "the embedded helper to exit")


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return exc[0] is not None and issubclass(exc[0], (ToolFailed, OSError))  # type: ignore[arg-type]


def wait_until(condition: Any, what: str, timeout: float = 20.0) -> None:
    """Poll ``condition`` (a liveness bound, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def cgroups_of(helper_pid: int) -> list[str]:
    """Exec cgroup dirs a helper named after itself (``…@<pid>``), in every hierarchy."""
    return sorted(glob.glob(f"/sys/fs/cgroup/*/ccw*/*@{helper_pid}"))


def mounts_under(pid: int | str, path: Path) -> list[str]:
    """Mount points under ``path`` in the mount namespace of ``pid``."""
    try:
        lines = Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [line.split()[4] for line in lines if line.split()[4].startswith(str(path))]


def assert_no_leaks(front: Front, dead_helpers: list[int]) -> None:
    """No cgroup of a dead helper, no mount of the state dir on the host."""
    for pid in dead_helpers:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert cgroups_of(pid) == []
    assert mounts_under("self", front.state) == []
    assert mounts_under("self", front.workspace) == []


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "a.txt").write_text("old a\n")
    (ws / "old.txt").write_text("to be deleted\n")
    (ws / "src" / "mod.py").write_text("VALUE = 1\n")
    return ws


@pytest.fixture
def front(root_required: None, tmp_path: Path, workspace: Path) -> Iterator[Front]:
    made = Front(tmp_path, workspace)
    yield made
    made.stop()


def test_helper_killed_during_exec(front: Front, record_property: Props) -> None:
    front.start()
    client = front.client()
    capsule = client.call("capsule_create", {"workspace": str(front.workspace)})["capsule_id"]
    ran = client.call("capsule_exec",
                      {"capsule_id": capsule, "cmd": ["sh", "-c", "echo kept > a.txt; echo new > b.txt"]})
    assert ran["exit_code"] == 0, ran
    [helper] = front.helper_pids()
    assert any("/merged" in m for m in mounts_under(helper, front.state))  # the helper's own namespace
    assert mounts_under("self", front.state) == []

    pending: dict[str, Any] = {}

    def long_exec() -> None:
        other = Client(front.server.path)  # type: ignore[union-attr]
        try:
            other.call("capsule_exec", {"capsule_id": capsule, "cmd": ["sleep", "120"]})
        except (ToolFailed, ConnectionError) as exc:
            pending["error"] = exc
        else:
            pending["error"] = None
        finally:
            other.close()

    thread = threading.Thread(target=long_exec, daemon=True)
    thread.start()
    # The exec is running once its cgroup holds the jail's processes.
    procs_files = lambda: [f for d in cgroups_of(helper) for f in glob.glob(d + "/cgroup.procs")]  # noqa: E731
    wait_until(lambda: any(Path(f).read_text().strip() for f in procs_files()), "the exec's cgroup to fill")
    jail_pids = {int(p) for f in procs_files() for p in Path(f).read_text().split()}
    assert jail_pids

    os.kill(helper, signal.SIGKILL)
    record_property("faults_tried", 1)
    thread.join(30)
    assert not thread.is_alive(), "the pending capsule_exec hung after the helper died"
    error = pending["error"]
    assert isinstance(error, ToolFailed) and error.code == "UNAVAILABLE", error
    assert "retry" in error.error["message"] and "Traceback" not in error.error["message"]
    # The jail dies with its helper (its init has PDEATHSIG), grandchildren included.
    wait_until(lambda: not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                               for p in jail_pids), "the jail's processes to die")

    # The next call starts a new helper, which recovers the capsule and the dead one's cgroups.
    again = client.call("capsule_exec", {"capsule_id": capsule, "cmd": ["cat", "a.txt", "b.txt"]})
    assert again["stdout"] == "kept\nnew\n", again
    [new_helper] = front.helper_pids()
    assert new_helper != helper
    assert "mcp:helper starting a new embedded helper" in front.server.log  # type: ignore[union-attr]
    assert_no_leaks(front, [helper])
    # The finished exec's cgroup goes after its answer (the janitor removes it once the init is
    # reaped: sandbox/jail_end.py, behind the dead helper's cgroups the new one recovers); the
    # next exec's waits, made ahead and empty.
    wait_until(lambda: [d for d in cgroups_of(new_helper) if not os.path.basename(d).startswith("spare")] == [],
               "the finished exec's cgroup to be removed")
    left = cgroups_of(new_helper)
    assert all(not Path(d, "cgroup.procs").read_text().strip() for d in left)
    assert (front.workspace / "a.txt").read_text() == "old a\n"  # the host tree untouched


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("step", STEPS)
def test_front_end_killed_during_promotion(front: Front, step: str, record_property: Props) -> None:
    old_tree = _tree(front.workspace)
    server = front.start(**{CRASH_ENV: step})
    client = front.client()
    capsule = client.call("capsule_create", {"workspace": str(front.workspace)})["capsule_id"]
    script = "echo new a > a.txt; rm old.txt; mkdir -p pkg/deep; echo x > pkg/deep/x.py; echo 'VALUE = 2' > src/mod.py"
    assert client.call("capsule_exec", {"capsule_id": capsule, "cmd": ["sh", "-c", script]})["exit_code"] == 0
    [helper] = front.helper_pids()
    with pytest.raises(ConnectionError):
        client.call("capsule_promote", {"capsule_id": capsule})
    record_property("faults_tried", 1)
    assert server.wait(30) == -signal.SIGKILL
    wait_until(lambda: not psutil.pid_exists(helper), "the embedded helper to die with its parent")

    restarted = front.start()
    new_tree = _tree(front.workspace)
    expected_new = {"a.txt": "new a\n", "pkg/deep/x.py": "x\n", "src/mod.py": "VALUE = 2\n"}
    # All or nothing, and no temp file of the promotion left in the workspace.
    assert new_tree in (old_tree, expected_new), new_tree
    if step in ("all_ops", "done"):
        assert new_tree == expected_new
    if step == "prepared":
        assert new_tree == old_tree
    assert not list((front.state / "promotions").glob("*"))
    if step != "done":
        assert "mcp:recovered promotion" in restarted.log
    # The capsule survived both processes; a promotion not yet applied can run again.
    client = front.client()
    assert capsule in [c["capsule_id"] for c in client.call("capsule_list", {})["capsules"]]
    if new_tree == old_tree:
        done = client.call("capsule_promote", {"capsule_id": capsule})
        assert done["promoted"] is True, done
        assert _tree(front.workspace) == expected_new
    assert_no_leaks(front, [helper])


def test_front_end_killed_while_writing_a_witness(front: Front, record_property: Props) -> None:
    server = front.start(**{WITNESS_CRASH_ENV: "partial"})
    client = front.client()
    capsule = client.call("capsule_create", {"workspace": str(front.workspace)})["capsule_id"]
    assert client.call("capsule_exec", {"capsule_id": capsule,
                                        "cmd": ["sh", "-c", "cat a.txt; echo w > w.txt"]})["exit_code"] == 0
    [helper] = front.helper_pids()
    with pytest.raises(ConnectionError):
        client.call("capsule_witness", {"capsule_id": capsule})
    record_property("faults_tried", 1)
    assert server.wait(30) == -signal.SIGKILL
    witnesses = front.state / "witnesses"
    left = sorted(p.name for p in witnesses.iterdir())
    # Only the temp file holds the partial bytes; nothing under a final name.
    assert len(left) == 1 and left[0].startswith(".wit_") and left[0].endswith(".tmp"), left
    assert (witnesses / left[0]).stat().st_size > 0
    wait_until(lambda: not psutil.pid_exists(helper), "the embedded helper to die with its parent")

    restarted = front.start()
    assert "mcp:recovered witness temp file" in restarted.log
    assert list(witnesses.iterdir()) == []
    client = front.client()
    made = client.call("capsule_witness", {"capsule_id": capsule})
    assert Path(made["path"]).name == made["witness_id"] + ".tar.zst"
    verified = client.call("witness_verify", {"witness_id": made["witness_id"]})
    assert verified["ok"] is True and verified["problems"] == []
    subprocess.run(["tar", "--zstd", "-tf", made["path"]], check=True, capture_output=True)
    assert_no_leaks(front, [helper])


def _dead_socket(path: Path) -> None:
    """Leave a socket file nobody listens on, as a killed server does."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(path))
    sock.close()
    assert path.is_socket()


def test_stale_socket_files_at_start(front: Front, record_property: Props) -> None:
    mcp_socket = front.tmp / "mcp.sock"
    helper_socket = front.state / "helper" / "helper.sock"
    _dead_socket(mcp_socket)
    _dead_socket(helper_socket)
    record_property("faults_tried", 2)
    server = front.start()
    assert server.path == str(mcp_socket)
    client = front.client()
    info = client.call("ccw_info", {})
    assert info["endpoint"] == "socket"
    # The helper socket was dead, so a new helper replaced it and serves capsules.
    capsule = client.call("capsule_create", {"workspace": str(front.workspace)})["capsule_id"]
    assert client.call("capsule_exec", {"capsule_id": capsule, "cmd": ["cat", "a.txt"]})["stdout"] == "old a\n"
    assert helper_socket.is_socket() and len(front.helper_pids()) == 1
    front.stop()
    assert not mcp_socket.exists()


# --- storage faults ------------------------------------------------------------------


def _git(cwd: Path, *args: str) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True)


@pytest.fixture
def small_state(root_required: None, tmp_path: Path) -> Iterator[Path]:
    """The state dir on a 16 MiB tmpfs, unmounted after the server stopped."""
    state = tmp_path / "state"
    state.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "ccw-faults", str(state)], check=True)
    try:
        yield state
    finally:
        subprocess.run(["umount", str(state)], check=True)


def _fill(directory: Path, number: int = 0) -> Path:
    """Write a file until the filesystem is full, down to the last byte."""
    filler = directory / f"filler-{number}"
    with open(filler, "wb", buffering=0) as out:
        for chunk in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    out.write(b"\xa5" * chunk)
            except OSError as exc:
                assert exc.errno == 28, exc
    return filler


def test_disk_full_in_the_state_dir(small_state: Path, front: Front, record_property: Props) -> None:
    _git(front.workspace, "init", "-q")
    _git(front.workspace, "add", "-A")
    _git(front.workspace, "commit", "-qm", "base")
    front.start()
    client = front.client()
    capsule = client.call("capsule_create", {"workspace": str(front.workspace)})["capsule_id"]
    assert client.call("capsule_exec", {"capsule_id": capsule,
                                        "cmd": ["sh", "-c", "echo 1 > one.txt"]})["exit_code"] == 0
    fillers: list[Path] = []
    record_property("faults_tried", 1)

    # Every tool that writes state answers with a structured error that says what to do.
    writes: list[tuple[str, dict[str, Any]]] = [
        ("capsule_create", {"workspace": str(front.workspace)}),
        ("capsule_exec", {"capsule_id": capsule, "cmd": ["sh", "-c", "seq 1 300000; seq 1 300000 >&2"]}),
        ("capsule_witness", {"capsule_id": capsule}),
        ("snapshot_create", {}),
    ]
    for method, params in writes:
        # Fill again: a failed call may free what it had taken (a capsule's disk image).
        fillers.append(_fill(small_state, len(fillers)))
        with pytest.raises(ToolFailed) as failed:
            client.call(method, params)
        assert failed.value.code == "TOO_LARGE", (method, failed.value)
        message = failed.value.error["message"]
        assert str(small_state) in message and "space" in message.lower(), (method, message)
    server = front.server
    assert server is not None and server.proc.poll() is None
    assert "mcp:bug" not in server.log

    for filler in fillers:
        filler.unlink()
    other = client.call("capsule_create", {"workspace": str(front.workspace)})["capsule_id"]
    ran = client.call("capsule_exec", {"capsule_id": capsule, "cmd": ["cat", "one.txt"]})
    assert ran["stdout"] == "1\n"
    made = client.call("capsule_witness", {"capsule_id": capsule})
    assert client.call("witness_verify", {"witness_id": made["witness_id"]})["ok"] is True
    assert client.call("snapshot_create", {})["snapshot_id"]
    client.call("capsule_destroy", {"capsule_id": other})
    front.stop()
    db = sqlite3.connect(small_state / "ccw.sqlite3")
    try:
        assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        db.close()
    assert not list((small_state / "witnesses").glob(".*.tmp"))


@pytest.mark.parametrize("damage", ["table_page", "header"])
def test_corrupt_database_is_moved_aside(front: Front, damage: str, record_property: Props) -> None:
    front.start()
    client = front.client()
    client.call("policy_set", {"name": "mine", "rules": {"deny_paths": ["secret"]}})
    assert "mine" in json.dumps(client.call("policy_list", {}))
    front.stop()
    db_path = front.state / "ccw.sqlite3"
    assert not Path(f"{db_path}-wal").exists() or Path(f"{db_path}-wal").stat().st_size == 0
    with open(db_path, "r+b") as db_file:
        header = db_file.read(100)
        page_size = int.from_bytes(header[16:18], "big")
        pages = db_path.stat().st_size // page_size
        assert pages > 2
        if damage == "header":
            db_file.seek(0)
            db_file.write(b"this is not sqlite" * 4)
        else:  # every b-tree page but the schema's: their headers become garbage
            for page in range(1, pages):
                db_file.seek(page * page_size)
                db_file.write(b"\x0d\xff\xff\xff\xff\x00\x00\x00")
    record_property("faults_tried", 1)

    server = front.start()
    corrupt = sorted(front.state.glob("ccw.sqlite3.corrupt-*"))
    assert len(corrupt) == 1, server.log
    assert f"mcp:state-corrupt {db_path}" in server.log and str(corrupt[0]) in server.log
    assert "Traceback" not in server.log
    client = front.client()
    assert "mine" not in json.dumps(client.call("policy_list", {}))  # lost, as documented
    client.call("policy_set", {"name": "mine", "rules": {"deny_paths": ["secret"]}})
    capsule = client.call("capsule_create", {"workspace": str(front.workspace)})["capsule_id"]
    assert client.call("capsule_exec", {"capsule_id": capsule, "cmd": ["cat", "a.txt"]})["stdout"] == "old a\n"
    front.stop()
    front.start()  # the fresh database is healthy: no second move
    assert len(sorted(front.state.glob("ccw.sqlite3.corrupt-*"))) == 1
    assert "mine" in json.dumps(front.client().call("policy_list", {}))

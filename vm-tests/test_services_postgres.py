"""A project whose tests need a database: PostgreSQL from Debian's packages as a capsule's
service, and nothing of it left on the host once the capsule is destroyed (issue 36).

PostgreSQL refuses to run as root, and a jail runs as its caller's uid, so the agent is an
unprivileged user made for the test, on a CI runner's path: its own ``ccw-mcp`` on stdio
talks to a privileged ``ccw-helper`` (CCW_HELPER_SOCKET), which traces and limits the
user's runs with cgroups and fanotify.  In the user's workspace (a small key-value store
kept in PostgreSQL through ``psql``, and its unittest suite) the agent ``initdb``-s a data
dir, starts ``postgres`` as a service (ready when it logs that it accepts connections),
runs the suite from an exec against it on the capsule's loopback, and forwards the port:
the user's own ``psql`` on the host reads what the suite wrote.  Then the capsule is
destroyed with the server running, and the test, as root, looks at the host: the
server's processes, their cgroups, the capsule's network namespace (the only place
port 5432 was listened on), its mounts and directories, and the forwarded port are gone.
"""

from __future__ import annotations

import contextlib
import grp
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import pytest

from mcp_server.devcluster import postgres
from tests.support.users import UserScript

HERE = Path(__file__).resolve().parent

STORE = '''\
"""A key-value store kept in PostgreSQL, through psql."""
import subprocess

PSQL = [{psql!r}, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", "5432",
        "-U", "app", "-d", "postgres"]


def sql(statement):
    return subprocess.run([*PSQL, "-c", statement], check=True, capture_output=True, text=True).stdout.strip()


def create():
    sql("CREATE TABLE IF NOT EXISTS kv (key text PRIMARY KEY, value text NOT NULL)")


def put(key, value):
    sql(f"INSERT INTO kv VALUES ('{{key}}', '{{value}}') ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value")


def get(key):
    return sql(f"SELECT value FROM kv WHERE key = '{{key}}'") or None
'''

TEST_STORE = '''\
import unittest

import store


class StoreTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        store.create()

    def test_a_value_put_is_read_back(self):
        store.put("greeting", "hello from the capsule")
        self.assertEqual(store.get("greeting"), "hello from the capsule")

    def test_a_put_replaces_the_value(self):
        store.put("count", "1")
        store.put("count", "2")
        self.assertEqual(store.get("count"), "2")

    def test_a_missing_key_reads_as_none(self):
        self.assertIsNone(store.get("nothing here"))
'''

# The agent's session, as the user (a UserScript): each step printed, the test answering.
SCRIPT = r"""
import json, os, subprocess, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import psutil, trio
from tests.support import agent_loop
from tests.support.mcp_process import agent_server_env
from tests.support.users import step

setup = json.loads(sys.argv[2])
ws, bin_dir = Path(setup["ws"]), setup["bin"]

def servers():
    return sorted(p.pid for p in psutil.process_iter(["uids", "exe"]) if p.info["uids"] and
                  p.info["uids"].real == os.getuid() and p.info["exe"] == f"{bin_dir}/postgres")

async def main():
    env = {**agent_server_env(Path(setup["state"]), ws), "CCW_HELPER_SOCKET": setup["socket"]}
    async with agent_loop.mcp_stdio(env) as call:
        out = {}
        cap = out["cap"] = (await call("capsule_create", {"workspace": str(ws), "auto_expose": False}))["capsule_id"]
        run = lambda *cmd: call("capsule_exec", {"capsule_id": cap, "cmd": list(cmd), "timeout_ms": 120000})
        out["initdb"] = await run(f"{bin_dir}/initdb", "-D", "pgdata", "-U", "app", "--auth=trust", "--no-sync",
                                  "-E", "UTF8", "--locale=C")
        out["start"] = await call("capsule_service_start", {"capsule_id": cap, "name": "db", "cmd": [
            f"{bin_dir}/postgres", "-D", "pgdata", "-k", "/tmp", "-h", "127.0.0.1", "-p", "5432",
            "-c", "fsync=off", "-c", "log_statement=all"],
            "ready": {"line": "database system is ready to accept connections", "timeout_ms": 60000}})
        out["tests"] = await run("python3", "-m", "unittest", "-v", "test_store")
        logs = {"text": ""}
        with trio.move_on_after(15):  # its output comes in a few times a second
            while "VALUES ('greeting'" not in logs["text"]:
                await trio.sleep(0.1)
                logs = await call("capsule_service_logs", {"capsule_id": cap, "name": "db"})
        out["logs"] = logs
        out["port"] = await call("capsule_port", {"capsule_id": cap, "port": 5432})
        out["host_psql"] = await trio.to_thread.run_sync(lambda: subprocess.run(
            [f"{bin_dir}/psql", "-X", "-A", "-t", "-h", "127.0.0.1", "-p", str(out["port"]["host_port"]), "-U",
             "app", "-d", "postgres", "-c", "SELECT value FROM kv WHERE key = 'greeting'"],
            capture_output=True, text=True).stdout)
        out["servers"] = servers()
        await trio.to_thread.run_sync(step, {"step": "running", "cap": cap, "servers": out["servers"],
                                             "host_port": out["port"]["host_port"]})
        out["destroy"] = await call("capsule_destroy", {"capsule_id": cap})
        out["servers_after"] = servers()
        await trio.to_thread.run_sync(step, {"step": "destroyed"})
    step({"step": "done", **out}, wait=False)

try:
    trio.run(main)
except BaseExceptionGroup as group:  # the MCP client's task groups wrap the scenario's failure
    raise agent_loop.leaf(group) from None
"""


@pytest.fixture
def bin_dir(root_required: None, require: Callable[[bool, str], None]) -> Path:
    """PostgreSQL's server binaries (``./dev test`` installs Debian's ``postgresql``; so does this, as root)."""
    installable = shutil.which("apt-get") is not None
    require(postgres.find_bin_dir() is not None or installable, "no PostgreSQL server and no apt-get to install it")
    return postgres.ensure_installed()


class ServiceHelper(NamedTuple):
    """A privileged helper started for the test."""

    socket: str
    pid: int
    capsules: Path  # where it keeps its capsules' directories


@pytest.fixture
def service_helper(user_dir: tuple[int, int, Path], launch_helper: Callable[..., Any]) -> Iterator[ServiceHelper]:
    """A privileged ``ccw-helper`` whose socket admits the user's group."""
    workdir = Path(tempfile.mkdtemp(prefix="ccw-pg-helper-"))
    workdir.chmod(0o755)
    group = grp.getgrgid(user_dir[1]).gr_name
    process = launch_helper(workdir / "helper.sock", workdir / "state", workdir / "helper.log", "--privileged",
                            "--socket-group", group)
    try:
        yield ServiceHelper(str(workdir / "helper.sock"), process.pid, workdir / "state" / "capsules")
    finally:
        process.terminate()
        assert process.wait(30) == 0, (workdir / "helper.log").read_text()
        subprocess.run(["rm", "-rf", str(workdir)], check=True)


def _workspace(home: Path, uid: int, gid: int, bin_dir: Path) -> Path:
    ws = home / "ws"
    ws.mkdir()
    (ws / "store.py").write_text(STORE.format(psql=str(bin_dir / "psql")))
    (ws / "test_store.py").write_text(TEST_STORE)
    for path in (ws, ws / "store.py", ws / "test_store.py"):
        os.chown(path, uid, gid)
    return ws


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 15) -> None:
    """Poll ``condition`` (a liveness bound: a jail's cgroup goes after its end, not with it)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _cgroups(pid: int) -> list[Path]:
    """The ccw cgroup directories (every hierarchy) a process is in."""
    found = []
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "/ccw/" in path:
            hierarchy = controllers.removeprefix("name=") or "unified"
            found.append(Path("/sys/fs/cgroup") / hierarchy.split(",")[0] / path.lstrip("/"))
    return found


def _holders(netns: str) -> list[str]:
    """Every process in the network namespace ``netns`` (``net:[inode]``), or holding a
    descriptor of it, or a mount of it."""
    held = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(proc / "ns" / "net") == netns:
                held.append(f"{proc.name} is in it")
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == netns:
                        held.append(f"{proc.name} holds it as fd {fd.name}")
            if netns in (proc / "mountinfo").read_text():
                held.append(f"{proc.name} sees a mount of it")
    return held


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _refused(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def _mounts_naming(pid: int | str, text: str) -> list[str]:
    return [line for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines() if text in line]


def test_postgres_serves_a_projects_tests_and_destroy_leaves_nothing(
        user_dir: tuple[int, int, Path], bin_dir: Path, service_helper: ServiceHelper) -> None:
    uid, gid, home = user_dir
    helper_socket, helper_pid, capsules = service_helper
    ws = _workspace(home, uid, gid, bin_dir)
    setup = {"ws": str(ws), "bin": str(bin_dir), "state": str(home / "state"), "socket": helper_socket}
    (home / "state").mkdir()
    os.chown(home / "state", uid, gid)

    with UserScript(uid, gid, [sys.executable, "-c", SCRIPT, str(HERE.parent), json.dumps(setup)], home) as script:
        running = script.receive()
        cap, servers = running["cap"], running["servers"]
        assert servers, running  # the postmaster and its workers, the user's own processes
        cgroups = sorted({path for pid in servers for path in _cgroups(pid)})
        netns = os.readlink(f"/proc/{servers[0]}/ns/net")
        # The service helper's cgroups (named after its pid): it runs the user's server.
        assert cgroups and all(path.is_dir() and path.name.endswith(f"@{helper_pid}") for path in cgroups), cgroups
        assert netns != os.readlink("/proc/self/ns/net") and _holders(netns), netns
        assert _mounts_naming(helper_pid, cap), "the probe of the capsule's mounts sees none while it lives"
        assert (capsules / cap).is_dir()
        assert not _refused(running["host_port"])
        script.send("destroy it")

        assert script.receive() == {"step": "destroyed"}
        _wait_until(lambda: not any(_alive(pid) for pid in servers), "the server's processes to end")
        _wait_until(lambda: not any(path.exists() for path in cgroups), "the server's cgroups to go")
        assert _holders(netns) == [], "the capsule's network namespace (where 5432 listened) is still held"
        assert _mounts_naming(helper_pid, cap) == [] and _mounts_naming("self", cap) == []
        _wait_until(lambda: not [name for name in os.listdir(capsules) if cap in name], "the capsule's directory to go")
        assert _refused(running["host_port"]), "the forwarded port outlived its capsule"
        script.send("done")
        out = script.receive()
        script.finish()

    assert out["initdb"]["exit_code"] == 0, out["initdb"]["stderr"][-2000:]
    assert out["start"]["ready"] is True and out["start"]["state"] == "ready", out["start"]
    tests = out["tests"]
    assert tests["exit_code"] == 0 and "Ran 3 tests" in tests["stderr"] and tests["stderr"].endswith("OK\n"), tests
    assert "statement: INSERT INTO kv VALUES ('greeting', 'hello from the capsule')" in out["logs"]["text"]
    assert out["host_psql"] == "hello from the capsule\n", out["host_psql"]
    assert out["servers_after"] == [], out["servers_after"]
    assert (ws / "pgdata").exists() is False  # the data dir lived in the capsule alone

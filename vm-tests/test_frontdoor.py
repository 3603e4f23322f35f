"""One front end per state dir (mcp_server/frontdoor.py), with real processes.

An agent's stdio ``ccw-mcp`` owns the state dir; a ``ccw capsule exec`` and a second
stdio ``ccw-mcp`` attach to it, so their calls take turns with the agent's, each
egress connection is recorded once, the attached server's client is served its own
tool list, and when the owner leaves, the attached server takes over.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mcp_server.config import PROFILES, TOOLSETS  # noqa: E402
from mcp_server.tools.registry import Registry  # noqa: E402
from tests.support.cli_process import cli_env  # noqa: E402
from tests.support.raw_mcp import RawStdio, structured  # noqa: E402
from tests.support.workspaces import make_workspace  # noqa: E402

sys.path.insert(0, str(ROOT / "vm-tests"))

from tests.support.netfixtures import HttpLoopback  # noqa: E402
from tests.support.users import as_user  # noqa: E402

CCW = ROOT / ".venv" / "bin" / "ccw"


def events(state_dir: Path, capsule_id: str, kind: str) -> list[dict[str, Any]]:
    """The state dir's events of ``kind`` for a capsule, in order."""
    db = sqlite3.connect(f"file:{state_dir / 'ccw.sqlite3'}?mode=ro", uri=True)
    try:
        rows = db.execute("SELECT data FROM events WHERE capsule_id = ? AND kind = ? ORDER BY id",
                          (capsule_id, kind)).fetchall()
    finally:
        db.close()
    return [json.loads(row[0]) for row in rows]


def wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    """Poll ``condition()`` until it holds (a sequencing wait, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.fixture
def state(tmp_path: Path, root_required: None) -> Path:
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    return state_dir


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws", {"f": ""})


def test_cli_exec_waits_for_the_agents_exec(state: Path, workspace: Path) -> None:
    with RawStdio(state, "capsule", tasks=None) as agent:
        cap = structured(agent.call("capsule_create",
                                    {"workspace": str(workspace), "auto_expose": False}))["capsule_id"]
        outcome: list[dict[str, Any]] = []
        running = threading.Thread(target=lambda: outcome.append(agent.call(
            "capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "sleep 3; echo a >> f"]})))
        running.start()
        wait_for(lambda: events(state, cap, "run.started"), "the agent's exec to start")
        cli = subprocess.run([str(CCW), "capsule", "exec", cap, "--", "sh", "-c", "echo b >> f; cat f"],
                             env=cli_env(state), capture_output=True, text=True, timeout=120)
        running.join(60)
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout == "a\nb\n"  # it ran after the agent's command, not beside it
        assert structured(outcome[0])["exit_code"] == 0
        finished = events(state, cap, "run.finished")
        assert [e["argv"][-1] for e in finished] == ["sleep 3; echo a >> f", "echo b >> f; cat f"]
        assert [e["seq"] for e in finished] == sorted(e["seq"] for e in finished)
        assert not (state / "frontend.log").exists()  # no daemon was started beside the agent's server


def test_a_persons_ccw_command_gets_its_own_tools_not_the_agents(state: Path, workspace: Path) -> None:
    # The agent's server is given only its loop's tools (no capsule_fork); the person's
    # `ccw capsule fork` on the same state dir is served its own families, as it would
    # be with no agent there.
    with RawStdio(state, "agent", tasks=None) as agent:
        cap = structured(agent.call("capsule_create",
                                    {"workspace": str(workspace), "auto_expose": False}))["capsule_id"]
        assert "capsule_fork" not in {tool["name"] for tool in agent.request("tools/list", {})["result"]["tools"]}
        cli = subprocess.run([str(CCW), "capsule", "fork", cap], env=cli_env(state), capture_output=True, text=True,
                             timeout=120)
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.strip().startswith("cap_"), cli.stdout
        listed = structured(agent.call("capsule_list", {}))["capsules"]
        assert [c["parent"] for c in listed if c["capsule_id"] != cap] == [cap]


# Through the jail's HTTP proxy (NO_PROXY names 127.0.0.1, so urllib would not use it).
FETCH = r"""
import os, socket, sys
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=20) as s:
    s.sendall(f"GET http://127.0.0.1:{sys.argv[1]}/ HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    print(s.recv(4096).split(b"\r\n")[0].decode())
"""


@pytest.fixture
def loopback() -> Iterator[HttpLoopback]:
    with HttpLoopback() as server:
        yield server


def test_two_front_ends_record_each_connection_once(state: Path, workspace: Path, loopback: HttpLoopback) -> None:
    rule = f"127.0.0.1:{loopback.port}"
    with RawStdio(state, "capsule", tasks=None) as first, RawStdio(state, "capsule", tasks=None) as second:
        made = first.call("capsule_create", {"workspace": str(workspace), "auto_expose": False,
                                             "network": {"allow": [rule]}})
        cap = structured(made)["capsule_id"]
        wait_for(lambda: any("tools=relayed" in line for line in second.stderr), "the second server to attach")
        fetch = ["python3", "-c", FETCH, str(loopback.port)]
        runs = [structured(client.call("capsule_exec", {"capsule_id": cap, "cmd": fetch}))
                for client in (first, second, second, first)]
        for ran in runs:
            assert ran["exit_code"] == 0 and ran["stdout"].startswith("HTTP/1.0 200"), ran
            (record,) = ran["touched"]["network"]  # its own connection, recorded in its own run
            assert (record["host"], record["port"], record["allowed"]) == ("127.0.0.1", loopback.port, True)
        assert loopback.accepted == 4
        connections = events(state, cap, "net.connection")
        # Once as its run's record, once live as the proxy decided it: never by both servers.
        assert [c["seq"] for c in connections if not c.get("live")] == [1, 2, 3, 4]
        assert len([c for c in connections if c.get("live")]) == 4
        assert [e["connections"] for e in events(state, cap, "run.finished")] == [1, 1, 1, 1]


def test_an_attached_client_is_served_its_own_tool_list(state: Path, workspace: Path) -> None:
    """An agent's ccw-mcp given the agent profile attaches to an owner serving every family:
    its client lists the profile's tools, runs its capsule through the owner's helper, and
    is refused the owner's other tools, however named; the owner's client keeps them all."""
    with RawStdio(state, ",".join(TOOLSETS), tasks=None) as owner, RawStdio(state, "agent", tasks=None) as agent:
        wait_for(lambda: any("tools=relayed" in line for line in agent.stderr), "the agent's server to attach")

        def listed(client: RawStdio) -> list[str]:
            return sorted(tool["name"] for tool in client.request("tools/list")["result"]["tools"])

        assert listed(agent) == sorted(PROFILES["agent"])
        assert listed(owner) == sorted(spec.name for spec in Registry.load(TOOLSETS).tools)
        cap = structured(agent.call("capsule_create",
                                    {"workspace": str(workspace), "auto_expose": False}))["capsule_id"]
        ran = structured(agent.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "echo mine > f; cat f"]}))
        assert ran["exit_code"] == 0 and ran["stdout"] == "mine\n"
        for name, args in (("capsule_fork", {"capsule_id": cap}), ("capsule/fork", {"capsule_id": cap}),
                           ("policy_set", {"name": "open", "rules": {}}), ("ccw_info", {})):
            refused = agent.request("tools/call", {"name": name, "arguments": args})
            assert refused["error"]["code"] == -32602, refused
            assert refused["error"]["message"].startswith(f"unknown tool {name!r}"), refused
        direct = agent.request("capsule/fork", {"capsule_id": cap})  # a direct method (seed 001) it was not given
        assert direct["error"]["code"] == -32601, direct
        listed_capsules = structured(owner.call("capsule_list", {}))["capsules"]
        assert [c["capsule_id"] for c in listed_capsules] == [cap]  # no refused call forked it
        fork = structured(owner.call("capsule_fork", {"capsule_id": cap}))
        again = structured(owner.call("capsule_exec", {"capsule_id": fork["capsule_id"], "cmd": ["cat", "f"]}))
        assert again["stdout"] == "mine\n"


def test_attached_server_takes_over_when_the_owner_leaves(state: Path, workspace: Path) -> None:
    owner = RawStdio(state, "capsule", tasks=None)
    try:
        with RawStdio(state, "capsule", tasks=None) as attached:
            wait_for(lambda: any("tools=relayed" in line for line in attached.stderr), "the second server to attach")
            cap = structured(attached.call("capsule_create", {"workspace": str(workspace), "auto_expose": False}))
            assert owner.close() == 0
            ran = structured(attached.call("capsule_exec", {"capsule_id": cap["capsule_id"],
                                                            "cmd": ["sh", "-c", "echo took over > f; cat f"]}))
            assert ran["exit_code"] == 0 and ran["stdout"] == "took over\n"
            listed = structured(attached.call("capsule_list", {}))
            assert [c["capsule_id"] for c in listed["capsules"]] == [cap["capsule_id"]]
            # A third comes and attaches to the one that took over.
            with RawStdio(state, "capsule", tasks=None) as third:
                wait_for(lambda: any("tools=relayed" in line for line in third.stderr), "the third to attach")
                again = structured(third.call("capsule_exec", {"capsule_id": cap["capsule_id"], "cmd": ["cat", "f"]}))
                assert again["stdout"] == "took over\n"
    finally:
        owner.close()  # closed above, or ending now: its pipes are closed either way


def test_the_cli_daemon_discovers_with_the_callers_path(state: Path, workspace: Path, tmp_path: Path) -> None:
    tool = tmp_path / "tool" / "bin"
    tool.mkdir(parents=True)
    (tool / "mytool").write_text("#!/bin/sh\necho from the callers toolchain\n")
    (tool / "mytool").chmod(0o755)
    env = cli_env(state)

    def ccw(*args: str, path: str = env["PATH"], **more: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(CCW), *args], env={**env, "PATH": path, **more}, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stderr
        return done

    try:
        ccw("capsule", "create", "--no-auto-expose", str(workspace))  # starts the daemon, with this PATH
        status = json.loads(ccw("helper", "status", "--json").stdout)
        assert status["frontend_daemon"] is True and status["frontend_endpoint"] == "socket"
        made = ccw("capsule", "create", str(workspace), path=f"{tool}:{env['PATH']}")
        assert f"shown read-only: {tool.parent} (PATH entry {tool})" in made.stderr
        ran = ccw("capsule", "exec", made.stdout.strip(), "--", str(tool / "mytool"))
        assert ran.stdout == "from the callers toolchain\n"
        # A whitelisted variable's value is the calling command's, not the daemon's.
        cap = ccw("capsule", "create", "--no-auto-expose", "--env", "GREETING", str(workspace),
                  GREETING="from the daemon's starter").stdout.strip()
        said = ccw("capsule", "exec", cap, "--", "sh", "-c", 'echo "$GREETING"', GREETING="from this shell")
        assert said.stdout == "from this shell\n"
    finally:
        stopped = json.loads(subprocess.run([str(CCW), "helper", "stop", "--json"], env=env, capture_output=True,
                                            text=True, timeout=120).stdout)
    assert stopped["frontend_stopped"] is True and stopped["frontend_pid"] == status["frontend_pid"]
    after = subprocess.run([str(CCW), "helper", "status", "--json"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert json.loads(after.stdout)["frontend_running"] is False



def test_an_agents_server_attaches_to_the_cli_front_end_while_it_runs_a_command(state: Path, workspace: Path) -> None:
    """A person's ``ccw capsule exec`` runs a long command: an agent's stdio ccw-mcp that
    starts meanwhile is answered before the command ends (it attaches to the busy daemon;
    asked to stop, the daemon would stop listening until its command ended), and an idle
    daemon still yields to the next one."""
    env = cli_env(state)
    cap = subprocess.run([str(CCW), "capsule", "create", "--no-auto-expose", str(workspace)], env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout.strip()
    person = subprocess.Popen([str(CCW), "capsule", "exec", cap, "--", "sh", "-c", "sleep 20; echo done"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: events(state, cap, "run.started"), "the person's exec to start")
        with RawStdio(state, "capsule", tasks=None) as agent:
            listed = structured(agent.call("capsule_list", {}))
            assert person.poll() is None  # answered while the person's command still ran
            assert [c["capsule_id"] for c in listed["capsules"]] == [cap]
            assert any("tools=relayed" in line for line in agent.stderr), agent.stderr
            out, err = person.communicate(timeout=120)
            assert (person.returncode, out) == (0, "done\n"), err
        # Nobody is connected now: the next agent's server owns the state dir itself.
        with RawStdio(state, "capsule", tasks=None) as agent:
            assert structured(agent.call("capsule_list", {}))["capsules"][0]["capsule_id"] == cap
            assert not any("tools=relayed" in line for line in agent.stderr), agent.stderr
            assert json.loads((state / "frontend.lock").read_text())["pid"] == agent.proc.pid
    finally:
        person.kill()
        person.wait()
        subprocess.run([str(CCW), "helper", "stop"], env=env, capture_output=True, timeout=120)


def test_frontend_socket_refuses_another_uid_even_root(user_dir: tuple[int, int, Path]) -> None:
    """An unprivileged user's front end: its socket is 0600, and root, who may connect
    anyway, is refused by SO_PEERCRED (a call may lend its caller's PATH and HOME)."""
    uid, gid, home = user_dir
    state = home / "state"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8", "CCW_STATE_DIR": str(state),
           "CCW_TOOLSETS": "server", "MCP_READY_FILE": str(home / "ready"), "HOME": str(home)}
    keep: list[str] = []
    owner = subprocess.Popen(as_user(uid, gid, [sys.executable, "-m", "mcp_server"], keep), env=env, cwd=str(home),
                             stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        sock_path = state / "frontend.sock"
        wait_for(lambda: (home / "ready").exists(), "the user's ccw-mcp to be ready")
        assert sock_path.stat().st_uid == uid and sock_path.stat().st_mode & 0o777 == 0o600
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
            client.settimeout(30)
            client.connect(str(sock_path))  # root passes the mode; the peer check must stop it
            client.sendall(b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"ccw_info"}}\n')
            try:
                answer = client.recv(4096)
            except ConnectionResetError:  # closed with our request unread
                answer = b""
            assert answer == b""  # no answer
    finally:
        assert owner.stdin is not None
        owner.stdin.close()
        owner.wait(60)
        log = owner.stderr.read().decode() if owner.stderr else ""
        if owner.stderr:
            owner.stderr.close()
        for directory in keep:
            os.rmdir(directory)
    assert f"mcp:frontend refused a client of uid 0 (serving uid {uid})" in log, log

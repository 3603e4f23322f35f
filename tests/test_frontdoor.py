"""mcp_server/frontdoor.py and transports/relay.py: the state dir's lock, the caller context's
trust, and a second stdio ccw-mcp relaying to the first (no helper needed: ccw_info)."""

from __future__ import annotations

import array
import dataclasses
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from mcp_server import framing, frontdaemon, frontdoor
from mcp_server.caller import (
    CALLER_META,
    CALLER_TERMINAL,
    CALLER_TRUSTED,
    PASSED_FDS,
    PassedFds,
    caller_env,
    caller_terminal,
)
from mcp_server.config import PROFILES, TOOLSETS, Config
from mcp_server.tools.registry import Registry
from mcp_server.transports.relay import Relay
from sandbox.errors import CcwError
from tests.support.descriptors import is_closed
from tests.support.raw_mcp import RawStdio, structured


def test_the_first_takes_the_lock_and_names_itself(tmp_path: Path) -> None:
    first = frontdoor.try_lock(str(tmp_path))
    assert first is not None
    try:
        assert frontdoor.try_lock(str(tmp_path)) is None
        config = Config.from_env({"CCW_STATE_DIR": str(tmp_path), "CCW_TOOLSETS": "server"})
        first.record("stdio", daemon=False, config=config)
        assert frontdoor.owner_of(str(tmp_path)) == {"pid": os.getpid(), "endpoint": "stdio", "daemon": False,
                                                     "settings": frontdoor.shared_settings(config),
                                                     "families": [*TOOLSETS, *PROFILES]}
        frontdoor.refuse_unlike(config)  # the same settings: attach
        # Other tool families: attach, and the client is served its own (not a shared setting).
        frontdoor.refuse_unlike(dataclasses.replace(config, toolsets=("agent", "capsule", "server")))
        with pytest.raises(CcwError) as unlike:
            frontdoor.refuse_unlike(dataclasses.replace(config, toolsets=("server", "capsule"),
                                                        reapi_url="grpc://127.0.0.1:1"))
        assert unlike.value.code == "CONFLICT" and unlike.value.details == {"settings": ["reapi_url"]}
        assert "CCW_REAPI_URL" in unlike.value.message and "CCW_TOOLSETS" not in unlike.value.message
        assert "own CCW_STATE_DIR" in unlike.value.message
        assert oct(os.stat(tmp_path / "frontend.lock").st_mode & 0o777) == "0o600"
    finally:
        first.release()
    assert frontdoor.owner_of(str(tmp_path)) is None  # the record of a released lock is stale
    again = frontdoor.try_lock(str(tmp_path))
    assert again is not None
    again.release()


def test_an_owner_that_cannot_serve_a_family_is_not_attached_to(tmp_path: Path) -> None:
    """An owner of another ccw version, without a family this one has: attaching would
    serve the client fewer tools than it was given, so this one says so and exits 2."""
    lock = frontdoor.try_lock(str(tmp_path))
    assert lock is not None
    try:
        config = Config.from_env({"CCW_STATE_DIR": str(tmp_path), "CCW_TOOLSETS": "server,schema"})
        record = {"pid": 1, "endpoint": "stdio", "daemon": False, "settings": frontdoor.shared_settings(config),
                  "families": ["server", "text"]}
        os.pwrite(lock.fd, json.dumps(record).encode(), 0)
        frontdoor.refuse_unlike(dataclasses.replace(config, toolsets=("server",)))
        with pytest.raises(CcwError) as unserved:
            frontdoor.refuse_unlike(config)
        assert unserved.value.code == "CONFLICT" and unserved.value.details == {"settings": ["toolsets"]}
        assert "CCW_TOOLSETS: it cannot serve schema (it serves server, text)" in unserved.value.message
    finally:
        lock.release()


@pytest.mark.parametrize("trusted", [True, False])
def test_caller_env_only_from_a_trusted_connection(trusted: bool) -> None:
    # The ccw command's whole environment: the front end reads PATH and HOME (discovery) and
    # the values of a capsule's whitelisted variables from it, nothing else.
    meta = {CALLER_META: {"cwd": "/w", "env": {"PATH": "/opt/x/bin", "HOME": "/home/u", "FOO": "bar", "N": 1}}}
    token = CALLER_TRUSTED.set(trusted)
    try:
        got = caller_env(meta)
        assert got == ({"PATH": "/opt/x/bin", "HOME": "/home/u", "FOO": "bar"} if trusted else None)
        for bad in (None, [], {CALLER_META: "x"}, {CALLER_META: {"env": ["PATH"]}}):
            assert caller_env(bad) is None
    finally:
        CALLER_TRUSTED.reset(token)


def test_a_terminal_comes_only_with_the_call_that_names_it() -> None:
    master, slave = os.openpty()
    os.close(master)
    passed = PassedFds()
    token = PASSED_FDS.set(passed)
    try:
        assert caller_terminal({}, "capsule_exec") is None and caller_terminal(None, "capsule_exec") is None
        with pytest.raises(CcwError) as none_came:
            caller_terminal({CALLER_TERMINAL: True}, "capsule_exec")
        assert none_came.value.code == "INVALID_ARGUMENT" and "none came" in none_came.value.message
        passed.add([os.dup(slave)])
        with pytest.raises(CcwError) as other_tool:
            caller_terminal({CALLER_TERMINAL: True}, "capsule_diff")
        assert other_tool.value.code == "INVALID_ARGUMENT"
        assert passed.take() is None  # taken and closed by the refusal, not left for a later call
        passed.add([os.dup(slave)])
        fd = caller_terminal({CALLER_TERMINAL: True}, "capsule_exec")
        assert fd is not None and os.path.samestat(os.fstat(fd), os.fstat(slave))
        os.close(fd)
    finally:
        PASSED_FDS.reset(token)
        os.close(slave)
    with pytest.raises(CcwError):  # on any connection but frontend.sock nothing is ever passed
        caller_terminal({CALLER_TERMINAL: True}, "capsule_exec")


OPENED = frontdoor.opening_line({"workspace": "/w", "env": {"A": "1"}}, ["server", "text"])


@pytest.mark.parametrize("sent", [
    [OPENED + b'{"jsonrpc":"2.0"}\n'],
    [OPENED[:5], OPENED[5:]],  # split: read until its newline
    [b'{"jsonrpc":"2.0","id":1,"method":"initialize"}\n'],
    [b"{}\n"],  # shorter than the opening's start: decided on its newline, not by waiting for more
    [frontdoor.OPENING + b"not json\n"],  # looks like one, is not: read as MCP (a parse error), not a crash
    [b""],
])
def test_a_connection_may_open_with_its_caller_context(sent: list[bytes]) -> None:
    async def main() -> tuple[Any, bytes]:
        ours, theirs = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        for chunk in sent:
            await theirs.send(chunk)
            await trio.sleep(0.01)
        theirs.shutdown(socket.SHUT_WR)
        receiver = frontdoor._FdReceiver(trio.SocketStream(ours), PassedFds())
        opening = await receiver.opening()
        rest = b""
        while chunk := await receiver.receive_some():
            rest += chunk
        await receiver.aclose()
        theirs.close()
        return opening, rest

    opening, rest = trio.run(main)
    whole = b"".join(sent)
    if whole.startswith(frontdoor.OPENING) and b"not json" not in whole:
        assert opening == frontdoor.Opening({"workspace": "/w", "env": {"A": "1"}}, ("server", "text"))
        assert rest == whole[len(OPENED):]
    else:
        assert opening is None and rest == whole  # nothing lost: the connection reads it all


@pytest.mark.parametrize(("lent", "served"), [
    (["text", "server"], ("text", "server")),
    (["agent"], ("agent",)),
    (None, None),  # names none: the owner's own families apply
    (["server", "fam_of_a_newer_ccw"], ("server",)),  # never more than it named, nor another's
    ("server", ("server",)),
    ({"all": True}, ()),  # malformed: no tools, not the owner's
    ([1, ["text"]], ()),
])
def test_an_opening_lends_the_attached_servers_tool_families(lent: Any, served: Any) -> None:
    line = json.dumps({CALLER_META: {"workspace": "/w"}, frontdoor.OPENING_TOOLSETS: lent}).encode()
    assert frontdoor.Opening.parse(line) == frontdoor.Opening({"workspace": "/w"}, served)


def test_a_call_naming_a_terminal_over_stdio_is_refused(tmp_path: Path) -> None:
    with RawStdio(tmp_path / "state", "capsule", tasks=None) as client:
        answer = client.request("tools/call", {"name": "capsule_exec", "_meta": {CALLER_TERMINAL: True},
                                               "arguments": {"capsule_id": "cap_x", "cmd": ["true"]}})
    result = answer["result"]
    assert result["isError"] and result["structuredContent"]["error"]["code"] == "INVALID_ARGUMENT"
    assert "ccw capsule shell" in result["structuredContent"]["error"]["message"]


def test_descriptors_passed_on_the_front_end_socket_are_kept_up_to_a_limit() -> None:
    async def main() -> None:
        ours, theirs = trio.socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        pipes = [os.pipe() for _ in range(PassedFds.LIMIT + 2)]
        sent = array.array("i", [r for r, _ in pipes])
        await theirs.sendmsg([b'{"x":1}\n'], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, sent)])
        passed = PassedFds()
        receiver = frontdoor._FdReceiver(trio.SocketStream(ours), passed)
        assert await receiver.receive_some() == b'{"x":1}\n'
        kept = [passed.take() for _ in range(PassedFds.LIMIT + 2)]
        assert kept[PassedFds.LIMIT:] == [None, None]  # the rest were closed on arrival
        for fd, (_, w) in zip(kept[: PassedFds.LIMIT], pipes, strict=False):
            assert fd is not None and os.get_inheritable(fd) is False  # MSG_CMSG_CLOEXEC
            os.write(w, b"y")
            assert os.read(fd, 1) == b"y"  # the pipe the client sent, in order
            passed.add([fd])
        extra = os.dup(kept[0] or 0)
        passed.add([extra])
        assert is_closed(extra)  # over the limit: closed at once
        held = list(kept[: PassedFds.LIMIT])
        passed.close()
        assert all(is_closed(fd) for fd in held if fd is not None)
        await receiver.aclose()
        theirs.close()
        for r, w in pipes:
            os.close(r)
            os.close(w)

    trio.run(main)


def _owner(state: Path) -> dict[str, Any]:
    """The owner's record without its settings and families."""
    return {k: v for k, v in (frontdoor.owner_of(str(state)) or {}).items() if k not in ("settings", "families")}


def _attached(client: RawStdio) -> None:
    deadline = time.monotonic() + 60
    while not any("tools=relayed" in line for line in client.stderr):
        assert time.monotonic() < deadline, "\n".join(client.stderr)
        time.sleep(0.05)


def _info(client: RawStdio, **args: Any) -> dict[str, Any]:
    answer = client.request("tools/call", {"name": "ccw_info", "arguments": args}, timeout=60)
    return answer


def test_a_second_stdio_server_relays_and_takes_over(tmp_path: Path) -> None:
    state = tmp_path / "state"
    owner = RawStdio(state, "server", tasks=None)
    try:
        with RawStdio(state, "server", tasks=None) as attached:
            _attached(attached)
            assert "result" in _info(attached)
            assert "result" in attached.request("tools/list")
            # A call in flight when the owner dies is answered "retry"; the next one works.
            in_flight: list[dict[str, Any]] = []
            waiting = threading.Thread(target=lambda: in_flight.append(_info(attached, delay_ms=8000)))
            waiting.start()
            time.sleep(2.0)  # let the request reach the owner (sequencing only)
            owner.proc.send_signal(signal.SIGKILL)
            owner.proc.wait(30)
            waiting.join(60)
            (failed,) = in_flight
            assert failed["error"]["code"] == -32001
            assert "stopped before answering" in failed["error"]["message"]
            assert "retry" in failed["error"]["message"]
            answer = _info(attached)
            assert answer["result"]["structuredContent"]["name"] == "ccw"
            assert _owner(state) == {"pid": attached.proc.pid, "endpoint": "stdio", "daemon": False}
        assert attached.proc.returncode == 0
        assert not (state / "frontend.sock").exists()
    finally:
        owner.close()  # killed above, or ending now: its pipes are closed either way


def test_lines_the_owner_stopped_reading_go_to_the_next_one(tmp_path: Path) -> None:
    """Found with three agents' ccw-mcp on one state dir: the owner's client left, and the
    relay writing a call to it died of the broken pipe, its client never answered."""
    config = Config.from_env({"CCW_STATE_DIR": str(tmp_path), "CCW_TOOLSETS": "server"})
    calls = [json.dumps({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                         "params": {"name": "ccw_info", "arguments": {}}}).encode() for n in (1, 2)]

    async def main() -> None:
        client_send, relay_in = trio.testing.memory_stream_one_way_pair()
        relay_out, _client_recv = trio.testing.memory_stream_one_way_pair()
        ours, owners = trio.socket.socketpair()
        owners.shutdown(socket.SHUT_RD)  # the owner stopped reading: our next write fails
        relay = Relay(config, relay_in, relay_out)
        with trio.fail_after(30):
            async with trio.SocketStream(ours) as upstream, trio.open_nursery() as nursery:
                nursery.start_soon(relay._pump, upstream, framing.LineSplitter(), trio.Event())
                await client_send.send_all(b"\n".join(calls) + b"\n")  # one read: two lines
                await trio.testing.wait_all_tasks_blocked()  # the write failed; the owner's end awaited
                owners.close()  # its end: the pump returns, and run() attaches to the next one
        assert relay.resend == calls
        assert relay.pending == {}  # not answered "retry": they never ran

    trio.run(main)


def test_an_attached_server_keeps_its_own_workspace(tmp_path: Path) -> None:
    """Two agents in two projects on one state dir: each one's file tools (no roots
    declared) read its own CCW_WORKSPACE, though the calls run in the owner's process."""
    state = tmp_path / "state"
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "f.txt").write_text(f"project {name}\n")
    with RawStdio(state, "text,server", tasks=None, CCW_WORKSPACE=str(tmp_path / "a")) as owner, \
            RawStdio(state, "text,server", tasks=None, CCW_WORKSPACE=str(tmp_path / "b")) as attached:
        _attached(attached)
        for client, name in ((owner, "a"), (attached, "b"), (owner, "a")):
            read = client.call("read_text_file", {"path": "f.txt"})
            assert f"project {name}" in read["content"][0]["text"], read


def test_an_attached_client_keeps_its_own_roots(tmp_path: Path) -> None:
    """Roots are asked of each connection's own client (the owner's roots/list passes
    through the relay) and kept per connection: each one's file tools read under its own."""
    state = tmp_path / "state"
    roots = {name: tmp_path / name for name in ("a", "b")}
    for name, root in roots.items():
        root.mkdir()
        (root / "f.txt").write_text(f"project {name}\n")
    with RawStdio(state, "text,server", tasks=None, roots=[roots["a"]]) as owner, \
            RawStdio(state, "text,server", tasks=None, roots=[roots["b"]]) as attached:
        _attached(attached)
        for client, name in ((owner, "a"), (attached, "b"), (owner, "a")):
            assert structured(client.call("ccw_info", {}))["roots"] == [str(roots[name])]
            read = client.call("read_text_file", {"path": "f.txt"})
            assert f"project {name}" in read["content"][0]["text"], read


def _listed(client: RawStdio) -> list[str]:
    return sorted(tool["name"] for tool in client.request("tools/list")["result"]["tools"])


def _own(toolsets: str) -> list[str]:
    """The tools a ccw-mcp of its own with this CCW_TOOLSETS lists."""
    return sorted(spec.name for spec in Registry.load(toolsets.split(",")).tools)


def test_an_attached_client_is_served_its_own_tool_families(tmp_path: Path) -> None:
    """The owner was given the server, text and file families, the attached ccw-mcp the
    server and schema families: the attached one's client lists and calls its own, the
    schema tools that the owner serves no client of its own included, and never the
    owner's text and file tools, by name, alias, direct method or resource."""
    state = tmp_path / "state"
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "f.txt").write_text("hello\n")
    with RawStdio(state, "server,text,file", tasks=None, CCW_WORKSPACE=str(workspace)) as owner, \
            RawStdio(state, "server,schema", tasks=None, CCW_WORKSPACE=str(workspace)) as attached:
        _attached(attached)
        assert _listed(attached) == _own("server,schema")
        assert _listed(owner) == _own("file,server,text")
        for name in ("read_text_file", "text.read", "file_create"):
            refused = attached.request("tools/call", {"name": name, "arguments": {"path": "f.txt"}})
            assert refused["error"]["code"] == -32602, refused  # as its own server would refuse it
            message = refused["error"]["message"]
            assert message.startswith(f"unknown tool {name!r}") and "list_schemas" in message
            assert "edit_text_file" not in message  # the tools it names are the attached client's
        direct = attached.request("text.read", {"path": "f.txt"})
        assert direct["error"]["code"] == -32601, direct  # no such method: not a tool of its own
        assert attached.request("resources/templates/list")["result"]["resourceTemplates"] == []
        assert structured(attached.call("ccw_info", {}))["families"] == ["schema", "server"]
        catalogue = {entry["name"] for entry in structured(attached.call("list_schemas", {}))["schemas"]}
        assert "tool.list_schemas.input" in catalogue and "tool.read_text_file.input" not in catalogue
        # The owner's own client is served as before.
        assert "hello" in owner.call("read_text_file", {"path": "f.txt"})["content"][0]["text"]
        assert owner.request("tools/call", {"name": "list_schemas", "arguments": {}})["error"]["code"] == -32602
        assert structured(owner.call("ccw_info", {}))["families"] == ["file", "server", "text"]
        templates = owner.request("resources/templates/list")["result"]["resourceTemplates"]
        assert [template["uriTemplate"] for template in templates] == ["list://{+path}"]


def test_a_server_with_another_helper_does_not_attach(tmp_path: Path) -> None:
    state = tmp_path / "state"
    with RawStdio(state, "server", tasks=None) as owner:
        assert "result" in _info(owner)
        # (no handshake sent: it ends first)
        other = RawStdio(state, "server", CCW_HELPER_SOCKET=str(tmp_path / "other-helper.sock"))
        assert other.proc.wait(60) == 2  # its client would be served by the owner's helper: refused
        other.close()  # (its stderr read to the end)
        assert any("CONFLICT" in line and "CCW_HELPER_SOCKET" in line for line in other.stderr), other.stderr
        assert "result" in _info(owner)


def test_an_agents_server_takes_the_state_dir_from_the_cli_daemon(tmp_path: Path) -> None:
    from mcp_server.cli.frontclient import start_daemon

    state = tmp_path / "state"
    assert start_daemon(str(state)) == {"frontend_started": True}
    daemon = frontdaemon.status(str(state))
    assert daemon["frontend_daemon"] is True
    with RawStdio(state, "server", tasks=None) as agent:
        assert "result" in _info(agent)
        assert not any("tools=relayed" in line for line in agent.stderr)
        assert _owner(state) == {"pid": agent.proc.pid, "endpoint": "stdio", "daemon": False}
        assert _ended(daemon["frontend_pid"])


def test_a_command_given_another_helper_is_not_served_by_the_daemons(tmp_path: Path, monkeypatch: Any) -> None:
    from mcp_server.cli import frontclient

    state, service = tmp_path / "state", str(tmp_path / "service.sock")
    first = frontclient.start_daemon(str(state))["frontend_started"] and frontdaemon.status(str(state))
    monkeypatch.setattr(frontclient, "answering", lambda path: {"mode": "privileged"} if path == service else None)
    monkeypatch.setenv("CCW_HELPER_SOCKET", service)  # README: export CCW_HELPER_SOCKET once the service is in
    stream = trio.run(frontclient.attach, Config.from_env({"CCW_STATE_DIR": str(state), "CCW_HELPER_SOCKET": service}))
    trio.run(stream.aclose)
    assert _ended(first["frontend_pid"])  # the idle daemon with the state dir's helper yielded
    assert json.loads((state / "frontend.lock").read_text())["settings"]["helper_socket"] == service
    frontdaemon.stop_daemon(str(state))


def test_a_command_given_another_helper_does_not_attach_to_an_agents_server(tmp_path: Path, monkeypatch: Any) -> None:
    from mcp_server.cli import frontclient

    state, service = tmp_path / "state", str(tmp_path / "service.sock")
    monkeypatch.setattr(frontclient, "answering", lambda path: {"mode": "privileged"})
    with RawStdio(state, "server", tasks=None) as agent:
        assert "result" in _info(agent)
        with pytest.raises(CcwError) as refused:
            trio.run(frontclient.attach, Config.from_env({"CCW_STATE_DIR": str(state), "CCW_HELPER_SOCKET": service}))
        assert refused.value.code == "CONFLICT" and f"pid {agent.proc.pid}" in refused.value.message
        assert "result" in _info(agent)


def _ended(pid: int) -> bool:
    """Exited (maybe not yet reaped: the daemon was adopted by whatever reaps here)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_a_call_sent_while_the_owner_drains_is_answered_by_the_next(tmp_path: Path) -> None:
    state = tmp_path / "state"
    owner = RawStdio(state, "server", tasks=None)
    try:
        with RawStdio(state, "server", tasks=None) as attached:
            _attached(attached)
            own_call: list[dict[str, Any]] = []
            busy = threading.Thread(target=lambda: own_call.append(_info(owner, delay_ms=3000)))
            busy.start()
            time.sleep(0.5)  # sequencing only: the owner's own call is running
            owner.proc.send_signal(signal.SIGTERM)  # it drains: finishes that call, takes no new one
            time.sleep(0.5)
            answer = _info(attached)
            assert answer["result"]["structuredContent"]["name"] == "ccw", answer
            busy.join(60)
            assert own_call[0]["result"]["structuredContent"]["delayed_ms"] == 3000
            assert owner.proc.wait(30) == 0
            assert _owner(state) == {"pid": attached.proc.pid, "endpoint": "stdio", "daemon": False}
    finally:
        owner.close()




# In a process of its own: the SDK's per-connection streams are left to the collector
# when a connection ends, which pytest's warnings-as-errors would report here.
IDLE_SCRIPT = r"""
import sys, trio
from mcp_server import frontdaemon, frontdoor
from mcp_server.config import Config
from mcp_server.config import Config

config = Config.from_env({"CCW_STATE_DIR": sys.argv[1], "CCW_TOOLSETS": "server"})

async def main():
    async with frontdoor.running_app(config) as app:
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:  # ends when serve returns: idle
                path = await nursery.start(frontdoor.serve, app, trio.Event(), 0.3)
                client = await trio.open_unix_socket(path)
                await trio.sleep(1.0)  # three idle periods with a client connected: still serving
                await client.send_all(b'{"jsonrpc":"2.0","id":7,"method":"ccw_info","params":{}}\n')
                print((await client.receive_some(65536)).decode().strip())
                await client.aclose()
    print("ended")

trio.run(main)
"""


def test_the_daemon_ends_once_idle_and_not_while_a_client_is_connected(tmp_path: Path) -> None:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", IDLE_SCRIPT, str(tmp_path / "state")], capture_output=True,
                          text=True, timeout=120, cwd=Path(__file__).resolve().parent.parent)
    assert done.returncode == 0, done.stderr
    answer, ended = done.stdout.splitlines()
    assert '"id":7' in answer and '"name":"ccw"' in answer, answer
    assert ended == "ended" and not (tmp_path / "state" / "frontend.sock").exists()


def test_an_idle_daemon_stays_while_it_holds_a_service_or_a_port() -> None:
    holding = [True]

    async def main() -> float:
        draining = trio.Event()
        clients = frontdoor._Clients()
        with trio.CancelScope() as accepting:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: frontdoor._stop_accepting(
                    draining, accepting, clients, 0.05, holding=lambda: holding[0]))
                await trio.sleep(0.5)  # ten idle periods: still serving, it holds a service
                assert not draining.is_set()
                holding[0] = False
                began = trio.current_time()
                await draining.wait()
                return trio.current_time() - began

    assert trio.run(main) < 5.0  # once nothing is held, the next idle period ends it

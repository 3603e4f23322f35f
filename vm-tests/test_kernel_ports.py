"""A forwarded port's kernel path (sandbox/kernel_ports.py), with a privileged helper: the
owner's connections are led into the capsule by NAT, and nothing else crosses the link.

What it must not become: another user's way into the capsule (through the port or straight to
the capsule's end of the link), the capsule's way to the host, or rules that outlive their
helper.  Each is tried here against the real kernel.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import trio

from sandbox import capsule_nets, kernel_ports, syscalls
from sandbox.errors import CcwError
from sandbox.netlink import Rtnl
from sandbox.nftables import Batch, NfTables
from tests.support.pages import page
from tests.support.users import OTHER_UID

SERVER = ["python3", "-u", "-m", "http.server", "8765", "--bind", "127.0.0.1"]

# Connect to argv[1]:argv[2] with a 2 s limit; prints "answered", "closed" (accepted, then
# closed unanswered), or the error.
_TRY = """
import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2)
except OSError as exc:
    print(type(exc).__name__)
    sys.exit()
try:
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    print("answered" if s.recv(100) else "closed")
except (BrokenPipeError, ConnectionResetError):
    print("closed")
"""


def _links() -> list[tuple[str, str]]:
    """The host's ends of forwarded ports' links: (name, address)."""
    out = json.loads(subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout)
    return [(link["ifname"], info["local"]) for link in out if link["ifname"].startswith(kernel_ports.HOST_PREFIX)
            for info in link.get("addr_info", []) if info.get("family") == "inet"]


def _ccw_tables() -> list[str]:
    listing = NfTables()
    try:
        return [name for name in listing.tables() if name.startswith("ccw_")]
    finally:
        listing.close()


async def _try(host: str, port: int, uid: int | None = None) -> str:
    prefix = [] if uid is None else ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    done = await trio.run_process([*prefix, "/usr/bin/python3", "-c", _TRY, host, str(port)],
                                  capture_stdout=True, capture_stderr=True, check=True)
    return done.stdout.decode().strip()


def test_only_the_owners_connections_cross_and_the_capsule_reaches_nothing_back(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("the owner's page\n")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": SERVER,
                                               "ready": {"port": 8765, "timeout_ms": 20000}})
        url = (await t.call("capsule_port", {"capsule_id": cap, "port": 8765}))["url"]
        host_port = int(url.rsplit(":", 1)[1].strip("/"))
        # Its link by the address the capsule's end has (other helpers on this host may have theirs).
        inside = await t.call("capsule_exec", {"capsule_id": cap, "cmd": [
            "ip", "-4", "-o", "addr", "show", "dev", kernel_ports.CAPSULE_LINK]})
        capsule_end = inside["stdout"].split(" inet ")[1].split("/")[0]
        host_end = str(ipaddress.ip_address(capsule_end) - 1)
        [link] = [name for name, address in _links() if address == host_end]
        ours = {f"ccw_{link}", f"ccw_fwd_{host_port}"}
        out: dict[str, Any] = {"tables": ours & set(_ccw_tables())}
        out["pages"] = [await trio.to_thread.run_sync(page, url + "index.txt") for _ in range(3)]
        out["other_by_port"] = await _try("127.0.0.1", host_port, OTHER_UID)
        out["other_straight"] = await _try(capsule_end, 8765, OTHER_UID)
        out["owner_straight"] = await _try(capsule_end, 8765)
        with trio.socket.socket() as on_host:  # something of the host's, listening on every address
            await on_host.bind(("0.0.0.0", 0))
            on_host.listen()
            back = await t.call("capsule_exec", {"capsule_id": cap, "cmd": [
                "python3", "-c", _TRY, host_end, str(on_host.getsockname()[1])]})
        out["from_capsule"] = back["stdout"].strip()
        out["list"] = (await t.call("capsule_service_list", {"capsule_id": cap}))["ports"]
        await t.call("capsule_destroy", {"capsule_id": cap})
        out["after"] = {"links": [name for name, _ in _links() if name == link],
                        "tables": ours & set(_ccw_tables()), "by_port": await _try("127.0.0.1", host_port)}
        return out

    out = tools.run(scenario)
    assert set(out["pages"]) == {b"the owner's page\n"}
    [port] = out["list"]
    assert port["path"] == "kernel"
    assert port["accepted"] == 3 and port["refused"] == 1  # the pages by NAT; the other user by the listener
    assert out["other_by_port"] == "closed"  # not led by NAT: the listener's owner check refused it
    assert out["other_straight"] == "TimeoutError"  # the link takes only what came to 127.0.0.1
    assert out["owner_straight"] == "TimeoutError"
    assert out["from_capsule"] == "ConnectionRefusedError"  # nothing new from the capsule's side: refused at once
    assert len(out["tables"]) == 2  # the link's and the forward's, on the host
    assert out["after"] == {"links": [], "tables": set(), "by_port": "ConnectionRefusedError"}


def test_a_server_on_ipv6_loopback_alone_is_relayed(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("over IPv6\n")

    async def scenario(t: Any) -> tuple[bytes, list[dict[str, Any]]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": [
            "python3", "-m", "http.server", "8766", "--bind", "::1"], "ready": {"port": 8766, "timeout_ms": 20000}})
        url = (await t.call("capsule_port", {"capsule_id": cap, "port": 8766}))["url"]
        body = await trio.to_thread.run_sync(page, url + "index.txt")
        listed = (await t.call("capsule_service_list", {"capsule_id": cap}))["ports"]
        await t.call("capsule_destroy", {"capsule_id": cap})
        return body, listed

    body, [port] = tools.run(scenario)
    assert body == b"over IPv6\n"
    assert port["path"] == "relay" and port["accepted"] == 1  # NAT to 127.0.0.1 would find nothing there


_OWN_AND_DIE = """
import os, signal, sys
sys.path.insert(0, sys.argv[1])
from sandbox.errors import CcwError
from sandbox.netlink import Rtnl
from sandbox.nftables import Batch, NfTables
NfTables().send(Batch().table("ccw_killed"))
print("made", flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_helper_leaves_no_rule(root_required: None) -> None:
    # The tables are owned by the socket that made them (nftables.py): a helper killed with
    # SIGKILL, which runs no cleanup, takes its rules with it.
    repo = str(Path(__file__).resolve().parents[1])
    made = subprocess.run([sys.executable, "-c", _OWN_AND_DIE, repo], capture_output=True, text=True, check=False)
    assert made.stdout.strip() == "made" and made.returncode == -9, made.stderr
    assert "ccw_killed" not in _ccw_tables()
    keeper = NfTables()
    try:
        keeper.send(Batch().table("ccw_kept"))
        assert "ccw_kept" in _ccw_tables()  # the listing sees a live one
    finally:
        keeper.close()
    assert "ccw_kept" not in _ccw_tables()


def _serving_in(netns: int, port: int) -> None:
    """A server on ``127.0.0.1:port`` in ``netns`` (the capsule's loopback), on a thread of its
    own that stays there, answering each connection by closing it; returns once it listens."""
    serving = threading.Event()

    def serve() -> None:
        syscalls.setns(netns, syscalls.CLONE_NEWNET)
        with socket.create_server(("127.0.0.1", port)) as server:
            serving.set()
            while True:
                server.accept()[0].close()

    threading.Thread(target=serve, daemon=True).start()
    assert serving.wait(10)


def test_a_forwards_rules_end_with_the_front_end_that_asked(root_required: None) -> None:
    # The helper outlives its front ends.  A front end killed with its listener leaves the
    # port free for any program; a rule left behind would lead the owner's connections
    # there into the capsule instead.
    netns = capsule_nets._make()
    front_end = subprocess.Popen(["sleep", "600"])
    ports = kernel_ports.KernelPorts(rootless=False)
    _serving_in(netns, 8000)
    link = "(none made)"
    try:
        with socket.create_server(("127.0.0.1", 0)) as held:
            host_port = kernel_ports.held_port(held.fileno())
            ports.open("cap_gone", netns, 8000, host_port, os.getuid(), front_end.pid, held.fileno())
            assert f"ccw_fwd_{host_port}" in _ccw_tables()
            front_end.kill()
            front_end.wait()
            deadline = time.monotonic() + 10
            while f"ccw_fwd_{host_port}" in _ccw_tables():
                assert time.monotonic() < deadline, "the rules outlived their front end"
                time.sleep(0.05)
            assert ports.connections("cap_gone", host_port) is None
        link = ports._links["cap_gone"].name
        assert link in dict(_links()) and f"ccw_{link}" in _ccw_tables()  # the link stays with its capsule
    finally:
        front_end.kill()
        ports.close_all()
        os.close(netns)
    assert link not in dict(_links()) and f"ccw_{link}" not in _ccw_tables()


# Echoes each line back, on every connection, until the client goes.
_ECHO = """
import socket, threading
def serve(conn):
    with conn, conn.makefile("rb") as lines:
        for line in lines:
            conn.sendall(line)
server = socket.create_server(("127.0.0.1", 8767))
while True:
    threading.Thread(target=serve, args=(server.accept()[0],), daemon=True).start()
"""


def _echo(conn: socket.socket, line: bytes) -> bytes | str:
    """What one line sent on ``conn`` brings back: the echo, or the error that ended the connection."""
    try:
        conn.sendall(line)
        return conn.recv(100) or "closed"
    except OSError as exc:
        return type(exc).__name__


def test_a_closed_forward_ends_the_connections_it_led(tools: Any, tmp_path: Path) -> None:
    # The relay ends its connections when the forward closes; the kernel path's went on
    # through their conntrack entries' NAT, into a capsule its owner had closed the port of.
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "echo", "cmd": ["python3", "-c", _ECHO],
                                               "ready": {"port": 8767, "timeout_ms": 20000}})
        host_port = (await t.call("capsule_port", {"capsule_id": cap, "port": 8767}))["host_port"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": SERVER,
                                               "ready": {"port": 8765, "timeout_ms": 20000}})
        await t.call("capsule_port", {"capsule_id": cap, "port": 8765})  # a forward that stays open
        out: dict[str, Any] = {}
        with socket.create_connection(("127.0.0.1", host_port), timeout=3) as kept:
            out["before"] = await trio.to_thread.run_sync(_echo, kept, b"one\n")
            listed = (await t.call("capsule_service_list", {"capsule_id": cap}))["ports"]
            out["paths"] = {port["path"] for port in listed}
            with socket.create_connection(("127.0.0.1", host_port), timeout=3) as reading:
                out["reader"] = await trio.to_thread.run_sync(_echo, reading, b"three\n")
                await t.call("capsule_port", {"capsule_id": cap, "port": 8767, "close": True})
                try:  # a client that only reads (a download, server-sent events) learns the end at once
                    out["reader_after"] = await trio.to_thread.run_sync(reading.recv, 100)
                except OSError as exc:
                    out["reader_after"] = type(exc).__name__
            out["after"] = await trio.to_thread.run_sync(_echo, kept, b"two\n")
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    assert out["before"] == b"one\n" and out["paths"] == {"kernel"}
    assert out["after"] == "ConnectionAbortedError"  # not b"two\n": ended, as the relay ends its own
    assert out["reader"] == b"three\n" and out["reader_after"] == "ConnectionAbortedError"  # not a 3 s timeout


def test_a_forwards_host_port_is_nobody_elses_while_its_rules_lead_from_it(root_required: None) -> None:
    # The front end asks the helper to drop a forward's rules, then closes its listener; an ask
    # that fails (its 5 s limit, a cancelled call) left the rules and freed the port, and the
    # owner's connections to the next program there went into the capsule instead.
    netns = capsule_nets._make()
    ports = kernel_ports.KernelPorts(rootless=False)
    _serving_in(netns, 8001)
    try:
        with socket.create_server(("127.0.0.1", 0)) as held:
            host_port = kernel_ports.held_port(held.fileno())
            ports.open("cap_held", netns, 8001, host_port, os.getuid(), os.getpid(), held.fileno())
        try:
            socket.create_server(("127.0.0.1", host_port)).close()
            taken = "bound"
        except OSError as exc:
            taken = errno.errorcode[exc.errno or 0]
        ports.close("cap_held", host_port)
        socket.create_server(("127.0.0.1", host_port)).close()  # free once nothing leads from it
    finally:
        ports.close_all()
        os.close(netns)
    assert taken == "EADDRINUSE"


def test_a_server_restarted_on_ipv6_loopback_alone_is_relayed_from_the_next_listing(tools: Any, tmp_path: Path) -> None:
    # NAT leads to 127.0.0.1 alone: a path kept after the server moved to ::1 refused the owner
    # while the listing said the port was listening.
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "index.txt").write_text("moved\n")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        server = ["python3", "-m", "http.server", "8768", "--bind"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": [*server, "127.0.0.1"],
                                               "ready": {"port": 8768, "timeout_ms": 20000}})
        url = (await t.call("capsule_port", {"capsule_id": cap, "port": 8768}))["url"]
        [before] = (await t.call("capsule_service_list", {"capsule_id": cap}))["ports"]
        await t.call("capsule_service_stop", {"capsule_id": cap, "name": "web"})
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": [*server, "::1"],
                                               "ready": {"port": 8768, "timeout_ms": 20000}})
        [after] = (await t.call("capsule_service_list", {"capsule_id": cap}))["ports"]
        try:
            body: bytes | str = await trio.to_thread.run_sync(page, url + "index.txt")
        except OSError as exc:
            body = str(exc)
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"before": before["path"], "after": (after["path"], after["listening"]), "body": body}

    assert tools.run(scenario) == {"before": "kernel", "after": ("relay", True), "body": b"moved\n"}


def test_one_uids_forwards_on_the_kernel_path_are_bounded(root_required: None, monkeypatch: Any) -> None:
    # Each forward holds its port's listener in the helper: a user asking the helper straight,
    # past the front end's 32 a capsule, would have filled its descriptor table.
    monkeypatch.setattr(kernel_ports, "MAX_FORWARDS", 2)
    netns = capsule_nets._make()
    ports = kernel_ports.KernelPorts(rootless=False)
    _serving_in(netns, 8002)
    held = [socket.create_server(("127.0.0.1", 0)) for _ in range(3)]
    refused = None
    try:
        for listener in held:
            try:
                ports.open("cap_many", netns, 8002, listener.getsockname()[1], os.getuid(), os.getpid(),
                           listener.fileno())
            except CcwError as exc:
                refused = (listener, exc.code)
        ports.open("cap_many", netns, 8002, held[0].getsockname()[1], os.getuid(), os.getpid(), held[0].fileno())
    finally:
        ports.close_all()
        os.close(netns)
        for listener in held:
            listener.close()
    assert refused == (held[2], "TOO_LARGE")  # the same forward asked again is no new one


def test_capsule_port_calls_at_once_for_one_port_make_one_forward(tools: Any, tmp_path: Path) -> None:
    # An agent's pipelined calls: each started a forward of its own, and all but the last were
    # left listening, with their rules, until the front end ended.
    ws = tmp_path / "ws"
    ws.mkdir()
    tables = set(_ccw_tables())

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": SERVER,
                                               "ready": {"port": 8765, "timeout_ms": 20000}})
        got: list[int] = []

        async def forward() -> None:
            got.append((await t.call("capsule_port", {"capsule_id": cap, "port": 8765}))["host_port"])

        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(forward)
        made = {f"ccw_fwd_{port}" for port in got} | {f"ccw_{name}" for name, _ in _links()}
        out = {"host_ports": set(got), "tables": (set(_ccw_tables()) - tables) & made}
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    [host_port] = out["host_ports"]
    assert len(out["tables"]) == 2 and f"ccw_fwd_{host_port}" in out["tables"]  # the link's and the one forward's


def _exists(name: str) -> bool:
    with Rtnl() as rtnl:
        try:
            rtnl.link_index(name)
        except OSError:
            return False
    return True


def test_a_dead_helpers_link_is_swept_and_a_live_ones_kept(root_required: None) -> None:
    # A helper killed with SIGKILL: its tables went with its sockets, its link stayed (something
    # held the capsule's namespace), with route_localnet and no filter.  Made here by hand.
    held = capsule_nets._make()
    name = f"{kernel_ports.HOST_PREFIX}{kernel_ports.MAX_LINKS - 1}"
    try:
        with Rtnl() as rtnl:
            rtnl.add_veth(name, kernel_ports.CAPSULE_LINK, held)
        assert name in kernel_ports.sweep() and not _exists(name)
        live = NfTables()
        try:
            live.send(kernel_ports._link_table(name, kernel_ports.addresses(kernel_ports.MAX_LINKS - 1)[0]))
            with Rtnl() as rtnl:
                rtnl.add_veth(name, kernel_ports.CAPSULE_LINK, held)
            assert name not in kernel_ports.sweep() and _exists(name)  # a live helper's: kept
        finally:
            live.close()
        assert name in kernel_ports.sweep() and not _exists(name)
    finally:
        os.close(held)
        with contextlib.suppress(OSError), Rtnl() as rtnl:
            rtnl.delete_link(name)


def test_an_abort_reaches_the_led_connection_alone(root_required: None) -> None:
    """A closed forward aborts the owner's socket each of its conntrack entries names.  An entry
    outlives its socket, and sock_diag, finding no such connection, answers with a listener on
    its source port: another uid's server there was aborted.  And a connection is the owner's."""
    loopback = socket.inet_aton("127.0.0.1")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setuid(OTHER_UID)
                listener = socket.socket()
                listener.bind(("127.0.0.1", 0))
                listener.listen()
                client = socket.socket()  # no create_connection: its idna codec is unreadable to that uid
                client.connect(("127.0.0.1", port))
                os.write(ready_w, json.dumps([listener.getsockname()[1], client.getsockname()[1]]).encode())
                time.sleep(30)
            finally:
                os._exit(0)
        os.close(ready_w)
        try:
            theirs, sport = json.loads(os.read(ready_r, 100))
            accepted, _ = server.accept()
            with accepted:
                accepted.settimeout(0.5)
                kernel_ports._abort((loopback, loopback, theirs, 45678), None)  # gone: it came from their server's port
                kernel_ports._abort((loopback, loopback, sport, port), OTHER_UID + 1)  # not that uid's connection
                with socket.create_connection(("127.0.0.1", theirs), timeout=2):
                    pass  # their server still listens
                with contextlib.suppress(TimeoutError):
                    assert accepted.recv(1) == b"never", "their connection was ended"
                kernel_ports._abort((loopback, loopback, sport, port), OTHER_UID)
                try:
                    assert accepted.recv(1) == b""
                except ConnectionResetError:
                    pass  # reset: ended
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            os.close(ready_r)

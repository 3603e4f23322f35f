"""The egress scenario of test_egress_kernel.py, run as its own process (as root, or as a user).

``python egress_scenario.py ROOT MODE DIR`` starts a ccw-helper (``--privileged`` or
``--rootless``) with its socket and state under DIR, drives an "egress" capsule and a
"none" capsule through the real client, and prints one JSON object of what it saw; the
test asserts on it.  Only loopback and the namespaces the helper makes carry traffic:
the host's server listens on 127.0.0.1, and every other address the jail tries ends in
the capsule's egress namespace.
"""

from __future__ import annotations

import ipaddress
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import textwrap
from typing import Any

import trio

sys.path.insert(0, sys.argv[1])

from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import CreateRequest, DestroyRequest, ExecRequest
from sandbox.spec import CapsuleSpec

ROOT, MODE, DIR = sys.argv[1], sys.argv[2], sys.argv[3]

# Runs in the jail: every way out it might try, with how it ended and how long it took.
JAIL = textwrap.dedent("""
    import errno, json, os, socket, sys, time
    targets = json.loads(sys.argv[1])
    out = {"links": sorted(os.listdir("/sys/class/net")), "netns": os.readlink("/proc/self/ns/net")}

    def attempt(family, kind, address, send=None):
        start = time.monotonic()
        sock = socket.socket(family, kind)
        sock.settimeout(3)
        try:
            sock.connect(address)
            if send is not None:
                sock.send(send)
                return {"got": sock.recv(100).decode(), "s": time.monotonic() - start}
            return {"ok": True, "s": time.monotonic() - start}
        except OSError as exc:
            return {"errno": errno.errorcode.get(exc.errno, str(exc)), "s": time.monotonic() - start}
        finally:
            sock.close()

    def sent(family, address, broadcast=False):
        # A datagram nobody answers (a group, a broadcast): only whether it left at once.
        start = time.monotonic()
        sock = socket.socket(family, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, int(broadcast))
            sock.sendto(b"who?", address)
            return {"sent": True, "s": time.monotonic() - start}
        except OSError as exc:
            return {"errno": errno.errorcode.get(exc.errno, str(exc)), "s": time.monotonic() - start}
        finally:
            sock.close()

    if targets.get("proxy"):
        out["proxy"] = attempt(socket.AF_INET, socket.SOCK_STREAM, ("10.99.0.1", 3128), b"ping")
    out["testnet"] = attempt(socket.AF_INET, socket.SOCK_STREAM, ("192.0.2.1", 80))
    out["udp"] = attempt(socket.AF_INET, socket.SOCK_DGRAM, ("192.0.2.53", 53), b"dns?")
    out["v6"] = attempt(socket.AF_INET6, socket.SOCK_STREAM, ("2001:db8::1", 80))
    out["host_loopback"] = attempt(socket.AF_INET, socket.SOCK_STREAM, ("127.0.0.1", targets["loopback_port"]))
    out["host_addresses"] = [
        [host, port, attempt(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, (host, port))]
        for host, port in targets["host"]]
    if targets.get("proxy"):  # the edges: link-local, multicast, broadcast (eth0 exists)
        eth0 = socket.if_nametoindex("eth0")  # a link-local address needs its link (scope id)
        out["edges"] = {
            "link_local": attempt(socket.AF_INET6, socket.SOCK_STREAM, ("fe80::1", 80, 0, eth0)),
            "link_local_udp": attempt(socket.AF_INET6, socket.SOCK_DGRAM, ("fe80::1", 53, 0, eth0), b"dns?"),
            "link_local_v4": attempt(socket.AF_INET, socket.SOCK_STREAM, ("169.254.169.254", 80)),
            "multicast_tcp": attempt(socket.AF_INET, socket.SOCK_STREAM, ("224.0.0.1", 80)),
            "multicast_tcp_v6": attempt(socket.AF_INET6, socket.SOCK_STREAM, ("ff02::1", 80, 0, eth0)),
            "multicast_udp": sent(socket.AF_INET, ("224.0.0.251", 5353)),
            "multicast_udp_v6": sent(socket.AF_INET6, ("ff02::fb", 5353, 0, eth0)),
            "broadcast_udp": sent(socket.AF_INET, ("255.255.255.255", 67), broadcast=True),
            "broadcast_no_option": sent(socket.AF_INET, ("255.255.255.255", 67)),
        }
    out["env"] = {k: v for k, v in os.environ.items() if "proxy" in k.lower()}
    print(json.dumps(out))
""")


def host_targets() -> list[tuple[str, int]]:
    """The host's own global addresses, each with a TCP port the host listens on for every address."""
    found = json.loads(subprocess.run(["ip", "-j", "addr", "show"], capture_output=True, check=True).stdout)
    addresses = [a["local"] for link in found for a in link.get("addr_info", ())
                 if a.get("scope") == "global" and not ipaddress.ip_address(a["local"]).is_loopback]
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as handle:
            for line in handle.read().splitlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                host, port = local.split(":")
                if state == "0A" and set(host) == {"0"}:  # LISTEN on the wildcard address
                    ports.add(int(port, 16))
    port = min(ports) if ports else 22
    return [(address, port) for address in addresses]


def helper_holds(pid: int) -> list[str]:
    """What the helper's descriptors point at ("socket:[inode]", "net:[inode]", paths)."""
    held = []
    for name in os.listdir(f"/proc/{pid}/fd"):
        try:
            held.append(os.readlink(f"/proc/{pid}/fd/{name}"))
        except FileNotFoundError:  # closed meanwhile
            pass
    return held


def kit_links(fds: list[int]) -> list[str]:
    """How the helper's copies of the passed sockets show in its /proc/PID/fd."""
    return [f"socket:[{os.fstat(fd).st_ino}]" for fd in fds]


def parse_attempt(packet: bytes) -> list[Any]:
    """[protocol, destination, port] of one packet the sniffer kept (from the network header)."""
    if packet[0] >> 4 == 4:
        header = (packet[0] & 0x0F) * 4
        protocol, destination = packet[9], str(ipaddress.IPv4Address(packet[16:20]))
    else:
        header, protocol, destination = 40, packet[6], str(ipaddress.IPv6Address(packet[24:40]))
    (port,) = struct.unpack_from("!H", packet, header + 2)
    return [{6: "tcp", 17: "udp"}.get(protocol, str(protocol)), destination, port]


def start_helper(number: int) -> subprocess.Popen[bytes]:
    """A helper on DIR/helper.sock, waited for until it listens."""
    ready_r, ready_w = os.pipe()
    log = open(os.path.join(DIR, f"helper-{number}.log"), "wb")  # noqa: SIM115 - the helper writes it
    process = subprocess.Popen(
        [sys.executable, "-m", "sandbox", "--socket", os.path.join(DIR, "helper.sock"),
         "--state-dir", os.path.join(DIR, "state"), "--ready-fd", str(ready_w), f"--{MODE}"],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(ready_w,))
    log.close()
    os.close(ready_w)
    readable, _, _ = select.select([ready_r], [], [], 60)
    ok = readable and os.read(ready_r, 1) == b"1"
    os.close(ready_r)
    if not ok:
        with open(os.path.join(DIR, f"helper-{number}.log")) as written:
            raise SystemExit(f"helper did not start: {written.read()}")
    return process


async def exec_code(client: HelperClient, capsule_id: str, targets: dict[str, Any]) -> dict[str, Any] | str:
    """Run the jail script; its JSON, or the error code and reason when the helper refused."""
    try:
        reply = await client.call(ExecRequest(capsule_id, ("python3", "-c", JAIL, json.dumps(targets)),
                                              timeout_ms=60_000))
    except CcwError as exc:
        return f"{exc.code} {exc.details.get('reason')}"
    assert reply.exit_code == 0, reply.stderr.decode()
    result: dict[str, Any] = json.loads(reply.stdout)
    return result


async def serve_proxy_once(listener_fd: int) -> str:
    """Accept one connection on the passed HTTP listener, answer its bytes with pong."""
    listener = trio.socket.from_stdlib_socket(socket.socket(fileno=os.dup(listener_fd)))
    with listener:
        conn, _ = await listener.accept()
        with conn:
            got = await conn.recv(100)
            await conn.send(b"pong")
    return str(got.decode())


def drain(sniffer_fd: int) -> list[list[Any]]:
    """Every packet the sniffer kept so far, parsed."""
    seen = []
    while True:
        try:
            seen.append(parse_attempt(os.read(sniffer_fd, 2048)))
        except BlockingIOError:
            return seen


async def scenario(helper: subprocess.Popen[bytes], ws: str, loopback_port: int) -> dict[str, Any]:
    """Everything before the restart: the refusals, the kit, the jail's view, the destroy."""
    client = HelperClient(os.path.join(DIR, "helper.sock"))
    out: dict[str, Any] = {}
    targets = {"loopback_port": loopback_port, "host": host_targets()}
    try:
        made = await client.call(CreateRequest(CapsuleSpec(ws, network="egress")))
        plain = await client.call(CreateRequest(CapsuleSpec(ws)))
        out["isolation"] = [made.isolation["network"], made.isolation["network_mechanism"],
                            plain.isolation["network_mechanism"]]
        out["before_open"] = await exec_code(client, made.capsule_id, {**targets, "proxy": False})
        reply, fds = await client.net_open(made.capsule_id)
        try:
            out["reply"] = reply.to_args()
            out["flags"] = [[os.get_blocking(fd), os.get_inheritable(fd)] for fd in fds]
            out["kit_links"] = kit_links(fds)
            async with trio.open_nursery() as nursery:
                served: list[str] = []

                async def proxy() -> None:
                    served.append(await serve_proxy_once(fds[0]))

                nursery.start_soon(proxy)
                out["jail"] = await exec_code(client, made.capsule_id, {**targets, "proxy": True})
            out["proxy_received"] = served
            await trio.sleep(0.1)
            out["sniffed"] = drain(fds[2])
            _again, more = await client.net_open(made.capsule_id)
            out["same_listener"] = os.path.samestat(os.fstat(more[0]), os.fstat(fds[0]))
            for fd in more:
                os.close(fd)
        finally:
            for fd in fds:
                os.close(fd)
        try:
            await client.net_open(plain.capsule_id)
        except CcwError as exc:
            out["none_net_open"] = exc.code
        out["none"] = await exec_code(client, plain.capsule_id, targets)
        out["held_before_destroy"] = helper_holds(helper.pid)
        await client.call(DestroyRequest(made.capsule_id))
        out["held_after_destroy"] = helper_holds(helper.pid)
        await client.call(DestroyRequest(plain.capsule_id))
        kept = await client.call(CreateRequest(CapsuleSpec(ws, network="egress")))
        out["kept"] = kept.capsule_id
    finally:
        await client.aclose()
    return out


async def spare_at_start(pid: int) -> list[str]:
    """What the helper holds once its spare kit is made (a network namespace among them).

    A namespace alone does not say the kit is done: a privileged helper also keeps a
    spare namespace for plain jails, and the kit's sockets come after its namespace.
    So wait until the helper holds a namespace and nothing has changed for half a second.
    """
    held, same = helper_holds(pid), 0
    for _ in range(300):
        await trio.sleep(0.05)
        now = helper_holds(pid)
        same = same + 1 if sorted(now) == sorted(held) else 0
        held = now
        if same >= 10 and any(link.startswith("net:[") for link in held):
            break
    return held


async def after_restart(helper: subprocess.Popen[bytes], capsule_id: str, loopback_port: int) -> dict[str, Any]:
    """A capsule made before a restart: still "egress", but without a kit until net_open.

    The helper saw an egress capsule in its state dir, so a spare kit waits before any
    net_open: the kit net_open passes, and the jail's namespace, are ones it held already.
    """
    client = HelperClient(os.path.join(DIR, "helper.sock"))
    out: dict[str, Any] = {"held_at_start": await spare_at_start(helper.pid)}
    targets = {"loopback_port": loopback_port, "host": []}
    try:
        out["before_open"] = await exec_code(client, capsule_id, targets)
        _reply, fds = await client.net_open(capsule_id)
        out["kit_links"] = kit_links(fds)
        for fd in fds:
            os.close(fd)
        jail = await exec_code(client, capsule_id, targets)
        out["testnet"] = jail["testnet"] if isinstance(jail, dict) else jail
        out["netns"] = jail["netns"] if isinstance(jail, dict) else jail
        await client.call(DestroyRequest(capsule_id))
    finally:
        await client.aclose()
    return out


def main() -> None:
    ws = os.path.join(DIR, "ws")
    os.makedirs(ws, exist_ok=True)
    host_server = socket.socket()  # the host's own server, on loopback only
    host_server.bind(("127.0.0.1", 0))
    host_server.listen()
    port = host_server.getsockname()[1]
    helper = start_helper(1)
    try:
        out = trio.run(scenario, helper, ws, port)
    finally:
        helper.send_signal(signal.SIGTERM)
        out_code = helper.wait(30)
    out["helper_exit"] = out_code
    helper = start_helper(2)
    try:
        out["restart"] = trio.run(after_restart, helper, out["kept"], port)
    finally:
        helper.send_signal(signal.SIGTERM)
        out["helper_exit_2"] = helper.wait(30)
    host_server.setblocking(False)
    try:
        host_server.accept()
        out["host_server_reached"] = True
    except BlockingIOError:
        out["host_server_reached"] = False
    print(json.dumps(out))


if __name__ == "__main__":
    main()

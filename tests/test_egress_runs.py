"""Whose a connection is (egress/runs.py): the kernel's cgroup id of a socket by its
4-tuple, and an EgressSession keeping each service's connections apart from the exec's."""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from mcp_server.capsules.exec import ExecOutcome
from mcp_server.capsules.networks import WINDOW_REASON, Networks
from mcp_server.core.netrules import NetworkSpec
from mcp_server.egress import peer
from mcp_server.egress.runs import RunOwners
from mcp_server.egress.session import EgressSession
from sandbox import mountinfo
from sandbox.errors import CcwError, ProtocolError
from sandbox.ops import NetOpenRequest
from sandbox.replies import NetOpenReply
from tests.support.egress_harness import Running, _listening_fd, network, shout, upstream
from tests.support.scratch_services import exec_reply

EXEC_ID = 7  # the helper's own cgroup, where a hybrid host's execs sit: no service's


def _own_cgroup_inode() -> int:
    """The inode of this process's cgroup v2 directory: what the kernel names its sockets by."""
    with open("/proc/self/mountinfo") as f:
        [mount] = [m for m in mountinfo.parse(f.read()) if m.fstype == "cgroup2"][:1]
    with open("/proc/self/cgroup") as f:
        [path] = [line.split(":", 2)[2].strip() for line in f if line.startswith("0::")]
    return os.stat(os.path.normpath(os.path.join(mount.mount_point, os.path.relpath(path, mount.root)))).st_ino


def _diag() -> socket.socket:
    return socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, peer.NETLINK_SOCK_DIAG)


def test_a_sockets_cgroup_id_is_its_makers_cgroup_directorys_inode() -> None:
    """The id sock_diag reports unasked (INET_DIAG_CGROUP_ID) is the inode of the v2 cgroup
    the socket's maker was in; a closed client has no id."""
    with socket.create_server(("127.0.0.1", 0)) as listener, _diag() as diag:
        client = socket.create_connection(listener.getsockname())
        accepted, _ = listener.accept()
        with accepted:
            ours, theirs = client.getsockname(), accepted.getsockname()
            assert peer.socket_cgroup(diag, ours, theirs) == _own_cgroup_inode()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\0\0\0\0\0\0\0")  # reset: gone at once
            client.close()
            assert peer.socket_cgroup(diag, ours, theirs) is None


def test_parse_cgroup_reads_the_attribute_and_none_without_it() -> None:
    local, remote = ("10.99.0.2", 40000), ("10.99.0.1", 3128)
    body = peer._DIAG_MSG.pack(socket.AF_INET, 1, 0, 0, socket.htons(40000), socket.htons(3128),
                               socket.inet_aton("10.99.0.2").ljust(16, b"\0"),
                               socket.inet_aton("10.99.0.1").ljust(16, b"\0"),
                               0, 0, 0, 0, 0, 0, 1000, 12345)
    other = peer._NLA.pack(8, 1) + bytes(4)  # INET_DIAG_MEMINFO-sized filler, skipped
    cgroup = peer._NLA.pack(12, peer.INET_DIAG_CGROUP_ID) + (987654321).to_bytes(8, "little")

    def frame(payload: bytes) -> bytes:
        return peer._NLMSGHDR.pack(peer._NLMSGHDR.size + len(payload), peer.SOCK_DIAG_BY_FAMILY, 0, 1, 0) + payload

    assert peer.parse_cgroup(frame(body + other + cgroup), local, remote) == 987654321
    assert peer.parse_cgroup(frame(body + other), local, remote) is None
    assert peer.parse_cgroup(frame(body + cgroup), remote, local) is None  # another socket's reply


class _ByPort(RunOwners):
    """RunOwners whose sockets' ids the test sets by the client's port (a test cannot put its
    own sockets in several cgroups); the rest is RunOwners' own: learning, caching, forgetting."""

    def __init__(self, answers: list[dict[str, int | None]]) -> None:
        self.asked = 1  # the first answer, given here
        self.ids: dict[int, int] = {}  # client port: cgroup id

        async def ask() -> tuple[dict[str, int | None], socket.socket]:
            self.asked += 1
            return answers[min(self.asked, len(answers)) - 1], _diag()

        super().__init__(answers[0], _diag(), ask)

    def cgroup_of(self, client: trio.socket.SocketType) -> int | None:
        return self.ids.get(client.getpeername()[1])


@asynccontextmanager
async def _served(spec: NetworkSpec, owners: RunOwners | None) -> AsyncIterator[Running]:
    http_fd, http_port = _listening_fd()
    socks_fd, socks_port = _listening_fd()
    sniff_peer, sniff_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    session = EgressSession(spec, http_fd, socks_fd, sniff_end.detach(), ["10.99.0.2"], owners=owners)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(session.serve)
            session.begin_exec()
            try:
                yield Running(session, http_port, socks_port, sniff_peer)
            finally:
                await session.aclose()
    finally:
        sniff_peer.close()


async def _socks_reply(stream: trio.SocketStream, port: int) -> int:
    """SOCKS5 without authentication to 127.0.0.1:``port``: the reply's code (0: connected)."""
    await stream.send_all(b"\x05\x01\x00" + b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1")
                          + struct.pack("!H", port))
    received = b""
    with trio.fail_after(10):
        while len(received) < 12 and (data := await stream.receive_some()):
            received += data
    return received[3]


async def _connect(proxy: Running, owners: _ByPort, cgroup_id: int, port: int) -> int:
    sock = trio.socket.socket()
    await sock.bind(("127.0.0.1", 0))
    owners.ids[sock.getsockname()[1]] = cgroup_id  # before connecting: the session asks at accept
    await sock.connect(("127.0.0.1", proxy.socks_port))
    client = trio.SocketStream(sock)
    code = await _socks_reply(client, port)
    if code == 0:
        await client.send_all(b"hi")
        assert await client.receive_some() == b"HI"
    await client.aclose()
    return code


def test_each_services_connections_are_its_own_and_the_rest_the_execs() -> None:
    """A service's connection goes to its book, with its own connection cap; one whose id is
    no service's is the exec's; an unknown id is asked of the helper once; a service the
    helper gave no id, or that was never learnt, is not told apart (None)."""
    owners = _ByPort([{"poller": 501, "bare": None}, {"poller": 501, "bare": None},
                      {"poller": 501, "bare": None, "late": 502}])

    async def main() -> dict[str, object]:
        async with upstream(shout) as up, _served(network(f"127.0.0.1:{up.port}", max_connections=1), owners) as proxy:
            codes = [await _connect(proxy, owners, EXEC_ID, up.port),  # asked once: no service's
                     await _connect(proxy, owners, 502, up.port),  # asked: a service started since
                     await _connect(proxy, owners, 501, up.port),
                     await _connect(proxy, owners, 501, up.port),  # past the poller's own cap
                     await _connect(proxy, owners, EXEC_ID, up.port)]  # past the exec's cap, not asked again
            await trio.sleep(0.05)
            session = proxy.session
            return {"codes": codes, "exec": session.end_exec(), "poller": session.take_service("poller"),
                    "late": session.take_service("late"), "bare": session.take_service("bare"),
                    "never": session.take_service("never"), "poller again": session.take_service("poller")}

    out = trio.run(main)
    assert out["codes"] == [0, 0, 0, 2, 2]
    assert [(r["allowed"], r["bytes_out"]) for r in out["exec"]] == [(True, 2), (False, 0)], out["exec"]  # type: ignore[index]
    assert [(r["allowed"], r["reason"]) for r in out["poller"]] == [  # type: ignore[union-attr]
        (True, None), (False, "connection cap (1) reached")]
    assert [(r["allowed"], r["bytes_in"]) for r in out["late"]] == [(True, 2)]  # type: ignore[union-attr]
    assert out["bare"] is None and out["never"] is None
    assert out["poller again"] is None  # its run ended: its ids name nobody now
    assert owners.asked == 3


def test_without_owners_every_connection_is_the_exec_windows_and_a_services_row_says_so() -> None:
    async def main() -> tuple[list[dict[str, object]], list[dict[str, object]] | None]:
        async with upstream(shout) as up, _served(network(f"127.0.0.1:{up.port}"), None) as proxy:
            client = await proxy.socks()
            assert await _socks_reply(client, up.port) == 0
            await client.aclose()
            await trio.sleep(0.05)
            return proxy.session.end_exec(), proxy.session.take_service("poller")

    records, service = trio.run(main)
    assert len(records) == 1 and service is None
    reply, network_records = Networks().service_network("cap-1", "poller", exec_reply())
    assert network_records is None
    outcome = ExecOutcome(reply, 1, 1, 0, network_records)
    assert outcome.touched["network"] is None and outcome.touched_unavailable["network"] == WINDOW_REASON


class _Client:
    """What ``RunOwners.of`` reads of an accepted connection: its peer (the jail's end)."""

    def __init__(self, port: int) -> None:
        self.port = port

    def getpeername(self) -> tuple[str, int]:
        return ("10.99.0.2", self.port)


def test_an_id_found_no_services_is_not_asked_again_until_a_service_start_is_learnt() -> None:
    """A service's first connection looked up before the helper noted it is the exec's, and
    so are its next ones (its id is cached as no service's), until its start is learnt."""
    owners = _ByPort([{}, {}, {"slow": 503}])
    owners.ids[1] = 503

    async def main() -> list[str | None]:
        seen = [await owners.of(_Client(1)), await owners.of(_Client(1))]  # type: ignore[arg-type]
        await owners.learn()
        return [*seen, await owners.of(_Client(1))]  # type: ignore[arg-type]

    assert trio.run(main) == [None, None, "slow"]
    assert owners.asked == 3 and owners.tagged("slow")
    owners.forget("slow")
    assert not owners.tagged("slow")
    owners.close()


def test_net_open_asked_with_runs_and_its_reply_read_strictly() -> None:
    """``net_open`` with ``runs`` (the helper's answer egress/runs.py asks for): the argument
    checked as the op table says, the services' ids read, a malformed one refused."""
    assert NetOpenRequest.from_args({"capsule_id": "cap_0001700000000000_1a2b", "runs": True}) == \
        NetOpenRequest("cap_0001700000000000_1a2b", runs=True)
    with pytest.raises(CcwError):
        NetOpenRequest.from_args({"capsule_id": "cap_0001700000000000_1a2b", "runs": 1})
    base = {"http_proxy": "10.99.0.1:3128", "socks_proxy": "10.99.0.1:1080", "jail_addresses": ["10.99.0.2"],
            "env": {}, "mechanism": "m"}
    assert NetOpenReply.from_args(base).services is None
    reply = NetOpenReply.from_args({**base, "services": {"web": 215, "bare": None}})
    assert reply.services == {"web": 215, "bare": None} and reply.to_args()["services"] == {"web": 215, "bare": None}
    for bad in ({"web": "215"}, {"web": True}, ["web"]):
        with pytest.raises(ProtocolError):
            NetOpenReply.from_args({**base, "services": bad})

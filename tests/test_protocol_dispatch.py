"""Dispatch routing and the socket server/client pair, with a CapsuleManager double.

The double records calls and hands back canned typed replies; it exists only to show that each
op reaches the right manager method with the caller's SO_PEERCRED identity, that
failures become error replies, and that the server survives malformed frames.  The
real CapsuleManager is exercised end to end in vm-tests/test_ipc_*.py.
"""

from __future__ import annotations

import base64
import contextlib
import os
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest, encode_request
from sandbox.protocol import (
    PROTOCOL_VERSION,
    FrameDecoder,
    Reply,
    Request,
    encode_frame,
)
from sandbox.replies import (
    ChangesReply,
    CreateReply,
    DestroyReply,
    ExecReply,
    ForkReply,
    ListReply,
    NetOpenReply,
    Touched,
    Truncated,
    Usage,
)
from sandbox.server import Dispatcher, HelperServer, Peer
from sandbox.spec import CapsuleSpec, Limits
from tests.support.helper_wire import raw_exchange


def exec_reply(stdout: bytes = b"") -> ExecReply:
    """An exec reply of a command that printed ``stdout`` and exited 0."""
    return ExecReply(0, None, False, False, 1, stdout, b"", len(stdout), 0, Truncated(False, False),
                     Usage(None, None, None, None, None), {}, {}, None, Touched(None, (), None, None), {})


class ManagerDouble:
    """Records (method, args) and returns small results; a few inputs fail on purpose."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.release = threading.Event()
        self.release.set()

    def _record(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.calls.append((name, args, kwargs))

    def create(self, owner_uid: int, owner_gid: int, spec: CapsuleSpec) -> CreateReply:
        self._record("create", owner_uid, owner_gid, spec)
        workspace = spec.workspace
        if workspace == "/boom":
            raise RuntimeError("a bug")
        if workspace == "/missing":
            raise FileNotFoundError(2, "No such file or directory", workspace)
        return CreateReply("cap_1", "/merged", workspace, "t", "t", {})

    def exec(self, request: ExecRequest, caller_uid: int, caller_gid: int, **kwargs: Any) -> ExecReply:
        self._record("exec", request, caller_uid, caller_gid, **kwargs)
        argv = request.argv
        if argv[0] == "wait":
            self.release.wait(10)
        if argv[0] == "huge":
            return exec_reply(b"A" * (7 * 1024 * 1024))  # 9.3 MiB as base64
        return exec_reply()

    def changes(self, capsule_id: str, caller_uid: int, leave_not_utf8: bool = False, unlisted: bool = False,
                mtimes: bool = False) -> ChangesReply:
        self._record("changes", capsule_id, caller_uid)
        if capsule_id == "cap_other":
            raise CcwError("PERMISSION_DENIED", "capsule belongs to another user")
        return ChangesReply(())

    def fork(self, capsule_id: str, caller_uid: int, caller_gid: int, donors: tuple[str, ...] = ()) -> ForkReply:
        self._record("fork", capsule_id, caller_uid, caller_gid, donors)
        return ForkReply("cap_2", "/merged2", "/w", "t", "t", {}, parent=capsule_id)

    def open_root(self, capsule_id: str, caller_uid: int) -> int:
        self._record("open_root", capsule_id, caller_uid)
        return os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)

    def net_open(self, capsule_id: str, caller_uid: int) -> tuple[NetOpenReply, list[int]]:
        self._record("net_open", capsule_id, caller_uid)
        reply = NetOpenReply("10.99.0.1:3128", "10.99.0.1:1080", ("10.99.0.2", "fd63:6377::2"),
                             {"HTTP_PROXY": "http://10.99.0.1:3128"}, "egress: test")
        return reply, [os.open(self.root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for _ in range(3)]

    def destroy(self, capsule_id: str, caller_uid: int) -> DestroyReply:
        self._record("destroy", capsule_id, caller_uid)
        return DestroyReply(capsule_id, destroyed=True)

    def list(self, caller_uid: int) -> ListReply:
        self._record("list", caller_uid)
        return ListReply(())


PEER = Peer(pid=10, uid=1234, gid=99)


@pytest.fixture
def manager(tmp_path: Path) -> ManagerDouble:
    return ManagerDouble(tmp_path)


def dispatch(manager: ManagerDouble, op: str, args: dict[str, Any],
             peer: Peer = PEER) -> tuple[dict[str, Any], list[int]]:
    return Dispatcher(manager, "privileged", {"jail": {}}).handle(Request(1, op, args), peer)


def test_each_op_reaches_its_manager_method_with_peer_identity(manager: ManagerDouble) -> None:
    stdin = base64.b64encode(b"in").decode()
    dispatch(manager, "create", {"workspace": "/w", "network": "none", "limits": {"pids_max": 5}})
    dispatch(manager, "exec", {"capsule_id": "cap_1", "argv": ["true"], "stdin_b64": stdin, "timeout_ms": 5})
    dispatch(manager, "exec", {"capsule_id": "cap_1", "argv": ["true"], "stdin_b64": None})
    dispatch(manager, "changes", {"capsule_id": "cap_1"})
    dispatch(manager, "fork", {"capsule_id": "cap_1"})
    dispatch(manager, "fork", {"capsule_id": "cap_1", "donors": ["cap_3", "cap_2"]})
    result, fds = dispatch(manager, "open_root", {"capsule_id": "cap_1"})
    assert result == {"capsule_id": "cap_1"} and len(fds) == 1
    os.close(fds[0])
    result, fds = dispatch(manager, "net_open", {"capsule_id": "cap_1"})
    assert result["http_proxy"] == "10.99.0.1:3128" and len(fds) == 3
    for fd in fds:
        os.close(fd)
    dispatch(manager, "destroy", {"capsule_id": "cap_1"})
    dispatch(manager, "list", {})
    assert manager.calls == [
        ("create", (1234, 99, CapsuleSpec("/w", network="none", limits=Limits(pids_max=5))), {}),
        ("exec", (ExecRequest("cap_1", ("true",), stdin=b"in", timeout_ms=5), 1234, 99), {"on_progress": None}),
        ("exec", (ExecRequest("cap_1", ("true",)), 1234, 99), {"on_progress": None}),
        ("changes", ("cap_1", 1234), {}),
        ("fork", ("cap_1", 1234, 99, ()), {}),
        ("fork", ("cap_1", 1234, 99, ("cap_3", "cap_2")), {}),
        ("open_root", ("cap_1", 1234), {}),
        ("net_open", ("cap_1", 1234), {}),
        ("destroy", ("cap_1", 1234), {}),
        ("list", (1234,), {}),
    ]


def test_hello_reports_mode_mechanisms_and_ops(manager: ManagerDouble) -> None:
    result, fds = dispatch(manager, "hello", {"version": PROTOCOL_VERSION})
    assert fds == [] and manager.calls == []
    assert result["mode"] == "privileged" and result["mechanisms"] == {"jail": {}}
    assert result["ops"] == sorted(["hello", "create", "exec", "changes", "fork", "open_root", "net_open", "signal",
                                    "freeze", "net_connect", "net_forward", "run_reads", "destroy",
                                    "list"])
    with pytest.raises(CcwError) as info:
        dispatch(manager, "hello", {"version": PROTOCOL_VERSION + 1})
    assert info.value.code == "UNSUPPORTED"


@pytest.mark.parametrize(
    ("op", "args", "code"),
    [
        ("create", {"workspace": "/boom"}, "INTERNAL"),
        ("create", {"workspace": "/missing"}, "NOT_FOUND"),
        ("changes", {"capsule_id": "cap_other"}, "PERMISSION_DENIED"),
        ("create", {"workspace": "rel"}, "INVALID_ARGUMENT"),
        ("mount", {}, "INVALID_ARGUMENT"),
    ],
)
def test_failures_become_ccw_errors(manager: ManagerDouble, op: str, args: dict[str, Any], code: str) -> None:
    with pytest.raises(CcwError) as info:
        dispatch(manager, op, args)
    assert info.value.code == code


def test_a_reply_of_another_op_is_an_internal_error(manager: ManagerDouble, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manager, "changes", lambda capsule_id, caller_uid, *flags: {"changes": []})
    with pytest.raises(CcwError) as info:
        dispatch(manager, "changes", {"capsule_id": "cap_1"})
    assert info.value.code == "INTERNAL" and "not ChangesReply" in info.value.message
    monkeypatch.setattr(manager, "destroy", lambda capsule_id, caller_uid: ListReply(()))
    with pytest.raises(CcwError) as info:
        dispatch(manager, "destroy", {"capsule_id": "cap_1"})
    assert info.value.code == "INTERNAL"


def test_unknown_op_and_bad_args_never_reach_the_manager(manager: ManagerDouble) -> None:
    for op, args in [("mount", {}), ("exec", {"capsule_id": "../x", "argv": ["true"]})]:
        with pytest.raises(CcwError):
            dispatch(manager, op, args)
    assert manager.calls == []


def test_overflow_uid_and_foreign_uids_are_refused(manager: ManagerDouble) -> None:
    with pytest.raises(CcwError) as info:
        dispatch(manager, "list", {}, Peer(1, 65534, 65534))
    assert info.value.code == "PERMISSION_DENIED"
    rootless = Dispatcher(manager, "rootless", {}, allowed_uids=frozenset({0}))
    with pytest.raises(CcwError):
        rootless.handle(Request(1, "list", {}), PEER)
    assert rootless.handle(Request(1, "list", {}), Peer(1, 0, 0))[0] == {"capsules": []}
    assert manager.calls == [("list", (0,), {})]


# --- over a real socket ---------------------------------------------------------------------


@pytest.fixture
def served(tmp_path: Path, manager: ManagerDouble) -> Iterator[tuple[str, ManagerDouble]]:
    path = str(tmp_path / "helper.sock")
    server = HelperServer(path, Dispatcher(manager, "privileged", {}))
    server.listen()
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield path, manager
    finally:
        manager.release.set()
        server.shutdown()
        thread.join(10)
        assert not thread.is_alive()
        assert not os.path.exists(path)


def test_socket_mode_and_peer_credentials(served: tuple[str, ManagerDouble]) -> None:
    path, manager = served
    assert os.stat(path).st_mode & 0o777 == 0o600
    (reply,) = raw_exchange(path, encode_request(5, "list", {}))
    assert reply == Reply(5, True, result={"capsules": []})
    assert manager.calls == [("list", (os.getuid(),), {})]


def test_pipelined_requests_answered_in_order(served: tuple[str, ManagerDouble]) -> None:
    path, _ = served
    data = b"".join(encode_request(i, "list", {}) for i in range(1, 6)) + encode_frame(
        {"id": 6, "op": "mount", "args": {}}
    )
    replies = raw_exchange(path, data + encode_request(7, "list", {}))
    assert [r.id for r in replies] == [1, 2, 3, 4, 5, 6, 7]
    assert replies[5].error.code == "INVALID_ARGUMENT" and replies[6].ok


@pytest.mark.parametrize(
    "garbage",
    [b"\x00\x00\x00\x05hello", struct.pack(">I", 1 << 30), b"\x00\x00\x00\x02[]", b"\x00\x00"],
)
def test_malformed_frame_closes_only_that_connection(served: tuple[str, ManagerDouble], garbage: bytes) -> None:
    path, _ = served
    replies = raw_exchange(path, encode_request(1, "list", {}) + garbage + encode_request(2, "list", {}))
    assert replies[0] == Reply(1, True, result={"capsules": []})
    assert len(replies) == 2 and replies[1].id is None and not replies[1].ok
    assert raw_exchange(path, encode_request(3, "list", {}))[0].ok


def test_oversize_result_becomes_too_large_error(served: tuple[str, ManagerDouble]) -> None:
    path, _ = served
    (reply,) = raw_exchange(path, encode_request(1, "exec", {"capsule_id": "cap_1", "argv": ["huge"]}))
    assert reply.error.code == "TOO_LARGE"


def test_stale_socket_replaced_and_live_one_refused(tmp_path: Path, manager: ManagerDouble) -> None:
    path = str(tmp_path / "s.sock")
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(path)
    stale.close()  # the file stays, nobody listens: ECONNREFUSED
    server = HelperServer(path, Dispatcher(manager, "privileged", {}))
    server.listen()
    with pytest.raises(CcwError) as info:
        HelperServer(path, Dispatcher(manager, "privileged", {})).listen()
    assert info.value.code == "CONFLICT"
    server.shutdown()
    server.serve_forever()  # returns at once: stopping
    assert not os.path.exists(path)
    Path(path).write_text("not a socket")
    with pytest.raises(CcwError):
        HelperServer(path, Dispatcher(manager, "privileged", {})).listen()
    assert Path(path).read_text() == "not a socket"


def test_long_socket_path(tmp_path: Path, manager: ManagerDouble) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "helper.sock")
    server = HelperServer(path, Dispatcher(manager, "privileged", {}))
    server.listen()
    thread = threading.Thread(target=server.serve_forever)
    thread.start()

    async def main() -> None:
        client = HelperClient(path)
        assert await client.request("list", {}) == {"capsules": []}
        await client.aclose()

    try:
        trio.run(main)
    finally:
        server.shutdown()
        thread.join(10)
    assert not os.path.exists(path)


def read_at(dirfd: int, name: str) -> bytes:
    fd = os.open(name, os.O_RDONLY, dir_fd=dirfd)
    try:
        return os.read(fd, 1000)
    finally:
        os.close(fd)


def test_client_requests_open_root_and_errors(served: tuple[str, ManagerDouble], tmp_path: Path) -> None:
    path, _ = served
    (tmp_path / "inside.txt").write_text("hello")

    async def main() -> None:
        client = HelperClient(path)
        try:
            assert (await client.hello())["version"] == PROTOCOL_VERSION
            fd = await client.open_root("cap_1")
            try:
                assert read_at(fd, "inside.txt") == b"hello"
            finally:
                os.close(fd)
            with pytest.raises(CcwError) as info:
                await client.request("changes", {"capsule_id": "cap_other"})
            assert info.value.code == "PERMISSION_DENIED"
            # The connection stays usable after an error reply.
            assert await client.request("list", {}) == {"capsules": []}
            with pytest.raises(CcwError):
                await client.request("mount", {})
        finally:
            await client.aclose()

    trio.run(main)


def test_long_exec_does_not_block_other_requests(served: tuple[str, ManagerDouble]) -> None:
    path, manager = served
    manager.release.clear()

    async def main() -> None:
        client = HelperClient(path)
        async with trio.open_nursery() as nursery:
            done = trio.Event()

            async def long_exec() -> None:
                await client.request("exec", {"capsule_id": "cap_1", "argv": ["wait"]})
                done.set()

            nursery.start_soon(long_exec)
            # While the exec is held inside the helper, other requests still get answers.
            for _ in range(3):
                assert await client.request("list", {}) == {"capsules": []}
            assert not done.is_set()
            manager.release.set()
        assert done.is_set()
        await client.aclose()

    trio.run(main)


def test_server_survives_client_vanishing_mid_request(served: tuple[str, ManagerDouble]) -> None:
    path, manager = served
    manager.release.clear()
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(path)
    sock.sendall(encode_request(1, "exec", {"capsule_id": "cap_1", "argv": ["wait"]}))
    sock.close()
    manager.release.set()
    assert raw_exchange(path, encode_request(2, "list", {}))[0].ok


def test_shutdown_finishes_in_flight_requests(tmp_path: Path, manager: ManagerDouble) -> None:
    path = str(tmp_path / "helper.sock")
    server = HelperServer(path, Dispatcher(manager, "privileged", {}))
    server.listen()
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    manager.release.clear()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(path)
        # Two pipelined requests: the first is held inside the manager during shutdown.
        sock.sendall(encode_request(1, "exec", {"capsule_id": "cap_1", "argv": ["wait"]})
                     + encode_request(2, "list", {}))
        while not manager.calls:
            threading.Event().wait(0.01)
        server.shutdown()
        with pytest.raises((ConnectionRefusedError, FileNotFoundError)):  # no longer accepting
            while True:
                with socket.socket(socket.AF_UNIX) as late:
                    late.connect(path)
                threading.Event().wait(0.01)
        manager.release.set()
        decoder = FrameDecoder("reply")
        while chunk := sock.recv(65536):
            decoder.feed(chunk)
        decoder.feed_eof()
        assert [(r.id, r.ok) for r in decoder.messages()] == [(1, True), (2, True)]
    thread.join(10)
    assert not thread.is_alive() and not os.path.exists(path)


def test_connections_over_the_limit_are_told_to_retry(
    served: tuple[str, ManagerDouble], monkeypatch: pytest.MonkeyPatch
) -> None:
    import sandbox.server

    path, _ = served
    monkeypatch.setattr(sandbox.server, "MAX_CONNECTIONS", 1)
    with socket.socket(socket.AF_UNIX) as first:
        first.connect(path)
        first.sendall(encode_request(1, "list", {}))
        assert first.recv(65536)  # the first connection is being served
        with socket.socket(socket.AF_UNIX) as second:
            second.connect(path)
            decoder = FrameDecoder("reply")
            while chunk := second.recv(65536):
                decoder.feed(chunk)
            (refused,) = decoder.messages()
        assert refused.error.code == "UNAVAILABLE"
    # Once the first is gone, the next is served (its thread may need a moment to end).
    # A request sent while still refused may meet the closed socket (EPIPE, ECONNRESET):
    # that is a refusal too.
    ok = False
    for _ in range(500):
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            ok = raw_exchange(path, encode_request(2, "list", {}))[0].ok
        if ok:
            break
        threading.Event().wait(0.01)
    assert ok


def test_unencodable_frame_in_encode_frame() -> None:
    with pytest.raises(CcwError):
        encode_frame({"x": object()})

"""The real helper process as root, driven through its socket by the front end's client.

Covers: hello; create / exec / changes / open_root / destroy end to end with the real
CapsuleManager; reading and writing capsule files through the open_root descriptor with
openat2(RESOLVE_BENEATH); malformed frames not killing the server; kill -9 and restart
losing no capsule data (with the stale socket file left behind); the embedded default
(connect_or_spawn) starting and stopping its own helper.
"""

from __future__ import annotations

import base64
import ctypes
import errno
import os
import platform
import select
import signal
import socket
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.config import Config
from mcp_server.launcher import connect_or_spawn
from sandbox import syscalls
from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import encode_request
from sandbox.protocol import PROTOCOL_VERSION
from tests.support.helper_wire import raw_exchange

ROOT = Path(__file__).resolve().parent.parent
BENEATH = syscalls.RESOLVE_BENEATH | syscalls.RESOLVE_NO_MAGICLINKS


class Helper:
    """A ccw-helper child process, started and waited for like the embedded default does."""

    def __init__(self, socket_path: Path, state_dir: Path, *extra: str) -> None:
        self.socket_path = str(socket_path)
        self.state_dir = str(state_dir)
        self.log = state_dir.parent / f"helper-{len(list(state_dir.parent.glob('helper-*')))}.log"
        ready_r, ready_w = os.pipe()
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "sandbox", "--socket", self.socket_path,
                 "--state-dir", self.state_dir, "--ready-fd", str(ready_w), *extra],
                cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(ready_w,),
            )  # fmt: skip
        os.close(ready_w)
        try:
            readable, _, _ = select.select([ready_r], [], [], 60)
            ready = os.read(ready_r, 1) if readable else b""
        finally:
            os.close(ready_r)
        if ready != b"1":
            self.stop()
            raise AssertionError(f"helper did not start:\n{self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(30)


def rpc(path: str, op: str, args: dict[str, Any]) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        client = HelperClient(path)
        try:
            return await client.request(op, args)
        finally:
            await client.aclose()

    return trio.run(main)


def open_root(path: str, capsule_id: str) -> int:
    async def main() -> int:
        client = HelperClient(path)
        try:
            return await client.open_root(capsule_id)
        finally:
            await client.aclose()

    return trio.run(main)


def read_beneath(root_fd: int, rel: str) -> bytes:
    fd = syscalls.openat2(root_fd, rel, os.O_RDONLY | os.O_CLOEXEC, resolve=BENEATH)
    try:
        return os.read(fd, 1 << 20)
    finally:
        os.close(fd)


def write_beneath(root_fd: int, rel: str, data: bytes) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
    fd = syscalls.openat2(root_fd, rel, flags, 0o644, resolve=BENEATH)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "module.py").write_text("VALUE = 1\n")
    (ws / "README").write_text("readme\n")
    return ws


@pytest.fixture
def start_helper(root_required: None, tmp_path: Path) -> Iterator[Callable[..., Helper]]:
    started: list[Helper] = []

    def start(*extra: str) -> Helper:
        helper = Helper(tmp_path / "helper.sock", tmp_path / "state", *extra)
        started.append(helper)
        return helper

    yield start
    for helper in started:
        if helper.process.poll() is None:
            state = Path(helper.state_dir)
            for capsule in rpc(helper.socket_path, "list", {})["capsules"]:
                rpc(helper.socket_path, "destroy", {"capsule_id": capsule["capsule_id"]})
            assert helper.stop() == 0, helper.log.read_text()
            assert not os.path.exists(helper.socket_path)
            assert not [p for p in (state / "capsules").iterdir() if p.name.startswith("cap_")]


def test_hello_reports_privileged_mode_and_mechanisms(start_helper: Callable[..., Helper]) -> None:
    helper = start_helper()
    assert os.stat(helper.socket_path).st_mode & 0o777 == 0o600
    hello = rpc(helper.socket_path, "hello", {"version": PROTOCOL_VERSION})
    assert hello["version"] == PROTOCOL_VERSION and hello["mode"] == "privileged"
    assert hello["ops"] == sorted(["hello", "create", "exec", "changes", "fork", "open_root", "net_open", "signal",
                                   "freeze", "net_connect", "net_forward", "run_reads", "destroy", "list"])
    assert hello["mechanisms"]["user_namespace"] is False
    assert "jail" in hello["mechanisms"] and hello["mechanisms"]["jail"]["network_egress"].startswith("egress: ")


def test_capsule_lifecycle_through_the_socket(start_helper: Callable[..., Helper], workspace: Path) -> None:
    helper = start_helper()
    path = helper.socket_path
    created = rpc(path, "create", {"workspace": str(workspace)})
    capsule_id = created["capsule_id"]
    assert capsule_id.startswith("cap_") and created["workspace"] == str(workspace)
    # The helper's overlays live in its own mount namespace, not the host's.
    assert created["mount"] not in Path("/proc/self/mountinfo").read_text()

    ran = rpc(path, "exec", {
        "capsule_id": capsule_id,
        "argv": ["sh", "-c", "cat src/module.py; echo new > added.txt; rm README; echo err >&2"],
        "cwd": str(workspace),
    })  # fmt: skip
    assert ran["exit_code"] == 0, ran
    assert base64.b64decode(ran["stdout_b64"]) == b"VALUE = 1\n"
    assert base64.b64decode(ran["stderr_b64"]) == b"err\n"

    changes = {c["path"]: c["kind"] for c in rpc(path, "changes", {"capsule_id": capsule_id})["changes"]}
    assert changes == {"README": "deleted", "added.txt": "added"}

    root_fd = open_root(path, capsule_id)
    try:
        assert read_beneath(root_fd, "added.txt") == b"new\n"
        assert read_beneath(root_fd, "src/module.py") == b"VALUE = 1\n"
        with pytest.raises(OSError) as info:
            read_beneath(root_fd, "../../../../../../etc/passwd")
        assert info.value.errno == errno.EXDEV
        write_beneath(root_fd, "src/module.py", b"VALUE = 2\n")
    finally:
        os.close(root_fd)
    kinds = {c["path"]: c["kind"] for c in rpc(path, "changes", {"capsule_id": capsule_id})["changes"]}
    assert kinds["src/module.py"] == "modified"
    # The host's tree is untouched.
    assert (workspace / "README").read_text() == "readme\n"
    assert not (workspace / "added.txt").exists()
    assert (workspace / "src" / "module.py").read_text() == "VALUE = 1\n"

    listed = rpc(path, "list", {})["capsules"]
    assert [c["capsule_id"] for c in listed] == [capsule_id]
    assert rpc(path, "destroy", {"capsule_id": capsule_id}) == {"capsule_id": capsule_id, "destroyed": True}
    assert rpc(path, "list", {})["capsules"] == []
    with pytest.raises(CcwError) as err:
        rpc(path, "changes", {"capsule_id": capsule_id})
    assert err.value.code == "NOT_FOUND"


@pytest.mark.parametrize(
    "garbage",
    [
        b"\x00\x00\x00\x04\xff\xfe\xfd\xfc",
        struct.pack(">I", 0xFFFFFFFF),
        b'\x00\x00\x00\x0d{"a":1,"a":2}',
        b'\x00\x00\x00\x0b{"id":1.5}x',
        b"\x00\x00\x01",
    ],
)
def test_malformed_frames_do_not_kill_the_server(start_helper: Callable[..., Helper], garbage: bytes) -> None:
    helper = start_helper()
    replies = raw_exchange(helper.socket_path, garbage)
    assert len(replies) == 1 and not replies[0].ok and replies[0].id is None
    assert replies[0].error.code in ("INVALID_ARGUMENT", "TOO_LARGE")
    # A connection closed half way through a frame, then a good client.
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(helper.socket_path)
        sock.sendall(encode_request(1, "list", {})[:7])
    assert helper.process.poll() is None
    assert rpc(helper.socket_path, "hello", {"version": PROTOCOL_VERSION})["mode"] == "privileged"


def test_kill9_and_restart_loses_no_capsule_data(start_helper: Callable[..., Helper], workspace: Path) -> None:
    helper = start_helper()
    capsule_id = rpc(helper.socket_path, "create", {"workspace": str(workspace)})["capsule_id"]
    root_fd = open_root(helper.socket_path, capsule_id)
    try:
        write_beneath(root_fd, "kept.txt", b"survives\n")
    finally:
        os.close(root_fd)
    assert helper.stop(signal.SIGKILL) == -signal.SIGKILL
    # kill -9 leaves the socket file behind: the next helper finds it stale and replaces it.
    assert Path(helper.socket_path).is_socket()

    again = start_helper()
    assert [c["capsule_id"] for c in rpc(again.socket_path, "list", {})["capsules"]] == [capsule_id]
    changes = rpc(again.socket_path, "changes", {"capsule_id": capsule_id})["changes"]
    assert [(c["path"], c["kind"]) for c in changes] == [("kept.txt", "added")]
    root_fd = open_root(again.socket_path, capsule_id)
    try:
        assert read_beneath(root_fd, "kept.txt") == b"survives\n"
        assert read_beneath(root_fd, "README") == b"readme\n"
    finally:
        os.close(root_fd)
    assert not (workspace / "kept.txt").exists()


def test_second_helper_on_a_live_socket_is_refused(start_helper: Callable[..., Helper], tmp_path: Path) -> None:
    helper = start_helper()
    with pytest.raises(AssertionError, match="another helper is serving"):
        Helper(Path(helper.socket_path), tmp_path / "state2")
    assert rpc(helper.socket_path, "list", {}) == {"capsules": []}


def test_sigterm_taken_by_another_thread_still_stops_the_helper(start_helper: Callable[..., Helper]) -> None:
    """A SIGTERM that the kernel hands to a pool thread, not the main thread, stops the helper.

    CPython runs the handler in the main thread only; without a wakeup fd, a main thread
    asleep in poll() never learned of it (found when ``stop`` timed out in a loaded run).
    """
    helper = start_helper()
    pid = helper.process.pid
    others = [int(tid) for tid in os.listdir(f"/proc/{pid}/task") if int(tid) != pid]
    assert others, "the helper runs pool threads; this test needs one to aim the signal at"
    libc = ctypes.CDLL(None, use_errno=True)
    sys_tgkill = {"x86_64": 234, "aarch64": 131}[platform.machine()]
    assert libc.syscall(sys_tgkill, pid, others[0], signal.SIGTERM) == 0, os.strerror(ctypes.get_errno())
    assert helper.process.wait(30) == 0, helper.log.read_text()
    assert "SIGTERM: finishing in-flight requests" in helper.log.read_text()


def test_embedded_default_starts_and_stops_its_helper(root_required: None, tmp_path: Path, workspace: Path) -> None:
    state = tmp_path / "ccw-state"
    socket_path = state / "helper" / "helper.sock"

    async def main() -> None:
        config = Config(state_dir=str(state), helper_socket=str(tmp_path / "nobody-here.sock"))
        client = await connect_or_spawn(config)
        try:
            assert client.process is not None and client.socket_path == str(socket_path)
            assert (await client.hello())["mode"] == "privileged"
            capsule_id = (await client.request("create", {"workspace": str(workspace)}))["capsule_id"]
            # Several requests at once, each on its own connection.
            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(client.request, "changes", {"capsule_id": capsule_id})
            await client.request("destroy", {"capsule_id": capsule_id})
        finally:
            await client.aclose()
        assert client.process.process.poll() == 0

    trio.run(main)
    assert not socket_path.exists()


def test_embedded_helper_that_cannot_start_says_why(root_required: None, tmp_path: Path) -> None:
    state = tmp_path / "ccw-state"
    (state / "helper").mkdir(parents=True)
    (state / "helper" / "helper.sock").write_text("squatter")  # not a socket: never unlinked

    async def main() -> None:
        with pytest.raises(CcwError) as info:
            await connect_or_spawn(Config(state_dir=str(state)))
        assert info.value.code == "UNAVAILABLE"
        assert "exit status 1" in info.value.message
        assert "is not a socket" in info.value.message  # the helper's own stderr, quoted

    trio.run(main)
    assert (state / "helper" / "helper.sock").read_text() == "squatter"


def test_sigterm_lets_an_exec_in_flight_finish(start_helper: Callable[..., Helper], workspace: Path) -> None:
    helper = start_helper()
    path = helper.socket_path
    capsule_id = rpc(path, "create", {"workspace": str(workspace)})["capsule_id"]
    results: list[dict[str, Any]] = []

    async def main() -> None:
        client = HelperClient(path)
        try:
            async with trio.open_nursery() as nursery:

                async def run() -> None:
                    results.append(await client.request("exec", {
                        "capsule_id": capsule_id, "cwd": str(workspace),
                        "argv": ["sh", "-c", "touch started; sleep 1; echo done"],
                    }))  # fmt: skip

                nursery.start_soon(run)
                while True:  # until the command runs inside the jail
                    changes = await client.request("changes", {"capsule_id": capsule_id})
                    if any(c["path"] == "started" for c in changes["changes"]):
                        break
                    await trio.sleep(0.05)
                helper.process.send_signal(signal.SIGTERM)
        finally:
            await client.aclose()

    trio.run(main)
    assert results[0]["exit_code"] == 0 and base64.b64decode(results[0]["stdout_b64"]) == b"done\n"
    assert helper.process.wait(30) == 0
    assert not os.path.exists(path)
    # Its data is still there for the next helper.
    again = start_helper()
    assert [c["capsule_id"] for c in rpc(again.socket_path, "list", {})["capsules"]] == [capsule_id]

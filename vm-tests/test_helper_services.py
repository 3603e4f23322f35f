"""Services in the helper: a run beside the exec, one network per capsule, signals, pause, destroy.

Driven through the helper's own client (no front end): a service is an ``exec`` with a
``service`` name, no time limit and streamed output, kept open by a task of the test,
as the front end's services keep theirs (sandbox/services.py).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest
from sandbox.replies import ExecProgress, ExecReply

SERVER = ("import http.server as h; "
          "h.ThreadingHTTPServer(('127.0.0.1', 8765), h.SimpleHTTPRequestHandler).serve_forever()")
FETCH = ("import urllib.request as u, sys; "
         "sys.stdout.write(u.urlopen('http://127.0.0.1:8765/hello.txt', timeout=5).read().decode())")


@pytest.fixture
def helper(tmp_path: Path, root_required: None,
           launch_helper: Callable[..., subprocess.Popen[bytes]]) -> Iterator[Path]:
    socket_path = tmp_path / "helper.sock"
    process = launch_helper(socket_path, tmp_path / "state", tmp_path / "helper.log")
    yield socket_path
    process.terminate()
    process.wait(30)


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "hello.txt").write_text("hello from the workspace\n")
    return ws


async def _service(client: HelperClient, capsule_id: str, name: str, code: str, seen: list[ExecProgress],
                   task_status: Any = trio.TASK_STATUS_IGNORED) -> ExecReply:
    request = ExecRequest(capsule_id, ("python3", "-u", "-c", code), timeout_ms=0, progress_ms=100, stream=True,
                          service=name)

    async def progress(report: dict[str, Any]) -> None:
        seen.append(ExecProgress.from_args(report))

    task_status.started()
    return await client.call(request, on_progress=progress)


async def _wait_listening(client: HelperClient, capsule_id: str, port: int) -> None:
    with trio.fail_after(20):
        while True:
            try:
                sock = await client.net_connect(capsule_id, port)
            except CcwError as exc:
                assert exc.code == "CONFLICT" and exc.details["reason"] == "refused"
                await trio.sleep(0.05)
                continue
            sock.close()
            return


def test_a_service_serves_an_exec_of_its_capsule_and_ends_with_destroy(helper: Path, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def main() -> dict[str, Any]:
        client = HelperClient(str(helper))
        made = await client.request("create", {"workspace": str(ws)})
        cap = made["capsule_id"]
        seen: list[ExecProgress] = []
        out: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            ended: list[ExecReply | BaseException] = []
            changed = [trio.Event(), trio.Event()]

            async def keep() -> None:
                try:
                    ended.append(await _service(client, cap, "web", SERVER, seen))
                except CcwError as exc:
                    ended.append(exc)
                changed[len(ended) - 1].set()

            nursery.start_soon(keep)
            await _wait_listening(client, cap, 8765)
            listed = await client.request("list", {})
            out["listed"] = [c.get("services") for c in listed["capsules"]]
            # An exec of the same capsule reaches the service on the capsule's loopback.
            fetched = await client.call(ExecRequest(cap, ("python3", "-c", FETCH)))
            out["fetched"] = fetched.stdout.decode()
            out["exec_touched_written"] = list(fetched.touched.written)
            # A second service of that name is refused; so is the same port from an exec of another capsule.
            with pytest.raises(CcwError) as twice:
                await _service(client, cap, "web", SERVER, [])
            out["twice"] = twice.value.code
            other = (await client.request("create", {"workspace": str(ws)}))["capsule_id"]
            elsewhere = await client.call(ExecRequest(other, ("python3", "-c", FETCH)))
            out["elsewhere_exit"] = elsewhere.exit_code
            # Pause: the service's processes freeze and the capsule takes no new run; resume thaws.
            frozen = await client.request("freeze", {"capsule_id": cap, "frozen": True})
            out["frozen_runs"] = frozen["runs"]
            with pytest.raises(CcwError) as paused:
                await client.call(ExecRequest(cap, ("true",)))
            out["paused_code"] = paused.value.code
            await client.request("freeze", {"capsule_id": cap, "frozen": False})
            again = await client.call(ExecRequest(cap, ("python3", "-c", FETCH)))
            out["after_resume"] = again.stdout.decode()
            # SIGTERM through the signal op ends the service; its run replies like an exec.
            sent = await client.request("signal", {"capsule_id": cap, "service": "web", "signal": "SIGTERM"})
            out["sent"] = sent["sent"]
            with trio.fail_after(20):
                await changed[0].wait()
            out["service_end"] = ended[0]
            out["log_bytes"] = b"".join(p.stderr_tail for p in seen)
            # Destroy kills a service still running.
            nursery.start_soon(keep)
            await _wait_listening(client, cap, 8765)
            await client.request("destroy", {"capsule_id": cap})
            with trio.fail_after(20):
                await changed[1].wait()
            out["killed_by_destroy"] = ended[1]
            await client.request("destroy", {"capsule_id": other})
        await client.aclose()
        return out

    out = trio.run(main)
    assert out["listed"] == [["web"]]
    assert out["fetched"] == "hello from the workspace\n"
    assert out["twice"] == "CONFLICT"
    assert out["elsewhere_exit"] != 0  # another capsule's loopback has nothing on 8765
    assert out["frozen_runs"] == ["web"] and out["paused_code"] == "CONFLICT"
    assert out["after_resume"] == "hello from the workspace\n"
    assert out["sent"] is True
    end = out["service_end"]
    assert isinstance(end, ExecReply) and (end.signal == "SIGTERM" or end.exit_code not in (0, None))
    assert end.touched.read is None or "hello.txt" in end.touched.read
    assert b'"GET /hello.txt HTTP/1.1" 200' in out["log_bytes"]  # the server's log, streamed
    assert isinstance(out["killed_by_destroy"], ExecReply) and out["killed_by_destroy"].signal == "SIGKILL"
    leftover = subprocess.run(["pgrep", "-f", "ThreadingHTTPServer"], capture_output=True, text=True)
    assert leftover.stdout == ""


# A service that prints and ends before its first report, and one that prints its last words
# after several: what each printed last comes in a report before the reply, never lost with it.
LAST_WORDS = {
    "fast": "import sys; print('fast-out-1'); print('fast-err-1', file=sys.stderr); sys.exit(3)",
    "crashy": "import sys, time; print('started'); time.sleep(0.5); print('Traceback-last-words', file=sys.stderr); "
              "sys.exit(1)",
}


def test_a_service_that_ends_reports_its_last_output_before_its_reply(helper: Path, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def main() -> dict[str, tuple[list[ExecProgress], ExecReply]]:
        client = HelperClient(str(helper))
        cap = (await client.request("create", {"workspace": str(ws)}))["capsule_id"]
        out = {}
        for name, code in LAST_WORDS.items():
            seen: list[ExecProgress] = []
            out[name] = (seen, await _service(client, cap, name, code, seen))
        await client.request("destroy", {"capsule_id": cap})
        await client.aclose()
        return out

    out = trio.run(main)
    expected = {"fast": (3, b"fast-out-1\n", b"fast-err-1\n"), "crashy": (1, b"started\n", b"Traceback-last-words\n")}
    for name, (exit_code, stdout, stderr) in expected.items():
        seen, reply = out[name]
        assert reply.exit_code == exit_code, (name, reply)
        assert b"".join(p.stdout_tail for p in seen) == stdout, (name, seen)
        assert b"".join(p.stderr_tail for p in seen) == stderr, (name, seen)
        assert (seen[-1].stdout_bytes, seen[-1].stderr_bytes) == (len(stdout), len(stderr))


def test_a_running_service_is_frozen_while_its_capsule_has_forks(helper: Path, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    ticker = "import time, pathlib\nwhile True:\n    time.sleep(0.05)\n"

    async def main() -> dict[str, Any]:
        client = HelperClient(str(helper))
        cap = (await client.request("create", {"workspace": str(ws)}))["capsule_id"]
        seen: list[ExecProgress] = []
        out: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_service, client, cap, "tick", ticker, seen)
            await trio.sleep(0.5)
            fork = (await client.request("fork", {"capsule_id": cap}))["capsule_id"]
            out["state"] = _freezer_state()
            await client.request("destroy", {"capsule_id": fork})
            out["thawed"] = _freezer_state()
            await client.request("destroy", {"capsule_id": cap})
        await client.aclose()
        return out

    out = trio.run(main)
    assert "FROZEN" in out["state"]
    assert "FROZEN" not in out["thawed"]


def _freezer_state() -> list[str]:
    """The v1 freezer state of every exec cgroup of ccw on this host (one service runs)."""
    states = []
    for root, _dirs, files in os.walk("/sys/fs/cgroup/freezer"):
        if "freezer.state" in files and "@" in os.path.basename(root):
            with open(os.path.join(root, "freezer.state")) as f:
                states.append(f.read().strip())
    time.sleep(0)
    return states


def test_each_capsule_has_one_network_namespace_of_its_own(root_required: None) -> None:
    import socket

    from sandbox import capsule_nets, namespaces, syscalls
    from sandbox.egress import Kits

    nets = capsule_nets.Nets(Kits())
    first, again, other = (nets.descriptor(cap, "none") for cap in ("cap_a", "cap_a", "cap_b"))
    try:
        inodes = [os.fstat(fd).st_ino for fd in (first, again, other)]
        assert inodes[0] == inodes[1] != inodes[2]
        assert inodes[0] != os.stat("/proc/self/ns/net").st_ino
        with pytest.raises(CcwError) as refused:
            nets.connect("cap_a", "none", 8080)
        assert refused.value.details == {"capsule_id": "cap_a", "port": 8080, "reason": "refused"}

        def listen_inside() -> socket.socket:
            syscalls.setns(first, syscalls.CLONE_NEWNET)
            server = socket.socket()
            server.bind(("127.0.0.1", 8080))
            server.listen()
            return server

        server = namespaces.on_own_thread(listen_inside)
        with server, nets.connect("cap_a", "none", 8080) as client:
            accepted, _ = server.accept()
            with accepted:
                client.setblocking(True)
                client.sendall(b"ping")
                assert accepted.recv(4) == b"ping"
        with pytest.raises(CcwError):  # another capsule's loopback is another world
            nets.connect("cap_b", "none", 8080)
    finally:
        for fd in (first, again, other):
            os.close(fd)
        nets.close_all()

"""The REAPI client against a real local cluster: private PostgreSQL + BuildGrid 0.9.1 on loopback.

The cluster comes up once for the module (5-9 s on this project's 2-core VM, plus
about 17 s the first time, to make BuildGrid's Python 3.13 venv, and about 10 s where
PostgreSQL must be installed from Debian).  Execute is shown here through the action
cache, by an uncached action staying QUEUED while no bot serves, and end to end with
the test bot of reapi_bot.py (the Remote Workers API session of mcp_server.reapi.worker
running plain subprocesses); ``ccw cluster up`` starts real ccw-bots, which
test_reapi_ccw_bot.py drives through deltamin and replays.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.devcluster import cluster as devcluster
from mcp_server.devcluster.cluster import Cluster, temporary_cluster
from mcp_server.reapi.action import CommandSpec, build_action
from mcp_server.reapi.client import ReapiClient, TrioReapi
from mcp_server.reapi.merkle import FileEntry, build_tree, digest_bytes, key, tree_of_directory
from mcp_server.reapi.protos import re_pb2
from sandbox.errors import CcwError
from tests.support.reapi_bot import running_bot
from tests.support.reapi_cluster import require_cluster_prerequisites

ROOT = Path(__file__).resolve().parent.parent
KEEPALIVE_S = 10  # a silent bot is dropped after this (BuildGrid's bot-session-keepalive-timeout)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module (module-scoped: the `require` fixture is function-scoped).

    Its logs are kept in the test run's temporary directory (``cluster-logs*``).
    """
    require_cluster_prerequisites(request.config)
    logs = tmp_path_factory.mktemp("cluster-logs")
    with temporary_cluster(bot_keepalive_s=KEEPALIVE_S) as running:
        print(f"cluster ready in {running.timings}")
        try:
            yield running
        finally:
            for name in ("bgd.log", "postgres.log"):
                with contextlib.suppress(OSError):
                    shutil.copy(running.state_dir / name, logs / name)


@pytest.fixture
def client(cluster: Cluster) -> Iterator[ReapiClient]:
    with ReapiClient(cluster.url) as reapi:
        yield reapi


def _workspace(tmp_path: Path, budget: int) -> Path:
    ws = tmp_path / "ws"
    (ws / "src" / "pkg").mkdir(parents=True)
    (ws / "empty").mkdir()
    (ws / "src" / "pkg" / "mod.py").write_text("VALUE = 1\n")
    (ws / "src" / "copy.py").write_text("VALUE = 1\n")  # same bytes: one blob
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "link").symlink_to("src/pkg/mod.py")
    (ws / "big.bin").write_bytes(os.urandom(budget + 300_000))  # over one batch: ByteStream
    return ws


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_capabilities(client: ReapiClient, cluster: Cluster) -> None:
    caps = client.capabilities()
    assert re_pb2.DigestFunction.SHA256 in caps.cache_capabilities.digest_function
    assert caps.execution_capabilities.exec_enabled
    assert cluster.timings["ready_s"] > 0 and cluster.server_python


def test_upload_tree_then_nothing_missing(client: ReapiClient, tmp_path: Path) -> None:
    tree = tree_of_directory(_workspace(tmp_path, client.batch_budget()))
    assert len(tree.blobs) == 7  # 3 distinct file contents + 4 directories (root, src, src/pkg, empty)
    first = client.upload_tree(tree)
    # The empty directory's Directory is the empty blob, which a CAS always holds.
    assert first.blobs == len(tree.blobs) - 1 and first.bytestream == 1
    assert (digest_bytes(b"").hash, 0) in tree.blobs
    assert client.find_missing(tree.digests()) == []
    for (hash_, size), source in tree.blobs.items():
        expected = source if isinstance(source, bytes) else source.read_bytes()
        assert client.read_blob(re_pb2.Digest(hash=hash_, size_bytes=size)) == expected
    again = client.upload_tree(tree)
    assert again.blobs == 0 and again.missing_before == []


def test_changed_file_uploads_only_its_path(client: ReapiClient, tmp_path: Path) -> None:
    ws = _workspace(tmp_path, 1000)
    client.upload_tree(tree_of_directory(ws))
    (ws / "src" / "pkg" / "mod.py").write_text("VALUE = 2\n")
    report = client.upload_tree(tree_of_directory(ws))
    # The new file, and the three directories above it (pkg, src, root): nothing else.
    assert report.blobs == 4, report
    assert digest_bytes(b"VALUE = 2\n").hash in {h for (h, _) in report.missing_before}


def test_missing_blob_is_uploaded_again(cluster: Cluster, tmp_path: Path) -> None:
    """The CAS loses everything (an in-memory CAS restarted); the next upload notices and refills."""
    tree = build_tree({"a.txt": FileEntry(data=b"a" * 100), "d/b.txt": FileEntry(data=b"b" * 100)})
    with ReapiClient(cluster.url) as reapi:
        reapi.upload_tree(tree)
        assert reapi.find_missing(tree.digests()) == []
    cluster.restart_server()
    with ReapiClient(cluster.url) as reapi:
        assert {key(d) for d in reapi.find_missing(tree.digests())} == set(tree.blobs)
        report = reapi.upload_tree(tree)
        assert report.blobs == len(tree.blobs)
        assert reapi.find_missing(tree.digests()) == []
        assert reapi.read_blob(digest_bytes(b"b" * 100)) == b"b" * 100


def _stored_result(client: ReapiClient, exit_code: int, stdout: bytes) -> re_pb2.ActionResult:
    stdout_digest = digest_bytes(stdout)
    client.upload({key(stdout_digest): stdout})
    return re_pb2.ActionResult(exit_code=exit_code, stdout_digest=stdout_digest)


def test_action_cache_hit_through_execute(client: ReapiClient) -> None:
    tree = build_tree({"t.py": FileEntry(data=b"print('x')\n")})
    spec = CommandSpec(argv=["python3", "t.py"], env={"PATH": "/usr/bin", "LANG": "C"}, cwd="",
                       platform={"OSFamily": "linux"})  # fmt: skip
    built = build_action(spec, tree.root, timeout_s=30)
    client.upload_tree(tree, built.blobs)
    assert client.get_action_result(built.action_digest) is None
    client.update_action_result(built.action_digest, _stored_result(client, 3, b"x\n"))
    cached = client.get_action_result(built.action_digest)
    assert cached is not None and cached.exit_code == 3
    executed = client.execute(built.action_digest, timeout_s=30)
    assert executed.response.cached_result and executed.result.exit_code == 3
    assert client.outputs(executed.result) == (b"x\n", b"")


def test_skip_cache_lookup_queues_without_a_worker(client: ReapiClient) -> None:
    """With the cache skipped, a cached action still has to run: with no bot it stays QUEUED."""
    tree = build_tree({"t.txt": FileEntry(data=b"queued\n")})
    built = build_action(CommandSpec(argv=["true"]), tree.root)
    client.upload_tree(tree, built.blobs)
    client.update_action_result(built.action_digest, _stored_result(client, 0, b""))
    names: list[str] = []
    with pytest.raises(CcwError) as raised:
        client.execute(built.action_digest, skip_cache_lookup=True, timeout_s=3,
                       on_update=lambda op: names.append(op.name))  # fmt: skip
    assert raised.value.code == "TIMEOUT"
    assert names and names[0]
    client.cancel_operation(names[0])


def test_trio_client(client: ReapiClient) -> None:
    tree = build_tree({"x": FileEntry(data=b"trio\n", executable=True)})
    built = build_action(CommandSpec(argv=["./x"]), tree.root)

    async def main() -> tuple[int, bytes, bool]:
        reapi = TrioReapi(client)
        report = await reapi.upload_tree(tree, built.blobs)
        client.update_action_result(built.action_digest, re_pb2.ActionResult(exit_code=0))
        executed = await reapi.execute(built.action_digest, timeout_s=30)
        data = await reapi.read_blob(digest_bytes(b"trio\n"))
        return report.blobs, data, executed.response.cached_result

    uploaded, data, cached = trio.run(main)
    assert uploaded == 4 and data == b"trio\n" and cached  # file, root Directory, Command, Action


def test_trio_execute_cancelled_ends_the_stream(client: ReapiClient) -> None:
    """Cancelling the trio caller cancels the gRPC stream instead of waiting for its deadline."""
    tree = build_tree({"c": FileEntry(data=b"cancel\n")})
    built = build_action(CommandSpec(argv=["true"], env={"N": "cancel"}), tree.root)
    client.upload_tree(tree, built.blobs)

    async def main() -> bool:
        # A deadline far beyond the test's own timeout: only the cancellation can end the call in time.
        with trio.move_on_after(1.0) as scope:
            await TrioReapi(client).execute(built.action_digest, skip_cache_lookup=True, timeout_s=24 * 3600)
        return scope.cancelled_caught

    assert trio.run(main)  # cancelled, not answered


def test_one_command_up_and_down(request: pytest.FixtureRequest) -> None:
    """``python -m mcp_server.devcluster.cluster up`` prints the URL once ready; SIGTERM tears all down."""
    require_cluster_prerequisites(request.config)
    start = time.monotonic()
    up = [sys.executable, "-m", "mcp_server.devcluster.cluster", "up", "--bots", "1", "--capacity", "2",
          "--property", "pool=big"]
    with subprocess.Popen(up, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as process:
        assert process.stdout is not None and process.stderr is not None
        try:
            line = process.stdout.readline().strip()
            ready = time.monotonic() - start
            assert line.startswith("CCW_REAPI_URL=grpc://127.0.0.1:"), line
            port = int(line.rsplit(":", 1)[1])
            # the slots one deltamin can fill, and the platform that reaches these bots
            assert process.stdout.readline().strip() == "CCW_REAPI_PARALLEL=2"
            assert process.stdout.readline().strip() == "CCW_REAPI_PLATFORM=OSFamily=linux,pool=big"
            with ReapiClient(line.split("=", 1)[1]) as reapi:
                assert reapi.capabilities().execution_capabilities.exec_enabled
                big = _submit(reapi, {"WHO": "big"}, platform={"OSFamily": "linux", "pool": "big"})
                assert reapi.execute(big, timeout_s=60).result.exit_code == 0  # the bot advertises pool=big
                small = _submit(reapi, {"WHO": "small"}, platform={"OSFamily": "linux", "pool": "small"})
                with pytest.raises(CcwError) as unmatched:
                    reapi.execute(small, timeout_s=5)  # no bot matches: it stays queued
                assert unmatched.value.code == "TIMEOUT"
            print(f"one command: ready in {ready:.1f} s")
        finally:
            process.send_signal(signal.SIGTERM)
            said = process.stderr.read()
            assert process.wait(60) == 0, said
    assert not _listening(port)
    state = Path(said.split("state in ", 1)[1].split(";", 1)[0])
    assert not state.exists(), said  # removed after PostgreSQL stopped


PY = "/usr/bin/python3"
SCRIPT = b"""\
import os, sys, time
began = time.time()
time.sleep(float(os.environ.get("NAP", "0")))
with open("result.txt", "w") as out:
    out.write("made by " + os.environ["WHO"] + "\\n")
print("out", sys.argv[1:])
print("err", file=sys.stderr)
if os.environ.get("STAMPS"):  # when it ran, by the clock all runs on this host share
    print("ran", began, time.time(), file=sys.stderr)
sys.exit(int(os.environ.get("CODE", "0")))
"""


def _submit(client: ReapiClient, env: dict[str, str], *, timeout_s: float = 60, do_not_cache: bool = False,
            argv: tuple[str, ...] = (PY, "job.py", "a"),
            platform: dict[str, str] | None = None) -> re_pb2.Digest:  # fmt: skip
    tree = build_tree({"src/job.py": FileEntry(data=SCRIPT)})
    spec = CommandSpec(argv=list(argv), env={"PATH": "/usr/bin:/bin", **env}, cwd="src",
                       output_paths=["result.txt", "absent.txt"],
                       platform=platform or {"OSFamily": "linux"})  # fmt: skip
    built = build_action(spec, tree.root, timeout_s=timeout_s, do_not_cache=do_not_cache)
    client.upload_tree(tree, built.blobs)
    return built.action_digest


def test_execute_on_a_bot_then_from_the_cache(client: ReapiClient, cluster: Cluster) -> None:
    action = _submit(client, {"WHO": "bot", "CODE": "3"})
    with running_bot(cluster.url, "bot-a") as bot:
        first = client.execute(action, timeout_s=60)
        assert not first.response.cached_result and first.response.status.code == 0
        assert first.result.exit_code == 3
        assert client.outputs(first.result) == (b"out ['a']\n", b"err\n")
        (made,) = first.result.output_files  # absent.txt was not made: not listed
        assert made.path == "result.txt" and client.read_blob(made.digest) == b"made by bot\n"
        assert re_pb2.ExecutionStage.EXECUTING in first.stages or re_pb2.ExecutionStage.QUEUED in first.stages
        second = client.execute(action, timeout_s=60)
        assert second.response.cached_result and second.result.exit_code == 3
        rerun = client.execute(action, skip_cache_lookup=True, timeout_s=60)
        assert not rerun.response.cached_result and rerun.result.exit_code == 3
        uncached = _submit(client, {"WHO": "bot"}, do_not_cache=True)
        client.execute(uncached, timeout_s=60)
        assert client.get_action_result(uncached) is None
        assert not client.execute(uncached, timeout_s=60).response.cached_result
    assert bot.completed >= 4


def test_execute_timeout_is_a_status_not_an_exit_code(client: ReapiClient, cluster: Cluster) -> None:
    action = _submit(client, {"WHO": "slow", "NAP": "30"}, timeout_s=1)
    with running_bot(cluster.url, "bot-t"):
        start = time.monotonic()
        executed = client.execute(action, timeout_s=60)
    assert executed.response.status.code == 4  # DEADLINE_EXCEEDED
    assert time.monotonic() - start < 15


def test_a_dropped_stream_is_picked_up_by_wait_execution(client: ReapiClient, cluster: Cluster) -> None:
    """The client drops its Execute stream while the job runs; WaitExecution on the name gets the same run's result."""
    action = _submit(client, {"WHO": "resume", "NAP": "2"}, do_not_cache=True)
    names: list[str] = []
    calls: list[Any] = []

    def dropped() -> None:
        def seen(operation: Any) -> None:
            names.append(operation.name)
            if _stage(operation) == re_pb2.ExecutionStage.EXECUTING:
                calls[-1].cancel()  # as a proxy's idle timeout or a client restart would

        client.execute(action, skip_cache_lookup=True, timeout_s=60, on_update=seen, on_call=calls.append)

    with running_bot(cluster.url, "bot-w") as bot:
        with pytest.raises(CcwError):
            dropped()
        assert names and names[-1]
        resumed = client.wait_execution(names[-1], timeout_s=60)
    assert resumed.operation == names[-1] and resumed.result.exit_code == 0
    assert not resumed.response.cached_result
    assert bot.completed == 1  # one run: the wait did not start another
    with pytest.raises(CcwError) as unknown:
        client.wait_execution("no-such-operation", timeout_s=10)
    assert unknown.value.code in ("NOT_FOUND", "INVALID_ARGUMENT")


def test_a_bot_runs_leases_in_parallel_and_overhead(client: ReapiClient, cluster: Cluster) -> None:
    """Capacity 2: two 2-second actions overlap (each says when it ran: a time taken on a
    loaded machine proves nothing either way).  Also the median round trip of a trivial action."""
    naps = [_submit(client, {"WHO": f"p{i}", "NAP": "2", "STAMPS": "1"}) for i in range(2)]
    trivial = [_submit(client, {"WHO": f"t{i}"}, do_not_cache=True) for i in range(5)]
    ran: list[tuple[float, float]] = []
    with running_bot(cluster.url, "bot-p", capacity=2):
        client.execute(trivial[0], timeout_s=60)  # the bot's session is up and polling
        start = time.monotonic()

        async def both() -> None:
            reapi = TrioReapi(client)

            async def one(action: re_pb2.Digest) -> None:
                executed = await reapi.execute(action, timeout_s=60)
                said = client.outputs(executed.result)[1].decode().split()
                ran.append((float(said[-2]), float(said[-1])))

            async with trio.open_nursery() as nursery:
                for action in naps:
                    nursery.start_soon(one, action)

        trio.run(both)
        parallel = time.monotonic() - start
        rounds = []
        for action in trivial:
            begin = time.monotonic()
            client.execute(action, skip_cache_lookup=True, timeout_s=60)
            rounds.append(time.monotonic() - begin)
    rounds.sort()
    print(f"two 2 s actions on a capacity-2 bot: {parallel:.2f} s; trivial action round trip: "
          f"median {rounds[2] * 1000:.0f} ms, min {rounds[0] * 1000:.0f} ms")  # fmt: skip
    first, second = sorted(ran)
    assert second[0] < first[1], ran  # the second began before the first had ended: they overlapped


DOOMED_BOT = """
import sys, threading
sys.path.insert(0, sys.argv[2])
from tests.support.reapi_bot import running_bot
from tests.support.reapi_cluster import require_cluster_prerequisites
with running_bot(sys.argv[1], "doomed"):
    print("serving", flush=True)
    threading.Event().wait()
"""


def test_bot_killed_mid_lease_loses_nothing(client: ReapiClient, cluster: Cluster, tmp_path: Path) -> None:
    """SIGKILL the bot running a lease: the server requeues the job after the keepalive, another bot runs it."""
    action = _submit(client, {"WHO": "survivor", "NAP": "3"})
    # TMPDIR: the killed bot cannot remove its lease's directory; the test's tmp_path holds it.
    with subprocess.Popen([sys.executable, "-c", DOOMED_BOT, cluster.url, str(ROOT)],
                          cwd=ROOT, stdout=subprocess.PIPE, text=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)}) as doomed:  # fmt: skip
        assert doomed.stdout is not None and doomed.stdout.readline() == "serving\n"
        answers: list[Any] = []
        waiter = threading.Thread(target=lambda: answers.append(client.execute(action, timeout_s=120)))
        waiter.start()
        deadline = time.monotonic() + 30
        while not _stage_is_executing(client, action) and time.monotonic() < deadline:
            time.sleep(0.1)
        doomed.kill()
    killed = time.monotonic()
    with running_bot(cluster.url, "survivor"):
        waiter.join(120)
    assert answers, "Execute did not finish"
    (executed,) = answers
    assert executed.result.exit_code == 0
    assert client.read_blob(executed.result.output_files[0].digest) == b"made by survivor\n"
    print(f"requeued and done {time.monotonic() - killed:.1f} s after the kill (keepalive {KEEPALIVE_S} s)")


def _stage_is_executing(client: ReapiClient, action: re_pb2.Digest) -> bool:
    """Whether an Execute of ``action`` (joining the running job) reports EXECUTING first thing."""
    stages: list[int] = []
    with contextlib.suppress(CcwError):
        client.execute(action, timeout_s=0.5,
                       on_update=lambda op: stages.append(_stage(op)))  # fmt: skip
    return re_pb2.ExecutionStage.EXECUTING in stages


def _stage(operation: Any) -> int:
    metadata = re_pb2.ExecuteOperationMetadata()
    operation.metadata.Unpack(metadata)
    return int(metadata.stage)


def test_a_port_taken_before_bgd_binds_it_is_picked_again(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    """bgd binds the port its config names, so a port found free can be taken before it does
    (another test's server took one once): the cluster picks again, and serves there.  Last in
    the file: the module's cluster moves to the new port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        picks = [taken.getsockname()[1]]
        monkeypatch.setattr(devcluster, "free_loopback_port",
                            lambda real=devcluster.free_loopback_port: picks.pop() if picks else real())
        cluster.stop_server()
        cluster.grpc_port = 0
        cluster.start_server()
        assert not picks and cluster.grpc_port not in (0, taken.getsockname()[1])
    with ReapiClient(cluster.url) as reapi:
        assert reapi.capabilities().execution_capabilities.exec_enabled

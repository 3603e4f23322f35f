"""deltamin and replays through a real local cluster (BuildGrid 0.9.1 + PostgreSQL) and two ccw-bots (issue 17).

Each ccw-bot is a process of its own with its own state dir and embedded helper, so every
trial runs in a capsule on a bot, jailed and recorded as a local exec is.  Shown here:

- on the Python real project (more-itertools), a deltamin through the cluster gives the
  same minimal patch as locally; a second identical deltamin is served wholly from the
  action cache; the capsule's witness replays through the cluster with the same
  replay_ok as locally;
- after the server restarts (its in-memory CAS is then empty) the next deltamin
  re-uploads what the CAS misses and still gives the same patch;
- a bot killed with SIGKILL in the middle of trials changes nothing in the result
  (BuildGrid requeues its leases after the keepalive);
- BuildGrid restarted in the middle of a search (its CAS and queue then empty): the
  Executes are retried after re-uploading, the bots open new sessions, same answer;
- a bot serves more leases than trio's thread limiter has tokens, and a lease the
  server withdraws (CancelOperation) stops its run.

CI cost: the module's cluster comes up in 5-9 s; the figures of a run are printed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.devcluster.cluster import Cluster, start_bot, stop_bot, temporary_cluster
from mcp_server.reapi.action import CommandSpec, build_action
from mcp_server.reapi.client import ReapiClient
from mcp_server.reapi.merkle import FileEntry, build_tree, digest_bytes
from mcp_server.reapi.protos import re_pb2
from sandbox.errors import CcwError
from tests.support import agent_loop, realprojects
from tests.support.reapi_cluster import require_cluster_prerequisites

KEEPALIVE_S = 10  # a silent (killed) bot is dropped after this, and its leases requeued
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    require_cluster_prerequisites(request.config)
    with temporary_cluster(bot_keepalive_s=KEEPALIVE_S) as running:
        print(f"cluster ready in {running.timings}")
        yield running


@pytest.fixture(scope="module")
def bots(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """Two ccw-bots, capacity 2 each; a test may replace one (the dict is shared)."""
    root = tmp_path_factory.mktemp("bots")
    running = {name: start_bot(cluster.url, name, root / name, capacity=2) for name in ("bot-a", "bot-b")}
    running["_root"] = root  # type: ignore[assignment]
    try:
        yield running
    finally:
        for name, bot in running.items():
            if name != "_root":
                stop_bot(bot)
        for name in ("bot-a", "bot-b"):
            log = root / name / "bot.log"
            if log.exists():
                print(f"--- {name}:\n{log.read_text()[-2000:]}")


def _remote(t: Any, url: str) -> None:
    t.runtime.config = dataclasses.replace(t.runtime.config, reapi_url=url, reapi_parallel=4)


def _local(t: Any) -> None:
    t.runtime.config = dataclasses.replace(t.runtime.config, reapi_url="")


async def _broken_python_project(t: Any, ws: Path) -> tuple[str, list[str]]:
    """The agent loop's capsule: tests pass, two harmless edits and a breaking one, tests fail."""
    project = realprojects.MORE_ITERTOOLS
    cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    assert (await agent_loop.run_tests(t.call, cap, project.test_cmd))["exit_code"] == 0
    for e in (*project.harmless, project.breaking):
        await agent_loop.edit(t.call, cap, ws, e.path, e.old, e.new)
    assert (await agent_loop.run_tests(t.call, cap, project.test_cmd))["exit_code"] not in (0, None)
    return cap, list(project.test_cmd)


def test_python_project_through_the_cluster(tools: Any, require: Any, tmp_path: Path, cluster: Cluster,
                                            bots: dict[str, Any]) -> None:  # fmt: skip
    require(os.path.exists(realprojects.SYSTEM_PYTHON), f"needs {realprojects.SYSTEM_PYTHON}")
    ws = realprojects.pristine(realprojects.MORE_ITERTOOLS, tmp_path / "ws")

    async def scenario(t: Any) -> dict[str, Any]:
        cap, cmd = await _broken_python_project(t, ws)
        ask = {"capsule_id": cap, "target_cmd": cmd}
        out: dict[str, Any] = {}
        begin = time.monotonic()
        out["local"] = await t.call("capsule_deltamin", ask)
        out["local_s"] = time.monotonic() - begin
        _remote(t, cluster.url)
        begin = time.monotonic()
        out["remote"] = await t.call("capsule_deltamin", ask)
        out["remote_s"] = time.monotonic() - begin
        out["again"] = await t.call("capsule_deltamin", ask)
        witness = await t.call("capsule_witness", {"capsule_id": cap})
        out["replay_remote"] = await t.call("capsule_replay", {"witness_id": witness["witness_id"]})
        _local(t)
        out["replay_local"] = await t.call("capsule_replay", {"witness_id": witness["witness_id"]})
        await trio.to_thread.run_sync(cluster.restart_server)  # the in-memory CAS and action cache start empty
        _remote(t, cluster.url)
        out["after_restart"] = await t.call("capsule_deltamin", ask)
        return out

    out = tools.run(scenario)
    local, remote, again, after = out["local"], out["remote"], out["again"], out["after_restart"]
    assert local["executor"] == {"kind": "local"}
    assert remote["minimal_patch"] == local["minimal_patch"] and remote["units"] == local["units"], remote
    assert remote["executor"]["kind"] == "reapi" and remote["executor"]["executed"] > 0, remote
    assert again["minimal_patch"] == local["minimal_patch"]
    # Every trial of the repeated search is an action-cache hit: nothing ran on a bot.
    assert again["executor"]["executed"] == 0 and again["executor"]["action_cache_hits"] > 0, again
    assert again["executor"]["uploaded_blobs"] == 0, again
    assert out["replay_remote"]["replay_ok"] == out["replay_local"]["replay_ok"] is True, out["replay_remote"]
    assert out["replay_remote"]["root_hash"] == out["replay_local"]["root_hash"]
    assert after["minimal_patch"] == local["minimal_patch"] and after["executor"]["uploaded_blobs"] > 0, after
    # The base goes up once, not once per trial of the first round (4 at once).
    base_bytes = sum(p.lstat().st_size for p in ws.rglob("*") if p.is_file() and not p.is_symlink())
    for run in (remote, after):
        assert run["executor"]["uploaded_bytes"] < 1.5 * base_bytes, (run["executor"], base_bytes)
    print(f"more-itertools deltamin: local {out['local_s']:.1f} s ({local['trials']} trials), cluster "
          f"{out['remote_s']:.1f} s {remote['executor']}; repeated: {again['executor']}; after restart: "
          f"{after['executor']}")


# A change of eight files of which one (m3.py) breaks the check; each run waits a second.
CHECK = "import time, m3\ntime.sleep(1.0)\nraise SystemExit(1 if m3.VALUE == 1 else 0)\n"
FILES = 8


def sleepy_workspace(ws: Path) -> None:
    """The base: m0..m7.py with VALUE = 0 and the check."""
    ws.mkdir()
    for i in range(FILES):
        (ws / f"m{i}.py").write_text("VALUE = 0\n")
    (ws / "check.py").write_text(CHECK)


async def sleepy_capsule(t: Any, ws: Path) -> str:
    """A capsule whose change sets every m*.py to VALUE = 1."""
    cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    script = "for f in m*.py; do echo 'VALUE = 1' > $f; done"
    assert (await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]}))["exit_code"] == 0
    return cap


SLEEPY_CMD = ["/usr/bin/python3", "-B", "check.py"]


def _mid_lease(state: Path) -> bool:
    """Whether the bot with this state dir has a capsule up (a lease it is running)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{state / 'ccw.sqlite3'}?mode=ro", uri=True)) as db:
            return bool(db.execute("select count(*) from capsules where destroyed_at is null").fetchone()[0])
    except sqlite3.Error:
        return False


def test_bot_killed_mid_trial_changes_nothing(tools: Any, tmp_path: Path, cluster: Cluster,
                                              bots: dict[str, Any]) -> None:  # fmt: skip
    ws = tmp_path / "ws"
    sleepy_workspace(ws)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = await sleepy_capsule(t, ws)
        ask = {"capsule_id": cap, "target_cmd": SLEEPY_CMD}
        local = await t.call("capsule_deltamin", ask)
        _remote(t, cluster.url)
        results: dict[str, Any] = {}
        begin = time.monotonic()

        async def deltamin() -> None:
            # wait_ms null: the run's end, however long the lost lease takes to go back under load (the
            # default 50 s answered "running" in one CI run, with no result to compare)
            results["remote"] = await t.call("capsule_deltamin", {**ask, "wait_ms": None})

        async with trio.open_nursery() as nursery:
            nursery.start_soon(deltamin)
            with trio.fail_after(60):  # until bot-a is in the middle of a lease (its capsule is up)
                while not _mid_lease(bots["_root"] / "bot-a"):  # noqa: ASYNC110 (another process's database)
                    await trio.sleep(0.05)
            bots["bot-a"].send_signal(signal.SIGKILL)
            results["killed_at_ms"] = int((time.monotonic() - begin) * 1000)
        return {"local": local, **results}

    out = tools.run(scenario)
    assert bots["bot-a"].wait(10) == -signal.SIGKILL
    bots["bot-a"] = start_bot(cluster.url, "bot-a2", bots["_root"] / "bot-a2", capacity=2)
    assert out["local"]["units"] == ["m3.py"]
    assert out["remote"]["minimal_patch"] == out["local"]["minimal_patch"], out["remote"]
    assert out["remote"]["executor"]["executed"] > 0
    print(f"with a bot killed (at {out['killed_at_ms']} ms): {out['remote']['elapsed_ms']} ms, "
          f"{out['remote']['executor']}")



def test_server_restart_mid_search(tools: Any, tmp_path: Path, cluster: Cluster, bots: dict[str, Any]) -> None:
    """BuildGrid restarts while trials run (its CAS and queue then empty): the Executes are
    retried after re-uploading, the bots open new sessions, the answer stays the same."""
    ws = tmp_path / "ws"
    sleepy_workspace(ws)
    (ws / "check.py").write_text("# restart\n" + CHECK)  # actions of their own: no cache hits

    async def scenario(t: Any) -> dict[str, Any]:
        cap = await sleepy_capsule(t, ws)
        _remote(t, cluster.url)
        results: dict[str, Any] = {}

        async def deltamin() -> None:
            results["remote"] = await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": SLEEPY_CMD})

        # The bots serving now (bot-a's journal keeps the capsule it had when it was killed).
        serving = [bots["_root"] / n for n in ("bot-a2" if (bots["_root"] / "bot-a2").exists() else "bot-a", "bot-b")]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(deltamin)
            with trio.fail_after(60):
                while not any(_mid_lease(state) for state in serving):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            await trio.to_thread.run_sync(cluster.restart_server)
        return results

    out = tools.run(scenario)
    assert out["remote"]["units"] == ["m3.py"], out["remote"]
    # sent again (inputs uploaded again) after the restart
    assert out["remote"]["executor"]["retried"] >= 1, out["remote"]
    print(f"through a server restart: {out['remote']['elapsed_ms']} ms, {out['remote']['executor']}")


def _action(client: ReapiClient, argv: list[str], tag: str) -> Any:
    """An uncached action over a one-file input root (no ccw workspace: the bot shows the lease dir)."""
    tree = build_tree({"tag.txt": FileEntry(data=tag.encode())})
    built = build_action(CommandSpec(argv=argv, env={"PATH": "/usr/bin:/bin"}, platform={"OSFamily": "linux"}),
                         tree.root, timeout_s=120, do_not_cache=True)  # fmt: skip
    client.upload_tree(tree, built.blobs)
    return built.action_digest


def _running(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


def test_many_leases_and_a_withdrawn_one(cluster: Cluster, bots: dict[str, Any]) -> None:
    """More leases than trio's thread limiter has tokens (40) all finish; a cancelled
    operation's lease is withdrawn and its run stopped."""
    with ReapiClient(cluster.url) as client:
        begin = time.monotonic()
        for i in range(45):
            done = client.execute(_action(client, ["/bin/sh", "-c", "cat tag.txt"], f"lease {i}"), timeout_s=60)
            assert done.result.exit_code == 0 and client.outputs(done.result)[0] == f"lease {i}".encode()
            assert {f.path for f in done.result.output_files} == {".ccw-witness.ccwz"}
        print(f"45 trivial leases one after another: {time.monotonic() - begin:.1f} s")
        names: list[str] = []
        action = _action(client, ["/bin/sleep", "31.5"], "withdrawn")

        def wait() -> None:
            with contextlib.suppress(CcwError):  # a cancelled operation ends in an error
                client.execute(action, timeout_s=60, on_update=lambda op: names.append(op.name))

        waiter = threading.Thread(target=wait)
        waiter.start()
        deadline = time.monotonic() + 30
        while not _running("sleep 31.5") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _running("sleep 31.5"), "the lease never ran"
        client.cancel_operation(names[0])
        cancelled = time.monotonic()
        while _running("sleep 31.5") and time.monotonic() < cancelled + 20:
            time.sleep(0.2)
        assert not _running("sleep 31.5"), "the withdrawn lease still runs"
        print(f"withdrawn lease stopped {time.monotonic() - cancelled:.1f} s after CancelOperation")
        waiter.join(60)


def test_outputs_files_and_directories(cluster: Cluster, bots: dict[str, Any]) -> None:
    """A declared output that is a directory comes back as a Tree (files, x bits, symlinks, empty
    subdirectories); a missing one is absent."""
    script = ("mkdir -p out/sub out/empty/deeper && echo alpha > out/a.txt && printf '#!/bin/sh\\n' > out/sub/b.sh && "
              "chmod +x out/sub/b.sh && ln -s a.txt out/link && echo one > single.txt")
    tree = build_tree({"tag.txt": FileEntry(data=b"outputs")})
    spec = CommandSpec(argv=["/bin/sh", "-c", script], env={"PATH": "/usr/bin:/bin"}, platform={"OSFamily": "linux"},
                       output_paths=["out", "single.txt", "missing"])
    built = build_action(spec, tree.root, timeout_s=120, do_not_cache=True)
    with ReapiClient(cluster.url) as client:
        client.upload_tree(tree, built.blobs)
        result = client.execute(built.action_digest, timeout_s=60).result
        assert result.exit_code == 0
        files = {f.path: f for f in result.output_files}
        assert set(files) == {"single.txt", ".ccw-witness.ccwz"}
        assert client.read_blob(files["single.txt"].digest) == b"one\n"
        (made,) = result.output_directories
        assert made.path == "out"
        out = re_pb2.Tree.FromString(client.read_blob(made.tree_digest))
        assert {f.name for f in out.root.files} == {"a.txt"}
        assert client.read_blob(out.root.files[0].digest) == b"alpha\n"
        assert [(s.name, s.target) for s in out.root.symlinks] == [("link", "a.txt")]
        children = {digest_bytes(child.SerializeToString(deterministic=True)).hash: child for child in out.children}
        assert len(children) == len(out.children) == 3  # sub, empty, and the empty deeper below it
        subdirectories = {node.name: children[node.digest.hash] for node in out.root.directories}
        assert sorted(subdirectories) == ["empty", "sub"]
        below, empty = subdirectories["sub"], subdirectories["empty"]
        assert [node.name for node in empty.directories] == ["deeper"] and not empty.files
        assert children[empty.directories[0].digest.hash] == re_pb2.Directory()
        assert [(f.name, f.is_executable) for f in below.files] == [("b.sh", True)]
        assert client.read_blob(below.files[0].digest) == b"#!/bin/sh\n"


def test_a_first_round_uploads_the_base_once(tools: Any, tmp_path: Path, cluster: Cluster,
                                             bots: dict[str, Any]) -> None:
    """Four trials at once over a base the CAS has never seen, from two executors (two deltamins at once): the
    base goes up once, each trial adds its file."""
    from mcp_server.capsules.exec import exec_request
    from mcp_server.capsules.remote import ReapiExecutor
    from mcp_server.capsules.trials import Trial, Unit

    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(200):  # contents no other test uploads
        (ws / f"f{i:03}.txt").write_bytes(os.urandom(2000))

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        record = t.ctx.capsules.live_record(cap)
        executors = [ReapiExecutor(cluster.url, 4), ReapiExecutor(cluster.url, 4)]
        try:
            async def one(i: int) -> None:
                files = {f"new{i}.txt": Unit(f"new{i}.txt", "write", content=f"trial {i}\n".encode(), mode=0o644)}
                trial = Trial(record, files, exec_request(cap, ["true"], record.workspace, 60_000))
                assert (await executors[i % 2].run_trial(t.ctx.capsules, trial)).exit_code == 0

            async with trio.open_nursery() as nursery:
                for i in range(4):
                    nursery.start_soon(one, i)
            return {key: sum(e.summary()[key] for e in executors)
                    for key in ("executed", "uploaded_blobs", "uploaded_bytes")}
        finally:
            for executor in executors:
                executor.close()

    summary = tools.run(scenario)
    # 200 files + root Directory once; then per trial its file, its root Directory, Command and Action
    assert summary["executed"] == 4 and summary["uploaded_blobs"] <= 201 + 4 * 4, summary
    assert summary["uploaded_bytes"] < 1.2 * 200 * 2000, summary

"""The capsule service (mcp_server/capsules/service.py) against a fake helper: the typed
requests it sends, what it journals, and what an exec whose reply never came does."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from mcp_server.capsules.exec import PROGRESS_MS, exec_request
from mcp_server.capsules.service import CapsuleService
from mcp_server.journal import Journal
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.ops import (
    ChangesRequest,
    CreateRequest,
    DestroyRequest,
    ExecRequest,
    ForkRequest,
    ListRequest,
    OpRequest,
)
from sandbox.replies import (
    CapsuleSummary,
    ChangesReply,
    CreateReply,
    DestroyReply,
    ExecReply,
    ForkReply,
    ListReply,
    OpReply,
    Touched,
    Truncated,
    Usage,
)
from sandbox.spec import DEFAULT_TIMEOUT_MS, CapsuleSpec, Limits
from tests.support.call_hooks import Hooks


def _exec_reply(written: list[str], stdout: bytes = b"out\n") -> ExecReply:
    return ExecReply(
        exit_code=0, signal=None, timed_out=False, oom_killed=False, duration_ms=5, stdout=stdout, stderr=b"",
        stdout_bytes=len(stdout), stderr_bytes=0, truncated=Truncated(False, False),
        usage=Usage(cpu_ms=1, rss_max_kb=2, rss_max_process_kb=2, io_read_kb=0, io_write_kb=0),
        usage_unavailable={}, usage_sources={"cpu_ms": "cgroup"}, disk=None,
        touched=Touched(("a.txt",), tuple(written), (), ()), touched_unavailable={},
    )


class FakeHelper:
    """Answers each typed request as the helper would, and remembers them."""

    def __init__(self, scratch: Path) -> None:
        self.scratch = scratch  # where the capsule root is made: the test's own tmp_path, removed with it
        self.requests: list[OpRequest] = []
        self.made = 0
        self.exec_error: BaseException | None = None
        self.written: list[str] = ["a.txt"]
        self.root: str | None = None
        self.others: tuple[CapsuleSummary, ...] = ()  # the same uid's capsules of other state dirs

    async def call(self, request: OpRequest, on_progress: Any = None) -> OpReply:
        self.requests.append(request)
        if isinstance(request, CreateRequest | ForkRequest):
            self.made += 1
            made = {"capsule_id": f"cap_{self.made}", "mount": f"/m/{self.made}", "workspace": "/w",
                    "created_at": "", "clock": "", "isolation": {"pid": "namespace"}}
            if isinstance(request, ForkRequest):
                return ForkReply(**made, parent=request.capsule_id)
            return CreateReply(**made)
        if isinstance(request, ExecRequest):
            if self.exec_error is not None:
                raise self.exec_error
            if on_progress is not None:
                await on_progress({"elapsed_ms": 1000, "stdout_bytes": 4, "stderr_bytes": 0,
                                   "stdout_tail_b64": "b3V0Cg==", "stderr_tail_b64": ""})
            return _exec_reply(self.written)
        if isinstance(request, ChangesRequest):
            return ChangesReply(())
        if isinstance(request, DestroyRequest):
            return DestroyReply(request.capsule_id, True)
        if isinstance(request, ListRequest):
            return ListReply((CapsuleSummary("cap_1", "/w", None, "then", "ready"), *self.others))
        raise AssertionError(request)

    async def open_root(self, capsule_id: str) -> int:
        """A capsule root holding what the exec wrote (the journal notes its mtimes)."""
        if self.root is None:
            self.root = tempfile.mkdtemp(prefix="fake-capsule-", dir=self.scratch)
            for path in self.written:
                fd = os.open(os.path.join(self.root, path), os.O_WRONLY | os.O_CREAT, 0o644)
                os.utime(fd, ns=(1_000_000_000, 1_000_000_000))
                os.close(fd)
        return os.open(self.root, os.O_PATH | os.O_DIRECTORY)


@pytest.fixture
def world(tmp_path: Path) -> tuple[CapsuleService, FakeHelper, Hooks, Path]:
    helper, hooks = FakeHelper(tmp_path), Hooks()

    async def get_helper() -> FakeHelper:
        return helper

    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a\n")
    return CapsuleService(State(tmp_path / "state"), get_helper, hooks), helper, hooks, workspace


def test_create_sends_the_spec_and_journals_the_capsule(world: Any) -> None:
    service, helper, _, workspace = world
    spec = CapsuleSpec(workspace=str(workspace), clock_offset_sec=60, env_whitelist=("LANG",),
                       limits=Limits(memory_mb=256))
    record = trio.run(service.create, spec)
    assert helper.requests == [CreateRequest(spec)]
    assert record.capsule_id == "cap_1" and record.mount == "/m/1" and record.isolation == {"pid": "namespace"}
    assert Journal(service.state).capsule("cap_1") == record
    assert (record.base, record.limits, record.env_whitelist) == (str(workspace), {"memory_mb": 256}, ["LANG"])
    assert record.spec == spec


def test_exec_sends_a_typed_request_and_journals_the_run(world: Any) -> None:
    service, helper, hooks, workspace = world

    async def main() -> Any:
        record = await service.create(CapsuleSpec(workspace=str(workspace), env_whitelist=("CCW_T", "HOME"),
                                                  limits=Limits(pids_max=64)))
        return await service.exec(exec_request(record.capsule_id, ["cat"], "sub", None, b"in"),
                                  {"CCW_T": "1", "HOME": "/elsewhere", "OTHER": "x"})

    ran = trio.run(main)
    request = helper.requests[-1]
    assert isinstance(request, ExecRequest)
    assert request.cwd == os.path.join(str(workspace), "sub") and request.stdin == b"in"
    assert request.timeout_ms == DEFAULT_TIMEOUT_MS and request.progress_ms == PROGRESS_MS
    assert request.limits is None  # the capsule's own hold in the helper, which knows them
    # The caller's whitelisted values, never HOME; PATH and LANG are the helper's defaults.
    assert request.env == {"CCW_T": "1"} and request.argv == ("cat",)
    assert (ran.started_generation, ran.generation, ran.queued_ms) == (0, 1, 0)
    assert ran.reply.stdout == b"out\n" and ran.touched["written"] == ["a.txt"]
    [entry] = Journal(service.state).execs("cap_1")
    assert entry["argv"] == ["cat"] and entry["stdin_b64"] == "aW4=" and entry["generation"] == 0
    assert entry["env_keys"] == ["CCW_T", "LANG", "PATH"] and entry["timeout_ms"] == DEFAULT_TIMEOUT_MS
    assert entry["cwd"] == request.cwd
    assert Journal(service.state).outputs("cap_1") == {(1, "stderr"): (b"", 1 << 20),
                                                       (1, "stdout"): (b"out\n", 1 << 20)}
    assert entry["written_mtimes"] == {"a.txt": 1_000_000_000}  # replays give it back (notes.py)
    assert Journal(service.state).base_states("cap_1")  # the base at a.txt, for promotion's conflict check
    # Progress sent on, read as the typed report: elapsed, total (the timeout), the message.
    assert hooks.reports == [(1000.0, float(DEFAULT_TIMEOUT_MS), "running 1 s; stdout 4 B, stderr 0 B\nout")]


def test_exec_refuses_a_cwd_outside_the_workspace_before_asking_the_helper(world: Any) -> None:
    service, helper, _, workspace = world

    async def main() -> None:
        record = await service.create(CapsuleSpec(workspace=str(workspace)))
        await service.exec(exec_request(record.capsule_id, ["true"], "../elsewhere"))

    with pytest.raises(CcwError) as caught:
        trio.run(main)
    assert caught.value.code == "INVALID_ARGUMENT" and "outside the workspace" in caught.value.message
    assert not any(isinstance(r, ExecRequest) for r in helper.requests)


def test_an_exec_whose_reply_never_came_advances_the_generation(world: Any) -> None:
    service, helper, _, workspace = world
    helper.exec_error = CcwError("UNAVAILABLE", "the helper went away")

    async def main() -> None:
        record = await service.create(CapsuleSpec(workspace=str(workspace)))
        await service.exec(exec_request(record.capsule_id, ["true"]))

    with pytest.raises(CcwError, match="went away"):
        trio.run(main)
    assert Journal(service.state).generation("cap_1") == 1  # what it wrote is unknown
    helper.exec_error = CcwError("CONFLICT", "busy")  # refused: nothing ran, nothing changed
    record = Journal(service.state).capsule("cap_1")
    assert record is not None
    with pytest.raises(CcwError, match="busy"):
        trio.run(service.exec, exec_request("cap_1", ["true"]))
    assert Journal(service.state).generation("cap_1") == 1
    # Neither is left noted as running, for a next front end to journal as cut short by a kill.
    assert Journal(service.state).recover_running() == []


def test_fork_list_and_destroy(world: Any) -> None:
    service, helper, _, workspace = world

    async def main() -> None:
        parent = await service.create(CapsuleSpec(workspace=str(workspace), clock_offset_sec=5))
        child = await service.fork(parent.capsule_id)
        assert (child.parent, child.clock_offset_sec, child.workspace) == ("cap_1", 5, str(workspace))
        [live] = await service.list_live()
        assert (live.capsule_id, live.execs, live.created_at) == ("cap_1", 0, parent.created_at)
        await service.destroy(child.capsule_id)
        with pytest.raises(CcwError) as gone:
            service.live_record(child.capsule_id)
        assert gone.value.code == "NOT_FOUND"

    trio.run(main)
    assert [type(r).__name__ for r in helper.requests] == ["CreateRequest", "ForkRequest", "ListRequest",
                                                           "DestroyRequest"]


def test_the_list_leaves_out_the_capsules_another_state_dir_made_through_the_same_helper(world: Any) -> None:
    # Found in a trial: one privileged helper serves a user's two state dirs (CCW_HELPER_SOCKET)
    # and lists that uid's capsules of both; capsule_list showed the other dir's with "execs 0".
    service, helper, _, workspace = world
    helper.others = (CapsuleSummary("cap_other", "/elsewhere", None, "then", "ready"),)

    async def main() -> list[str]:
        await service.create(CapsuleSpec(workspace=str(workspace)))
        return [live.capsule_id for live in await service.list_live()]

    assert trio.run(main) == ["cap_1"]


def test_scratch_capsules_are_destroyed_and_not_journaled(world: Any) -> None:
    service, helper, _, workspace = world
    spec = CapsuleSpec(workspace=str(workspace), limits=Limits(memory_mb=64))

    async def main() -> None:
        async with service.scratch(spec) as capsule_id:
            reply = (await service.scratch_exec(exec_request(capsule_id, ["true"], str(workspace)), spec)).value
            assert reply.exit_code == 0
        with pytest.raises(RuntimeError):
            async with service.scratch(spec):
                raise RuntimeError("the trial failed")

    trio.run(main)
    assert Journal(service.state).capsule("cap_1") is None
    destroyed = [r.capsule_id for r in helper.requests if isinstance(r, DestroyRequest)]
    assert destroyed == ["cap_1", "cap_2"]
    [run] = [r for r in helper.requests if isinstance(r, ExecRequest)]
    assert run.limits is None and run.progress_ms is None  # the scratch capsule's own limits hold in the helper


def test_an_exec_that_wrote_nothing_notes_no_base_state(world: Any) -> None:
    service, helper, _, workspace = world
    helper.written = []

    async def main() -> Any:
        record = await service.create(CapsuleSpec(workspace=str(workspace)))
        return await service.exec(exec_request(record.capsule_id, ["true"]))

    ran = trio.run(main)
    assert (ran.started_generation, ran.generation) == (0, 0)
    [entry] = Journal(service.state).execs("cap_1")
    assert entry["generation_out"] is None and entry["written_mtimes"] is None
    assert Journal(service.state).base_states("cap_1") == {} and helper.root is None  # no root opened


def test_an_exec_queued_behind_a_destroy_finds_the_capsule_gone(world: Any) -> None:
    service, helper, hooks, workspace = world

    async def main() -> None:
        record = await service.create(CapsuleSpec(workspace=str(workspace)))
        # The destroy holds the turn while the exec arrives and reads the record.
        async with trio.open_nursery() as nursery, hooks.queue.turn(record.capsule_id, "destroy"):
            nursery.start_soon(service.exec, exec_request(record.capsule_id, ["true"]))
            await trio.testing.wait_all_tasks_blocked()
            await service.call(DestroyRequest(record.capsule_id))
            service.journal.mark_destroyed(record.capsule_id, "now")

    with pytest.raises(BaseExceptionGroup) as caught:
        trio.run(main)
    [error] = caught.value.exceptions
    assert isinstance(error, CcwError) and error.code == "NOT_FOUND" and "capsule_list" in error.message
    assert not any(isinstance(r, ExecRequest) for r in helper.requests)


# capsule_exec's text block for the run above, as the tool answered it before the exec
# request had one form (issue 27): the reply must not change with how the request travels.
EXEC_TEXT = (
    '{"disk":null,"disk_full":false,"duration_ms":5,"exit_code":0,"generation":1,"network_notes":[],'
    '"oom_killed":false,"queued_ms":0,"signal":null,"started_generation":0,"stderr":"","stderr_bytes":0,'
    '"stdout":"out\\n","stdout_bytes":4,"timed_out":false,"touched":{"executed":[],"listed":[],"network":null,'
    '"read":["a.txt"],"written":["a.txt"]},"touched_unavailable":{"network":"network is none: the jail has only '
    'loopback; attempts to leave fail at once (ENETUNREACH) and are not recorded"},"truncated":{"stderr":false,'
    '"stdout":false},"usage":{"cpu_ms":1,"io_read_kb":0,"io_write_kb":0,"rss_max_kb":2,"rss_max_process_kb":2},'
    '"usage_sources":{"cpu_ms":"cgroup"},"usage_unavailable":{}}'
)


def test_the_capsule_exec_reply_is_unchanged_byte_for_byte(world: Any) -> None:
    from mcp_server.tools.exec_result import exec_result, exec_text

    service, _, _, workspace = world

    async def main() -> Any:
        record = await service.create(CapsuleSpec(workspace=str(workspace)))
        return await service.exec(exec_request(record.capsule_id, ["cat"], "sub", None, b"in"))

    assert exec_text(exec_result(trio.run(main))) == EXEC_TEXT
    [entry] = Journal(service.state).execs("cap_1")
    assert (entry["env_keys"], entry["cwd"], entry["timeout_ms"]) == (["LANG", "PATH"], f"{workspace}/sub", 300_000)


def test_a_timed_out_exec_is_told_its_limit_and_how_to_raise_it() -> None:
    import dataclasses

    from mcp_server.capsules.exec import ExecOutcome
    from mcp_server.tools.exec_result import exec_result

    reply = dataclasses.replace(_exec_reply([]), exit_code=None, signal="SIGKILL", timed_out=True)
    ran = ExecOutcome(reply, 0, 0, 0, hints=("expose /opt/tool",))
    hints = exec_result(ran, False, DEFAULT_TIMEOUT_MS)["hints"]
    assert hints == ["expose /opt/tool", "timed out: killed at the 300 s limit (the default); give a larger "
                     "timeout_ms (milliseconds, at most 86400000: 24 h)"]
    assert exec_result(ran, False, 1500)["hints"][1].startswith("timed out: killed at the 1.5 s limit; give")
    in_time = dataclasses.replace(ran, reply=_exec_reply([]))
    assert exec_result(in_time, False, 1500)["hints"] == ["expose /opt/tool"]


GIT_ASKED = (b"Author identity unknown\n\n*** Please tell me who you are.\n\nRun\n\n"
             b"  git config --global user.email \"you@example.com\"\n")


@pytest.mark.parametrize("known", [True, False])
def test_a_git_without_an_author_identity_is_told_how_to_set_it_in_the_capsule(
        world: Any, monkeypatch: pytest.MonkeyPatch, known: bool) -> None:
    """Found in a new-user trial: git commit in a capsule stopped at 'Author identity unknown',
    the user's ~/.gitconfig being outside the jail's $HOME, with no word of a way forward."""
    service, helper, _, workspace = world
    monkeypatch.setenv("HOME", str(workspace.parent))  # no ~/.gitconfig of the test's user
    monkeypatch.setenv("XDG_CONFIG_HOME", str(workspace.parent / "config"))
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    if known:  # the caller's git names them (here in the repository's config)
        subprocess.run(["git", "-C", str(workspace), "config", "user.name", "Ada L'ovelace"], check=True)
        subprocess.run(["git", "-C", str(workspace), "config", "user.email", "ada@example.org"], check=True)
    replies = {b"": _exec_reply([]), GIT_ASKED: dataclasses.replace(_exec_reply([]), exit_code=128,
                                                                     stderr=GIT_ASKED)}

    def ran(stderr: bytes) -> tuple[str, ...]:
        async def main() -> tuple[str, ...]:
            record = await service.create(CapsuleSpec(workspace=str(workspace)))
            monkeypatch.setattr(helper, "call", _answering(helper.call, replies[stderr]))
            return (await service.exec(exec_request(record.capsule_id, ["git", "commit"], None, None, None),
                                       {})).hints
        return trio.run(main)

    (hint,) = ran(GIT_ASKED)
    assert hint.startswith("git found no author identity: a capsule's $HOME is its own, without your ~/.gitconfig")
    if known:
        assert hint.endswith("(your values on this host; it stays in the capsule's $HOME, never promoted): "
                             "git config --global user.name 'Ada L'\"'\"'ovelace' && "
                             "git config --global user.email ada@example.org")
    else:
        assert hint.endswith("git config --global user.name 'YOUR NAME' && "
                             "git config --global user.email you@example.com")
    assert ran(b"") == ()


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_git_that_found_no_editor_is_told_how_to_name_one_or_do_without(
        world: Any, monkeypatch: pytest.MonkeyPatch, stream: str) -> None:
    """Found in a developer's trial: git rebase -i on a tty run (stdout: the terminal's) and git
    commit without -m stopped at git's "Terminal is dumb, but EDITOR unset", with no word of how
    an editor is named in a capsule."""
    service, helper, _, workspace = world
    said = {stream: b"error: Terminal is dumb, but EDITOR unset\n"}

    async def main() -> tuple[tuple[str, ...], tuple[str, ...]]:
        record = await service.create(CapsuleSpec(workspace=str(workspace)))
        found = []
        for exit_code in (1, 0):  # an exit 0 that printed the words (a log shown) is no refusal
            reply = dataclasses.replace(_exec_reply([]), exit_code=exit_code, **said)
            monkeypatch.setattr(helper, "call", _answering(helper.call, reply))
            request = exec_request(record.capsule_id, ["git", "rebase", "-i", "HEAD~2"], None, None, None)
            found.append((await service.exec(request, {})).hints)
        return found[0], found[1]

    refused, shown = trio.run(main)
    (hint,) = refused
    assert shown == ()
    assert hint.startswith("git found no editor: a capsule's terminal is dumb and EDITOR is unset.")
    assert "sh -c 'GIT_EDITOR=vi git ...' with tty: true and capsule_run" in hint and "git commit -m MESSAGE" in hint


def _answering(call: Any, reply: ExecReply) -> Any:
    async def answer(request: OpRequest, on_progress: Any = None) -> OpReply:
        return reply if isinstance(request, ExecRequest) else await call(request, on_progress)
    return answer


def test_a_diff_reads_no_byte_of_what_the_workspace_ignores(world: Any) -> None:
    """capsule_diff read every changed file whole before leaving the ignored ones out: a reinstalled
    node_modules/ cost the front end its 300 MB, and an ignored file past MAX_READ_BYTES (a sparse
    build artefact) refused the whole diff with TOO_LARGE; the scope is cut before any read now."""
    from mcp_server.capsules.carried import carried
    from sandbox.replies import Change

    service, helper, _, workspace = world
    subprocess.run(["git", "init", "-q", str(workspace)], check=True)
    (workspace / ".gitignore").write_text("node_modules/\n")
    helper.root = str(workspace.parent / "capsule")
    (Path(helper.root) / "node_modules").mkdir(parents=True)
    with open(Path(helper.root) / "node_modules" / "huge.bin", "wb") as f:
        f.truncate(3 << 30)
    (Path(helper.root) / "a.txt").write_text("a\nb\n")
    changes = (Change("a.txt", "modified", "file", 0o644, 4), Change("node_modules", "added", "dir", 0o755),
               Change("node_modules/huge.bin", "added", "file", 0o644, 3 << 30))
    answer = helper.call

    async def call(request: Any, on_progress: Any = None) -> Any:
        return ChangesReply(changes) if isinstance(request, ChangesRequest) else await answer(request, on_progress)

    helper.call = call

    async def main() -> Any:
        record = await service.create(CapsuleSpec(workspace=str(workspace)))
        return await carried(service, record.capsule_id)

    found = trio.run(main)
    assert [fc.path for fc in found.diff.file_changes] == ["a.txt"] and found.diff.file_changes[0].new == b"a\nb\n"
    assert found.ignored == ["node_modules/"] and found.ignored_files == 1

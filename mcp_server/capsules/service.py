"""CapsuleService: make, run, fork, diff, list and destroy capsules, journaled, one call at a time.

The helper does the kernel work; the service checks what the helper cannot (a capsule
the journal knows, a cwd inside the workspace), keeps the journal (every exec: argv,
cwd, env keys, exit status, blake3 of the output, usage, touched sets) and reads
changes through the capsule's O_PATH root (no file content crosses the IPC).  It is
the only place that builds a ``CapsuleRecord`` (``_journal_new``).

- Execs, forks and destroys of one capsule take turns in arrival order (``turns``): a
  second exec sent while one runs waits, reporting "queued" through progress, instead
  of failing; cancelled while it waits, it never runs.  Diff, list and file reads take
  no turn.
- Every capsule carries its change ``generation`` (mcp_server/core/generations.py); an exec's
  outcome gives the one it started on and the one it left.  An exec whose reply never came
  (cancelled while running, the helper died) advances the generation: what it wrote is unknown;
  one whose front end was killed is noted before it runs, so the next front end journals it so.
- Scratch capsules (``scratch``, ``scratch_fork``, ``run``) are the unjournaled ones that
  deltamin's trials, replays and promotion's required tests run in; they are destroyed
  when the block ends, even when it is cancelled.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import trio
from outcome import acapture

from mcp_server import events
from mcp_server.caller import Caller
from mcp_server.capsules import capsecrets, exposure, git_identity
from mcp_server.capsules.branch_base import base_commit
from mcp_server.capsules.call_hooks import CallHooks, Unattended
from mcp_server.capsules.console import Console
from mcp_server.capsules.exec import (
    FRONT_END_DIED,
    PROGRESS_MS,
    ExecOutcome,
    cut_entry,
    cut_reason,
    for_capsule,
    journal_entry,
    progress_message,
    settle,
)
from mcp_server.capsules.networks import Networks, Traced, network_not_open
from mcp_server.capsules.notes import record_base_states, written_mtimes
from mcp_server.capsules.turns import EXEC_LABEL, TakesTurn, Ticket, exec_label
from mcp_server.core import unidiff
from mcp_server.core.netrules import NetworkSpec
from mcp_server.fs import changeset
from mcp_server.fs.view import RootView
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord, helper_network
from mcp_server.state import State
from sandbox.client import HelperClient
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
    Change,
    CreateReply,
    ExecProgress,
    ExecReply,
    GitdirChanges,
    NotCarried,
    ReplyT,
)
from sandbox.spec import CapsuleSpec, exec_env

if TYPE_CHECKING:
    from mcp_server.capsules.services import Services

# The turns the service takes (capsules/turns.py), declared on their tools' specs too.
EXEC = TakesTurn(EXEC_LABEL, command_arg="cmd")
FORK = TakesTurn("fork")
DESTROY = TakesTurn("destroy", parent_too=True)
MAX_FORKS = 128  # children one capsule_fork call makes: each holds a mount, and maybe a disk
# Errors with which the helper refuses an exec before anything runs in the capsule.
_REFUSED = frozenset({"CONFLICT", "NOT_FOUND", "INVALID_ARGUMENT", "PERMISSION_DENIED", "UNSUPPORTED"})


@dataclass(frozen=True)
class LiveCapsule:
    """One live capsule as ``list`` shows it: ``state`` in the helper's word (ready, busy, paused,
    frozen or unmounted), ``held_by`` the live capsules stacked on its layer, which keep it frozen
    (its forks, merges of it), and ``merged_from`` a merged capsule's inputs."""

    capsule_id: str
    workspace: str
    parent: str | None
    created_at: str
    execs: int
    generation: int
    state: str
    services: dict[str, str] | None = None  # its services' states by name (capsules/services.py)
    held_by: list[str] | None = None
    merged_from: list[str] | None = None


@dataclass(frozen=True)
class Diff:
    """A capsule's change against its base: the entries and, for files, their contents."""

    record: CapsuleRecord
    entries: list[changeset.Entry]
    file_changes: list[unidiff.FileChange]
    gitdirs: tuple[GitdirChanges, ...] = ()  # its git dirs' changes (a worktree's; capsules/gitdirs.py)
    not_utf8: NotCarried | None = None  # changes left out, naming something that is not UTF-8 (sandbox/rawnames.py)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _iso(moment: dt.datetime) -> str:
    return moment.isoformat(timespec="microseconds")


class CapsuleService:
    """The capsules of one state dir, as seen by one call (its progress and turns)."""

    def __init__(self, state: State, helper: Callable[[], Awaitable[HelperClient]], call: CallHooks,
                 networks: Networks | None = None, services: Services | None = None) -> None:
        self.state = state
        self._helper = helper
        self._call = call
        # The process's egress sessions (Runtime.networks); a service of its own has its own.
        self.networks = networks if networks is not None else Networks()
        self.services = services  # the process's long-lived services (Runtime.services; capsules/services.py)

    def background(self) -> CapsuleService:
        """This service for work that no call waits for (a service's execs): no progress, no turns."""
        return CapsuleService(self.state, self._helper, Unattended(), self.networks, self.services)

    @property
    def journal(self) -> Journal:
        """The state dir's capsule journal."""
        return Journal(self.state)

    async def helper(self) -> HelperClient:
        """The helper client (connected, or started, on first use)."""
        return await self._helper()

    async def call(self, request: OpRequest[ReplyT], on_progress: Any = None) -> ReplyT:
        """Ask the helper ``request``; its typed reply (of the class the request names)."""
        helper = await self.helper()
        return await helper.call(request, on_progress)

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: ExecProgress | None = None) -> None:
        """Report progress to the caller (nothing if it did not ask); ``output``: a streaming exec's report."""
        await self._call.progress(progress, total, message, output)

    def turn(self, capsule_id: str, takes: TakesTurn) -> AbstractAsyncContextManager[Ticket]:
        """Hold the capsule's turn for the block, as a call labelled ``takes.label``."""
        return self._call.capsule_turn(capsule_id, takes.label)

    def live_record(self, capsule_id: str) -> CapsuleRecord:
        """The journal's record of a live capsule; NOT_FOUND if destroyed or unknown."""
        return self.journal.live_capsule(capsule_id, f"capsule {capsule_id} not found (destroyed or never created); "
                                         "call capsule_list to see live capsules or capsule_create to make one")

    # --- journaled capsules --------------------------------------------------------

    async def create(self, spec: CapsuleSpec, network: NetworkSpec | None = None,
                     volatile: tuple[str, ...] = (), secrets: tuple[str, ...] = ()) -> CapsuleRecord:
        """Make a capsule from ``spec`` (with the allowlist ``network``, if any; ``volatile``: globs its
        witnesses' replays leave out) and journal it.

        An allowlist capsule's egress session starts opening now, in the background
        (capsules/networks.py: ``open_soon``), so that neither create nor, usually, the
        first exec waits for it.  ``secrets``: names in the state dir's store, whose
        placeholders its commands get (capsules/capsecrets.py).
        """
        https = capsecrets.tls_hosts(network)  # an https method/path rule's host: its TLS terminated too
        given = await capsecrets.for_create(self.state.root, secrets, network, https)
        # a secret's variable is passed (its placeholder) and its CA bundle, read-only
        spec = dataclasses.replace(spec, network=helper_network(network),
                                   env_whitelist=capsecrets.whitelist(spec.env_whitelist, secrets, given is not None),
                                   expose=capsecrets.shown(spec.expose, given))
        base: list[dict[str, str] | None] = []  # its base's commit, read while the helper makes the view

        async def read_base() -> None:
            base.append(await trio.to_thread.run_sync(base_commit, spec.workspace))

        async with trio.open_nursery() as nursery:  # the helper's error keeps its type (no exception group)
            nursery.start_soon(read_base)
            made = await acapture(self.call, CreateRequest(spec))
        reply = made.unwrap()
        if given is not None:
            capsecrets.remember(self.state.root, reply.capsule_id, secrets, given, https)
            self.networks.give_credentials(reply.capsule_id, given)
        await self._open_network(reply.capsule_id, network)
        return self._journal_new(reply, spec, None, network, volatile, base[0])

    async def _open_network(self, capsule_id: str, network: NetworkSpec | None) -> None:
        if network is not None:
            await self.networks.open_soon(await self.helper(), capsule_id, network)

    def _journal_new(self, reply: CreateReply, spec: CapsuleSpec, parent: CapsuleRecord | None,
                     network: NetworkSpec | None, volatile: tuple[str, ...] = (),
                     base: dict[str, str] | None = None) -> CapsuleRecord:
        """Journal a capsule the helper just made from ``spec`` (a fork: of ``parent``; ``base``: the
        commit its base was taken from, capsules/branch_base.py)."""
        created = _now()
        record = CapsuleRecord(
            capsule_id=reply.capsule_id,
            spec=spec,
            parent=parent.capsule_id if parent else None,
            created_at=_iso(created),
            clock=_iso(created + dt.timedelta(seconds=spec.clock_offset_sec)),
            isolation=reply.isolation,
            mount=reply.mount,
            base_fingerprint=parent.base_fingerprint if parent else base,
            destroyed_at=None,
            network_spec=network,
            volatile=parent.volatile if parent else volatile,
        )
        self.journal.add_capsule(record)
        return record

    async def exec(self, request: ExecRequest, values: Mapping[str, str] | None = None,
                   terminal: int | None = None, console: Console | None = None) -> ExecOutcome:
        """Run ``request`` in its capsule's jail, after the calls queued before it, and journal it.

        ``request`` is completed for its capsule first (exec.for_capsule: its cwd made
        absolute, its whitelisted variables' values taken from ``values``), so bad
        arguments fail now, not after the wait.  ``terminal``: a pty slave the caller holds
        (``ccw capsule shell``), sent to the helper as the command's stdio and controlling
        terminal, with the caller's TERM.  Its output goes to the terminal, not to us: the
        journal's row has everything but the output (its stdout and stderr are those of no
        bytes, and no output is kept for witnesses).  ``console``: an interactive exec's
        (capsules/console.py), whose stdin the caller types into while it runs; what was
        typed is journaled as the run's stdin, and a terminal's output as its stdout.
        """
        record = self.live_record(request.capsule_id)
        request = for_capsule(request, record.spec, values, PROGRESS_MS)
        request = await capsecrets.placed(self.state.root, self.networks, record.network_spec is not None, request)
        if terminal is not None:
            term = Caller(values).env.get("TERM")  # nothing lent: what stands in (caller.py)
            request = dataclasses.replace(request, stdio="tty", tty_fd=terminal,
                                          env={**(request.env or {}), **({"TERM": term} if term else {})})
        elif console is not None:
            request = console.prepare(request)
        async with self._call.capsule_turn(record.capsule_id, exec_label(request.argv)) as ticket:
            if ticket.waited:  # a destroy queued before this call may have run meanwhile
                record = self.live_record(record.capsule_id)
            if self.services is not None:  # the capsule is used: its kept and inherited services come up first
                await self.services.start_pending(self, record.capsule_id)
            started = _now()
            async with self._held_off(record.capsule_id):  # no readiness probe then: the helper would refuse us
                traced = await self.networks.exec(await self.helper(), record.capsule_id, record.network_spec,
                                                  lambda: self._exec_reply(request, ticket.waited_ms, started,
                                                                           console),
                                                  self._call.asker(), request.argv)
            return await self._journal_exec(record, request, ExecOutcome(
                traced.value, record.generation, record.generation, ticket.waited_ms, traced.attempts,
                tuple(traced.notes)), started, console, values)

    async def _journal_exec(self, record: CapsuleRecord, request: ExecRequest, outcome: ExecOutcome,
                            started: dt.datetime, console: Console | None = None,
                            values: Mapping[str, str] | None = None) -> ExecOutcome:
        """Journal an exec that ran (its row, events and outputs in one transaction), note the base's
        state where it wrote, and find hints for a command the jail could not run, by the caller's
        environment (``values``: what it lent; ``Caller`` says what stands in).  ``console``: an
        interactive exec's, whose input is kept as its stdin (and how it went in, for a replay)."""
        reply = outcome.reply
        journal = self.journal
        typed = None if console is None else bytes(console.typed)
        entry = journal_entry(request, outcome, started, typed, None if console is None else console.record())
        written = list(reply.touched.written)
        if written:
            root = await self.open_root(record.capsule_id)
            entry["written_mtimes"] = await trio.to_thread.run_sync(written_mtimes, root, written)
        kept = request.stdio != "tty" or typed is not None  # a shell's output went to its person alone
        outputs = {"stdout": reply.stdout, "stderr": reply.stderr} if kept else None
        if (request.service is None and self.services is not None
                and (beside := self.services.beside(record.capsule_id))):
            entry["services"] = json.dumps(beside, sort_keys=True)  # what ran beside it (a witness starts them)
        seq, generation = journal.append_exec(record.capsule_id, entry, outputs)  # outputs: for witnesses
        if written:  # nothing written: no path to note, and no thread to hop to
            await trio.to_thread.run_sync(record_base_states, journal, record, written)
        hints: list[str] = []
        if reply.exit_code in (126, 127):  # could not run it: perhaps the jail hides it
            path = exec_env(record.workspace, dict(request.env or {}))["PATH"]  # the jail's: finds what it shows
            hints = await trio.to_thread.run_sync(exposure.hints, record.workspace, request.cwd or record.workspace,
                                                  path, Caller(values).env, record.spec.expose, reply.exit_code,
                                                  reply.stderr)
        elif reply.exit_code and git_identity.ASKED in reply.stderr:  # the jail's $HOME is the capsule's
            hints = await trio.to_thread.run_sync(git_identity.hints, record.workspace, reply.stderr)
        elif reply.exit_code and git_identity.NO_EDITOR in reply.stderr + reply.stdout:  # a terminal's is stdout
            hints = [git_identity.EDITOR_HINT]
        return dataclasses.replace(outcome, generation=generation, hints=tuple(hints), seq=seq)

    async def record_service_run(self, record: CapsuleRecord, request: ExecRequest, outcome: ExecOutcome,
                                 started: dt.datetime) -> int | None:
        """Journal an exec of a service that ended (capsules/services.py), as an exec's; its row."""
        return (await self._journal_exec(record, request, outcome, started)).seq

    async def _exec_reply(self, request: ExecRequest, waited_ms: int, started: dt.datetime,
                          console: Console | None = None) -> ExecReply:
        """The helper's reply to an exec, its progress sent on (and an interactive exec's output to its
        ``console``); a lost reply (cancelled, the helper gone) is journaled as cut short."""
        helper = await self.helper()

        async def forward(raw: dict[str, Any]) -> None:
            report = ExecProgress.from_args(raw)
            if console is not None:
                console.stream(report)
            if report.written:  # as the run goes: watchers see its files before it ends
                events.add(self.state, "files.written", request.capsule_id,
                           {"seq": None, "live": True, "count": len(report.written), "paths": list(report.written)})
            # Counted from the call's arrival, so the reports of a call that was queued keep
            # growing (MCP asks progress to increase).
            await self.progress(float(waited_ms + report.elapsed_ms), float(waited_ms + request.timeout_ms),
                                progress_message(report), report if request.stream and console is None else None)

        running = self.journal.mark_running(request.capsule_id, cut_entry(request, started, FRONT_END_DIED))
        try:
            if console is None:
                return await self.call(request, on_progress=forward)
            async with console.attached():
                reply = await self.call(request, on_progress=forward)
            return console.finished(reply)
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                if (isinstance(exc, CcwError) and exc.code in _REFUSED) or network_not_open(exc):
                    self.journal.unmark_running(request.capsule_id, running)  # it never ran
                else:
                    await settle(helper, request.capsule_id)
                    self.journal.append_exec(request.capsule_id, cut_entry(request, started, cut_reason(exc)))
            raise

    def _held_off(self, capsule_id: str) -> AbstractAsyncContextManager[None]:
        return self.services.held_off(capsule_id) if self.services is not None else contextlib.nullcontext()

    async def fork(self, capsule_id: str, donors: Sequence[str] = (), in_turn: bool = False) -> CapsuleRecord:
        """A child capsule stacked on its parent's view (and ``donors``' layers, ForkRequest's), journaled;
        ``in_turn``: the call holds the parent's turn already (a merge, over its inputs)."""
        return (await self.forks(capsule_id, 1, donors, in_turn))[0]

    async def forks(self, capsule_id: str, count: int, donors: Sequence[str] = (),
                    in_turn: bool = False) -> list[CapsuleRecord]:
        """``count`` children of one parent (at most ``MAX_FORKS``), made in one turn of it (no exec queued
        meanwhile lands between two), journaled.  All or none: when one fails, those made are destroyed."""
        if not 1 <= count <= MAX_FORKS:
            raise CcwError("TOO_LARGE" if count > MAX_FORKS else "INVALID_ARGUMENT",
                           f"count {count} is outside 1..{MAX_FORKS} forks per call; ask for at most {MAX_FORKS} "
                           "and call capsule_fork again for more", {"count": count, "max": MAX_FORKS})
        parent = self.live_record(capsule_id)
        made: list[CapsuleRecord] = []
        turn = contextlib.nullcontext() if in_turn else self.turn(parent.capsule_id, FORK)  # turns nest not
        async with turn, self._held_off(parent.capsule_id):
            parent = self.live_record(parent.capsule_id)
            asked = 0  # forks asked of the helper: the last one is the one that failed
            try:
                while asked < count:
                    asked += 1
                    reply = await self.call(ForkRequest(parent.capsule_id, donors=tuple(donors)))
                    # Journaled before its network opens: a fork whose session fails to open is
                    # one of those made, and destroyed with them, not left unjournaled.
                    made.append(self._journal_new(reply, parent.spec, parent, parent.network_spec))
                    capsecrets.inherit(self.state.root, parent.capsule_id, reply.capsule_id)  # fresh placeholders
                    await self._open_network(reply.capsule_id, parent.network_spec)
                    if self.services is not None:  # its parent's services, to start at its first exec
                        self.services.inherit(parent.capsule_id, made[-1].capsule_id)
            except BaseException as exc:
                if not made:
                    raise
                left = await self._unmake(made)
                if not isinstance(exc, CcwError):
                    raise
                raise CcwError(exc.code, f"fork {asked} of {count} failed ({exc.message}); the {len(made)} "
                               f"made were destroyed{f', but not {left}' if left else ''}: fork again, or "
                               "destroy those named", {**exc.details, "destroyed": len(made) - len(left),
                                                        "not_destroyed": left}) from exc
        return made

    async def _unmake(self, made: list[CapsuleRecord]) -> list[str]:
        """Destroy the forks a failed ``forks`` made, even when cancelled; the ids it could not."""
        left = []
        with trio.CancelScope(shield=True):
            for child in made:
                try:
                    await self.destroy(child.capsule_id)
                except CcwError:
                    left.append(child.capsule_id)
        return left

    async def destroy(self, capsule_id: str) -> CapsuleRecord:
        """Unmount a capsule and delete its data, in its turn; its journal stays for witnesses."""
        record = self.live_record(capsule_id)
        async with self.turn(record.capsule_id, DESTROY):
            record = self.live_record(record.capsule_id)
            if self.services is not None:  # nothing of a destroyed capsule runs on
                await self.services.stop_all(record.capsule_id)
            await self.networks.close(record.capsule_id)
            capsecrets.forget(self.state.root, record.capsule_id)
            await self.call(DestroyRequest(record.capsule_id))
            self.journal.mark_destroyed(record.capsule_id, _iso(_now()))
        return record

    async def list_live(self) -> list[LiveCapsule]:
        """The caller's live capsules of this state dir, by id.  The helper lists every capsule of
        the caller's uid: a shared one (``CCW_HELPER_SOCKET``) serves the user's other state dirs
        too, whose capsules this journal does not know and no call here can act on; nor are this
        front end's scratch capsules (trials, unjournaled) the caller's to act on."""
        live = (await self.call(ListRequest())).capsules
        journal = self.journal
        if self.services is not None:  # kept services show as they are after a restart (lost, pending)
            await self.services.recover(self)
        out = []
        for item in sorted(live, key=lambda c: c.capsule_id):
            record = journal.capsule(item.capsule_id)
            if record is None:
                continue
            services = ({one["name"]: one["state"] for one in self.services.summaries(item.capsule_id, item.state)}
                        if self.services is not None else None)
            out.append(LiveCapsule(item.capsule_id, item.workspace, item.parent, record.created_at,
                                   len(journal.execs(item.capsule_id)), record.generation, item.state, services,
                                   list(item.held_by or ()) or None, journal.merged_from(item.capsule_id) or None))
        return out

    async def changes(self, capsule_id: str) -> tuple[Change, ...]:
        """The helper's list of what differs between the capsule's upper layer and its base."""
        return (await self.call(ChangesRequest(capsule_id))).changes

    async def open_root(self, capsule_id: str) -> int:
        """An O_PATH descriptor of the capsule's merged view (the caller closes it)."""
        helper = await self.helper()
        return await helper.open_root(capsule_id)

    async def diff(self, capsule_id: str, shown: Callable[[CapsuleRecord, list[changeset.Entry], RootView],
                                                          list[changeset.Entry]] | None = None) -> Diff:
        """The capsule's changes against its base, read through its root; a change naming something
        that is not UTF-8 is left out and counted (``Diff.not_utf8``), where promote refuses.  Files'
        bytes are read for the entries ``shown`` keeps (given the capsule's view) only."""
        record = self.live_record(capsule_id)
        reply = await self.call(ChangesRequest(record.capsule_id, leave_not_utf8=True))
        root_fd = await self.open_root(record.capsule_id)

        def read() -> Diff:
            with RootView.from_fd(root_fd) as capsule_view, RootView.open(record.base) as base_view:
                entries = changeset.expand(reply.changes, base_view, capsule_view)
                kept = entries if shown is None else shown(record, entries, capsule_view)
                return Diff(record, entries, changeset.file_changes(kept, base_view, capsule_view),
                            reply.gitdirs or (), reply.not_utf8)

        return await trio.to_thread.run_sync(read)

    # --- scratch capsules: not journaled, destroyed after the block ----------------

    @contextlib.asynccontextmanager
    async def scratch(self, spec: CapsuleSpec, quiet: bool = False,
                      network: NetworkSpec | None = None) -> AsyncIterator[str]:
        """A fresh unjournaled capsule for the block (with the allowlist ``network``);
        ``quiet``: a failed destroy is not an error."""
        spec = dataclasses.replace(spec, network=helper_network(network))
        capsule_id = (await self.call(CreateRequest(spec))).capsule_id
        try:
            yield capsule_id
        finally:
            with trio.CancelScope(shield=True), contextlib.suppress(*((CcwError,) if quiet else ())):
                await self.networks.close(capsule_id)
                await self.call(DestroyRequest(capsule_id))

    @contextlib.asynccontextmanager
    async def scratch_fork(self, capsule_id: str) -> AsyncIterator[str]:
        """An unjournaled fork of a capsule for the block (runs that must leave the capsule as it is)."""
        fork_id = (await self.call(ForkRequest(capsule_id))).capsule_id
        try:
            yield fork_id
        finally:
            with trio.CancelScope(shield=True):
                await self.networks.close(fork_id)
                await self.call(DestroyRequest(fork_id))

    async def scratch_exec(self, request: ExecRequest, spec: CapsuleSpec, network: NetworkSpec | None = None,
                  values: Mapping[str, str] | None = None, console: Console | None = None) -> Traced:
        """Run ``request`` in a scratch capsule made from ``spec``, unjournaled: the helper's reply
        (``value``) and, with an allowlist ``network``, the attempts it made.  ``console``: the
        run's stdin and output, as an interactive exec's (a replay's of one: replay_steps.py).

        The capsule's own limits hold in the helper (an exec's may only tighten them).
        """
        request = for_capsule(request, spec, values)
        if console is None:
            return await self.networks.exec(await self.helper(), request.capsule_id, network,
                                            lambda: self.call(request))
        wired = console.prepare(request)

        async def forward(raw: dict[str, Any]) -> None:
            console.stream(ExecProgress.from_args(raw))

        async def on_console() -> ExecReply:
            async with console.attached():
                reply = await self.call(wired, on_progress=forward)
            return console.finished(reply)

        return await self.networks.exec(await self.helper(), request.capsule_id, network, on_console)

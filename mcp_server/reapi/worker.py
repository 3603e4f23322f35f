"""A Remote Workers API bot session: take leases from the server, run them, report results.

The runner (what executes an Action) is passed in: ccw-bot's runs it in a capsule;
the tests' runs a plain subprocess.  This module is only the protocol.

Some facts about the Remote Workers API, as BuildGrid 0.9.1 serves it:

- ``CreateBotSession(parent=instance, bot_session)`` registers the bot: ``bot_id`` is
  ours and stable, the session's ``name`` is the server's.  Platform properties go on
  the *first device* of ``worker.devices`` (BuildGrid matches jobs against those), and
  capacity is a worker config ``capacity`` (default 1).
- Everything else is ``UpdateBotSession`` with the whole session: the bot sends its
  leases with their states (ACTIVE while running, COMPLETED with ``result`` = an Any
  of the ActionResult and ``status``), the server answers with the leases it wants
  the bot to hold (new ones PENDING or ACTIVE, withdrawn ones CANCELLED; reported
  COMPLETED ones are gone).  A lease's payload is the Action itself (or its digest).
  BuildGrid withdraws a lease (its operation cancelled) by leaving it out of the
  answer rather than marking it CANCELLED; the bot treats both alike.
- The call is a long poll: with free capacity the server holds it until a job is
  assigned or 80% of the call's deadline, and gives no lease at all when that is
  under 3 s (``NETWORK_TIMEOUT``), so ``poll_s`` must be above 3.75 s.  A finished
  run would wait out the poll, so the bot cancels the pending call and reports at
  once; a lease the server assigned meanwhile comes again on the next call.
- A bot that stops calling is dropped after ``bot-session-keepalive-timeout`` and its
  leases are requeued (``max_job_attempts``): a killed bot loses no job, but until then
  the scheduler may still assign jobs to it.  A bot that stops cleanly says so
  (status BOT_TERMINATING, which the assigners skip) and hands its unfinished leases
  back as UNAVAILABLE, a status BuildGrid retries at once.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc

from mcp_server.reapi.client import ReapiClient, rpc_errors
from mcp_server.reapi.protos import bots_pb2, bots_pb2_grpc, code_pb2, re_pb2, worker_pb2
from sandbox.errors import CcwError

POLL_S = 5.0
KEEPALIVE_S = 5.0  # between updates while every slot is busy


def parse_properties(pairs: Sequence[str]) -> dict[str, str]:
    """``--property k=v`` flags as platform properties (OSFamily=linux unless given)."""
    properties = {"OSFamily": "linux"}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise CcwError("INVALID_ARGUMENT", f"--property {pair!r}: want name=value")
        properties[name] = value
    return properties


@dataclass(frozen=True)
class LeaseOutcome:
    """What a runner returns: the ActionResult, and a google.rpc code when the run itself failed."""

    result: re_pb2.ActionResult
    status_code: int = 0  # e.g. 4 (DEADLINE_EXCEEDED) when the action's timeout hit
    message: str = ""


# runner(client, action, cancelled) → outcome; ``cancelled`` is set when the lease is withdrawn.
Runner = Callable[[ReapiClient, re_pb2.Action, threading.Event], LeaseOutcome]


@dataclass(frozen=True)
class BotConfig:
    """Who the bot is and what it offers."""

    bot_id: str
    capacity: int = 1
    properties: Mapping[str, str] = field(default_factory=lambda: {"OSFamily": "linux"})
    poll_s: float = POLL_S


@dataclass
class _Run:
    future: Future[LeaseOutcome]
    cancelled: threading.Event


class BotSession:
    """One bot session; ``serve(stop)`` runs until ``stop`` is set."""

    def __init__(self, client: ReapiClient, config: BotConfig, runner: Runner) -> None:
        self.client = client
        self.config = config
        self.runner = runner
        self.completed = 0  # leases reported COMPLETED
        self._stub = bots_pb2_grpc.BotsStub(client.channel)
        self._wake = threading.Event()
        self._runs: dict[str, _Run] = {}
        self._calls = 0

    def _new_session(self) -> bots_pb2.BotSession:
        device = worker_pb2.Device(handle=self.config.bot_id)
        for name, value in sorted(self.config.properties.items()):
            device.properties.add(key=name, value=value)
        worker = worker_pb2.Worker(devices=[device])
        worker.configs.add(key="capacity", value=str(self.config.capacity))
        return bots_pb2.BotSession(bot_id=self.config.bot_id, status=bots_pb2.BotStatus.OK, worker=worker)

    def _report_finished(self, session: bots_pb2.BotSession) -> None:
        for lease in session.leases:
            run = self._runs.get(lease.id)
            if run is None or not run.future.done() or lease.state == bots_pb2.LeaseState.COMPLETED:
                continue
            error = run.future.exception()
            if error is not None:
                outcome = LeaseOutcome(re_pb2.ActionResult(), code_pb2.INTERNAL, f"runner failed: {error}")
            else:
                outcome = run.future.result()
            lease.state = bots_pb2.LeaseState.COMPLETED
            self.completed += 1
            lease.result.Pack(outcome.result)
            lease.status.code = outcome.status_code
            lease.status.message = outcome.message

    def _take_leases(self, session: bots_pb2.BotSession, pool: ThreadPoolExecutor) -> None:
        held = {lease.id for lease in session.leases}
        for lease_id, running in list(self._runs.items()):
            if lease_id in held:
                continue
            if running.future.done():
                del self._runs[lease_id]
            else:  # dropped from the session while it runs: withdrawn (BuildGrid's cancel)
                running.cancelled.set()
        for lease in list(session.leases):
            run = self._runs.get(lease.id)
            if lease.state == bots_pb2.LeaseState.CANCELLED:
                if run is not None:
                    run.cancelled.set()
                session.leases.remove(lease)
            elif lease.state in (bots_pb2.LeaseState.PENDING, bots_pb2.LeaseState.ACTIVE) and run is None:
                self._runs[lease.id] = self._start(lease, pool)
                lease.state = bots_pb2.LeaseState.ACTIVE

    def _start(self, lease: bots_pb2.Lease, pool: ThreadPoolExecutor) -> _Run:
        cancelled = threading.Event()
        action = re_pb2.Action()
        digest = re_pb2.Digest()
        if lease.payload.Unpack(action):
            future = pool.submit(self.runner, self.client, action, cancelled)
        elif lease.payload.Unpack(digest):
            future = pool.submit(self._run_by_digest, digest, cancelled)
        else:  # not ours to run: report it failed rather than stop serving
            future = Future()
            future.set_result(LeaseOutcome(re_pb2.ActionResult(), code_pb2.INVALID_ARGUMENT,
                                           f"lease payload {lease.payload.type_url} is not an Action"))  # fmt: skip
        future.add_done_callback(lambda _: self._wake.set())
        return _Run(future, cancelled)

    def _run_by_digest(self, digest: re_pb2.Digest, cancelled: threading.Event) -> LeaseOutcome:
        action = re_pb2.Action.FromString(self.client.read_blob(digest))
        return self.runner(self.client, action, cancelled)

    def _busy(self) -> int:
        return sum(not run.future.done() for run in self._runs.values())

    def _update(self, session: bots_pb2.BotSession) -> bots_pb2.BotSession:
        """One UpdateBotSession, cut short when a run finishes (or stop is asked) meanwhile."""
        request = bots_pb2.UpdateBotSessionRequest(name=session.name, bot_session=session)
        call = self._stub.UpdateBotSession.future(request, timeout=self.config.poll_s)
        # Only the current call may wake the loop: a cancelled one's callback can fire
        # after the next call started, and would cancel that one too, and so on.
        self._calls += 1
        current = self._calls
        call.add_done_callback(lambda _: self._wake.set() if current == self._calls else None)
        self._wake.wait()
        if not call.done():
            call.cancel()
        try:
            return call.result()
        except grpc.FutureCancelledError:
            return session
        except grpc.RpcError as error:
            if isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.CANCELLED:
                return session
            with rpc_errors("UpdateBotSession"):
                raise

    def serve(self, stop: threading.Event) -> None:
        """Create the session, then update it until ``stop`` is set; cancels unfinished runs at the end."""
        def wake_on_stop() -> None:
            stop.wait()
            self._wake.set()

        threading.Thread(target=wake_on_stop, daemon=True).start()
        with rpc_errors("CreateBotSession"):
            session = self._stub.CreateBotSession(
                bots_pb2.CreateBotSessionRequest(parent=self.client.instance, bot_session=self._new_session()),
                timeout=self.config.poll_s)  # fmt: skip
        with ThreadPoolExecutor(self.config.capacity, thread_name_prefix="lease") as pool:
            try:
                self._take_leases(session, pool)
                while not stop.is_set():
                    # Each clear comes before what it guards is read (how many runs are
                    # busy, which are finished), so a run that ends afterwards still wakes
                    # the next wait and is reported by the next call.
                    self._wake.clear()
                    if self._busy() >= self.config.capacity:  # no long poll at capacity: pace keepalives
                        self._wake.wait(KEEPALIVE_S)
                        self._wake.clear()
                    self._report_finished(session)
                    session = self._update(session)
                    self._take_leases(session, pool)
            finally:
                for run in self._runs.values():
                    run.cancelled.set()
                self._sign_off(session)

    def _sign_off(self, session: bots_pb2.BotSession) -> None:
        """Tell the server the bot is going: no more leases, and unfinished ones back to the queue.

        Without this the server would keep assigning to the session (and hold its leases)
        until the keepalive timeout expires it.
        """
        for lease in session.leases:
            if lease.state != bots_pb2.LeaseState.COMPLETED:
                lease.state = bots_pb2.LeaseState.COMPLETED
                lease.status.code = code_pb2.UNAVAILABLE  # retryable: BuildGrid requeues the job
                lease.status.message = "bot terminating"
        session.status = bots_pb2.BotStatus.BOT_TERMINATING
        request = bots_pb2.UpdateBotSessionRequest(name=session.name, bot_session=session)
        with contextlib.suppress(grpc.RpcError):
            self._stub.UpdateBotSession(request, timeout=self.config.poll_s)

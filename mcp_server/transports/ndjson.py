"""One NDJSON connection (stdio or a unix-socket client), served on trio.

The thin I/O loop around ``framing``: bytes are split into frames (1 MiB guard before
parsing), then

* direct methods (a tool name as the JSON-RPC method) run here, without the SDK;
* MCP requests, notifications and the client's answers to our own requests go to the
  SDK's dual-era loop (``CcwServer.serve_streams``) as ``SessionMessage``s;
* direct methods run one after another per connection (seed 001: "processed
  sequentially"); MCP requests run concurrently, as MCP allows;
* answers to direct methods, and the framing layer's own answers (oversized, invalid
  frames), go through ``ResponseOrder``, so they leave in request order per connection
  (seed 001); answers to MCP requests leave as soon as they are ready: JSON-RPC matches
  answers by id, and an MCP client that sends a diff while a long exec runs must not
  wait for the exec (issue 13).  Notifications (cancellation included) reach the SDK at
  once, and server-initiated messages (progress, ``roots/list``) are written at once.

A request the SDK settles without an answer (the client cancelled it) frees its slot
through the ``on_request_unanswered`` hook, so later answers are not held forever.
A cancelled direct method likewise gets no answer and frees its slot.

Shutdown: when ``draining`` is set, requests read from then on are answered with
error -32001 ("shutting down"), requests already read are finished and answered, and
the connection ends once nothing is pending.  End of input (stdin closed, a client's
half-close) ends the connection the same way.  A peer that is gone ends it at once,
cancelling its requests, since nobody is left to answer: a write that fails, and after the
end of input, its whole close and not a half-close.  A unix socket tells the two apart: a
closed peer leaves ours hung up both ways (POLLHUP), a half-closed one only for reading;
stdio's output pipe has no reader left (POLLERR) once a killed client's end of it is gone,
which may come a little after its end of our input, so a connection with calls in flight
looks again every ``PEER_POLL_S`` after its input ended.  Waiting for a write to fail
instead left a closed client's ``sleep 1000`` running (holding its capsule's turn) until
the next progress report, and for ever if it asked for none: a call without a progress
token writes nothing until it ends.  A peer that closed with our bytes unread resets the
connection: reading fails (ECONNRESET), which is the same end.
"""

from __future__ import annotations

import functools
import json
import math
import select
from typing import Any

import anyio
import mcp_types as types
import trio
from mcp.shared.message import ServerMessageMetadata, SessionMessage

from mcp_server import framing
from mcp_server.capsules.turns import Arrival, Ticket
from mcp_server.server import CcwServer
from mcp_server.tools.surface import ToolList

READ_CHUNK = 65536
MAX_PENDING = 1024  # requests read but not yet answered, per connection
SMALL_FRAME = 65536  # frames below this are joined with their newline and written at once
PEER_POLL_S = 0.25  # after the end of input, how often a connection with calls in flight looks for its peer


class NdjsonConnection:
    """State of one connection; ``run`` serves it until input ends or drain completes."""

    def __init__(
        self, app: CcwServer, reader: trio.abc.ReceiveStream, writer: trio.abc.SendStream, draining: trio.Event,
        tools: ToolList | None = None,
    ) -> None:
        self.app = app
        self.tools = tools if tools is not None else app.tools  # what this client may list and call
        self.reader = reader
        self.writer = writer
        self.draining = draining
        self.order = framing.ResponseOrder()
        self.splitter = framing.LineSplitter()
        # Frames (JSON without the newline) to write: ("now" | "slot" | "id" | "drop", key, frame).
        self._out_send, self._out_recv = trio.open_memory_channel[tuple[str, Any, bytes | None]](math.inf)
        self._to_sdk_send, self._to_sdk_recv = anyio.create_memory_object_stream[SessionMessage | Exception](32)
        self._from_sdk_send, self._from_sdk_recv = anyio.create_memory_object_stream[SessionMessage](32)
        self._progress = trio.lowlevel.ParkingLot()
        self._input_ended = False
        self._ended = trio.Event()  # set with _input_ended, for ``_watch_peer``
        self._broken = False  # the peer stopped reading; answers are discarded
        self._direct: dict[tuple[str, Any], trio.CancelScope] = {}  # direct requests running
        self._direct_tail: trio.Event | None = None  # set when the last direct request read has finished
        self._sdk_pending: dict[tuple[str, Any], int] = {}  # MCP requests read but not yet answered, by id
        # Capsule turns taken when an MCP request was read (CcwServer.arrive), by request
        # id: handed to the handler with the request; given back when it is answered.
        self._arrivals: dict[tuple[str, Any], Ticket] = {}

    async def run(self) -> None:
        """Serve until input ends (or drain) and every request read has been answered."""
        try:
            await self._run()
        finally:
            for key in list(self._arrivals):
                self._give_back(key)

    async def _run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._serve_sdk)
            nursery.start_soon(self._pump_sdk)
            nursery.start_soon(self._write_loop)
            async with trio.open_nursery() as inner:
                inner.start_soon(self._read_loop, nursery)
                inner.start_soon(self._wake_on_drain)
                inner.start_soon(self._watch_peer)
                while not ((self._input_ended or self.draining.is_set()) and self.pending == 0):
                    if self._broken:
                        break
                    await self._progress.park()
                inner.cancel_scope.cancel()
            if self._broken:
                # The peer is gone: nobody is left to answer, so stop the work too.
                nursery.cancel_scope.cancel()
                self._to_sdk_send.close()
                return
            # Nothing is pending: closing the SDK's input ends its loop, which closes its
            # output, which ends the pump, which closes ours, which ends the writer.
            await self._to_sdk_send.aclose()

    def _in_flight(self, request_id: Any) -> bool:
        """Whether a request with this id is still unanswered on this connection."""
        key = framing.id_key(request_id)
        return key in self._direct or self._sdk_pending.get(key, 0) > 0

    @property
    def pending(self) -> int:
        """Requests read but not yet answered (or settled unanswered)."""
        return self.order.pending + sum(self._sdk_pending.values())

    def _settle_sdk(self, request_id: Any) -> bool:
        """Count an MCP request as answered; False if it was not one of ours in flight."""
        key = framing.id_key(request_id)
        left = self._sdk_pending.get(key, 0)
        if left == 0:
            return False
        if left == 1:
            del self._sdk_pending[key]
        else:
            self._sdk_pending[key] = left - 1
        return True

    async def _wake_on_drain(self) -> None:
        await self.draining.wait()
        self._progress.unpark_all()

    async def _watch_peer(self) -> None:
        """Once input has ended, whether the peer is gone too (its end of our output closed)."""
        await self._ended.wait()
        while not self._broken:
            if _closed_both_ways(self.writer):
                self._broken = True
                self._progress.unpark_all()
                return
            await trio.sleep(PEER_POLL_S)

    async def _serve_sdk(self) -> None:
        await self.app.serve_streams(self._to_sdk_recv, self._from_sdk_send, self.tools)

    def _give_back(self, key: tuple[str, Any]) -> None:
        """Give back the capsule turn an MCP request took on arrival, if it never claimed it."""
        self.app.runtime.capsule_queue.give_back(self._arrivals.pop(key, None))

    async def _pump_sdk(self) -> None:
        async with self._out_send, self._from_sdk_recv:  # closed too: an open one warns when collected
            async for item in self._from_sdk_recv:
                message = item.message
                frame = framing.dumps(message.model_dump(mode="json", by_alias=True, exclude_unset=True))
                if isinstance(message, types.JSONRPCResponse | types.JSONRPCError) and message.id is not None:
                    await self._out_send.send(("id", message.id, frame))
                else:
                    await self._out_send.send(("now", None, frame))

    async def _write_loop(self) -> None:
        async for kind, key, frame in self._out_recv:
            if kind == "now":
                frames = [frame] if frame is not None else []
            elif kind == "slot":
                frames = self.order.fill(key, frame)
            elif kind == "drop":
                self._give_back(framing.id_key(key))
                frames = [] if self._settle_sdk(key) else self.order.drop_id(key)
            elif self._settle_sdk(key):
                self._give_back(framing.id_key(key))
                frames = [frame] if frame is not None else []
            else:
                frames = self.order.fill_id(key, frame)
            for item in frames:
                if self._broken:
                    break
                try:
                    await self._send_line(item)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._broken = True
            self._progress.unpark_all()

    async def _send_line(self, frame: bytes) -> None:
        # Frames travel without their newline: appending it to a large one copies the
        # whole answer into freshly faulted memory (half a millisecond for a 1.4 MB
        # file read), so a large frame and its newline are sent one after the other.
        if len(frame) < SMALL_FRAME:
            await self.writer.send_all(frame + b"\n")
        else:
            await self.writer.send_all(frame)
            await self.writer.send_all(b"\n")

    async def _read_loop(self, nursery: trio.Nursery) -> None:
        try:
            while True:
                try:
                    data = await self.reader.receive_some(READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self._broken = True  # reset: the peer closed with our answers unread
                    return
                if not data:
                    self._broken = _closed_both_ways(self.writer)
                    return
                for event in self.splitter.feed(data):
                    while self.pending >= MAX_PENDING:
                        # Backpressure: a client that pipelines without reading its
                        # answers stops being read, instead of growing our memory.
                        await self._progress.park()
                    await self._handle(event, nursery)
        finally:
            self._input_ended = True
            self._ended.set()
            self._progress.unpark_all()

    async def _answer_now(self, message: dict[str, Any]) -> None:
        slot = self.order.reserve()
        await self._out_send.send(("slot", slot, framing.dumps(message)))

    async def _handle(self, event: framing.Event, nursery: trio.Nursery) -> None:
        if isinstance(event, framing.Oversized):
            _, method = framing.scan_head(event.head)
            direct = method is not None and self.app.is_direct_method(method, self.tools)
            await self._answer_now(framing.oversized_answer(event, direct))
            return
        frame = framing.classify(event.data)
        if isinstance(frame, framing.Invalid):
            await self._answer_now(frame.answer)
        elif isinstance(frame, framing.Request):
            if self.draining.is_set():
                await self._answer_now(
                    framing.error_message(frame.id, framing.SHUTTING_DOWN,
                                          "server is shutting down; reconnect and retry")
                )
            elif self._in_flight(frame.id):
                # JSON-RPC answers name requests by id, and a cancellation too: a second request
                # under the id of one still running made the first one's answer ambiguous and the
                # first uncancellable (the SDK's table of requests in flight keeps one per id).
                await self._answer_now(framing.error_message(
                    frame.id, framing.INVALID_REQUEST, f"id {json.dumps(frame.id)} is in use by a request still "
                    "running on this connection; send each request with a new id"))
            elif (problem := framing.call_params_problem(frame.method, frame.params)) is not None:
                await self._answer_now(framing.error_message(frame.id, framing.INVALID_PARAMS, problem))
            elif self.app.is_direct_method(frame.method, self.tools):
                slot = self.order.reserve()
                # Registered now, not when the task starts, so a cancellation read
                # right after the request still finds it.
                scope = trio.CancelScope()
                self._direct[framing.id_key(frame.id)] = scope
                before, self._direct_tail = self._direct_tail, trio.Event()
                ticket = self.app.arrive(frame.method, frame.params, self.tools)  # its turn is taken now, as it is read
                nursery.start_soon(self._run_direct, slot, frame, scope, before, self._direct_tail, ticket)
            else:
                await self._to_sdk(frame.message, request_id=frame.id)
        else:
            if isinstance(frame, framing.Notification) and frame.method == "notifications/cancelled":
                self._cancel_direct(frame.message.get("params"))
            await self._to_sdk(frame.message)

    def _cancel_direct(self, params: Any) -> None:
        # The SDK cancels its own requests; direct methods are ours to cancel.
        request_id = params.get("requestId") if isinstance(params, dict) else None
        # Only a valid id can name a request; a list or object here is unhashable and must
        # not reach the dict lookup (a TypeError would end the connection's nursery).
        scope = self._direct.get(framing.id_key(request_id)) if framing.is_valid_id(request_id) else None
        if scope is not None:
            scope.cancel()

    async def _to_sdk(self, message: dict[str, Any], request_id: Any = None) -> None:
        try:
            parsed = types.jsonrpc_message_adapter.validate_python(message, by_name=False)
        except ValueError as exc:
            if request_id is not None:
                await self._answer_now(
                    framing.error_message(request_id, framing.INVALID_REQUEST, f"invalid JSON-RPC message: {exc}")
                )
            return
        if request_id is not None and not (
            isinstance(parsed, types.JSONRPCRequest) and framing.id_key(parsed.id) == framing.id_key(request_id)
        ):
            # The SDK reads a request with a float id (1.5, even 2.0) as a notification and
            # would never answer it; its reserved slot would then hold back every later answer.
            await self._answer_now(framing.error_message(
                request_id, framing.INVALID_REQUEST, "MCP methods take a string or integer id; resend with one"))
            return
        metadata = None
        if request_id is not None:
            key = framing.id_key(request_id)
            self._sdk_pending[key] = self._sdk_pending.get(key, 0) + 1
            ticket = self.app.arrive(str(message.get("method")), message.get("params"), self.tools)
            if ticket is not None:
                self._arrivals[key] = ticket
            metadata = ServerMessageMetadata(
                request_context=Arrival(ticket),  # the handler's ctx.request: its place, explicitly
                on_request_unanswered=functools.partial(self._out_send.send, ("drop", request_id, None)),
            )
        await self._to_sdk_send.send(SessionMessage(parsed, metadata=metadata))

    async def _run_direct(
        self, slot: int, frame: framing.Request, scope: trio.CancelScope, before: trio.Event | None, done: trio.Event,
        ticket: Ticket | None,
    ) -> None:
        # Seed 001: direct requests on one connection are processed one after another,
        # so a pipelined capsule/exec then capsule/diff sees the exec's effects.
        frame_out: bytes | None = None
        key = framing.id_key(frame.id)
        try:
            with scope:
                try:
                    if before is not None:
                        await before.wait()
                    answer = await self.app.run_direct(frame.id, frame.method, frame.params, ticket=ticket,
                                                       tools=self.tools)
                    frame_out = framing.dumps(answer)
                finally:
                    self.app.runtime.capsule_queue.give_back(ticket)
                    if self._direct.get(key) is scope:
                        del self._direct[key]
        finally:
            done.set()
        # Cancelled by the client: like the SDK, send no answer, but free the slot.
        await self._out_send.send(("slot", slot, frame_out))


def _closed_both_ways(writer: trio.abc.SendStream) -> bool:
    """Whether the peer of ``writer`` has closed it, not just its sending half: a socket hung up
    both ways (POLLHUP), a pipe (stdio) with no reader left (POLLERR); False for what has no
    descriptor (a test's memory stream)."""
    sock = getattr(writer, "socket", None)
    fileno = sock.fileno if sock is not None else getattr(writer, "fileno", None)
    if fileno is None:
        return False
    poller = select.poll()
    poller.register(fileno(), select.POLLOUT)
    return any(events & (select.POLLHUP | select.POLLERR) for _fd, events in poller.poll(0))

"""Forwarded ports: a capsule's port opened on the host's loopback, for its owner alone.

``capsule_port`` makes ``127.0.0.1:HOST_PORT`` on the host lead to ``PORT`` on the
capsule's own loopback, so a person can open the app an agent is building.  The
forward (egress/forward.py) holds the port in this process and runs ``ccw-forward``, a
small C program of this process's user, which accepts and relays; it reaches the capsule
through sockets the helper made in the capsule's network namespace: a pool of unconnected
ones asked ahead (``net_connect`` with ``spares``, sandbox/capsule_nets.py), each
connected by the program for one accepted connection, or one the helper connects when
the pool is empty.  What it trusts (THREATS.md, "Forwarded ports"):

- **Who may connect.**  Any local process can connect to a loopback port, so each
  connection's peer is looked up by its 4-tuple (sock_diag: egress/peer.py's essay, and
  the program's own lookup) and only a socket owned by the capsule's owner (this
  process's uid: the helper makes a caller's capsules as the caller) is relayed; any
  other is closed at once, counted and shown as a ``port`` event with its uid.
- **What the capsule gets.**  Nothing new: the bytes a person's browser sends, on a
  connection the capsule accepted.  The helper's sockets live in the capsule's namespace,
  so neither this process nor the program enters it, and the capsule never reaches the
  host through them.  A spare socket lets its holder connect anywhere that namespace
  reaches: the capsule's loopback, and for an egress capsule its way out, which leads
  only to this process's own proxy listeners.
- **How long.**  A forward lives as long as its capsule (destroy closes it) and is kept
  in the state dir's ``ports`` table: a front end that starts opens it again
  (``reopen_kept``, from ``frontdoor.running_app`` through ``Services.reopen_kept``, in
  the background so that starting waits for no helper), with the same owner check, on the same host port when that is
  free, else on another: the log says so, and the ``port`` event's ``moved_from`` names
  the old one.  One that cannot be opened again (the helper refuses) stays kept, logged,
  and is tried at the next start.  Calls that read or change the forwards wait for that
  reopening (``recover``), so none is opened twice and none is missing from a listing.
- **What it leads to.**  A forward is the capsule's, not a service's: it may reach what
  an exec or any service opens, so it outlives the service that listened there (one that
  ended, or was lost with its front end).  What leads nowhere must not read as a live
  address, so a listing says of each forward whether something accepts there now
  (``listening``, asked of the helper as a readiness check is), and a forward opened where
  nothing listens yet says so (``note``); it is opened all the same, as a service may
  listen there later.
- **Which path.**  With a privileged helper the owner's connections skip the relay: the
  helper leads them into the capsule by NAT (sandbox/kernel_ports.py), proved to hold the
  port by the listener it is sent, once ``127.0.0.1:PORT`` answers in the capsule; it is
  tried when the forward opens and again at each ``capsule_port`` and listing until it is
  in place.  Other users' connections still reach the listener and are refused there.  A
  listing's ``path`` says which (``kernel`` or ``relay``), and ``accepted`` counts both.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from mcp_server import events
from mcp_server.capsules.background import Background
from mcp_server.egress.forward import Client, PortForward
from mcp_server.journal import Journal
from mcp_server.logs import LOGGER
from mcp_server.state import State
from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import MAX_SPARES, NetForwardRequest

MAX_PORTS = 32  # forwards one capsule keeps at once
REFUSED_EVENT_S = 1.0  # at most one ``refused`` event per peer uid and port in this long


class Refusals:
    """Which refusals become events: the first of a peer uid's, then one a second at most,
    saying how many were folded into it (``more``).  Any local user can connect to a
    forwarded port as fast as the kernel accepts; an event each would let them push the
    capsule's other events out of the bounded log (events.KEEP_EVENTS).  The port's own
    ``refused`` count stays exact."""

    def __init__(self, window: float = REFUSED_EVENT_S, most: int = 1024) -> None:
        self._window = window
        self._most = most  # uids remembered; past it the oldest is forgotten
        self._last: dict[int | None, tuple[float, int]] = {}  # uid: (when its last event went, folded since)

    def note(self, uid: int | None, now: float) -> int | None:
        """The count folded into an event to add now for ``uid``, or None: no event now."""
        last = self._last.pop(uid, None)
        if last is not None and now - last[0] < self._window:
            self._last[uid] = (last[0], last[1] + 1)
            return None
        if len(self._last) >= self._most:
            self._last.pop(next(iter(self._last)))
        self._last[uid] = (now, 0)
        return 0 if last is None else last[1]

_DDL = """
CREATE TABLE IF NOT EXISTS ports (
    capsule_id TEXT NOT NULL,
    port INTEGER NOT NULL,
    host_port INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (capsule_id, port)
);
"""


class Ports:
    """The forwarded ports of this front end's capsules (one per process, in the Runtime)."""

    def __init__(self, state: State, helper: Callable[[], Awaitable[HelperClient]]) -> None:
        self.state = state
        self._helper = helper
        self._open: dict[tuple[str, int], PortForward] = {}
        self._kernel: set[tuple[str, int]] = set()  # forwards whose owner's connections skip the relay
        self._unanswered: set[tuple[str, int]] = set()  # asked for a kernel path, no answer read: maybe made
        self._no_kernel: str | None = None  # why no forward can have a kernel path here (a rootless helper)
        self._background = Background("ccw forwarded ports")
        self._recovered = False
        self._recovering = trio.Lock()
        self._starting = trio.Lock()
        state.ensure_schema("ports", _DDL)

    async def summaries(self, capsule_id: str) -> list[dict[str, Any]]:
        """The capsule's forwards, with their programs' counts as of now."""
        await self.recover()
        out = []
        for (cap, _), forward in sorted(self._open.items()):
            if cap == capsule_id:
                counts = await forward.counts()
                listening = await self._listening(capsule_id, forward)
                led = await self._kernel_count(capsule_id, forward)
                out.append({**_summary(capsule_id, forward), "refused": counts.refused,
                            "accepted": counts.accepted + led, "listening": listening,
                            "path": "kernel" if (capsule_id, forward.capsule_port) in self._kernel else "relay"})
        return out

    async def _listening(self, capsule_id: str, forward: PortForward) -> bool | None:
        """Whether something accepts on the forwarded port in the capsule now (None if the helper
        cannot say); the path follows where: the kernel's to 127.0.0.1, the relay's to ``::1``
        or the jail's hostname's address alone (a server restarted there after the kernel path
        was made: NAT cannot reach it)."""
        try:
            with await (await self._helper()).net_connect(capsule_id, forward.capsule_port) as answered:
                on_v4 = answered.getpeername()[0] == "127.0.0.1"  # the helper tries it first
        except CcwError as exc:
            return False if exc.code == "CONFLICT" else None  # CONFLICT: refused, nothing listens there
        if on_v4:
            await self._kernel_path(capsule_id, forward)
        else:
            await self._drop_kernel_path(capsule_id, forward)
        return True

    def held(self) -> list[str]:
        """The open forwards, each in a few words (frontdaemon.ask_what_it_holds)."""
        return [f"port {cap}:{port} (forwarded to 127.0.0.1:{forward.host_port})"
                for (cap, port), forward in sorted(self._open.items())]

    async def open(self, capsule_id: str, port: int, host_port: int = 0) -> dict[str, Any]:
        """Forward ``port`` of the capsule (the same forward if it has one); its URL."""
        await self.recover()
        async with self._starting:  # calls at once for one port start one forward, not one each (the rest leaked)
            forward = self._open.get((capsule_id, port))
            if forward is None:
                if sum(1 for cap, _ in self._open if cap == capsule_id) >= MAX_PORTS:
                    raise CcwError("TOO_LARGE", f"capsule {capsule_id} already forwards {MAX_PORTS} ports; close one "
                                   "(capsule_port with close: true)", {"capsule_id": capsule_id})
                forward = await self._start(capsule_id, port, host_port)
                self.state.execute("INSERT OR REPLACE INTO ports (capsule_id, port, host_port, created_at) "
                                   "VALUES (?, ?, ?, ?)", (capsule_id, port, forward.host_port,
                                                           dt.datetime.now(dt.UTC).isoformat(timespec="seconds")))
        listening = await self._listening(capsule_id, forward)
        nobody = {"note": f"nothing listens on port {port} in capsule {capsule_id} now; the forward stays open "
                          "and leads there once something does"} if listening is False else {}
        return {**_summary(capsule_id, forward), "listening": listening, **nobody}

    async def _start(self, capsule_id: str, port: int, host_port: int, moved_from: int | None = None) -> PortForward:
        async def connect() -> trio.socket.SocketType:
            helper = await self._helper()
            return await helper.net_connect(capsule_id, port)

        async def spares(count: int, v6: bool) -> list[socket.socket]:
            helper = await self._helper()
            return await helper.net_spares(capsule_id, port, count, v6)

        quiet = Refusals()

        def refused(who: Client) -> None:
            folded = quiet.note(who.uid, time.monotonic())
            if folded is not None:
                events.add(self.state, "port", capsule_id, {"port": port, "state": "refused", "peer_uid": who.uid,
                                                            "peer": f"{who.address}:{who.port}", "more": folded})

        first = await self._first_spares(capsule_id, port)
        try:
            forward = PortForward(connect, os.getuid(), port, host_port, on_refused=refused,
                                  spares=spares, ready=first)
        except BaseException:
            for sock in first:
                sock.close()
            raise
        self._open[(capsule_id, port)] = forward
        nursery = await self._background.nursery()
        await nursery.start(forward.serve)
        moved = {} if moved_from is None else {"moved_from": moved_from}
        events.add(self.state, "port", capsule_id, {**_summary(capsule_id, forward), "state": "open", **moved})
        await self._kernel_path(capsule_id, forward)
        return forward

    async def _first_spares(self, capsule_id: str, port: int) -> list[socket.socket]:
        """A first batch of spare sockets; none if the helper cannot now (the program asks again)."""
        helper = await self._helper()
        try:
            return await helper.net_spares(capsule_id, port, MAX_SPARES)  # the program asks for the rest
        except CcwError as exc:
            if exc.code == "NOT_FOUND":  # this helper has no such capsule (the state dir moved to another helper)
                raise
            LOGGER.info(f"mcp:port {capsule_id}:{port} without spare sockets for now: {exc.message}")
            return []

    async def _kernel_path(self, capsule_id: str, forward: PortForward) -> None:
        """Ask the helper to lead the owner's connections by NAT, if it has not yet (the essay)."""
        key = (capsule_id, forward.capsule_port)
        if key in self._kernel or self._no_kernel is not None:
            return
        self._unanswered.add(key)  # a call cancelled midway may have made the rules: closing drops them all the same
        try:
            await (await self._helper()).call(NetForwardRequest(capsule_id, forward.capsule_port, forward.host_port,
                                                                "open", listener=forward.listener_fd))
        except CcwError as exc:
            self._unanswered.discard(key)
            if exc.code == "UNSUPPORTED":
                self._no_kernel = exc.message
            LOGGER.info(f"mcp:port {capsule_id}:{forward.capsule_port} relays in user space: {exc.message}")
            return
        self._unanswered.discard(key)
        self._kernel.add(key)

    async def _kernel_count(self, capsule_id: str, forward: PortForward) -> int:
        """The connections the kernel path has led (0 without one)."""
        if (capsule_id, forward.capsule_port) not in self._kernel:
            return 0
        request = NetForwardRequest(capsule_id, forward.capsule_port, forward.host_port, "count")
        try:
            reply = await (await self._helper()).call(request)
        except CcwError as exc:
            LOGGER.info(f"mcp:port {capsule_id}:{forward.capsule_port}: no count from the helper: {exc.message}")
            return 0
        if not reply.open:  # a helper that restarted has none: the relay serves, and the next listing asks again
            self._kernel.discard((capsule_id, forward.capsule_port))
        return reply.connections

    async def _drop_kernel_path(self, capsule_id: str, forward: PortForward) -> None:
        key = (capsule_id, forward.capsule_port)
        if key not in self._kernel and key not in self._unanswered:
            return
        self._kernel.discard(key)
        self._unanswered.discard(key)
        request = NetForwardRequest(capsule_id, forward.capsule_port, forward.host_port, "close")
        with trio.move_on_after(5), contextlib.suppress(CcwError, OSError):
            await (await self._helper()).call(request)

    async def close(self, capsule_id: str, port: int) -> dict[str, Any]:
        forward = self._open.pop((capsule_id, port), None)
        self.state.execute("DELETE FROM ports WHERE capsule_id = ? AND port = ?", (capsule_id, port))
        if forward is None:
            raise CcwError("NOT_FOUND", f"capsule {capsule_id} forwards no port {port}",
                           {"capsule_id": capsule_id, "port": port})
        await self._drop_kernel_path(capsule_id, forward)
        await forward.aclose()
        events.add(self.state, "port", capsule_id, {**_summary(capsule_id, forward), "state": "closed"})
        return {**_summary(capsule_id, forward), "open": False}

    async def close_all(self, capsule_id: str) -> None:
        """Close every forward of a capsule (it is being destroyed)."""
        for cap, port in list(self._open):
            if cap == capsule_id:
                await self.close(cap, port)
        self.state.execute("DELETE FROM ports WHERE capsule_id = ?", (capsule_id,))

    async def reopen_kept(self) -> None:
        """At a front end's start: reopen the kept forwards in the background (``recover``),
        if there are any; the helper is not asked otherwise."""
        if not self.state.execute("SELECT 1 FROM ports LIMIT 1"):
            return

        async def reopen() -> None:
            try:
                await self.recover()
            except Exception as exc:  # a system task must not raise; the next start tries again
                LOGGER.warning(f"mcp:port could not reopen the forwarded ports: {exc}")

        nursery = await self._background.nursery()
        nursery.start_soon(reopen)

    async def recover(self) -> None:
        """Once per process: open again the forwards the state dir keeps for live capsules."""
        async with self._recovering:
            if self._recovered:
                return
            self._recovered = True
            journal = Journal(self.state)
            for row in self.state.execute("SELECT capsule_id, port, host_port FROM ports ORDER BY capsule_id, port"):
                capsule_id, port, host_port = row["capsule_id"], row["port"], row["host_port"]
                record = journal.capsule(capsule_id)
                if record is None or record.destroyed_at is not None:
                    self.state.execute("DELETE FROM ports WHERE capsule_id = ?", (capsule_id,))
                    continue
                await self._reopen(capsule_id, port, host_port)

    async def _reopen(self, capsule_id: str, port: int, host_port: int) -> None:
        """Open a kept forward again: on its host port if free, else on another (said); kept if it cannot be."""
        try:
            try:
                forward = await self._start(capsule_id, port, host_port)
            except CcwError as exc:
                if exc.details.get("errno") != "EADDRINUSE":
                    raise
                forward = await self._start(capsule_id, port, 0, moved_from=host_port)
                LOGGER.warning(f"mcp:port {capsule_id}:{port} reopened on {forward.url}: its host port {host_port} "
                               "is taken by another program now")
        except CcwError as exc:
            LOGGER.warning(f"mcp:port {capsule_id}:{port} not reopened (kept, tried again at the next start): "
                           f"{exc.message}")
            return
        self.state.execute("UPDATE ports SET host_port = ? WHERE capsule_id = ? AND port = ?",
                           (forward.host_port, capsule_id, port))

    async def aclose(self) -> None:
        for (capsule_id, _), forward in list(self._open.items()):
            await self._drop_kernel_path(capsule_id, forward)
            await forward.aclose()
        self._open.clear()
        self._background.cancel()


def _summary(capsule_id: str, forward: PortForward) -> dict[str, Any]:
    return {"capsule_id": capsule_id, "port": forward.capsule_port, "host_port": forward.host_port,
            "url": forward.url, "open": True, "refused": forward.refused}

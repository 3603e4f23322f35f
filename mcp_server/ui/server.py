"""The dashboard's HTTP server: a small ASGI app on trio through hypercorn (as ``transports/http.py``).

Who may use it.  Any local user can reach a loopback port, and the dashboard can promote
and destroy; so, on every request, in this order:

1. ``Host`` must be this server's own loopback name and port (``127.0.0.1:PORT``,
   ``localhost:PORT``, ``[::1]:PORT``), else **421**: a page on another site whose name
   an attacker rebinds to 127.0.0.1 (DNS rebinding) sends its own name there.
2. The page and its assets (``static/``, files shipped in the package) are served to
   anyone who passes 1: they hold no data.  Everything under ``/api/`` needs the token
   ``ccw ui`` generated at start and printed in the URL's fragment (``#token=``, which a
   browser never sends in a request, a Referer or a log): the page reads it there and
   sends it as ``X-CCW-Token`` on each call, compared in constant time, else **401**.
   No cookie is ever set, so a request another site makes the browser send carries
   nothing; and a custom header needs a CORS preflight this server never grants.
3. A POST (promote, destroy) whose ``Origin`` is present and is not this server's origin
   is refused with **403**; its body is read up to ``MAX_BODY`` (**413**).

Every response carries ``Content-Security-Policy: default-src 'self'; frame-ancestors
'none'`` (no inline script, no framing), ``X-Content-Type-Options: nosniff``,
``Referrer-Policy: no-referrer`` and ``Cache-Control: no-store``.  The JSON is data to
the page, which renders every string from a capsule with ``textContent``.

Routes (JSON unless said): ``GET /`` (the page), ``GET /static/NAME``,
``GET /api/capsules?limit=&after=`` (a page: live capsules first, newest first, continuing after
capsule ``after``), ``GET /api/questions`` (the connections waiting for a person's answer:
capsules/asks.py) and ``POST /api/questions/ID`` (body: ``answer``: once, capsule or denied, and
``reason``; answered as ``ccw ui``; an approved proposal's rules are then added by the
``capsule_network`` tool, capsules/proposals.py), ``GET /api/races?limit=&before=`` (the newest
races, with their best rows: ui/races.py) and ``GET /api/races/ID`` (one race's ranked table),
``GET /api/capsules/ID/runs?limit=&before=`` (the newest runs numbered below ``before``),
``GET /api/capsules/ID/runs/N``, ``GET /api/capsules/ID/diff`` (the ``capsule_diff`` tool),
``GET /api/events?after=&capsule=&wait=`` (a long poll: answers when events after ``after``
exist or ``wait`` ms passed, at most ``MAX_WAIT_MS``),
``GET /api/events?capsule=&kinds=&limit=&before=`` (without ``after``: a page going back from
the newest event, or from ``before``), ``POST /api/capsules/ID/promote`` (body: ``policies``,
``dry_run``) and ``POST /api/capsules/ID/destroy`` (the tools of those names).  A tool's refusal is a 200
whose body is ``{"ok": false, "error": {"code", "message"}}``: the page shows the message.
A page's ``limit`` is capped (``api.PAGES``) and its answer says whether ``more`` (older) exist:
the page never asks for a capsule's whole history at once.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from mcp_server.config import Config
from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.state import State
from mcp_server.transports.asgi import lifespan, read_body
from mcp_server.ui import api, races
from sandbox.errors import CcwError

TOKEN_HEADER = "x-ccw-token"
MAX_BODY = 64 * 1024
MAX_WAIT_MS = 25_000
ASSETS = {"index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
          "races.js": "text/javascript; charset=utf-8", "style.css": "text/css; charset=utf-8"}
SECURITY_HEADERS = [
    (b"content-security-policy",
     b"default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'; object-src 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
]
HTTP_STATUS_OF = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400, "CONFLICT": 409}

ToolCaller = Callable[[Config, str, dict[str, Any]], Awaitable[dict[str, Any]]]


class Reply(Exception):
    """An answer other than 200 (raised anywhere in a request's handling)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def asset(name: str) -> bytes:
    """A file of the page, from the package (shipped in the wheel)."""
    return (resources.files("mcp_server.ui") / "static" / name).read_bytes()


def loopback_names(host: str, port: int) -> frozenset[str]:
    """The ``Host`` values this server answers: its loopback names with its port."""
    names = ("[::1]",) if ":" in host else ("127.0.0.1", "localhost")
    return frozenset(f"{name}:{port}" for name in names)


class Dashboard:
    """The ASGI app: checks (module docstring), then routes."""

    def __init__(self, config: Config, state: State, token: str, host: str, port: int,
                 call_tool: ToolCaller) -> None:
        self.config, self.state, self.call_tool = config, state, call_tool
        self.token = token.encode()
        self.hosts = loopback_names(host, port)
        self.origins = frozenset(f"http://{name}" for name in self.hosts)
        Journal(state)  # its tables, in a state dir nothing has used yet
        self.log = EventLog(state)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
        elif scope["type"] == "http":
            await self._answer(scope, receive, send)

    async def _answer(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            status, body, kind = 200, *await self._serve(scope, receive)
        except Reply as reply:
            status, body, kind = reply.status, _json({"error": str(reply)}), "application/json"
        headers = [(b"content-type", kind.encode()), (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _serve(self, scope: dict[str, Any], receive: Any) -> tuple[bytes, str]:
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope["headers"]}
        if headers.get("host") not in self.hosts:
            raise Reply(421, f"Host must be one of {sorted(self.hosts)} (DNS rebinding guard)")
        method, path = scope["method"], scope["path"]
        if not path.startswith("/api/"):
            if method not in ("GET", "HEAD"):
                raise Reply(405, "the page takes GET only")
            name = "index.html" if path == "/" else path.removeprefix("/static/")
            if name not in ASSETS or (path != "/" and not path.startswith("/static/")):
                raise Reply(404, "no such page")
            return asset(name), ASSETS[name]
        if not hmac.compare_digest(headers.get(TOKEN_HEADER, "").encode("latin-1"), self.token):
            raise Reply(401, "the API needs the token printed by ccw ui (open the URL it printed)")
        body: dict[str, Any] = {}
        if method == "POST":
            origin = headers.get("origin")
            if origin is not None and origin not in self.origins:
                raise Reply(403, f"Origin {origin!r} may not act on this dashboard")
            body = await _json_body(receive)
        elif method != "GET":
            raise Reply(405, "the API takes GET and POST")
        query = {key: values[-1] for key, values in parse_qs(scope["query_string"].decode("latin-1")).items()}
        try:
            return _json(await self._route(method, path.removeprefix("/api/").split("/"), query, body)), \
                "application/json"
        except CcwError as exc:
            raise Reply(HTTP_STATUS_OF.get(exc.code, 500), f"{exc.code}: {exc.message}") from exc

    async def _route(self, method: str, parts: list[str], query: dict[str, str], body: dict[str, Any]) -> Any:
        read = trio.to_thread.run_sync
        if method == "GET" and parts == ["capsules"]:
            return await read(api.capsules, self.state, self.log, _number(query, "limit"), query.get("after"))
        if method == "GET" and parts == ["events"]:
            return await self._events(query)
        if method == "GET" and parts == ["questions"]:
            return await read(api.questions, self.state)
        if method == "POST" and len(parts) == 2 and parts[0] == "questions" and parts[1].isdigit():
            answered = await read(api.answer_question, self.state, int(parts[1]), body)
            if answered["kind"] == "proposal" and answered["state"] == "capsule":
                # An approved proposal's rules go live in the front end's session (capsules/proposals.py).
                added = await self._tool("capsule_network", {"capsule_id": answered["capsule_id"],
                                                             "proposal": answered["id"]})
                return await read(api.question, self.state, answered["id"]) if added["ok"] else answered
            return answered
        if method == "GET" and parts == ["races"]:
            return await read(races.listed, self.state, _number(query, "limit"), _number(query, "before"))
        if method == "GET" and len(parts) == 2 and parts[0] == "races" and parts[1]:
            return await read(races.one, self.state, parts[1])
        if len(parts) < 3 or parts[0] != "capsules" or not parts[1]:
            raise Reply(404, "no such API")
        capsule_id, rest = parts[1], parts[2:]
        if method == "GET" and rest == ["runs"]:
            return await read(api.runs, self.state, capsule_id, _number(query, "limit"), _number(query, "before"))
        if method == "GET" and len(rest) == 2 and rest[0] == "runs" and rest[1].isdigit():
            return await read(api.run, self.state, capsule_id, int(rest[1]))
        if method == "GET" and rest == ["diff"]:
            return await self._tool("capsule_diff", {"capsule_id": capsule_id, "format": "unified"})
        if method == "POST" and rest == ["promote"]:
            args: dict[str, Any] = {"capsule_id": capsule_id, "dry_run": bool(body.get("dry_run"))}
            policies = body.get("policies")
            if policies:
                if not isinstance(policies, list) or not all(isinstance(p, str) for p in policies):
                    raise Reply(400, "policies: a list of policy names")
                args["policies"] = policies
            return await self._tool("capsule_promote", args)
        if method == "POST" and rest == ["destroy"]:
            return await self._tool("capsule_destroy", {"capsule_id": capsule_id})
        raise Reply(404, "no such API")

    async def _tool(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """A tool's result, or its refusal (a CcwError's code and message) for the page to show."""
        try:
            return {"ok": True, "result": await self.call_tool(self.config, name, args)}
        except CcwError as exc:
            return {"ok": False, "error": {"code": exc.code, "message": exc.message}}

    async def _events(self, query: dict[str, str]) -> dict[str, Any]:
        capsule_id = query.get("capsule") or None
        if "after" not in query:  # a page going back from the newest (or from ``before``)
            return await trio.to_thread.run_sync(api.older_events, self.log, capsule_id, api.kinds_of(
                query.get("kinds")), _number(query, "limit"), _number(query, "before"))
        after, wait_ms = _number(query, "after") or 0, min(_number(query, "wait") or 0, MAX_WAIT_MS)
        # A long poll, not Server-Sent Events: EventSource cannot send the token header.
        found = await trio.to_thread.run_sync(api.events, self.log, after, capsule_id)
        if found["events"] or wait_ms <= 0:
            return found
        with trio.move_on_after(wait_ms / 1000):
            # follow looks at the database only when a commit changed its files.
            async with contextlib.aclosing(self.log.follow(after, capsule_id)) as stream:
                async for _ in stream:
                    break
            found = await trio.to_thread.run_sync(api.events, self.log, after, capsule_id)
        return found


def _number(query: dict[str, str], key: str) -> int | None:
    """The integer parameter ``key`` (None when absent), else 400."""
    if key not in query:
        return None
    try:
        return int(query[key])
    except ValueError:
        raise Reply(400, f"{key} is an integer") from None


def _json(payload: Any) -> bytes:
    return json.dumps(payload, ensure_ascii=False).encode()


async def _json_body(receive: Any) -> dict[str, Any]:
    data, _ = await read_body(receive, MAX_BODY)
    if data is None:
        raise Reply(413, f"a request body is at most {MAX_BODY} bytes")
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        raise Reply(400, "the body must be a JSON object") from None
    if not isinstance(body, dict):
        raise Reply(400, "the body must be a JSON object")
    return body


async def serve(app: Dashboard, sock: socket.socket, stop: trio.Event,
                task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ``app`` on the listening ``sock`` until ``stop``."""
    hconfig = HypercornConfig()
    hconfig.bind = [f"fd://{sock.detach()}"]
    hconfig.graceful_timeout = 1.0  # long polls in flight are only waiting
    hconfig.accesslog = None
    # Its warnings and errors, not its "Running on" line: ccw ui prints the URL itself,
    # and an INFO line named hypercorn.error read like a failure to the person starting it.
    errors = logging.getLogger("mcp_server.ui.http")
    errors.setLevel(logging.WARNING)
    hconfig.errorlog = errors
    await hypercorn_serve(app, hconfig, shutdown_trigger=stop.wait, task_status=task_status)  # type: ignore[arg-type]

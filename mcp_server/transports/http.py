"""The HTTP transport: Streamable HTTP at ``/mcp``, on trio through hypercorn.

The SDK's ``StreamableHTTPSessionManager`` serves both protocol eras on one endpoint: a
request with a 2026-07-28 ``MCP-Protocol-Version`` header is served statelessly, and
anything else goes through 2025-11-25 sessions (``initialize`` creates one and returns
``Mcp-Session-Id``; an unknown or ended id is 404; DELETE ends it).  In front of it,
this module's ASGI layer does what ccw adds, in this order:

1. Only ``/mcp`` exists (404 otherwise).
2. DNS rebinding and Origin (``host_guard``).  Bound to loopback, the SDK's own
   protection (``TransportSecurityMiddleware``) judges every request, direct methods
   included: ``Host`` must be a loopback name with this server's port (421 otherwise),
   and ``Origin``, when present, a loopback origin (403).  Bound beyond loopback (only
   with ``CCW_TOKENS_FILE``), the names clients use to reach the machine are not ccw's to
   list, so ``Host`` is not checked there; ``Origin``, when present, must still name a
   loopback host or the bound address (403).  A rebinding page cannot send a bearer
   token either way.
3. Every request needs ``Authorization: Bearer`` naming a token (401 with
   ``WWW-Authenticate: Bearer`` otherwise), on loopback too: any local user can reach a
   loopback port, and the server may run as root.  The tokens are ``CCW_TOKENS_FILE``'s,
   or, when it is unset, the one the server generates in its state dir on first start
   (``mcp_server.auth``: mode 0600, owned by the server's uid, never through a symlink;
   ``ccw client-config CLIENT --http HOST:PORT`` prints a client config carrying it).
   Without ``CCW_TOKENS_FILE`` the server binds loopback only and refuses to start
   otherwise: who may call from other machines, with which scopes, is the operator's
   choice to write down.  Sessions are bound to the credential that created them, the
   token under its name (``Principal.key`` as the SDK's ``subject``: the SDK answers 404
   to any other, a rotated token of the same name included).  The tokenless local path
   is the unix socket (``transports/unix.py``), where the kernel names the caller.
4. POST bodies are read up to 1 MiB; a larger body is refused before parsing with
   **413** and a JSON-RPC error body whose ``data`` is seed 001's shape
   ``{"ok": false, "reason": "validation_failed", "errors": [{"path": "",
   "msg": "payload_too_large"}]}`` (id recovered from the head when possible, as on the
   other transports).  The connection stays usable (HTTP keep-alive).
5. The JSON-RPC method decides the scope a token needs (``CcwServer.scope_for``: the
   tool's own scope for ``tools/call`` and direct methods); a token without it gets
   **403** with ``WWW-Authenticate: Bearer error="insufficient_scope", scope=…`` (the MCP
   authorization spec's answer) and a JSON-RPC error naming the scope, with the request's
   id, which an MCP client hands its session as the call's error (and ``tools/list`` shows
   a token only the tools its scopes reach, ``ToolSpec.scopes``; the resource lists, only
   what it may read: ``ToolList.resources_to``).  A body that
   ``json.loads`` cannot read as one message (so no scope can be judged) is refused with
   **400** (-32700) before the SDK sees it: fail closed rather than trust two parsers.
6. A direct method (a tool name as the method) is answered here, as plain JSON, with no
   session or handshake; everything else is replayed to the SDK.

Revocation.  The tokens file is looked at (``TokenFile.refresh``: one ``stat``) before
every request is judged, and every ``TOKENS_POLL_S`` between requests, so once ``ccw http
token rotate`` (or an operator's edit of ``CCW_TOKENS_FILE``) has replaced the file, no
request is admitted with a credential that is gone (401).  What a revoked credential holds
ends at that look: each of its requests in flight is cut (one whose answer had not
started is answered 401), and each session it opened is ended as its client's DELETE
would end it (``_end_session``: the SDK forgets the id, so it is 404 from then on, closes
its streams and ends its loop, so a tool call that had not answered is cancelled as when
its client leaves).  A long run that had answered "running" goes on, and it and its task
stay the token *name*'s (capsules/run.py): a rotation gives the same user a new secret,
and that user, reconnecting with it, fetches or cancels the run; a name removed from
``CCW_TOKENS_FILE`` leaves its runs to finish and expire unreachable.  Which sessions a
credential opened is this layer's own book (``transports/holdings.py``, from each
opening answer's ``Mcp-Session-Id``), which forgets a session once the SDK's idle
timeout (``SESSION_IDLE_S``) has ended it.  A tokens file that cannot be used (gone,
malformed, unsafe) revokes nothing, since an editor's half-saved file is not a decision,
and every request is answered **503** until it is fixed.

Shutdown: on drain hypercorn stops accepting; once the requests in flight are answered
the sessions end (closing their GET event streams), and hypercorn waits at most
``GRACEFUL_S`` for anything left.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
from typing import Any
from urllib.parse import urlsplit

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecurityMiddleware, TransportSecuritySettings
from starlette.requests import Request

from mcp_server import framing
from mcp_server.auth import Principal, TokenFile, insufficient_scope
from mcp_server.capsules.turns import ARRIVAL_KEY, Ticket
from mcp_server.logs import LOGGER
from mcp_server.server import TOOL_ERROR, CcwServer
from mcp_server.transports import asgi
from mcp_server.transports.holdings import Holdings
from sandbox.errors import CcwError, from_oserror

MCP_PATH = "/mcp"
GRACEFUL_S = 60.0
SESSION_IDLE_S = 30 * 60.0  # the SDK ends a session with nothing in flight this long; the book forgets it then
TOKENS_POLL_S = 1.0  # the tokens file is looked at this often between requests (each request looks too)
SESSION_HEADER = "mcp-session-id"
REVOKED = [(b"www-authenticate", b'Bearer realm="ccw", error="invalid_token"')]
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def parse_addr(addr: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → (host, port)."""
    host, sep, port = addr.rpartition(":")
    if not sep or not port.isdigit():
        raise CcwError("INVALID_ARGUMENT", f"CCW_HTTP_ADDR={addr!r}: use host:port, e.g. 127.0.0.1:8765")
    return host.strip("[]") or "127.0.0.1", int(port)


def is_loopback(host: str) -> bool:
    """True for localhost and loopback addresses."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind_http(addr: str, has_tokens_file: bool) -> socket.socket:
    """A listening TCP socket for CCW_HTTP_ADDR; beyond loopback needs CCW_TOKENS_FILE (docstring, 3)."""
    host, port = parse_addr(addr)
    if not has_tokens_file and not is_loopback(host):
        raise CcwError(
            "PERMISSION_DENIED",
            f"refusing to serve HTTP on {host} with only the generated local token: set CCW_TOKENS_FILE "
            "to the tokens (and scopes) you hand out, or bind a loopback address such as 127.0.0.1",
        )
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise from_oserror(exc, "bind HTTP", addr, "choose another CCW_HTTP_ADDR") from exc
    sock.listen(128)
    return sock


def host_guard(host: str, port: int) -> TransportSecuritySettings:
    """The SDK's DNS-rebinding settings for a server bound to ``host:port`` (module docstring, 2).

    Off for a non-loopback bind, where ``CcwHttpApp`` checks only ``Origin``.
    """
    if not is_loopback(host):
        return TransportSecuritySettings(enable_dns_rebinding_protection=False)
    names = ["localhost", "127.0.0.1", "[::1]"]
    bound = f"[{host}]" if ":" in host else host
    if bound not in names:
        names.append(bound)  # another loopback address, e.g. 127.0.0.2
    origins = [f"{scheme}://{name}{port_part}" for scheme in ("http", "https") for name in names
               for port_part in ("", ":*")]
    return TransportSecuritySettings(enable_dns_rebinding_protection=True,
                                     allowed_hosts=[f"{name}:{port}" for name in names], allowed_origins=origins)


class CcwHttpApp:
    """The ASGI layer in front of the SDK's Streamable HTTP handler (see module docstring)."""

    def __init__(
        self, app: CcwServer, manager: StreamableHTTPSessionManager, tokens: TokenFile, host: str, port: int,
    ) -> None:
        self.app = app
        self.manager = manager
        self.tokens = tokens
        self.guard = host_guard(host, port)
        self._guard_check = TransportSecurityMiddleware(self.guard)
        self.origin_hosts = {*LOOPBACK_NAMES, host}
        self._in_flight = 0  # requests being answered, not counting GET event streams
        self._settled = trio.lowlevel.ParkingLot()
        self.holdings = Holdings()
        self._keeping = trio.CancelScope()

    async def idle(self) -> None:
        """Return once no request (other than a GET event stream) is being answered."""
        while self._in_flight:
            await self._settled.park()

    def close_streams(self) -> None:
        """End every open GET event stream, and the tokens file's keeper (at shutdown, once
        requests are answered)."""
        self.holdings.close_streams()
        self._keeping.cancel()

    def look(self) -> None:
        """Look at the tokens file (one stat); end what the credentials it no longer has hold."""
        revoked = self.tokens.refresh()
        if revoked:
            self.holdings.revoke(revoked)

    async def keep_tokens(self) -> None:
        """Look at the tokens file every TOKENS_POLL_S, so a revoked credential's idle session
        ends too; end the sessions revoked; forget those the SDK ended for idleness."""
        with self._keeping:
            while True:
                with trio.move_on_after(TOKENS_POLL_S):
                    await self.holdings.wake.wait()
                self.look()
                for session_id, opener in self.holdings.take_ending():
                    await self._end_session(session_id, opener)
                self.holdings.forget_idle(SESSION_IDLE_S + TOKENS_POLL_S)

    async def _end_session(self, session_id: str, opener: Principal) -> None:
        """End a session as its client's DELETE would (the SDK's own way to end one): its id
        answers 404 from now on, its streams close, its loop ends."""
        await trio.lowlevel.checkpoint_if_cancelled()  # at shutdown the manager may be gone already
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "DELETE",
                 "scheme": "http", "path": MCP_PATH, "raw_path": MCP_PATH.encode(), "query_string": b"",
                 "root_path": "", "headers": [(SESSION_HEADER.encode(), session_id.encode("latin-1"))],
                 "client": None, "server": None, "user": _user(opener)}

        async def gone() -> dict[str, Any]:
            return {"type": "http.disconnect"}

        async def discard(message: Any) -> None:
            pass

        await self.manager.handle_request(scope, asgi.replay(b"", gone), discard)
        LOGGER.info(f"mcp:http ended session {session_id[:8]}… of token {opener.name!r}: its token was revoked")

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await asgi.lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["method"] == "GET":  # a long-lived event stream: cut when the server drains
            await self._serve(scope, receive, send)
            return
        self._in_flight += 1
        try:
            await self._serve(scope, receive, send)
        finally:
            self._in_flight -= 1
            self._settled.unpark_all()

    async def _serve(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"].rstrip("/") != MCP_PATH:
            await asgi.refuse(receive, send, 404, {"error": f"not found; the MCP endpoint is {MCP_PATH}"})
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if await self._refused_origin(scope, headers, receive, send):
            return
        self.look()
        if self.tokens.fault:
            await asgi.refuse(receive, send, 503, {"error": "this server's tokens file cannot be used now (the "
                                                            "server's log says why); nothing is served until it is "
                                                            "fixed"})
            return
        principal = self.tokens.table.authenticate(headers.get("authorization"))
        if principal is None:
            await asgi.refuse(
                receive, send, 401, {"error": "missing or unknown bearer token; send Authorization: Bearer <token> "
                                              "(ccw client-config CLIENT --http HOST:PORT prints a config with it)"},
                [(b"www-authenticate", b'Bearer realm="ccw"')],
            )
            return
        scope = dict(scope)
        scope["user"] = _user(principal)
        await self._answer(scope, receive, send, principal, headers.get(SESSION_HEADER))

    async def _answer(self, scope: dict[str, Any], receive: Any, send: Any, principal: Principal,
                      session_id: str | None) -> None:
        """Answer an authenticated request, cut if its credential is revoked meanwhile (module
        docstring, Revocation); book the session it opens."""
        answered = False

        async def answer(message: Any) -> None:
            nonlocal answered
            if message["type"] == "http.response.start":
                answered = True
                opened = [v for k, v in message.get("headers", []) if k.lower() == SESSION_HEADER.encode()]
                if session_id is None and opened and message["status"] < 400:
                    self.holdings.opened(opened[0].decode("latin-1"), principal, self.tokens.table.credentials())
            await send(message)

        with self.holdings.hold(principal, scope["method"] == "GET", session_id) as held:
            if scope["method"] == "POST":
                await self._serve_post(scope, receive, answer, principal)
            else:
                await self.manager.handle_request(scope, receive, answer)
        if held.cancelled_caught and not answered and principal.key not in self.tokens.table.credentials():
            # Its body may be half read, and once it is all read another receive() waits for
            # the client to leave (ASGI): not drained as ``asgi.refuse`` does, the connection ends.
            await asgi.respond(send, 401, {"error": "this bearer token was revoked while the request was answered"},
                               [*REVOKED, asgi.CLOSE])

    async def _refused_origin(self, scope: dict[str, Any], headers: dict[str, str], receive: Any, send: Any) -> bool:
        """Answer a request from a Host or Origin this server does not serve; True if refused."""
        origin = headers.get("origin")
        if self.guard.enable_dns_rebinding_protection:
            refused = await self._guard_check.validate_request(Request(scope), is_post=False)
            if refused is not None:
                what = f"Host {headers.get('host')!r}" if refused.status_code == 421 else f"Origin {origin!r}"
                await asgi.refuse(receive, send, refused.status_code,
                                  {"error": f"{what} is not allowed; call this server as http://127.0.0.1:PORT or "
                                            "http://localhost:PORT from this host"})
                return True
        elif origin is not None and urlsplit(origin).hostname not in self.origin_hosts:
            await asgi.refuse(receive, send, 403, {"error": f"Origin {origin!r} is not allowed; call from this host"})
            return True
        return False

    async def _serve_post(self, scope: dict[str, Any], receive: Any, send: Any, principal: Principal) -> None:
        body, trailing = await asgi.read_body(receive, framing.MAX_FRAME)
        if body is None:
            event = framing.Oversized(trailing or b"", -1)
            answer = framing.oversized_answer(event, is_direct_method=False)
            answer["error"]["message"] = f"payload_too_large: body exceeds {framing.MAX_FRAME} bytes"
            await asgi.respond(send, 413, answer)
            return
        try:
            message = json.loads(body)
        except (ValueError, RecursionError):  # RecursionError: 100,000 nested arrays
            message = None
        if not _scope_checkable(message):
            # Fail closed: the scope check reads the method from json.loads' view of the
            # body; a body it cannot read (or that is no single message) must not go on to
            # the SDK's own parser, which might read it differently and run it unchecked.
            await asgi.respond(send, 400, framing.error_message(
                None, framing.PARSE_ERROR,
                "parse error: the body is not one JSON-RPC message that json.loads reads, so its "
                "scope cannot be checked; send one JSON object (UTF-8, no BOM)"))
            return
        if isinstance(message, dict) and isinstance(message.get("method"), str):
            method, params = message["method"], message.get("params")
            needed = self.app.scope_for(method, params)
            if needed is not None and not principal.grants(needed):
                why = f"token {principal.name!r} lacks scope {needed!r}, which {_what(method, params)} needs"
                refused = {"error": {"code": "PERMISSION_DENIED", "message": why, "details": {"scope": needed}}}
                request_id = message.get("id") if framing.is_valid_id(message.get("id")) else None
                await asgi.respond(send, 403, framing.error_message(request_id, TOOL_ERROR, why, refused),
                                   [insufficient_scope(needed)])
                return
            problem = framing.call_params_problem(method, params)
            if problem is not None and framing.is_valid_id(message.get("id")):
                await asgi.respond(send, 200, framing.error_message(message["id"], framing.INVALID_PARAMS, problem))
                return
            # The call's place in a capsule's line is taken now, as it is read, and handed
            # to it (CcwServer.arrive); one it never claims is given back once answered.
            ticket = self.app.arrive(method, params)
            try:
                if self.app.is_direct_method(method):
                    await self._serve_direct(message, method, params, send, principal.name, ticket)
                    return
                scope[ARRIVAL_KEY] = ticket  # the handler's ctx.request.scope (turns.arrived_ticket)
                await self.manager.handle_request(scope, asgi.replay(body, receive), send)
            finally:
                self.app.runtime.capsule_queue.give_back(ticket)
            return
        await self.manager.handle_request(scope, asgi.replay(body, receive), send)

    async def _serve_direct(self, message: dict[str, Any], method: str, params: Any, send: Any,
                            owner: str, ticket: Ticket | None) -> None:
        # A direct method (a tool called by name) is answered here; the SDK does not know it.
        if "id" not in message:
            await asgi.respond(send, 202, None)
            return
        if not framing.is_valid_id(message["id"]):
            await asgi.respond(send, 400, framing.error_message(
                None, framing.INVALID_REQUEST, "id must be a string or a finite number"))
            return
        # The token's name: a long run it starts is its own (capsules/run.py).
        await asgi.respond(send, 200, await self.app.run_direct(message["id"], method, params, owner, ticket))


def _scope_checkable(message: Any) -> bool:
    """Whether the scope check can judge ``message``: a request or notification with a
    string method, or a response to the server (no method, needs no scope)."""
    return isinstance(message, dict) and (isinstance(message.get("method"), str) or "method" not in message)


def _user(principal: Principal) -> AuthenticatedUser:
    """The SDK's user for a request of ``principal``: the token's name as ``client_id`` (whose
    runs and tasks, tasks.token_name), the credential's key as ``subject`` (whose sessions)."""
    return AuthenticatedUser(AccessToken(token="-", client_id=principal.name, scopes=sorted(principal.scopes),
                                         subject=principal.key))


def _what(method: str, params: Any) -> str:
    if method == "tools/call" and isinstance(params, dict):
        return f"tool {params.get('name')!r}"
    return f"method {method!r}"


async def serve(
    app: CcwServer, draining: trio.Event, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve Streamable HTTP on CCW_HTTP_ADDR until ``draining``."""
    config = app.config
    sock = bind_http(config.http_addr, bool(config.tokens_file))
    try:
        tokens = TokenFile.for_server(config.tokens_file, config.state_dir)
    except BaseException:
        sock.close()
        raise
    try:
        await _serve_on(app, sock, tokens, draining, task_status)
    finally:
        tokens.close()


async def _serve_on(app: CcwServer, sock: socket.socket, tokens: TokenFile, draining: trio.Event,
                    task_status: trio.TaskStatus[str]) -> None:
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}{MCP_PATH}"
    manager = StreamableHTTPSessionManager(
        app=app.sdk,
        # ccw's layer already ran the same check (host_guard) on every request, direct
        # methods included, before any token or body handling: not repeated here.
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
        max_request_body_size=framing.MAX_FRAME + 1,
        session_idle_timeout=SESSION_IDLE_S,
    )
    hconfig = HypercornConfig()
    hconfig.bind = [f"fd://{sock.detach()}"]
    hconfig.graceful_timeout = GRACEFUL_S
    hconfig.accesslog = None
    hconfig.errorlog = logging.getLogger("hypercorn.error")  # through ccw's handler (logs.py)
    http_app = CcwHttpApp(app, manager, tokens, host, port)
    async with trio.open_nursery() as nursery, manager.run():
        await nursery.start(_hypercorn, http_app, hconfig, draining)
        nursery.start_soon(http_app.keep_tokens)
        made = " (generated; ccw client-config CLIENT --http HOST:PORT prints it)" if tokens.generated else ""
        LOGGER.info(f"mcp:http listening on {url} auth=bearer tokens={tokens.path}{made}")
        task_status.started(url)
        await draining.wait()
        # hypercorn has stopped accepting; let requests in flight finish, then cut the
        # long-lived GET streams and end the sessions, so hypercorn's graceful wait
        # does not sit on them.
        await http_app.idle()
        http_app.close_streams()


async def _hypercorn(
    http_app: CcwHttpApp, hconfig: HypercornConfig, draining: trio.Event,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    await hypercorn_serve(http_app, hconfig, shutdown_trigger=draining.wait, task_status=task_status)  # type: ignore[arg-type]

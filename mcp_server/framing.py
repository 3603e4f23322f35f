"""NDJSON framing for the stdio and unix-socket transports, sans-IO (h11's habit).

Bytes go in, events come out; the caller does the I/O.  It sits below the server, not
among the transports, because more than the transports frame JSON-RPC: the server
writes its text blocks with ``dumps``, a call's context finds the turn its transport
took by ``id_key``, and the ``ccw`` command is a client of the front end's socket.  It
imports nothing of the front end.  Seed 001 §3 sets the rules:

* One JSON-RPC message per line, ``\\n``-terminated (a trailing ``\\r`` is tolerated),
  UTF-8.  Blank lines are ignored.  Batches (JSON arrays) are refused.
* A frame over ``MAX_FRAME`` (1 MiB, not counting the newline) is rejected *before it
  is parsed*: the splitter stops buffering at the limit, discards the rest of the line
  and reports ``Oversized`` once the newline arrives.  Memory per connection is bounded
  by ``MAX_FRAME`` however long the line.  The connection keeps working.

How a rejected frame is answered (the choice seed 001 leaves open, written down here):
the id and method are recovered cheaply from the first ``HEAD_SCAN`` bytes by a tiny
scanner that looks only at top-level keys (``scan_head``).

* If the method is a direct method (a tool name, seed 001 style), the answer is an
  ordinary JSON-RPC *result* carrying seed 001's shape, exactly what a seed 001 tool
  returns: ``{"ok": false, "reason": "validation_failed", "errors": [{"path": "",
  "msg": "payload_too_large"}]}``.
* Otherwise (an MCP method, or nothing recoverable) it is a JSON-RPC *error*,
  code -32600, message ``payload_too_large: …``, whose ``data`` is that same seed shape,
  so MCP clients see a failed request rather than a malformed result.
* The ``id`` is the recovered one, or ``null`` when none was found in the head.

Either way the answer takes the rejected request's place in the per-connection
response order.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import pydantic_core

MAX_FRAME = 1 << 20  # seed 001: 1 MiB per request, UTF-8 bytes
HEAD_SCAN = 4096  # bytes of an oversized frame kept to recover its id and method

# JSON-RPC 2.0's own codes (the MCP SDK's mcp.types holds the same numbers; tests/test_names.py
# checks they agree), here so that a client that does not load the SDK (ccw) names them too.
PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
# Not run, retry it: a request a draining server read too late (server.py), or one a
# relay could not deliver because its front end stopped (transports/relay.py).
SHUTTING_DOWN = -32001

PAYLOAD_TOO_LARGE: dict[str, Any] = {
    "ok": False,
    "reason": "validation_failed",
    "errors": [{"path": "", "msg": "payload_too_large"}],
}


@dataclass(frozen=True)
class Line:
    """One complete frame (without its newline), at most MAX_FRAME bytes."""

    data: bytes


@dataclass(frozen=True)
class Oversized:
    """A frame over MAX_FRAME was discarded; ``head`` is its first HEAD_SCAN bytes."""

    head: bytes
    size: int


Event = Line | Oversized


class LineSplitter:
    """Split a byte stream into ``Line`` and ``Oversized`` events with bounded memory."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buffer = bytearray()
        self._discarding = False  # inside an oversized line, waiting for its newline
        self._head = b""
        self._dropped = 0

    def feed(self, data: bytes | bytearray) -> list[Event]:
        """Consume ``data``; return the events it completes."""
        events: list[Event] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            chunk = data[start:end]
            if self._discarding:
                # Top the head up to HEAD_SCAN, so it does not depend on how the line
                # was chunked (it matters when max_frame < HEAD_SCAN).
                self._head += chunk[: HEAD_SCAN - len(self._head)]
                self._dropped += len(chunk)
            elif len(self._buffer) + len(chunk) > self.max_frame + 1:
                # +1 leaves room for a trailing \r that is not part of the frame.
                self._discarding = True
                whole = bytes(self._buffer) + chunk
                self._head = whole[:HEAD_SCAN]
                self._dropped = len(whole)
                self._buffer.clear()
            else:
                self._buffer += chunk
            if newline < 0:
                break
            events.extend(self._end_line())
            start = newline + 1
        return events

    def _end_line(self) -> list[Event]:
        if self._discarding:
            event: Event = Oversized(self._head, self._dropped)
            self._discarding, self._head, self._dropped = False, b"", 0
            return [event]
        frame = bytes(self._buffer)
        self._buffer.clear()
        if frame.endswith(b"\r"):
            frame = frame[:-1]
        if len(frame) > self.max_frame:
            return [Oversized(frame[:HEAD_SCAN], len(frame))]
        if not frame.strip():
            return []
        return [Line(frame)]

    @property
    def buffered(self) -> int:
        """Bytes held for an unfinished line (never more than max_frame + 1)."""
        return len(self._buffer)


# --- what a frame is -----------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A JSON-RPC request: it gets exactly one answer, in order."""

    id: str | int | float
    method: str
    params: Any
    message: dict[str, Any]


@dataclass(frozen=True)
class Notification:
    """A JSON-RPC notification (cancellation included): handled at once, never answered."""

    method: str
    message: dict[str, Any]


@dataclass(frozen=True)
class Response:
    """A client's answer to a server-initiated request (roots/list, ping)."""

    id: str | int | None
    message: dict[str, Any]


@dataclass(frozen=True)
class Invalid:
    """A frame that cannot be served; ``answer`` is the JSON-RPC message to send back."""

    answer: dict[str, Any]


Frame = Request | Notification | Response | Invalid


def error_message(id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response."""
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": error}


def call_params_problem(method: str, params: Any) -> str | None:
    """What is wrong with a ``tools/call``'s params, said so a model can resend it, or None.

    The SDK answers these "Invalid request parameters" with no data; a model that sent its
    arguments as JSON text (a string holding an object), as some do, learns nothing from it."""
    if method != "tools/call":
        return None
    if not isinstance(params, dict):
        return "tools/call takes params as an object: {\"name\": TOOL, \"arguments\": {...}}"
    if not isinstance(params.get("name"), str):
        return "tools/call params.name must be the tool's name, a string (tools/list names them)"
    arguments = params.get("arguments")
    if arguments is not None and not isinstance(arguments, dict):
        kind = "JSON text (a string)" if isinstance(arguments, str) else type(arguments).__name__
        return (f"tools/call params.arguments must be a JSON object, not {kind}: send the arguments "
                "as an object, e.g. {\"capsule_id\": \"cap_...\"}")
    return None


def result_message(id_: Any, result: Any) -> dict[str, Any]:
    """A JSON-RPC success response."""
    return {"jsonrpc": "2.0", "id": id_, "result": result}


def _valid_id(value: Any) -> bool:
    # Seed 001: ids are strings or numbers (not booleans, which Python calls ints).  1e400
    # parses as inf, which no JSON answer can carry back: not a usable id.
    if isinstance(value, float):
        return math.isfinite(value)
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def is_valid_id(value: Any) -> bool:
    """True for a JSON-RPC id that can name a request: a string or a number, not a bool."""
    return _valid_id(value)


def classify(data: bytes) -> Frame:
    """Parse one frame and say what it is; malformed input becomes ``Invalid``."""
    try:
        message = json.loads(data)
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, 4300-digit ints
        return Invalid(error_message(None, PARSE_ERROR, f"parse error: {exc}; send one JSON object per line"))
    if isinstance(message, list):
        return Invalid(error_message(None, INVALID_REQUEST, "batches are not supported; send one request per line"))
    if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
        return Invalid(error_message(None, INVALID_REQUEST, 'not a JSON-RPC 2.0 message; include "jsonrpc": "2.0"'))
    has_id = "id" in message
    id_ = message.get("id")
    method = message.get("method")
    if method is None and has_id and ("result" in message or "error" in message):
        return Response(id_ if _valid_id(id_) else None, message)
    if not isinstance(method, str):
        return Invalid(error_message(id_ if _valid_id(id_) else None, INVALID_REQUEST, "method must be a string"))
    if not has_id:
        return Notification(method, message)
    if not _valid_id(id_) or not isinstance(id_, str | int | float):
        return Invalid(error_message(None, INVALID_REQUEST, "id must be a string or a finite number"))
    return Request(id_, method, message.get("params"), message)


# --- recovering the id of a frame we refuse to parse -----------------------------


def scan_head(head: bytes) -> tuple[Any, str | None]:
    """Best-effort (id, method) from the start of a JSON object, top-level keys only.

    Stops at the first thing it does not understand; never raises.
    """
    text = head.decode("utf-8", errors="replace")
    decoder = json.JSONDecoder()
    found: dict[str, Any] = {}
    i = _skip_ws(text, 0)
    if i >= len(text) or text[i] != "{":
        return None, None
    i += 1
    while "id" not in found or "method" not in found:
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != '"':
            break
        try:
            key, i = decoder.raw_decode(text, i)
        except ValueError:
            break
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != ":":
            break
        i = _skip_ws(text, i + 1)
        if key in ("id", "method", "jsonrpc"):
            try:
                value, i = decoder.raw_decode(text, i)
            except ValueError:
                break
            found[key] = value
        else:
            i = _skip_value(text, i)
            if i < 0:
                break
        i = _skip_ws(text, i)
        if i >= len(text) or text[i] != ",":
            break
        i += 1
    id_ = found.get("id")
    method = found.get("method")
    return (id_ if _valid_id(id_) else None), (method if isinstance(method, str) else None)


def _skip_ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _skip_value(text: str, i: int) -> int:
    """Index just past the JSON value starting at ``i``, or -1 if the head ends first."""
    depth = 0
    in_string = False
    while i < len(text):
        c = text[i]
        if in_string:
            if c == "\\":
                i += 1
            elif c == '"':
                in_string = False
                if depth == 0:
                    return i + 1
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
            if depth < 0:
                return -1
        elif depth == 0 and c in ",}":
            return i
        i += 1
    return -1


def oversized_answer(event: Oversized, is_direct_method: bool) -> dict[str, Any]:
    """The JSON-RPC answer to an oversized frame (see the module docstring)."""
    id_, method = scan_head(event.head)
    if method is not None and is_direct_method:
        return result_message(id_, PAYLOAD_TOO_LARGE)
    return error_message(
        id_,
        INVALID_REQUEST,
        f"payload_too_large: frame of {event.size} bytes exceeds {MAX_FRAME}; split the request",
        PAYLOAD_TOO_LARGE,
    )


def encode(message: dict[str, Any]) -> bytes:
    """One frame: compact JSON and a newline (non-ASCII stays literal UTF-8)."""
    return dumps(message) + b"\n"


# --- JSON text, fast for large strings -------------------------------------------
#
# Some facts about encoding answers.  The stdlib encoder escapes a str one character at
# a time into a growing buffer, about 250 MB/s: a 10,000-line file read back (the tagged
# text once in structuredContent and once inside the JSON text block, 1.4 MB) spends
# 3 ms there per frame, more than reading and tagging the file.  pydantic-core's encoder
# (installed with the MCP SDK, which is built on pydantic) writes UTF-8 bytes directly,
# 4-5x as fast, and gives the same bytes as ``json.dumps(ensure_ascii=False,
# separators=(",", ":"))`` for plain JSON values, with three exceptions, all measured:
# floats with 1e-9 <= |x| < 1e-4 (``1e-7`` and ``0.00001`` where Python writes
# ``1e-07`` and ``1e-05``), values json.dumps refuses (sets, bytes, ...: pydantic
# encodes them), and lone surrogates (pydantic raises).  It cannot sort keys.  So a walk
# checks the value first: only exact dicts with str keys, lists, tuples, str, int, bool,
# None and floats outside that range take the fast path (sorted copies of the dicts when
# sorting); anything else, and values with many nodes (where the Python walk would cost
# more than the C encoder saves), take json.dumps.  Either way the bytes are the ones
# json.dumps would give.

FAST_MAX_NODES = 2048  # values with more nodes than this go to json.dumps whole
_FAST_MAX_DEPTH = 64  # deeper than any answer of ours; also ends the walk on a cycle
_FAST_INT = 1 << 63  # pydantic writes big ints as json.dumps does; stay well inside


class _NotPlain(Exception):
    """The value needs json.dumps (see the facts above)."""


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact JSON as UTF-8, byte for byte ``json.dumps(value, ensure_ascii=False,
    separators=(",", ":"), sort_keys=sort_keys)``; a lone surrogate is \\u-escaped."""
    try:
        plain = _plain(value, sort_keys, [FAST_MAX_NODES], 0)
    except _NotPlain:
        pass
    else:
        try:
            return pydantic_core.to_json(plain)
        except pydantic_core.PydanticSerializationError:
            pass  # a lone surrogate: json.dumps below escapes it
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys).encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate (a client's "\ud800" echoed back, say) has no UTF-8 form; JSON's
        # own \u escape carries it, as the client sent it.
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), sort_keys=sort_keys).encode("ascii")


def _plain(value: Any, sort_keys: bool, budget: list[int], depth: int) -> Any:
    """``value`` (with sorted dict copies when ``sort_keys``) if pydantic-core encodes it
    exactly as json.dumps does; raises ``_NotPlain`` otherwise."""
    budget[0] -= 1
    if budget[0] < 0 or depth > _FAST_MAX_DEPTH:
        raise _NotPlain
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if -_FAST_INT < value < _FAST_INT:
            return value
        raise _NotPlain
    if kind is float:
        if value == 0.0 or (math.isfinite(value) and abs(value) >= 1e-4):
            return value
        raise _NotPlain
    if kind is dict:
        if not all(type(key) is str for key in value):
            raise _NotPlain
        if sort_keys:
            return {key: _plain(value[key], sort_keys, budget, depth + 1) for key in sorted(value)}
        for item in value.values():
            _plain(item, sort_keys, budget, depth + 1)
        return value
    if kind is list or kind is tuple:
        if sort_keys:
            return [_plain(item, sort_keys, budget, depth + 1) for item in value]
        for item in value:
            _plain(item, sort_keys, budget, depth + 1)
        return value
    raise _NotPlain


# --- per-connection response order -----------------------------------------------


class ResponseOrder:
    """Answers leave in the order their requests arrived, whatever order they finish in.

    ``reserve`` a slot per request as it is read; ``fill`` it with the encoded answer
    (or ``drop`` it when the request settles unanswered, e.g. cancelled); ``fill`` and
    ``drop`` return the frames now due, oldest first.  Server-initiated messages
    (progress, roots/list) bypass this: they are not answers.
    """

    def __init__(self) -> None:
        self._next = 0  # next slot to reserve
        self._due = 0  # oldest slot not yet released
        self._done: dict[int, bytes | None] = {}
        self._by_id: dict[tuple[str, Any], list[int]] = {}

    def reserve(self, request_id: Any = None) -> int:
        """Take the next slot; with ``request_id``, remember it for ``fill_id``."""
        slot = self._next
        self._next += 1
        if request_id is not None:
            self._by_id.setdefault(id_key(request_id), []).append(slot)
        return slot

    def slot_for(self, request_id: Any) -> int | None:
        """The oldest open slot reserved for ``request_id``, without taking it."""
        slots = self._by_id.get(id_key(request_id))
        return slots[0] if slots else None

    def fill_id(self, request_id: Any, frame: bytes | None) -> list[bytes]:
        """Fill the oldest slot reserved for ``request_id``; an unknown id is sent at once."""
        slots = self._by_id.get(id_key(request_id))
        if not slots:
            return [frame] if frame is not None else []
        slot = slots.pop(0)
        if not slots:
            del self._by_id[id_key(request_id)]
        return self.fill(slot, frame)

    def fill(self, slot: int, frame: bytes | None) -> list[bytes]:
        """Record a slot's answer (None: no answer) and return the frames now due."""
        if slot < self._due or slot in self._done:
            return []
        self._done[slot] = frame
        released: list[bytes] = []
        while self._due in self._done:
            item = self._done.pop(self._due)
            if item is not None:
                released.append(item)
            self._due += 1
        return released

    def drop_id(self, request_id: Any) -> list[bytes]:
        """The request settled without an answer (cancelled): free its slot."""
        return self.fill_id(request_id, None) if self.slot_for(request_id) is not None else []

    @property
    def pending(self) -> int:
        """Requests read but not yet answered."""
        return self._next - self._due


def id_key(request_id: Any) -> tuple[str, Any]:
    """A dict key for a JSON-RPC id that keeps 1 and "1" apart."""
    return (type(request_id).__name__, request_id)

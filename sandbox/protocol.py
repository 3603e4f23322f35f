"""The helper's IPC protocol: sans-IO framing of requests, replies and progress reports.

Both halves import this module: the helper (``sandbox/server.py``) decodes requests and
encodes replies, the front end (``sandbox/client.py``) does the reverse.  Nothing here
touches a socket (h11's habit): callers feed bytes in and get messages out, so every
rule below is tested synchronously, and fuzzed, without I/O.

Wire format
    frame   = length (4 bytes, big-endian, unsigned) + body (``length`` bytes)
    body    = compact sorted JSON of one object (canonical JSON, the same bytes as
              ``mcp_server.core.canonical``), at most ``MAX_FRAME`` bytes
    request = {"id": int, "op": str, "args": {...}}
    reply   = {"id": int|null, "ok": true, "result": {...}}
            | {"id": int|null, "ok": false, "error": {"code", "message", "details"}}
    progress = {"id": int, "progress": {...}}, zero or more before an ``exec`` reply
              whose request asked for them (``progress_ms``)
    ``open_root``'s reply carries one descriptor (SCM_RIGHTS) with its first byte,
    ``net_open``'s three; an ``exec`` request with ``stdio: "tty"`` carries one (its
    terminal), and any other request none (``ops.attach_descriptors``).

What the decoder refuses, always as ``ProtocolError`` and never as anything else: a
length over ``MAX_FRAME`` (refused as soon as the header arrives, before buffering the
body), a frame cut short by EOF, a body that is not UTF-8, not JSON, not an object, has
duplicate keys (two readers could disagree on which one counts), NaN or infinities,
numbers that overflow, nesting too deep for the parser, lone surrogates, or an
envelope whose fields are missing, unknown or of the wrong type.  The decoder accepts
any strict JSON, not only canonical JSON: the sender's spelling is harmless, ambiguity
is not.

Op arguments are checked against the closed op table in ``sandbox/ops.py``, by the
helper, for every request, whoever sent it (bubblewrap: "in case something manages to
send hacked requests"); the front end's typed requests are checked there alone.  A
request whose envelope is sound but whose op or arguments are not gets an error reply
and the connection stays usable; a frame that cannot be decoded ends the connection.
"""

from __future__ import annotations

import json
import math
import socket
import struct
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sandbox import rawnames
from sandbox.errors import CcwError, ProtocolError

PROTOCOL_VERSION = 2  # 2: a hello's reply names its surface (sandbox/opsurface.py)
MAX_FRAME = 8 * 1024 * 1024  # bytes of one frame's body; replies are built to fit
HEADER = struct.Struct(">I")
MAX_ID = 2**53 - 1  # exact in every JSON reader

# Frames are compact sorted JSON, byte for byte what mcp_server.core.canonical writes
# (the front end's one serialisation for hashes); the helper keeps its own encoder so
# that it imports nothing of the front end.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _json_bytes(value: Any) -> bytes:
    return _ENCODER.encode(value).encode("utf-8")


# --- framing ----------------------------------------------------------------------------


def encode_frame(message: dict[str, Any]) -> bytes:
    """Length-prefix the canonical JSON of ``message``; over ``MAX_FRAME`` is TOO_LARGE."""
    try:
        body = _json_bytes(message)
    except UnicodeEncodeError:  # a lone surrogate: most often a file name that is not UTF-8
        text = _not_utf8(message)
        raise ProtocolError(
            f"message holds text that is not UTF-8: '{text}'; ccw carries names as UTF-8 text, so rename the file "
            "or directory whose name holds those bytes to a UTF-8 name", {"text": text}) from None
    except (TypeError, ValueError) as exc:  # NaN, non-JSON types
        raise ProtocolError(f"message is not encodable as canonical JSON: {exc}") from exc
    if len(body) > MAX_FRAME:
        raise ProtocolError(
            f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte frame limit; "
            "ask for less (lower output_cap, fewer paths)",
            {"size": len(body), "limit": MAX_FRAME},
            code="TOO_LARGE",
        )
    return HEADER.pack(len(body)) + body


def _not_utf8(value: Any) -> str:
    """The first string in ``value`` (keys too) that is not UTF-8, in ``rawnames.display`` form
    (each byte that is not UTF-8 written ``\\xff``); "" if there is none."""
    if isinstance(value, str):
        return "" if rawnames.carried(value) else rawnames.display(value)[:500]
    children = [*value, *value.values()] if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        found = _not_utf8(child)
        if found:
            return found
    return ""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]!r} overflows")
    return value


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)  # built in C; a key given twice leaves it shorter (a change list: 1,000 objects)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key[:80]!r}")
            seen.add(key)
    return obj


_DECODER = json.JSONDecoder(
    object_pairs_hook=_unique_object, parse_constant=_refuse_constant, parse_float=_finite_float
)


def decode_body(body: bytes) -> dict[str, Any]:
    """Parse one frame body into a JSON object, or raise ProtocolError."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(f"frame is not UTF-8: {exc.reason} at byte {exc.start}") from None
    try:
        value = _DECODER.decode(text)
    except RecursionError:
        raise ProtocolError("frame nests JSON too deeply") from None
    except ValueError as exc:  # JSONDecodeError, our hooks, int digit limit
        raise ProtocolError(f"frame is not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"frame holds a JSON {type(value).__name__}, not an object")
    if b"\\u" not in body:  # text decoded from UTF-8 holds a surrogate only where an escape wrote one
        return value
    try:
        # Lone surrogates (from \\ud800 escapes) parse but cannot be re-encoded as UTF-8.
        _json_bytes(value)
    except (ValueError, UnicodeEncodeError, RecursionError) as exc:
        raise ProtocolError(f"frame holds text that is not valid Unicode: {exc}") from None
    return value


@dataclass(frozen=True)
class Request:
    """One decoded request; ``args`` are checked by ``validate_args`` separately."""

    id: int
    op: str
    args: dict[str, Any]


@dataclass(frozen=True)
class Reply:
    """One decoded reply: ``result`` when ok, else ``error``."""

    id: int | None
    ok: bool
    result: dict[str, Any] | None = None
    error: CcwError | None = None
    progress: dict[str, Any] | None = None  # an interim report; the reply proper follows


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON's true is not 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_id(value: Any, nullable: bool) -> int | None:
    """A request id in [0, MAX_ID] (or None where ``nullable``), else ProtocolError."""
    if value is None and nullable:
        return None
    if not is_int(value) or not 0 <= value <= MAX_ID:
        raise ProtocolError(f"'id' must be an integer in [0, {MAX_ID}], got {value!r:.80}")
    return int(value)


def check_keys(obj: dict[str, Any], required: set[str], allowed: set[str], what: str) -> None:
    """Refuse an object that lacks a required key or has one not allowed."""
    missing = required - obj.keys()
    unknown = obj.keys() - allowed
    if missing:
        raise ProtocolError(f"{what} lacks {sorted(missing)}")
    if unknown:
        raise ProtocolError(f"{what} has unknown fields {sorted(k[:80] for k in unknown)}")


def parse_request(message: dict[str, Any]) -> Request:
    """Check a request envelope (not its arguments) and return it."""
    check_keys(message, {"id", "op", "args"}, {"id", "op", "args"}, "request")
    request_id = check_id(message["id"], nullable=False)
    assert request_id is not None
    if not isinstance(message["op"], str):
        raise ProtocolError("request 'op' must be a string")
    if not isinstance(message["args"], dict):
        raise ProtocolError("request 'args' must be an object")
    return Request(request_id, message["op"], message["args"])


def parse_reply(message: dict[str, Any]) -> Reply:
    """Check a reply envelope and return it; an error reply's error becomes a CcwError."""
    if "progress" in message and "ok" not in message:
        check_keys(message, {"id", "progress"}, {"id", "progress"}, "progress report")
        progress_id = check_id(message["id"], nullable=False)
        if not isinstance(message["progress"], dict):
            raise ProtocolError("progress report 'progress' must be an object")
        return Reply(progress_id, True, progress=message["progress"])
    ok = message.get("ok")
    if not isinstance(ok, bool):
        raise ProtocolError("reply 'ok' must be a boolean")
    body = "result" if ok else "error"
    check_keys(message, {"id", "ok", body}, {"id", "ok", body}, "reply")
    reply_id = check_id(message["id"], nullable=True)
    if not isinstance(message[body], dict):
        raise ProtocolError(f"reply '{body}' must be an object")
    if ok:
        return Reply(reply_id, True, result=message["result"])
    error = message["error"]
    check_keys(error, {"code", "message"}, {"code", "message", "details"}, "reply error")
    if not isinstance(error["code"], str) or not isinstance(error["message"], str):
        raise ProtocolError("reply error 'code' and 'message' must be strings")
    if not isinstance(error.get("details", {}), dict):
        raise ProtocolError("reply error 'details' must be an object")
    return Reply(reply_id, False, error=CcwError.from_dict(error))


class FrameDecoder:
    """Turn a byte stream into messages; feed whole chunks or single bytes alike.

    ``kind`` is "request" (the helper's side), "reply" (the front end's side) or "raw"
    (plain JSON objects).  After a ``ProtocolError`` from framing (oversize, truncation)
    the decoder refuses all further input, since the stream's boundaries are lost.
    """

    def __init__(self, kind: str = "request") -> None:
        if kind not in ("request", "reply", "raw"):
            raise ValueError(f"unknown decoder kind {kind!r}")
        self.kind = kind
        self._buffer = bytearray()
        self._broken: ProtocolError | None = None
        self._eof = False

    def feed(self, data: bytes) -> None:
        """Append bytes received from the peer."""
        if self._eof and data:
            raise ProtocolError("data fed after EOF")
        self._buffer += data

    def feed_eof(self) -> None:
        """The peer closed its end; a partial frame left in the buffer is an error."""
        self._eof = True

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as a message."""
        return len(self._buffer)

    def next_message(self) -> Any:
        """The next complete message, or None when more bytes are needed (or at clean EOF)."""
        if self._broken is not None:
            raise self._broken
        if len(self._buffer) >= HEADER.size:
            (length,) = HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME:
                self._broken = ProtocolError(
                    f"frame announces {length} bytes, over the {MAX_FRAME}-byte limit",
                    {"size": length, "limit": MAX_FRAME},
                    code="TOO_LARGE",
                )
                raise self._broken
            end = HEADER.size + length
            if len(self._buffer) >= end:
                body = bytes(self._buffer[HEADER.size : end])
                del self._buffer[:end]
                return self._parse(body)
        if self._eof and self._buffer:
            self._broken = ProtocolError(
                f"connection closed inside a frame ({len(self._buffer)} bytes pending)"
            )
            raise self._broken
        return None

    def messages(self) -> Iterator[Any]:
        """Every complete message buffered so far."""
        while (message := self.next_message()) is not None:
            yield message

    def _parse(self, body: bytes) -> Any:
        message = decode_body(body)
        if self.kind == "request":
            return parse_request(message)
        if self.kind == "reply":
            return parse_reply(message)
        return message


def descriptors_of(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors of the SCM_RIGHTS messages in a ``recvmsg``'s ancillary data, in order."""
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True) for i in range(0, usable, 4))
    return fds


def encode_reply(request_id: int | None, result: dict[str, Any]) -> bytes:
    """A success reply frame."""
    return encode_frame({"id": request_id, "ok": True, "result": result})


def encode_progress(request_id: int, progress: dict[str, Any]) -> bytes:
    """An interim progress report for a running request."""
    return encode_frame({"id": request_id, "progress": progress})


def encode_error(request_id: int | None, error: CcwError) -> bytes:
    """An error reply frame; details that cannot be encoded are dropped, never the error."""
    try:
        return encode_frame({"id": request_id, "ok": False, "error": error.to_dict()})
    except ProtocolError:
        bare = {"code": error.code, "message": error.message[:4096], "details": {}}
        return encode_frame({"id": request_id, "ok": False, "error": bare})

"""The helper's IPC protocol: sans-IO framing and the closed set of operations.

Both halves import this module: the helper (``sandbox/server.py``) decodes requests and
encodes replies, the front end (``mcp_server/helper.py``) does the reverse.  Nothing here
touches a socket (h11's habit): callers feed bytes in and get messages out, so every
rule below is tested synchronously, and fuzzed, without I/O.

Wire format
    frame   = length (4 bytes, big-endian, unsigned) + body (``length`` bytes)
    body    = canonical JSON of one object (``mcp_server.core.canonical``), at most
              ``MAX_FRAME`` bytes
    request = {"id": int, "op": str, "args": {...}}
    reply   = {"id": int|null, "ok": true, "result": {...}}
            | {"id": int|null, "ok": false, "error": {"code", "message", "details"}}
    progress = {"id": int, "progress": {...}}, zero or more before an ``exec`` reply
              whose request asked for them (``progress_ms``)
    ``open_root``'s reply carries one descriptor (SCM_RIGHTS) with its first byte.

What the decoder refuses, always as ``ProtocolError`` and never as anything else: a
length over ``MAX_FRAME`` (refused as soon as the header arrives, before buffering the
body), a frame cut short by EOF, a body that is not UTF-8, not JSON, not an object, has
duplicate keys (two readers could disagree on which one counts), NaN or infinities,
numbers that overflow, nesting too deep for the parser, lone surrogates, or an
envelope whose fields are missing, unknown or of the wrong type.  The decoder accepts
any strict JSON, not only canonical JSON: the sender's spelling is harmless, ambiguity
is not.

Op arguments are checked by ``validate_args`` against ``OPS``, the closed table below;
the helper re-checks every argument even though the front end checked it already
(bubblewrap: "in case something manages to send hacked requests").  A request whose
envelope is sound but whose op or arguments are not gets an error reply and the
connection stays usable; a frame that cannot be decoded ends the connection.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mcp_server.core.canonical import canonical_json
from sandbox.errors import CcwError

PROTOCOL_VERSION = 1
MAX_FRAME = 8 * 1024 * 1024  # bytes of one frame's body; replies are built to fit
HEADER = struct.Struct(">I")

# Bounds on arguments.  They are generous for real use and small enough that no single
# request can make the helper allocate without limit.
MAX_PATH = 4096  # PATH_MAX
MAX_ARGV = 4096  # entries
MAX_ARG_BYTES = 2 * 1024 * 1024  # all argv + env strings together, like ARG_MAX
MAX_ENV = 1024  # entries
MAX_STDIN = 4 * 1024 * 1024  # decoded bytes
MAX_OUTPUT_CAP = 2 * 1024 * 1024  # per stream; two base64 streams still fit one frame
MAX_TIMEOUT_MS = 24 * 3600 * 1000
MAX_CLOCK_OFFSET_SEC = 100 * 366 * 86400
MAX_ID = 2**53 - 1  # exact in every JSON reader
NETWORKS = ("none",)
DISK_MB_MIN = 32  # a capsule disk smaller than this is mostly ext4's own metadata
DISK_MB_MAX = 1 << 24  # 16 TiB: ext4's limit with 4 KiB blocks

CAPSULE_ID_RE = re.compile(r"cap_[A-Za-z0-9_]{1,100}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")


class ProtocolError(CcwError):
    """A frame or request that breaks the protocol; ``code`` is INVALID_ARGUMENT or TOO_LARGE."""

    def __init__(
        self, message: str, details: dict[str, Any] | None = None, code: str = "INVALID_ARGUMENT"
    ) -> None:
        super().__init__(code, message, details)


# --- framing ----------------------------------------------------------------------------


def encode_frame(message: dict[str, Any]) -> bytes:
    """Length-prefix the canonical JSON of ``message``; over ``MAX_FRAME`` is TOO_LARGE."""
    try:
        body = canonical_json(message)
    except (TypeError, ValueError) as exc:  # NaN, lone surrogates, non-JSON types
        raise ProtocolError(f"message is not encodable as canonical JSON: {exc}") from exc
    if len(body) > MAX_FRAME:
        raise ProtocolError(
            f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte frame limit; "
            "ask for less (lower output_cap, fewer paths)",
            {"size": len(body), "limit": MAX_FRAME},
            code="TOO_LARGE",
        )
    return HEADER.pack(len(body)) + body


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:40]!r} overflows")
    return value


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key[:80]!r}")
        obj[key] = value
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
    try:
        # Lone surrogates (from \\ud800 escapes) parse but cannot be re-encoded as UTF-8.
        canonical_json(value)
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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_id(value: Any, nullable: bool) -> int | None:
    if value is None and nullable:
        return None
    if not _is_int(value) or not 0 <= value <= MAX_ID:
        raise ProtocolError(f"'id' must be an integer in [0, {MAX_ID}], got {value!r:.80}")
    return int(value)


def _check_keys(obj: dict[str, Any], required: set[str], allowed: set[str], what: str) -> None:
    missing = required - obj.keys()
    unknown = obj.keys() - allowed
    if missing:
        raise ProtocolError(f"{what} lacks {sorted(missing)}")
    if unknown:
        raise ProtocolError(f"{what} has unknown fields {sorted(k[:80] for k in unknown)}")


def parse_request(message: dict[str, Any]) -> Request:
    """Check a request envelope (not its arguments) and return it."""
    _check_keys(message, {"id", "op", "args"}, {"id", "op", "args"}, "request")
    request_id = _check_id(message["id"], nullable=False)
    assert request_id is not None
    if not isinstance(message["op"], str):
        raise ProtocolError("request 'op' must be a string")
    if not isinstance(message["args"], dict):
        raise ProtocolError("request 'args' must be an object")
    return Request(request_id, message["op"], message["args"])


def parse_reply(message: dict[str, Any]) -> Reply:
    """Check a reply envelope and return it; an error reply's error becomes a CcwError."""
    if "progress" in message and "ok" not in message:
        _check_keys(message, {"id", "progress"}, {"id", "progress"}, "progress report")
        progress_id = _check_id(message["id"], nullable=False)
        if not isinstance(message["progress"], dict):
            raise ProtocolError("progress report 'progress' must be an object")
        return Reply(progress_id, True, progress=message["progress"])
    ok = message.get("ok")
    if not isinstance(ok, bool):
        raise ProtocolError("reply 'ok' must be a boolean")
    body = "result" if ok else "error"
    _check_keys(message, {"id", "ok", body}, {"id", "ok", body}, "reply")
    reply_id = _check_id(message["id"], nullable=True)
    if not isinstance(message[body], dict):
        raise ProtocolError(f"reply '{body}' must be an object")
    if ok:
        return Reply(reply_id, True, result=message["result"])
    error = message["error"]
    _check_keys(error, {"code", "message"}, {"code", "message", "details"}, "reply error")
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


def encode_request(request_id: int, op: str, args: dict[str, Any]) -> bytes:
    """A request frame; the arguments are validated here as well as in the helper."""
    _check_id(request_id, nullable=False)
    validate_args(op, args)
    return encode_frame({"id": request_id, "op": op, "args": args})


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


# --- argument checking -------------------------------------------------------------------

Check = Callable[[str, Any], Any]


def _fail(name: str, why: str) -> ProtocolError:
    return ProtocolError(f"argument {name!r} {why}", {"argument": name})


def _int(lo: int, hi: int) -> Check:
    def check(name: str, value: Any) -> Any:
        if not _is_int(value) or not lo <= value <= hi:
            raise _fail(name, f"must be an integer in [{lo}, {hi}]")
        return value

    return check


def _text(name: str, value: Any, limit: int) -> str:
    if not isinstance(value, str):
        raise _fail(name, "must be a string")
    if "\x00" in value:
        raise _fail(name, "must not contain NUL")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise _fail(name, f"is longer than {limit} bytes")
    return value


def _abs_path(name: str, value: Any) -> Any:
    _text(name, value, MAX_PATH)
    if not value.startswith("/"):
        raise _fail(name, "must be an absolute path")
    return value


def _nullable(check: Check) -> Check:
    def nullable(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return nullable


def _capsule_id(name: str, value: Any) -> Any:
    if not isinstance(value, str) or not CAPSULE_ID_RE.fullmatch(value):
        raise _fail(name, "must be a capsule id such as 'cap_0001700000000000_1a2b'")
    return value


def _enum(*choices: str) -> Check:
    def check(name: str, value: Any) -> Any:
        if value not in choices:
            raise _fail(name, f"must be one of {list(choices)}")
        return value

    return check


def _env_names(name: str, value: Any) -> Any:
    if not isinstance(value, list) or len(value) > MAX_ENV:
        raise _fail(name, f"must be a list of at most {MAX_ENV} variable names")
    for item in value:
        if not isinstance(item, str) or not ENV_NAME_RE.fullmatch(item):
            raise _fail(name, f"holds {item!r:.80}, not an environment variable name")
    return value


def _env(name: str, value: Any) -> Any:
    if not isinstance(value, dict) or len(value) > MAX_ENV:
        raise _fail(name, f"must be an object of at most {MAX_ENV} variables")
    total = 0
    for key, item in value.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise _fail(name, f"holds {key!r:.80}, not an environment variable name")
        total += len(key) + len(_text(f"{name}.{key}", item, MAX_ARG_BYTES)) + 2
    if total > MAX_ARG_BYTES:
        raise _fail(name, f"is larger than {MAX_ARG_BYTES} bytes")
    return value


def _argv(name: str, value: Any) -> Any:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_ARGV:
        raise _fail(name, f"must be a list of 1 to {MAX_ARGV} strings")
    total = sum(len(_text(name, item, MAX_ARG_BYTES)) + 1 for item in value)
    if total > MAX_ARG_BYTES:
        raise _fail(name, f"is larger than {MAX_ARG_BYTES} bytes")
    if value[0] == "":
        raise _fail(name, "must start with a program name")
    return value


def _base64(limit: int) -> Check:
    def check(name: str, value: Any) -> Any:
        if not isinstance(value, str) or len(value) > (limit + 2) // 3 * 4:
            raise _fail(name, f"must be base64 text of at most {limit} decoded bytes")
        try:
            base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise _fail(name, "is not valid base64") from None
        return value

    return check


_LIMIT_FIELDS: dict[str, Check] = {
    "memory_mb": _int(1, 1 << 20),
    "pids_max": _int(1, 1 << 22),
    "cpu_ms": _int(1, MAX_TIMEOUT_MS),
    "disk_mb": _int(DISK_MB_MIN, DISK_MB_MAX),
}


def _limits(name: str, value: Any) -> Any:
    if not isinstance(value, dict):
        raise _fail(name, "must be an object")
    _check_keys(value, set(), set(_LIMIT_FIELDS), f"argument {name!r}")
    for key, item in value.items():
        _LIMIT_FIELDS[key](f"{name}.{key}", item)
    return value


@dataclass(frozen=True)
class OpSpec:
    """One operation of the closed set: its arguments and why serving it is safe."""

    name: str
    required: dict[str, Check]
    optional: dict[str, Check] = field(default_factory=dict)
    safety: str = ""


def _op(name: str, safety: str, required: dict[str, Check], optional: dict[str, Check] | None = None) -> OpSpec:
    return OpSpec(name, required, optional or {}, " ".join(safety.split()))


# The closed op set (bubblewrap's PrivSepOp).  The helper serves these and nothing else.
# Every op that names a capsule is authorised against the capsule's owner uid, which the
# helper takes from SO_PEERCRED, never from the request.
OPS: dict[str, OpSpec] = {
    op.name: op
    for op in (
        _op(
            "hello",
            """Reads nothing but constants: the protocol version, the helper's mode and the
            mechanisms in force.  No state is touched.""",
            {"version": _int(0, 1 << 31)},
        ),
        _op(
            "create",
            """Mounts an overlay whose lower layer is a directory the caller can already
            write (checked against the peer's uid/gid), so the capsule grants no access the
            caller lacks; upper/work dirs live under the helper's state dir with names the
            helper chooses.  Paths are absolute, bounded and NUL-free; network is a closed
            enum; limits are bounded integers that only restrict.""",
            {"workspace": _abs_path},
            {
                "base": _nullable(_abs_path),
                "clock_offset_sec": _int(-MAX_CLOCK_OFFSET_SEC, MAX_CLOCK_OFFSET_SEC),
                "env_whitelist": _env_names,
                "limits": _limits,
                "network": _enum(*NETWORKS),
            },
        ),
        _op(
            "exec",
            """Runs argv in a fresh jail (mount, pid, net, uts, ipc, cgroup namespaces) as the
            caller's own uid/gid with no capabilities and no_new_privs, so the command can do
            nothing the caller could not do outside, and less.  Only the caller's own
            capsules.  Sizes of argv, env, stdin, output and time are bounded.""",
            {"capsule_id": _capsule_id, "argv": _argv},
            {
                "cwd": _nullable(_abs_path),
                "env": _env,
                "stdin_b64": _nullable(_base64(MAX_STDIN)),
                "timeout_ms": _int(1, MAX_TIMEOUT_MS),
                "limits": _limits,
                "output_cap": _int(0, MAX_OUTPUT_CAP),
                "progress_ms": _int(100, 60_000),
            },
        ),
        _op(
            "changes",
            """Reads the upper dir of the caller's own capsule: names, types, modes, sizes,
            symlink targets (read with readlink, never followed).  No file content.""",
            {"capsule_id": _capsule_id},
        ),
        _op(
            "fork",
            """Creates a capsule stacked on one the caller owns; the child sees exactly what
            the parent sees and belongs to the same caller.""",
            {"capsule_id": _capsule_id},
        ),
        _op(
            "open_root",
            """Passes an O_PATH directory descriptor of the merged view of the caller's own
            capsule.  O_PATH grants no read or write by itself; every open through it is
            checked by the kernel against the caller's own credentials, and the front end
            resolves beneath it (openat2 RESOLVE_BENEATH).""",
            {"capsule_id": _capsule_id},
        ),
        _op(
            "destroy",
            """Unmounts and deletes the caller's own capsule, whose files live only under the
            helper's state dir; the workspace (the lower layer) is never written.""",
            {"capsule_id": _capsule_id},
        ),
        _op(
            "list",
            """Lists the caller's own capsules (ids, workspaces, parents, times); other
            callers' capsules are not shown.""",
            {},
        ),
    )
}


def validate_args(op: str, args: Any) -> dict[str, Any]:
    """Check ``args`` against ``op``'s schema: types, required/optional, bounds, no unknown keys."""
    spec = OPS.get(op) if isinstance(op, str) else None
    if spec is None:
        raise ProtocolError(
            f"unknown op {op!r:.80}; the helper serves {sorted(OPS)}", {"op": str(op)[:80]}
        )
    if not isinstance(args, dict):
        raise ProtocolError(f"{op}: args must be an object")
    _check_keys(args, set(spec.required), set(spec.required) | set(spec.optional), f"{op} args")
    for key, value in args.items():
        check = spec.required.get(key) or spec.optional[key]
        check(key, value)
    return args

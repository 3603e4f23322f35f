"""The protocol's argument checks, and the bounds they hold every request to.

Each check is a function ``(name, value) -> value`` that returns what it was given or
raises a ``ProtocolError`` (INVALID_ARGUMENT) naming the argument, and the combinators
here (``int_in``, ``nullable``, ``one_of``, ``base64_text``) build checks from bounds.
``sandbox/ops.py`` builds its closed op table from them, ``sandbox/spec.py`` the capsule
spec's fields, and the front end its own documents' fields (a bot's marker, a witness),
so a value read from a request, a file or a tool call obeys the same bounds.

Capsule ids: the helper generates ``cap_<13-digit ms>_<8 hex>``; everyone validates
with the one wider grammar ``CAPSULE_ID_RE``, so an id is never refused for a detail
of how it was made.
"""

from __future__ import annotations

import base64
import binascii
import re
import stat
from collections.abc import Callable
from typing import Any

from sandbox import rawnames
from sandbox.errors import ProtocolError
from sandbox.protocol import check_keys, is_int

CAPSULE_ID_RE = re.compile(r"cap_[0-9A-Za-z_]{1,64}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
# A service's name within its capsule (the front end's tools take the same grammar).
SERVICE_NAME_RE = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")

# Bounds on arguments.  They are generous for real use and small enough that no single
# request can make the helper allocate without limit.
MAX_PATH = 4096  # PATH_MAX
MAX_ARGV = 4096  # entries
MAX_ARG_BYTES = 2 * 1024 * 1024  # all argv + env strings together, like ARG_MAX
MAX_ENV = 1024  # entries
MAX_STDIN = 4 * 1024 * 1024  # decoded bytes
MAX_OUTPUT_CAP = 2 * 1024 * 1024  # per stream; two base64 streams still fit one frame
MAX_TIMEOUT_MS = 24 * 3600 * 1000
MAX_PORT = 65535
MAX_CLOCK_OFFSET_SEC = 100 * 366 * 86400
MAX_BINDS = 64  # directories a capsule shows besides its workspace (exposed toolchains, git dirs)
MAX_DONORS = 8  # capsules whose layers one fork stacks besides its parent's (a merge's other inputs)
DISK_MB_MIN = 32  # a capsule disk smaller than this is mostly ext4's own metadata
DISK_MB_MAX = 1 << 24  # 16 TiB: ext4's limit with 4 KiB blocks


# --- the checks -------------------------------------------------------------------------

Check = Callable[[str, Any], Any]


def fail(name: str, why: str) -> ProtocolError:
    """The error for argument ``name``: INVALID_ARGUMENT, with the name in the details."""
    return ProtocolError(f"argument {name!r} {why}", {"argument": name})


def int_in(lo: int, hi: int) -> Check:
    """A check for an integer in [lo, hi]."""

    def check(name: str, value: Any) -> Any:
        if not is_int(value) or not lo <= value <= hi:
            raise fail(name, f"must be an integer in [{lo}, {hi}]")
        return value

    return check


def text(name: str, value: Any, limit: int) -> str:
    """UTF-8 text without NUL of at most ``limit`` bytes."""
    if not isinstance(value, str):
        raise fail(name, "must be a string")
    if "\x00" in value:
        raise fail(name, "must not contain NUL")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        # A lone surrogate: a byte that is not UTF-8 (a command line's, surrogateescape) or a JSON
        # "\ud800" escape.  No exec can be given it, and the journal keeps argv as UTF-8 text.
        raise fail(name, f"holds {rawnames.display(value)[:200]!r}, which is not UTF-8 text; send UTF-8 "
                   "(make other bytes in the jail, e.g. sh -c with printf '\\377')") from None
    if size > limit:
        raise fail(name, f"is longer than {limit} bytes")
    return value


def abs_path(name: str, value: Any) -> Any:
    """An absolute path of at most MAX_PATH bytes, without NUL."""
    text(name, value, MAX_PATH)
    if not value.startswith("/"):
        raise fail(name, "must be an absolute path")
    return value


def nullable(check: Check) -> Check:
    """``check``, or None."""

    def nullable_check(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return nullable_check


def one_of(*choices: str) -> Check:
    """A check for one of a closed set of strings."""

    def check(name: str, value: Any) -> Any:
        if value not in choices:
            raise fail(name, f"must be one of {list(choices)}")
        return value

    return check


def kind_of(mode: int) -> str:
    """``file`` | ``dir`` | ``symlink`` | ``other`` for an ``st_mode`` (front end and helper alike)."""
    return ("file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode)
            else "symlink" if stat.S_ISLNK(mode) else "other")


def boolean(name: str, value: Any) -> Any:
    if not isinstance(value, bool):
        raise fail(name, "must be true or false")
    return value


def service_name(name: str, value: Any) -> Any:
    if not isinstance(value, str) or not SERVICE_NAME_RE.fullmatch(value):
        raise fail(name, f"must match {SERVICE_NAME_RE.pattern} (lower case letters, digits, '_', '.', '-')")
    return value


def capsule_id(name: str, value: Any) -> Any:
    """A capsule id (``CAPSULE_ID_RE``)."""
    if not isinstance(value, str) or not CAPSULE_ID_RE.fullmatch(value):
        raise fail(name, "must be a capsule id such as 'cap_0001700000000000_1a2b'")
    return value


def check_capsule_id(value: Any) -> str:
    """``value`` if it is a capsule id, else INVALID_ARGUMENT."""
    return str(capsule_id("capsule_id", value))


def capsule_ids(name: str, value: Any) -> Any:
    """A list of at most MAX_DONORS distinct capsule ids."""
    if not isinstance(value, list) or len(value) > MAX_DONORS:
        raise fail(name, f"must be a list of at most {MAX_DONORS} capsule ids")
    for index, item in enumerate(value):
        capsule_id(f"{name}[{index}]", item)
    if len(set(value)) != len(value):
        raise fail(name, "names a capsule twice")
    return value


def abs_paths(name: str, value: Any) -> Any:
    """A list of at most MAX_BINDS absolute paths (directories the jail shows besides the workspace)."""
    if not isinstance(value, list) or len(value) > MAX_BINDS:
        raise fail(name, f"must be a list of at most {MAX_BINDS} absolute paths")
    for index, item in enumerate(value):
        abs_path(f"{name}[{index}]", item)
    return value


def env_names(name: str, value: Any) -> Any:
    """A list of at most MAX_ENV environment variable names."""
    if not isinstance(value, list) or len(value) > MAX_ENV:
        raise fail(name, f"must be a list of at most {MAX_ENV} variable names")
    for item in value:
        if not isinstance(item, str) or not ENV_NAME_RE.fullmatch(item):
            raise fail(name, f"holds {item!r:.80}, not an environment variable name")
    return value


def env(name: str, value: Any) -> Any:
    """An object of at most MAX_ENV variables, MAX_ARG_BYTES in all."""
    if not isinstance(value, dict) or len(value) > MAX_ENV:
        raise fail(name, f"must be an object of at most {MAX_ENV} variables")
    total = 0
    for key, item in value.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise fail(name, f"holds {key!r:.80}, not an environment variable name")
        total += len(key) + len(text(f"{name}.{key}", item, MAX_ARG_BYTES)) + 2
    if total > MAX_ARG_BYTES:
        raise fail(name, f"is larger than {MAX_ARG_BYTES} bytes")
    return value


def argv(name: str, value: Any) -> Any:
    """A list of 1 to MAX_ARGV strings, MAX_ARG_BYTES in all, starting with a program name."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_ARGV:
        raise fail(name, f"must be a list of 1 to {MAX_ARGV} strings")
    total = sum(len(text(name, item, MAX_ARG_BYTES)) + 1 for item in value)
    if total > MAX_ARG_BYTES:
        raise fail(name, f"is larger than {MAX_ARG_BYTES} bytes")
    if value[0] == "":
        raise fail(name, "must start with a program name")
    return value


def base64_text(limit: int) -> Check:
    """A check for base64 text of at most ``limit`` decoded bytes."""

    def check(name: str, value: Any) -> Any:
        if not isinstance(value, str) or len(value) > (limit + 2) // 3 * 4:
            raise fail(name, f"must be base64 text of at most {limit} decoded bytes")
        try:
            base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise fail(name, "is not valid base64") from None
        return value

    return check


_LIMIT_FIELDS: dict[str, Check] = {
    "memory_mb": int_in(1, 1 << 20),
    "pids_max": int_in(1, 1 << 22),
    "cpu_ms": int_in(1, MAX_TIMEOUT_MS),
    "disk_mb": int_in(DISK_MB_MIN, DISK_MB_MAX),
}


def limits(name: str, value: Any) -> Any:
    """A limits object: any of memory_mb, pids_max, cpu_ms, disk_mb, each bounded."""
    if not isinstance(value, dict):
        raise fail(name, "must be an object")
    check_keys(value, set(), set(_LIMIT_FIELDS), f"argument {name!r}")
    for key, item in value.items():
        _LIMIT_FIELDS[key](f"{name}.{key}", item)
    return value


def check_fields(value: Any, required: dict[str, Check], optional: dict[str, Check], what: str) -> dict[str, Any]:
    """Check an object against its required and optional fields; unknown keys are refused."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be an object")
    check_keys(value, set(required), set(required) | set(optional), what)
    for key, item in value.items():
        (required.get(key) or optional[key])(key, item)
    return value

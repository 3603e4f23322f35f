"""One error type for all of ccw, with a stable ``code`` (psutil's habit).

Both halves use it: the helper sends ``{"code", "message", "details"}`` over IPC and the
front end raises the same class again, so a tool failure carries the kernel's errno and
path all the way to the agent.  Codes are seed 000's (NOT_FOUND, INVALID_ARGUMENT,
REPO_CHANGED, PERMISSION_DENIED, TOO_LARGE, INTERNAL, STALE_LEASE) plus what capsules
need (TIMEOUT, POLICY_FAILED, UNSUPPORTED, CONFLICT, UNAVAILABLE).
"""

from __future__ import annotations

import contextlib
import errno as _errno
import os
from collections.abc import Iterator
from typing import Any

CODES = frozenset(
    {
        "NOT_FOUND",
        "INVALID_ARGUMENT",
        "REPO_CHANGED",
        "PERMISSION_DENIED",
        "TOO_LARGE",
        "INTERNAL",
        "STALE_LEASE",
        "TIMEOUT",
        "POLICY_FAILED",
        "UNSUPPORTED",
        "CONFLICT",
        "UNAVAILABLE",
    }
)

# errno → code; anything else is INTERNAL with the errno kept in details.
_ERRNO_CODES = {
    _errno.ENOENT: "NOT_FOUND",
    _errno.ENOTDIR: "NOT_FOUND",
    _errno.EACCES: "PERMISSION_DENIED",
    _errno.EPERM: "PERMISSION_DENIED",
    _errno.EXDEV: "PERMISSION_DENIED",  # openat2 RESOLVE_BENEATH escape
    _errno.ELOOP: "PERMISSION_DENIED",  # O_NOFOLLOW / RESOLVE_NO_SYMLINKS met a symlink
    _errno.EINVAL: "INVALID_ARGUMENT",
    _errno.ENAMETOOLONG: "INVALID_ARGUMENT",
    _errno.EEXIST: "CONFLICT",
    _errno.ENOTEMPTY: "CONFLICT",
    _errno.EISDIR: "INVALID_ARGUMENT",
    _errno.EFBIG: "TOO_LARGE",
    _errno.ENOSPC: "TOO_LARGE",
    _errno.EDQUOT: "TOO_LARGE",
    _errno.ENOSYS: "UNSUPPORTED",
    _errno.EOPNOTSUPP: "UNSUPPORTED",
}


class CcwError(Exception):
    """A failure with a stable code, a message that says how to recover, and details."""

    def __init__(self, code: str, message: str, details: dict[str, Any] | None = None) -> None:
        if code not in CODES:
            raise ValueError(f"unknown error code {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})

    def to_dict(self) -> dict[str, Any]:
        """The wire form: ``{"code", "message", "details"}``."""
        return {"code": self.code, "message": self.message, "details": self.details}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CcwError:
        """Rebuild an error sent by the other side; an unknown code becomes INTERNAL."""
        code = data.get("code")
        if not isinstance(code, str) or code not in CODES:
            code = "INTERNAL"
        details = data.get("details")
        return cls(code, str(data.get("message", "")), details if isinstance(details, dict) else {})

    def __repr__(self) -> str:
        return f"CcwError({self.code!r}, {self.message!r})"


class ProtocolError(CcwError):
    """A frame, request or argument that breaks the IPC protocol's rules (sandbox/protocol.py,
    sandbox/ops.py); ``code`` is INVALID_ARGUMENT or TOO_LARGE."""

    def __init__(
        self, message: str, details: dict[str, Any] | None = None, code: str = "INVALID_ARGUMENT"
    ) -> None:
        super().__init__(code, message, details)


def from_oserror(exc: OSError, what: str, path: str | None = None, hint: str = "") -> CcwError:
    """Turn an OSError into a CcwError that names the operation, the path and the errno."""
    num = exc.errno or 0
    name = _errno.errorcode.get(num, str(num))
    where = f" {path!r}" if path is not None else ""
    message = f"{what}{where} failed: {name} ({os.strerror(num) if num else exc})"
    if hint:
        message += f"; {hint}"
    details: dict[str, Any] = {"errno": name}
    if path is not None:
        details["path"] = path
    return CcwError(_ERRNO_CODES.get(num, "INTERNAL"), message, details)


JAIL_STEP_HINT = "check that the capsule's directories exist and the helper has the privileges it reported in hello"


def jail_step_error(step: str, exc: OSError, hint: str = JAIL_STEP_HINT) -> CcwError:
    """A step of building a jail failed (in ccw-jail, or in the helper for it): named in the
    message and in ``details["step"]``."""
    error = from_oserror(exc, f"jail step '{step}'", hint=hint)
    error.details["step"] = step
    return error


@contextlib.contextmanager
def wrap_oserror(what: str, path: str | None = None, hint: str = "") -> Iterator[None]:
    """Re-raise any OSError inside the block as a CcwError (one place, as psutil does)."""
    try:
        yield
    except OSError as exc:
        raise from_oserror(exc, what, path, hint) from exc

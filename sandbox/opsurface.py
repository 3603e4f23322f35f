"""What the helper and the front end must agree on, as one digest: every op's arguments,
the spec objects inside them, and every reply's keys.

The two programs must come from one install, yet they meet across a socket that outlives
installs: the ``ccw`` command's detached helper runs until ``ccw helper stop`` or a reboot,
and a system service is upgraded on its own schedule.  A front end newer than its helper
then sends arguments the helper refuses (a fork's ``donors``), and an older one cannot read
replies whose keys it does not know (a list's ``held_by``), each failing at some later call
with a message about that call.  ``PROTOCOL_VERSION`` catches this only when a person
remembers to raise it; this digest is worked out from the op table and the classes
themselves, so it changes whenever they do.  The helper sends it in ``hello``, and the
front end's client compares it with its own at each ``hello`` (``check``, from
``HelperClient.hello``), refusing a helper that differs and saying how to get a matching one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from sandbox import replies, spec
from sandbox.errors import CcwError
from sandbox.ops import OPS, OpSpec


def _keys(cls: Any) -> list[tuple[str, bool]]:
    """A reply or spec class's wire keys, each with whether it may be left out."""
    coded, optional = getattr(cls, "base64_fields", ()), getattr(cls, "optional_fields", ())
    return sorted((f"{one.name}_b64" if one.name in coded else one.name,
                   one.name in optional or one.default is not dataclasses.MISSING) for one in dataclasses.fields(cls))


def digest(ops: Mapping[str, OpSpec], classes: Iterable[type]) -> str:
    """The digest of ``ops``' arguments and ``classes``' keys (16 hex digits)."""
    shape = {"ops": {name: [sorted(op.required), sorted(op.optional)] for name, op in ops.items()},
             "classes": {cls.__qualname__: _keys(cls) for cls in classes}}
    return hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()[:16]


def _defined(module: Any) -> list[type]:
    """The dataclasses ``module`` defines (not those it imports: the same set in either process,
    whatever else each has imported)."""
    return [one for one in vars(module).values()
            if isinstance(one, type) and dataclasses.is_dataclass(one) and one.__module__ == module.__name__]


SURFACE = digest(OPS, [*_defined(replies), *_defined(spec)])


def check(hello: Mapping[str, Any], socket_path: str) -> None:
    """Refuse (UNSUPPORTED) the helper that answered ``hello`` on ``socket_path`` unless it
    serves this front end's surface; the message says how to get one that does."""
    theirs = hello.get("surface")
    if theirs != SURFACE:
        told = "does not say which ops it serves (it is older)" if theirs is None else f"serves other ops ({theirs})"
        raise _other_install(socket_path, told, theirs)


def refused(refusal: CcwError, socket_path: str) -> CcwError:
    """A helper's UNSUPPORTED answer to this front end's hello (a protocol version of its
    own: older or newer), in ``check``'s words."""
    return _other_install(socket_path, f"refused this front end's hello ({refusal.message})", None)


def _other_install(socket_path: str, told: str, theirs: str | None) -> CcwError:
    return CcwError(
        "UNSUPPORTED",
        f"the helper at {socket_path} comes from another ccw install than this front end: it {told}, this "
        f"front end needs {SURFACE}. Stop it with ccw helper stop (its capsules stay on disk; the next "
        "command starts a matching helper), or for a system service, install the same ccw for both",
        {"socket": socket_path, "helper_surface": theirs, "surface": SURFACE},
    )

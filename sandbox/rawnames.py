"""File names that are not UTF-8: how ccw shows them, since it cannot carry them.

Some facts about file names
    A Linux file name is bytes: anything but "/" and NUL.  Python's os functions hand
    back str, each byte that is not part of valid UTF-8 as a lone surrogate
    (U+DC80..U+DCFF, PEP 383's "surrogateescape"), so such a name round-trips through
    ``os.fsencode`` but has no UTF-8 form.  The helper's wire (sandbox/protocol.py) is
    UTF-8 JSON and refuses lone surrogates, as every JSON reader should; the MCP wire,
    the journal's JSON columns and git's paths in promotion are text too.  A capsule's
    command makes such names freely (an archive from another system, a test suite for
    unicode handling), so they reach the helper's exec reply and its ``changes``.

What ccw does with them
    *Carried* means: valid UTF-8, and sent as it is.  A name that is not carried is never
    sent as a name; it is shown in ``display`` form, which is text and unambiguous: each
    byte that is not UTF-8 is ``\\xNN`` and a backslash of the name is ``\\\\`` (so
    ``name_bytes`` reads it back byte for byte).  An exec's reply keeps every carried
    name in its touched sets and counts and shows the others beside them
    (``replies.NotCarried``), with a warning; the exec itself, its output and its
    journal row are never lost to a name.  ``changes`` (so promote, witness and merge,
    which all start from it) refuses whole, naming the names: a promotion that left one
    file behind would be a silent loss.  A diff asks for the list without them, counted
    and shown apart (``replies.ChangesReply.carried``), to show the rest.  The way out is a rename inside the
    capsule; since an argv is text too, the rename names the file through printf's octal
    escapes (``rename_argv``).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterable

from sandbox.errors import CcwError

SHOWN = 20  # names in display form a reply or an error shows at most; the count is always whole


def carried(name: str) -> bool:
    """Whether ``name`` is valid UTF-8 text, as the wire carries it."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def all_carried(names: Iterable[str]) -> bool:
    """Whether every one of ``names`` is carried: one encode of them all, the common case's cost."""
    try:
        "\0".join(names).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def raw(name: str) -> bytes:
    """The bytes a name from os stands for (its surrogates as the bytes they escape)."""
    try:
        return name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no os call makes (U+D800): no byte stands behind it
        return name.encode("utf-8", "surrogatepass")


def display(name: str) -> str:
    """``name`` as unambiguous UTF-8 text: each byte that is not UTF-8 as ``\\xNN``, ``\\`` as ``\\\\``
    (a surrogate that stands for no byte, which no os call makes, as ``\\ud800``)."""
    try:
        data = name.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return name.encode("utf-8", "backslashreplace").decode("utf-8")
    return data.replace(b"\\", b"\\\\").decode("utf-8", "backslashreplace")


def name_bytes(shown: str) -> bytes:
    """The bytes of the name ``display`` showed as ``shown``; a stray backslash is a ValueError."""
    out = bytearray()
    data, i = shown.encode("utf-8"), 0
    while i < len(data):
        if data[i : i + 1] != b"\\":
            out.append(data[i])
            i += 1
        elif data[i + 1 : i + 2] == b"\\":
            out.append(0x5C)
            i += 2
        elif data[i + 1 : i + 2] == b"x" and len(data[i + 2 : i + 4]) == 2:
            out.append(int(data[i + 2 : i + 4], 16))
            i += 4
        else:
            raise ValueError(f"{shown!r} is not a displayed name: a backslash at byte {i} starts no escape")
    return bytes(out)


def rename_argv(name: str) -> list[str]:
    """An argv that renames ``name`` (relative to the workspace) to NEW_NAME in the capsule.

    The name is written in printf's octal escapes but for letters, digits and ``._-+,:=@/``,
    so the script holds no quote and a shell quotes it plainly; the x and ``${f%x}`` keep a
    trailing newline that ``$(...)`` would strip.
    """
    octal = "".join(chr(b) if chr(b).isascii() and (chr(b).isalnum() or chr(b) in "._-+,:=@/") else f"\\{b:03o}"
                    for b in raw(name))
    return ["sh", "-c", f"f=$(printf \"{octal}x\"); mv -- \"${{f%x}}\" NEW_NAME"]


def listed(names: Iterable[str]) -> tuple[int, tuple[str, ...]]:
    """How many of ``names`` are not carried, and the first ``SHOWN`` of them (by bytes) in display form."""
    refused = sorted((name for name in names if not carried(name)), key=raw)
    return len(refused), tuple(display(name) for name in refused[:SHOWN])


def way_out(first: str) -> str:
    """How to make such a name carried again, with the argv for the first one (``first``, os form)."""
    argv = rename_argv(first)
    return (f"rename it inside the capsule to a UTF-8 name of your choice (NEW_NAME): capsule_exec with cmd "
            f"{json.dumps(argv)}, or ccw capsule exec CAPSULE -- {shlex.join(argv)}; a symlink whose target is "
            "not UTF-8 is pointed elsewhere with ln -sfn")


def warning(count: int, shown: tuple[str, ...], first: str) -> str:
    """The exec reply's note on the names it left out of its touched sets."""
    return (f"{count} touched name(s) are not UTF-8, so they are left out of the sets and shown escaped in "
            f"touched.not_utf8: {', '.join(shown)}{' ...' if count > len(shown) else ''}; promote, witness and "
            f"merge refuse while the capsule holds them (diff leaves them out): {way_out(first)}")


IN_WORKSPACE = ("rename it in the workspace itself to a UTF-8 name (the capsule no longer holds it: a directory "
                "it deleted did), then try again")


def refuse(names: Iterable[str], what: str, way: str | None = None) -> None:
    """Raise INVALID_ARGUMENT naming the ``names`` that are not carried (none: return); ``way``:
    how to rename them, if not inside the capsule (``way_out``)."""
    names = list(names)
    if all_carried(names):
        return
    count, shown = listed(names)
    first = min((name for name in names if not carried(name)), key=raw)
    raise CcwError(
        "INVALID_ARGUMENT",
        f"the capsule's {what} include {count} name(s) that are not UTF-8, which ccw cannot carry: "
        f"{', '.join(shown)}{' ...' if count > len(shown) else ''} (each byte that is not UTF-8 shown as \\xNN); "
        f"nothing was listed or changed; {way or way_out(first)}",
        {"not_utf8": list(shown), "count": count})

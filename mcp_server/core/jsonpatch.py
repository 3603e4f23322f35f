"""``diff_assets``: a deterministic RFC 6902 patch between two JSON documents (seed 001 §5).

The rules, and why the sorted patch is always valid:

- Only ``add``, ``remove`` and ``replace`` are emitted.
- Two objects are compared key by key, keys in sorted (code-point) order: a key only in
  ``base`` is removed, a key only in ``new`` is added, a key in both recurses when both
  values are objects and is replaced when the values differ in any other way.
- Arrays are never entered: a changed array is one ``replace`` of the whole array.  So
  no op ever addresses an array index, and no index shifts when ops are reordered.
- Two documents that are not both objects and differ are one ``replace`` at ``""``.
- The ops are sorted by ``path`` (the RFC 6901 pointer string, code-point order), then
  ``remove`` < ``add`` < ``replace``.

Validity under that sort.  An op is emitted at a location only when the diff does not
descend into it, and the diff descends only into locations present as objects in both
documents.  Hence (1) no op's path is a proper prefix (in pointer segments) of another
op's path, and (2) no two ops share a path, since each key yields at most one op.  Every
op's parent exists in ``base`` (it is an object present in both documents, at a location
no op touches), removes and replaces target members that exist in ``base``, and adds
target members that do not: each op's precondition reads only locations that no other
op writes.  So the ops commute, any order is valid, and the sorted order in particular
yields ``new``.  The tie-break ``remove`` < ``add`` < ``replace`` never has to act for
that reason; it is still applied, so that the order is the one the spec names even for
patches a future rule might produce (e.g. remove then add of the same path).  A naive
diff that emitted ``remove /a`` together with ``add /a/b`` would break under sorting
(``/a`` < ``/a/b`` removes the parent first); rule (1) is what rules that out.

Equality is JSON equality with types kept apart: ``true`` is not ``1`` and ``1`` is not
``1.0`` (their canonical bytes differ), so applying the patch reproduces ``new`` byte for
byte under canonical JSON, not merely ``==`` in Python.
"""

from __future__ import annotations

import math
from typing import Any

OP_RANK = {"remove": 0, "add": 1, "replace": 2}


def escape_pointer_token(token: str) -> str:
    """Escape one reference token for an RFC 6901 pointer (``~`` → ``~0``, ``/`` → ``~1``)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(tokens: list[str] | tuple[str | int, ...]) -> str:
    """The RFC 6901 pointer for a list of tokens; ``""`` is the whole document."""
    return "".join("/" + escape_pointer_token(str(token)) for token in tokens)


def same_json(a: Any, b: Any) -> bool:
    """JSON equality that keeps booleans, integers and floats apart, and 0.0 from -0.0
    (they compare equal in Python but serialise differently)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same_json(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)
    return bool(a == b)


def _diff(base: Any, new: Any, path: str, ops: list[dict[str, Any]]) -> None:
    if isinstance(base, dict) and isinstance(new, dict):
        for key in sorted(base.keys() | new.keys()):
            child = path + "/" + escape_pointer_token(key)
            if key not in new:
                ops.append({"op": "remove", "path": child})
            elif key not in base:
                ops.append({"op": "add", "path": child, "value": new[key]})
            else:
                _diff(base[key], new[key], child, ops)
        return
    if not same_json(base, new):
        ops.append({"op": "replace", "path": path, "value": new})


def diff_assets(base: Any, new: Any) -> list[dict[str, Any]]:
    """The RFC 6902 patch turning ``base`` into ``new``, ordered as seed 001 §5 says.

    Values in the ops are the very objects of ``new`` (not copies); serialise the patch
    before mutating ``new``.
    """
    ops: list[dict[str, Any]] = []
    _diff(base, new, "", ops)
    ops.sort(key=lambda op: (op["path"], OP_RANK[op["op"]]))
    return ops

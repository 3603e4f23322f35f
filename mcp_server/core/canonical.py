"""Canonical JSON (seed 000 §1.1): the one serialisation used wherever a hash covers JSON.

UTF-8, object keys sorted by byte order (code-point order, which UTF-8 preserves), no
insignificant whitespace, standard escapes only (non-ASCII text stays literal), arrays in
the order given, no trailing newline.  NaN and infinities are not JSON and are refused.
"""

from __future__ import annotations

import json
from typing import Any

_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def canonical_json(value: Any) -> bytes:
    """Serialise ``value`` as canonical JSON bytes."""
    return _ENCODER.encode(value).encode("utf-8")


def canonical_text(value: Any) -> str:
    """The canonical form as text, for places that frame it themselves."""
    return _ENCODER.encode(value)

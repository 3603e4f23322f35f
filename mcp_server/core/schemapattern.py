r"""JSON Schema's ``pattern`` with ``$`` as ECMA-262 reads it: the end of the string.

JSON Schema's regular expressions are ECMA-262's, where ``$`` without the multiline flag
matches only at the end of the input.  Python's ``$`` also matches just before a final
newline, and jsonschema hands the pattern to ``re.search`` as it is, so ``"cap_…\n"``
passed ``^cap_…$``: an id with a newline in it reached the capsule lookup, and the
NOT_FOUND's message carried it raw.  ``ecma`` rewrites each ``$`` that is neither escaped
nor inside a character class as ``\Z``; ``Validator`` is Draft 2020-12 with ``pattern``
read so.  Every other construct the schemas here use means the same in both dialects.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from typing import Any

from jsonschema import Draft202012Validator, ValidationError
from jsonschema.validators import extend


def ecma(pattern: str) -> str:
    """``pattern`` for Python's ``re`` with each bare ``$`` the end of the string (``\\Z``)."""
    out: list[str] = []
    escaped = in_class = False
    for char in pattern:
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
        elif char == "$":
            char = r"\Z"
        out.append(char)
    return "".join(out)


@functools.lru_cache(maxsize=1024)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(ecma(pattern))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _compiled(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")  # jsonschema's own words


Validator = extend(Draft202012Validator, validators={"pattern": _pattern})

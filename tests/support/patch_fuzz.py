"""The check every patch fuzzer makes (the hypothesis tests of tests/test_fuzz_core.py and
the atheris target in tests/fuzz/targets.py): whatever bytes arrive, parsing and applying
them to a small tree either gives the parser's structured refusal or a result that is safe
to write.  Atheris instruments only ccw's own modules, so this check being outside them
does not steer its search."""

from __future__ import annotations

import json

from mcp_server.core import paths
from mcp_server.core.patch import parse_patch
from mcp_server.core.patch_apply import apply
from sandbox.errors import CcwError

# The tree patches are applied to: a text file to change, one to rename, a non-ASCII name
# and a binary file (the fuzzers' seeds change each of them).
TREE = {"src/a.py": b"one\ntwo\nthree\n", "old": b"o\n", "q\xc3\xa9": b"a\n", "bin": b"\x00\x01\x02\n"}


def _read(path: str) -> tuple[bytes, int] | None:
    content = TREE.get(path)
    return None if content is None else (content, 0o100644)


def check_patch(data: bytes) -> None:
    """Parse ``data`` as a patch and apply it to ``TREE``: a refusal must be a ``CcwError``
    that is not INTERNAL and serialises; every path the applier would write must already be
    in normal form (inside the root); the rejects must serialise.  Anything else raises."""
    try:
        result = apply(parse_patch(data), _read)
    except CcwError as exc:
        assert exc.code != "INTERNAL", exc
        json.dumps(exc.to_dict())
        return
    for path in result.files:
        assert paths.normalize(path) == path  # every name the applier would write is safe
    json.dumps(result.rejects)

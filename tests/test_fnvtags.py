"""The C tagger (mcp_server/core/_fnvtags.c) against the Python one, and that CI builds it."""

from __future__ import annotations

import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_server.core import linetags

needs_c = pytest.mark.skipif(linetags._fnvtags is None and os.environ.get("CCW_MUST_WORK") != "1",
                             reason="the C tagger was not built here (no compiler or Python headers)")


@needs_c
def test_the_c_tagger_is_built_and_used() -> None:
    # Under CCW_MUST_WORK=1 (CI) a missing build fails here instead of skipping.
    assert linetags._fnvtags is not None, "mcp_server/core/_fnvtags.c was not built: ./dev setup"
    assert linetags.tags(["function hello() {", '  return "world";', "}"]) == ["f3", "18", "a8"]


@needs_c
@given(st.lists(st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n")),
                max_size=60))
def test_c_and_python_taggers_agree(lines: list[str]) -> None:
    stripped = list(map(str.rstrip, lines))
    expected = [linetags.line_tag(line) for line in lines]
    assert linetags.tags(lines) == expected
    if lines:
        assert linetags._tags_python(stripped, "\n".join(stripped), lines) == expected


@needs_c
def test_c_tagger_edges() -> None:
    fnv = linetags._fnvtags
    assert fnv is not None
    assert fnv.tags(b"") == bytes([0xC5])  # one empty line: the offset basis' low byte
    assert fnv.tags(b"\n\n") == bytes([0xC5]) * 3
    assert fnv.tags(bytearray(b"a")) == bytes([linetags.fnv1a32(b"a") & 0xFF])  # any buffer
    with pytest.raises(TypeError):
        fnv.tags("text")  # type: ignore[arg-type]

"""framing.dumps: the fast JSON encoder gives exactly the bytes json.dumps gives."""

from __future__ import annotations

import enum
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_server import framing


def reference(value: Any, sort_keys: bool = False) -> bytes:
    """What the frames were before the fast path: json.dumps, \\u-escaping lone surrogates."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), sort_keys=sort_keys).encode("ascii")


# Every code point, lone surrogates included (hypothesis leaves them out by default).
any_text = st.text(st.characters(exclude_categories=()), max_size=30)
scalars = (
    st.none() | st.booleans() | st.integers() | st.floats() | any_text
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(min_value=1e-12, max_value=1e-3) | st.floats(min_value=-1e-3, max_value=-1e-12)
)
json_like = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=5)
    | st.tuples(children, children)
    | st.dictionaries(any_text, children, max_size=5),
    max_leaves=40,
)


@settings(max_examples=600, deadline=None)
@given(json_like, st.booleans())
def test_fuzz_same_bytes_as_json_dumps(value: Any, sort_keys: bool) -> None:
    assert framing.dumps(value, sort_keys=sort_keys) == reference(value, sort_keys)


def _nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("value", [
    [1e-9, 1e-7, 3.865571047614699e-05, 1e-5, 9.99e-5, 1e-4, -2e-6, 5e-324, 0.0, -0.0, 1e16, 1e300],
    [float("inf"), float("-inf"), float("nan")],
    [2**63 - 1, 2**63, -(2**63), 2**64 + 1, 10**100],
    {"b": 1, "a": {"d": [1, {"z": 0, "y": 1}], "c": None}},
    {2: "int keys", 1: "become strings"},
    {"lone": "\ud800", "\udfff": "key", "fine": "é ✓ 𝄞 \u2028 \x7f \x00 \x1f"},
    ("tuple", ["inside"]),
    _nested(framing.FAST_MAX_NODES // 4),  # deeper than the walk goes: json.dumps encodes it
    list(range(framing.FAST_MAX_NODES * 2)),
])
@pytest.mark.parametrize("sort_keys", [False, True])
def test_edge_values_same_bytes(value: Any, sort_keys: bool) -> None:
    assert framing.dumps(value, sort_keys=sort_keys) == reference(value, sort_keys)


class Colour(enum.IntEnum):
    RED = 1


class Name(enum.StrEnum):
    ADA = "ada"


@pytest.mark.parametrize("value", [[Colour.RED], {"who": Name.ADA}])
def test_subclasses_of_json_types_encode_as_json_dumps_does(value: Any) -> None:
    assert framing.dumps(value) == reference(value)


@pytest.mark.parametrize("value", [{1, 2}, b"bytes", {"when": object()}])
def test_what_json_dumps_refuses_is_refused(value: Any) -> None:
    with pytest.raises(TypeError):
        framing.dumps(value)


def test_a_cycle_is_refused_as_json_dumps_refuses_it() -> None:
    looped: list[Any] = []
    looped.append(looped)
    with pytest.raises(ValueError, match="Circular reference"):
        framing.dumps(looped)


def test_a_large_read_answer_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # The point of the fast path: a file read back (one long string) never reaches the
    # stdlib encoder, in the text block (sorted) or in the frame.
    content = "\n".join(f"{n}:ab|    value = compute({n})  # é" for n in range(1, 10_001))
    answer = {"path": "/w/big.py", "content": content, "file_hash": "0" * 64, "total_lines": 10_000}
    expected_text = reference(answer, sort_keys=True)
    frame = {"jsonrpc": "2.0", "id": 7, "result": {
        "content": [{"type": "text", "text": expected_text.decode()}], "structuredContent": answer}}
    expected_frame = reference(frame)

    def refuse(*args: Any, **kwargs: Any) -> str:
        raise AssertionError("json.dumps was used")

    monkeypatch.setattr(framing.json, "dumps", refuse)
    assert framing.dumps(answer, sort_keys=True) == expected_text
    assert framing.dumps(frame) == expected_frame
    assert framing.encode(frame) == expected_frame + b"\n"

"""diff_assets: RFC 6902, add/remove/replace only, deterministic and always a valid patch."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_server.core.canonical import canonical_json
from mcp_server.core.jsonpatch import OP_RANK, diff_assets, pointer

# Few distinct keys, so base and new share keys often; some need RFC 6901 escaping.
keys = st.sampled_from(["a", "b", "c", "", "~", "/", "a/b", "~1", "é", "a~0"])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=3)
    | st.floats(allow_nan=False, allow_infinity=False, width=32)
    | st.sampled_from(["", "x", "y"])
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=16,
)


@st.composite
def related_pairs(draw: st.DrawFn) -> tuple[Any, Any]:
    """(base, new) where new is base with random edits, so deep common structure occurs."""
    base = draw(json_values)

    def mutate(value: Any) -> Any:
        choice = draw(st.integers(0, 5))
        if choice == 0:
            return draw(json_values)
        if isinstance(value, dict) and choice < 5:
            out = dict(value)
            for key in list(out):
                if draw(st.integers(0, 3)) == 0:
                    del out[key]
                elif draw(st.booleans()):
                    out[key] = mutate(out[key])
            for key in draw(st.lists(keys, max_size=2)):
                out[key] = draw(json_values)
            return out
        return value

    return base, mutate(copy.deepcopy(base))


pairs = st.tuples(json_values, json_values) | related_pairs()


def apply(base: Any, patch: list[dict[str, Any]]) -> Any:
    return jsonpatch.apply_patch(copy.deepcopy(base), patch, in_place=False)


@settings(max_examples=400)
@given(pairs)
def test_applying_the_patch_gives_new_byte_for_byte(pair: tuple[Any, Any]) -> None:
    base, new = pair
    patch = diff_assets(base, new)
    assert canonical_json(apply(base, patch)) == canonical_json(new)


@settings(max_examples=400)
@given(pairs)
def test_ops_are_sorted_by_path_then_remove_add_replace(pair: tuple[Any, Any]) -> None:
    patch = diff_assets(*pair)
    order = [(op["path"], OP_RANK[op["op"]]) for op in patch]
    assert order == sorted(order)
    assert {op["op"] for op in patch} <= {"add", "remove", "replace"}
    for op in patch:
        assert ("value" in op) == (op["op"] != "remove")


@settings(max_examples=300)
@given(pairs)
def test_repeated_calls_give_identical_bytes(pair: tuple[Any, Any]) -> None:
    base, new = pair
    first = canonical_json(diff_assets(base, new))
    again = canonical_json(diff_assets(json.loads(json.dumps(base)), json.loads(json.dumps(new))))
    assert first == again == canonical_json(diff_assets(base, new))


@settings(max_examples=300)
@given(pairs, st.randoms(use_true_random=False))
def test_ops_commute_so_no_order_can_break_the_patch(pair: tuple[Any, Any], rng: Any) -> None:
    # The validity argument of mcp_server/core/jsonpatch.py: no op path is a prefix of
    # another, hence every permutation applies and gives the same document.
    base, new = pair
    patch = diff_assets(base, new)
    paths = [op["path"] for op in patch]
    for p in paths:
        for q in paths:
            assert p == q or not q.startswith(p + "/")
    assert len(set(paths)) == len(paths)
    shuffled = list(patch)
    rng.shuffle(shuffled)
    assert canonical_json(apply(base, shuffled)) == canonical_json(new)


@given(json_values)
def test_identical_documents_give_an_empty_patch(value: Any) -> None:
    assert diff_assets(value, copy.deepcopy(value)) == []


def test_arrays_are_replaced_whole_and_keys_escaped() -> None:
    base = {"tags": ["x"], "a/b": 1, "m~": {"keep": 1, "drop": 2}, "gone": True}
    new = {"tags": ["x", "y"], "a/b": 2, "m~": {"keep": 1, "add": 3}, "new": None}
    assert diff_assets(base, new) == [
        {"op": "replace", "path": "/a~1b", "value": 2},
        {"op": "remove", "path": "/gone"},
        {"op": "add", "path": "/m~0/add", "value": 3},
        {"op": "remove", "path": "/m~0/drop"},
        {"op": "add", "path": "/new", "value": None},
        {"op": "replace", "path": "/tags", "value": ["x", "y"]},
    ]


def test_removing_a_key_and_adding_under_its_replacement_is_one_replace() -> None:
    # A naive diff could emit remove /a then add /a/b; sorting keeps that order, but the
    # parent would be gone.  Here the change of /a from scalar to object is one replace.
    assert diff_assets({"a": 1}, {"a": {"b": 2}}) == [{"op": "replace", "path": "/a", "value": {"b": 2}}]
    assert diff_assets({"a": {"b": 2}}, {}) == [{"op": "remove", "path": "/a"}]


def test_type_changes_are_not_hidden_by_python_equality() -> None:
    assert diff_assets({"x": 1}, {"x": True}) == [{"op": "replace", "path": "/x", "value": True}]
    assert diff_assets({"x": 1}, {"x": 1.0}) == [{"op": "replace", "path": "/x", "value": 1.0}]
    assert diff_assets([1], [1.0]) == [{"op": "replace", "path": "", "value": [1.0]}]


def test_whole_document_replace_and_pointer_escapes() -> None:
    assert diff_assets(1, "x") == [{"op": "replace", "path": "", "value": "x"}]
    assert diff_assets({}, []) == [{"op": "replace", "path": "", "value": []}]
    assert pointer(["a/b", "~", 0]) == "/a~1b/~0/0"


def test_negative_zero_is_a_change() -> None:
    # 0.0 == -0.0 in Python, but they are different JSON texts (found by hypothesis).
    from mcp_server.core.jsonpatch import diff_assets

    assert diff_assets({"x": [0.0]}, {"x": [-0.0]}) == [{"op": "replace", "path": "/x", "value": [-0.0]}]
    assert diff_assets({"x": -0.0}, {"x": -0.0}) == []

"""sandbox/fork_layers.py: a fork's lower stack with its donors' layers, and what cannot be stacked (no mount)."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox import fork_layers
from sandbox.errors import CcwError
from sandbox.meta import Capsule
from sandbox.spec import CapsuleSpec

STATE = "/state/capsules"
SPEC = CapsuleSpec("/ws")


def made(name: str, base: str = "/ws") -> Capsule:
    """A capsule over ``base``, as create records it."""
    return Capsule(name, f"{STATE}/{name}", {"lowers": [base], "ancestors": [], "parent": None, "disk_mb": None}, SPEC)


def forked(parent: Capsule, name: str, *donors: Capsule) -> Capsule:
    """A fork of ``parent`` with ``donors``, its meta as the manager records it."""
    lowers, above = fork_layers.stacked(parent, donors)
    meta: dict[str, Any] = {"lowers": lowers, "ancestors": [parent.capsule_id, *parent.ancestors],
                            "parent": parent.capsule_id, "disk_mb": None,
                            "donors": [d.capsule_id for d in donors], "layers_above_base": above}
    return Capsule(name, f"{STATE}/{name}", meta, SPEC)


def up(name: str) -> str:
    return f"{STATE}/{name}/upper"


def refused(parent: Capsule, *donors: Capsule) -> CcwError:
    with pytest.raises(CcwError) as info:
        fork_layers.stacked(parent, donors)
    return info.value


def test_two_forks_of_one_capsule_stack_the_donors_own_layer_above_the_parents() -> None:
    p = made("cap_p")
    a, b, c = forked(p, "cap_a"), forked(p, "cap_b"), forked(p, "cap_c")
    assert fork_layers.stacked(a, [b, c]) == ([up("cap_b"), up("cap_c"), up("cap_a"), up("cap_p"), "/ws"], 4)
    merged = forked(a, "cap_m", b)
    assert merged.base_lowers == ["/ws"] and merged.layers_above_base == 3
    # A fork of the merged capsule stacks on all of it, and so counts every layer above the base.
    child = forked(merged, "cap_x")
    assert child.lowers == [up("cap_m"), up("cap_b"), up("cap_a"), up("cap_p"), "/ws"]
    assert child.layers_above_base == 4 and child.base_lowers == ["/ws"]


def test_a_donor_adds_only_its_layers_above_the_chain_it_shares() -> None:
    p = made("cap_p")
    a = forked(p, "cap_a")
    deeper = forked(forked(p, "cap_b"), "cap_bb")  # a fork of a sibling: two layers of its own
    assert fork_layers.stacked(a, [deeper])[0] == [up("cap_bb"), up("cap_b"), up("cap_a"), up("cap_p"), "/ws"]
    assert fork_layers.stacked(a, [p]) == ([up("cap_a"), up("cap_p"), "/ws"], 2)  # an ancestor adds nothing
    grandchild = forked(a, "cap_g")  # a fork of the parent itself: its own layer
    assert fork_layers.stacked(a, [grandchild])[0] == [up("cap_g"), up("cap_a"), up("cap_p"), "/ws"]
    assert fork_layers.stacked(made("cap_q"), [made("cap_r")])[0] == [up("cap_r"), up("cap_q"), "/ws"]


def test_a_donor_over_another_base_is_unsupported() -> None:
    p, other = made("cap_p"), made("cap_o", base="/elsewhere")
    error = refused(forked(p, "cap_a"), forked(other, "cap_b"))
    assert error.code == "UNSUPPORTED" and "/elsewhere" in error.message and error.details["capsule_id"] == "cap_b"


def test_a_layer_stacked_twice_is_unsupported() -> None:
    p = made("cap_p")
    a, b = forked(p, "cap_a"), forked(p, "cap_b")
    error = refused(a, b, forked(b, "cap_bb"))  # both hold b's upper
    assert error.code == "UNSUPPORTED" and error.details == {"capsule_id": "cap_bb", "layer": up("cap_b")}
    # A merged capsule holds b's layer already; a fork of b above it would hold it a second time.
    error = refused(forked(a, "cap_m", b), forked(b, "cap_n"))
    assert error.code == "UNSUPPORTED" and error.details["layer"] == up("cap_b")


def test_the_depth_bound_counts_every_layer_above_the_base() -> None:
    deep = made("cap_0")
    for i in range(1, fork_layers.MAX_FORK_DEPTH - 1):
        deep = forked(deep, f"cap_{i}")
    assert deep.layers_above_base == fork_layers.MAX_FORK_DEPTH - 2
    assert fork_layers.stacked(deep, [])[1] == fork_layers.MAX_FORK_DEPTH - 1
    error = refused(deep, forked(made("cap_0"), "cap_side"))
    assert error.code == "TOO_LARGE"

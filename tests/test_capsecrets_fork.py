"""capsules/capsecrets.py ``inherit``: a fork is given its parent's secrets by name, and gets
placeholders of its own (a placeholder is unique to its capsule); its parent keeps its own."""

from __future__ import annotations

from pathlib import Path

import trio

from mcp_server.capsules import capsecrets
from mcp_server.capsules.networks import Networks
from mcp_server.core.netrules import parse_network
from mcp_server.core.secretbind import make_binding
from mcp_server.fs.secretstore import SecretStore

VALUE = b"v4lue-" + b"y" * 34


def test_a_fork_inherits_the_names_with_placeholders_of_its_own(tmp_path: Path) -> None:
    root = tmp_path / "state"
    root.mkdir(mode=0o700)
    SecretStore(root).put(make_binding("TOKEN", ["index.example:80"]), "stdin", VALUE)
    holder = Networks()  # the front end's holder of capsules' placeholders
    given = trio.run(capsecrets.for_create, root, ("TOKEN",), parse_network(["index.example:80"]))
    assert given is not None
    capsecrets.remember(root, "cap_parent", ["TOKEN"])
    holder.give_credentials("cap_parent", given)
    for child in ("cap_child1", "cap_child2"):
        capsecrets.inherit(root, "cap_parent", child)
    capsecrets.inherit(root, "cap_plain", "cap_child3")  # a parent without secrets: its fork has none
    parent = trio.run(capsecrets.env, root, holder, "cap_parent")
    first = trio.run(capsecrets.env, root, holder, "cap_child1")
    second = trio.run(capsecrets.env, root, holder, "cap_child2")
    assert capsecrets.recall(root, "cap_child1") == ["TOKEN"] and capsecrets.recall(root, "cap_child3") == []
    assert trio.run(capsecrets.env, root, holder, "cap_child3") == {}
    tokens = {parent["TOKEN"], first["TOKEN"], second["TOKEN"]}
    assert len(tokens) == 3 and all(token.startswith("ccwph_") and len(token) == len(VALUE) for token in tokens)
    assert VALUE.decode() not in repr([parent, first, second])
    # Each fork's proxy knows its own placeholder only: the parent's means nothing to it.
    child = holder.credentials("cap_child1")
    assert child is not None and child.capsule.identify(parent["TOKEN"].encode()) is None
    assert child.capsule.identify(first["TOKEN"].encode()) == "TOKEN"
    capsecrets.forget(root, "cap_child1")
    assert capsecrets.recall(root, "cap_parent") == ["TOKEN"]  # a fork's end leaves its parent's

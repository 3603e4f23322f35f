"""A git directory merges as a unit (capsules/merge_git.py): the first input that changed it keeps it whole."""

from __future__ import annotations

from mcp_server.capsules.merge3 import ABSENT, State, merge_path
from mcp_server.capsules.merge_git import GIT_KEPT, one_history
from mcp_server.capsules.merge_plan import Plan


def _file(text: str) -> State:
    return State("file", 0o644, text.encode())


def _plan(base: dict[str, State], sides: dict[str, dict[str, State]]) -> Plan:
    """A plan as merge_plan.combine makes one: every side at every path, each path merged."""
    full = {name: {path: changed.get(path, base[path]) for path in base} for name, changed in sides.items()}
    plan = Plan(base=base, sides=full, lower=base)
    for path in base:
        plan.outcomes[path] = merge_path(path, base[path], [(name, full[name][path]) for name in sides])
    return plan


BASE = {".git": State("dir", 0o755), ".git/index": _file("index 0"), ".git/refs/heads/main": _file("c0\n"),
        ".git/objects/aa/1": ABSENT, ".git/objects/bb/2": ABSENT, "a.txt": _file("a"), "b.txt": _file("b"),
        "sub/.git/index": _file("sub index 0"), "vendor/.github/x.yml": _file("x")}


def test_two_inputs_that_committed_merge_with_the_first_ones_git_dir_and_both_ones_files() -> None:
    plan = _plan(BASE, {
        "one": {".git/index": _file("index 1"), ".git/refs/heads/main": _file("c1\n"),
                ".git/objects/aa/1": _file("commit 1"), "a.txt": _file("a1")},
        "two": {".git/index": _file("index 2"), ".git/refs/heads/main": _file("c2\n"),
                ".git/objects/bb/2": _file("commit 2"), "b.txt": _file("b2"), "vendor/.github/x.yml": _file("y")},
    })
    assert {one.path for one in plan.conflicts} == {".git/index", ".git/refs/heads/main"}
    assert one_history(plan, ["one", "two"]) == [".git"]
    assert plan.conflicts == []
    merged = {one.path: (one.state, one.how, one.sides) for one in plan.changed}
    assert merged[".git/index"] == (_file("index 1"), GIT_KEPT, ("one",))
    assert merged[".git/objects/aa/1"][0] == _file("commit 1")
    assert ".git/objects/bb/2" not in merged  # the second's commit is left out, not merged in beside
    assert merged["a.txt"][0] == _file("a1") and merged["b.txt"][0] == _file("b2")
    assert merged["vendor/.github/x.yml"][1] != GIT_KEPT  # a name like .git's is no git directory
    assert plan.outcomes["sub/.git/index"].how != GIT_KEPT  # nobody changed the nested repository


def test_a_git_dir_only_one_input_changed_merges_as_any_change_and_order_picks_the_keeper() -> None:
    sides = {"one": {"a.txt": _file("a1")}, "two": {".git/index": _file("index 2"), "b.txt": _file("b2")},
             "three": {".git": ABSENT, ".git/index": ABSENT, ".git/refs/heads/main": ABSENT}}
    only = _plan(BASE, {"one": sides["one"], "two": sides["two"]})
    assert one_history(only, ["one", "two"]) == [] and only.outcomes[".git/index"].how != GIT_KEPT
    assert only.outcomes[".git/index"].state == _file("index 2")
    deleted = _plan(BASE, {"three": sides["three"], "two": sides["two"]})
    assert one_history(deleted, ["three", "two"]) == [".git"]  # deleting .git is changing it
    assert deleted.outcomes[".git"].state == ABSENT and deleted.outcomes[".git/index"].sides == ("three",)
    assert deleted.conflicts == []


def test_the_command_shows_a_git_dir_kept_whole_as_one_line_not_a_line_a_path() -> None:
    from mcp_server.cli.merge import text

    kept = [{"path": f".git/objects/a{n}/{n}", "how": GIT_KEPT, "capsules": ["cap_1"]} for n in range(300)]
    result = {"base": {"directory": "/ws"}, "merged": True, "conflicts": [], "pairs": [], "counts": {},
              "files": [*kept, {"path": "sub/.git/index", "how": GIT_KEPT, "capsules": ["cap_2"]},
                        {"path": "a.txt", "how": "one side", "capsules": ["cap_1"]}]}
    shown = text(result, {"capsule_ids": ["cap_1", "cap_2"], "dry_run": True}).splitlines()
    assert shown[1:4] == ["  a.txt: one side (cap_1)", f"  .git/ (300 path(s)): {GIT_KEPT} (cap_1)",
                          f"  sub/.git/ (1 path(s)): {GIT_KEPT} (cap_2)"]
    assert len(shown) == 5

"""The three-way merge of capsule_merge without a helper (issue 39): git's rules path by path
(capsules/merge3.py), clean merges byte-identical to ``git merge``'s, conflicts with both
sides and the base, and a merge of plain directories read as capsules' views
(capsules/merge_plan.py) with the ops that would write it (capsules/merge_write.py)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from mcp_server.capsules.merge import Question, report
from mcp_server.capsules.merge3 import ABSENT, State, merge_file, merge_path
from mcp_server.capsules.merge_plan import Side, pairs, read_plan, read_side
from mcp_server.capsules.merge_write import _apply, ops_of, view_side, write
from mcp_server.cli.merge import succeeded, text
from mcp_server.fs import changeset
from mcp_server.fs.promote import Op
from mcp_server.fs.statcache import RACY_NS, StatCache, digest_of
from mcp_server.fs.view import RootView
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord
from mcp_server.state import State as StateDir
from mcp_server.tools.merge import TOOLS
from sandbox.errors import CcwError
from sandbox.replies import Change
from sandbox.spec import CapsuleSpec

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git merges both-sided text")

BASE = b"".join(b"line %d\n" % i for i in range(1, 31))


def _edit(data: bytes, number: int, new: bytes) -> bytes:
    lines = data.splitlines(keepends=True)
    lines[number - 1] = new
    return b"".join(lines)


def _file(data: bytes, mode: int = 0o644) -> State:
    return State("file", mode, data)


def _git_merge(tmp_path: Path, base: bytes, ours: bytes, theirs: bytes) -> bytes:
    """What ``git merge`` of two branches leaves in the file (it must merge cleanly)."""
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "t",
           "GIT_AUTHOR_EMAIL": "t@example.invalid", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.invalid"}
    repo = tmp_path / "repo"

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(repo), *args], env=env, check=True, capture_output=True)

    repo.mkdir()
    git("init", "-q", "-b", "main")
    for branch, data in (("main", base), ("ours", ours), ("theirs", theirs)):
        if branch != "main":
            git("checkout", "-q", "-b", branch, "main")
        (repo / "f.txt").write_bytes(data)
        git("add", "f.txt")
        git("commit", "-q", "--allow-empty", "-m", branch)
    git("checkout", "-q", "ours")
    git("merge", "-q", "--no-edit", "theirs")
    return (repo / "f.txt").read_bytes()


def test_non_overlapping_hunks_combine_as_git_merge_combines_them(tmp_path: Path) -> None:
    ours = _edit(_edit(BASE, 3, b"ours three\n"), 20, b"ours twenty\n")
    theirs = _edit(BASE, 10, b"theirs ten\n") + b"theirs appended\n"
    out = merge_path("f.txt", _file(BASE), [("a", _file(ours)), ("b", _file(theirs))])
    assert not out.conflict and out.how == "lines merged" and out.sides == ("a", "b")
    assert out.state is not None and out.state.data == _git_merge(tmp_path, BASE, ours, theirs)
    assert b"ours three" in out.state.data and b"theirs ten" in out.state.data and b"ours twenty" in out.state.data


def test_overlapping_hunks_conflict_with_both_sides_and_the_base() -> None:
    ours, theirs = _edit(BASE, 12, b"fixed twelve\n"), _edit(BASE, 12, b"broken twelve\n")
    out = merge_path("f.txt", _file(BASE), [("fix", _file(ours)), ("other", _file(theirs))])
    assert out.conflict and out.how == "conflict: overlapping lines changed on both sides"
    assert out.sides == ("fix", "other")
    [hunk] = out.hunks
    assert (hunk.line, hunk.base, hunk.ours, hunk.theirs) == (12, "line 12\n", "fixed twelve\n", "broken twelve\n")


def test_a_conflict_is_placed_where_the_sides_changed_the_base_not_where_its_lines_first_stand() -> None:
    # Five functions ending alike: a conflict at the third "return" is at line 6, not line 2,
    # a second one after it at its own place, and lines both sides added at one place are
    # placed before the base line they precede.
    base = b"".join(b"def f%d():\n    return\n" % i for i in range(1, 6))
    ours, theirs = _edit(_edit(base, 6, b"    return 1\n"), 10, b"    return 9\n"), \
        _edit(_edit(base, 6, b"    return 2\n"), 10, b"    return 8\n")
    out = merge_path("m.py", _file(base), [("a", _file(ours)), ("b", _file(theirs))])
    assert [(h.line, h.base, h.ours, h.theirs) for h in out.hunks] == [
        (6, "    return\n", "    return 1\n", "    return 2\n"),
        (10, "    return\n", "    return 9\n", "    return 8\n")]
    lines = base.splitlines(keepends=True)
    added = [b"".join([*lines[:4], new, *lines[4:]]) for new in (b"x = 1\n", b"x = 2\n")]
    out = merge_path("m.py", _file(base), [("a", _file(added[0])), ("b", _file(added[1]))])
    assert [(h.line, h.base, h.ours, h.theirs) for h in out.hunks] == [(5, "", "x = 1\n", "x = 2\n")]


def test_adjacent_changes_conflict_as_in_git() -> None:
    merged, clean = merge_file(BASE, _edit(BASE, 5, b"five\n"), _edit(BASE, 6, b"six\n"))
    assert not clean and b"<" * 41 in merged


def test_same_change_on_both_sides_and_one_sided_changes() -> None:
    ours = _edit(BASE, 1, b"one\n")
    same = merge_path("f", _file(BASE), [("a", _file(ours)), ("b", _file(ours))])
    assert same.how == "same change" and same.state == _file(ours)
    one = merge_path("f", _file(BASE), [("a", _file(BASE)), ("b", _file(ours))])
    assert one.how == "one side" and one.sides == ("b",) and one.state == _file(ours)
    assert merge_path("f", _file(BASE), [("a", _file(BASE)), ("b", _file(BASE))]).how == "unchanged"


def test_delete_against_edit_conflicts_and_delete_against_nothing_deletes() -> None:
    edited = _file(_edit(BASE, 2, b"two\n"))
    out = merge_path("f", _file(BASE), [("del", ABSENT), ("edit", edited)])
    assert out.conflict and "deleted on one side, changed on the other (now a file)" in out.how
    gone = merge_path("f", _file(BASE), [("del", ABSENT), ("keep", _file(BASE))])
    assert gone.state == ABSENT and gone.how == "one side"


def test_binary_files_changed_on_both_sides_never_merge() -> None:
    base = b"\0" + BASE
    out = merge_path("b.bin", _file(base), [("a", _file(base + b"x")), ("b", _file(b"y" + base))])
    assert out.conflict and "binary" in out.how
    one = merge_path("b.bin", _file(base), [("a", _file(base + b"x")), ("b", _file(base))])
    assert one.state == _file(base + b"x")


def test_modes_merge_three_way() -> None:
    ours = _edit(BASE, 1, b"one\n")
    out = merge_path("run.sh", _file(BASE), [("exec", _file(BASE, 0o755)), ("edit", _file(ours))])
    assert out.state == _file(ours, 0o755) and not out.conflict
    both = merge_path("run.sh", _file(BASE), [("a", _file(BASE, 0o755)), ("b", _file(BASE, 0o600))])
    assert both.conflict and "mode changed on both sides (755 and 600)" in both.how


def test_symlinks_merge_as_git_merges_them() -> None:
    base = State("symlink", 0o777, target="a")
    out = merge_path("l", base, [("x", State("symlink", 0o777, target="b")),
                                 ("y", State("symlink", 0o777, target="c"))])
    assert out.conflict and "symlink changed on both sides ('b' and 'c')" in out.how
    kind = merge_path("l", base, [("x", _file(b"now a file\n")), ("y", State("symlink", 0o777, target="c"))])
    assert kind.conflict and "a file on one side, a symlink on the other" in kind.how
    files = merge_path("l", base, [("x", _file(b"one\n")), ("y", _file(b"two\n"))])
    assert files.conflict and files.how == "conflict: overlapping lines added on both sides in place of a symlink"
    assert [(h.line, h.base, h.ours, h.theirs) for h in files.hunks] == [(0, "", "one\n", "two\n")]
    one = merge_path("l", base, [("x", State("symlink", 0o777, target="b")), ("y", base)])
    assert one.state == State("symlink", 0o777, target="b")


def test_add_add_merges_identical_and_conflicts_otherwise() -> None:
    same = merge_path("new.py", ABSENT, [("a", _file(b"x = 1\n")), ("b", _file(b"x = 1\n"))])
    assert same.state == _file(b"x = 1\n") and same.how == "same change"
    out = merge_path("new.py", ABSENT, [("a", _file(b"x = 1\n")), ("b", _file(b"x = 2\n"))])
    assert out.conflict and out.how == "conflict: overlapping lines added on both sides"
    assert [(h.line, h.base, h.ours, h.theirs) for h in out.hunks] == [(0, "", "x = 1\n", "x = 2\n")]
    modes = merge_path("new.py", ABSENT, [("a", _file(b"x\n", 0o755)), ("b", _file(b"x\n"))])
    assert modes.conflict and "added on both sides with different modes" in modes.how
    # an empty file added is not the base's bytes (git's add/add merges against no file): lines from the
    # other side merge, a binary from it does not
    text = merge_path("new.py", ABSENT, [("a", _file(b"")), ("b", _file(b"x = 1\n"))])
    assert text.state == _file(b"x = 1\n") and text.how == "lines merged (added on both sides)"
    binary = merge_path("new.bin", ABSENT, [("a", _file(b"\0bin")), ("b", _file(b""))])
    assert binary.conflict and "binary" in binary.how


def test_two_files_over_a_directory_or_a_symlink_merge_as_added_as_git_merges_them() -> None:
    """merge-ort merges two files where the base held no regular file against an empty base (its two-way
    merge): an empty file on one side and lines on the other give the lines, in place of a directory
    (a capsule whose ``d/`` two attempts each replaced with a file) as in place of a symlink."""
    for base in (State("dir", 0o755), State("symlink", 0o777, target="t")):
        out = merge_path("d", base, [("x", _file(b"")), ("y", _file(b"fresh\n"))])
        assert out.state == _file(b"fresh\n"), out.how
        lines = merge_path("d", base, [("x", _file(b"a\n")), ("y", _file(b"b\n"))])
        assert lines.conflict and [(h.line, h.ours, h.theirs) for h in lines.hunks] == [(0, "a\n", "b\n")]
        modes = merge_path("d", base, [("x", _file(b"")), ("y", _file(b"fresh\n", 0o755))])
        assert modes.conflict and "in place of a" in modes.how and "with different modes (644 and 755)" in modes.how


def test_a_directory_against_a_delete_is_no_conflict_as_git_holds_no_directory() -> None:
    """A file one side deleted and another turned into a directory: both took the file away (git,
    which holds no directory, merges them cleanly), and the directory stays; so for a directory one
    side deleted and another replaced with a file or a symlink."""
    base = _file(BASE)
    out = merge_path("f", base, [("del", ABSENT), ("dir", State("dir", 0o755))])
    assert out.state == State("dir", 0o755) and out.how == "deleted on one side, replaced by a directory on the other"
    assert out.sides == ("del", "dir")
    gone = merge_path("d", State("dir", 0o755), [("file", _file(b"x\n")), ("del", ABSENT)])
    assert gone.state == _file(b"x\n") and gone.how == "deleted on one side, replaced by a file on the other"
    link = State("symlink", 0o777, target="t")
    assert merge_path("d", State("dir", 0o755), [("del", ABSENT), ("link", link)]).state == link
    # an edit against the directory still clashes: the file's change would be lost
    edited = merge_path("f", base, [("edit", _file(_edit(BASE, 2, b"two\n"))), ("dir", State("dir", 0o755))])
    assert edited.conflict and "a file on one side, a directory on the other" in edited.how


def test_three_sides_fold_and_name_the_pair_that_clashes() -> None:
    a, b = _edit(BASE, 2, b"a\n"), _edit(BASE, 15, b"b\n")
    c = _edit(BASE, 15, b"c\n")
    clean = merge_path("f", _file(BASE), [("A", _file(a)), ("B", _file(b)), ("same", _file(b))])
    assert clean.state is not None and clean.state.data is not None
    assert b"a\n" in clean.state.data and b"\nb\n" in clean.state.data
    out = merge_path("f", _file(BASE), [("A", _file(a)), ("B", _file(b)), ("C", _file(c))])
    assert out.conflict and out.sides == ("A+B", "C")


def _tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)


def _sides(base: Path, one: Path, two: Path, names: tuple[str, str] = ("one", "two")) -> list[Side]:
    """Two edited copies of ``base``, as capsules' views with the helper's change lists."""
    _tree(base, {"src/m.py": BASE, "src/gone.py": b"x\n", "docs/a.md": b"a\n"})
    shutil.copytree(base, one, symlinks=True)
    shutil.copytree(base, two, symlinks=True)
    _tree(one, {"src/m.py": _edit(BASE, 1, b"one\n"), "added.txt": b"new\n"})
    (one / "src" / "gone.py").unlink()
    _tree(two, {"src/m.py": _edit(BASE, 29, b"two\n"), "docs/new.md": b"n\n"})
    shutil.rmtree(one / "docs")
    (one / "docs").symlink_to("/etc")  # the merge would write docs/new.md through it
    return [Side(names[0], os.open(one, os.O_RDONLY | os.O_DIRECTORY),
                  [Change("src/m.py", "modified", "file"), Change("added.txt", "added", "file"),
                   Change("src/gone.py", "deleted", "file"), Change("docs", "type_changed", "symlink")]),
             Side(names[1], os.open(two, os.O_RDONLY | os.O_DIRECTORY),
                  [Change("src/m.py", "modified", "file"), Change("docs/new.md", "added", "file")])]


def test_a_plan_over_directories_reads_merges_and_checks_parents(tmp_path: Path) -> None:
    base = tmp_path / "base"
    plan = read_plan(str(base), _sides(base, tmp_path / "one", tmp_path / "two"), None)
    merged = plan.outcomes["src/m.py"].state
    assert merged is not None and merged.data == _edit(_edit(BASE, 1, b"one\n"), 29, b"two\n")
    assert plan.outcomes["src/gone.py"].state == ABSENT and plan.outcomes["added.txt"].how == "one side"
    under = plan.outcomes["docs/new.md"]
    assert under.conflict and "its directory docs is symlink -> /etc in the merge" in under.how
    assert [c.path for c in plan.conflicts] == ["docs/new.md"]
    assert plan.outcomes["docs/a.md"].state == ABSENT  # gone with its directory, changed by no one else
    assert pairs(plan, ["one", "two"]) == [{"capsules": ["one", "two"], "verdict": "conflict", "shared": 1,
                                            "conflicts": ["docs/new.md"]}]
    del plan.outcomes["docs/new.md"]
    assert [(op.action, op.path) for op in ops_of(plan, plan.base)] == [
        ("delete", "docs/a.md"), ("delete", "src/gone.py"), ("delete", "docs"), ("write", "added.txt"),
        ("symlink", "docs"), ("write", "src/m.py")]
    # Into a fork of the first input, only what the second brought is written: the lines merged.
    assert [(op.action, op.path) for op in ops_of(plan, plan.sides["one"])] == [("write", "src/m.py")]


def test_a_directory_one_side_deleted_holds_what_another_added_below_it(tmp_path: Path) -> None:
    """One attempt deletes ``d/`` (all its files), another adds ``d/new.txt``: git merges that
    cleanly (``d/new.txt`` alone in ``d``), and so does the plan, written into either side."""
    base, one, two = (tmp_path / name for name in ("base", "one", "two"))
    _tree(base, {"d/a.txt": b"a\n", "d/e/b.txt": b"b\n", "keep.txt": b"k\n"})
    shutil.copytree(base, one, symlinks=True)
    shutil.copytree(base, two, symlinks=True)
    shutil.rmtree(one / "d")
    _tree(two, {"d/new.txt": b"new\n"})
    plan = read_plan(str(base), [
        Side("gone", os.open(one, os.O_RDONLY | os.O_DIRECTORY), [Change("d", "deleted", "dir")]),
        Side("added", os.open(two, os.O_RDONLY | os.O_DIRECTORY), [Change("d/new.txt", "added", "file")])], None)
    assert plan.conflicts == []
    assert plan.outcomes["d"].state == State("dir", (two / "d").stat().st_mode & 0o7777)
    assert plan.outcomes["d"].how == "deleted on one side, kept as a directory for what added put below it"
    kept = {path: one.state for path, one in plan.outcomes.items() if one.state is not None and one.state.kind}
    assert sorted(kept) == ["d", "d/new.txt"]
    for start, view in ((plan.sides["gone"], one), (plan.sides["added"], two)):
        contents = {o.path: o.state for o in plan.outcomes.values() if o.state is not None}
        with RootView.open(str(view)) as root:
            _apply(root, ops_of(plan, start), contents, start)
        assert sorted(str(p.relative_to(view)) for p in view.rglob("*")) == ["d", "d/new.txt", "keep.txt"]
        assert (view / "d" / "new.txt").read_bytes() == b"new\n"


def test_the_report_fits_the_tool_schema_and_the_command_prints_it(tmp_path: Path) -> None:
    import jsonschema

    base = tmp_path / "base"
    names = ("cap_one", "cap_two")
    plan = read_plan(str(base), _sides(base, tmp_path / "one", tmp_path / "two", names), None)
    result = {**report(Question(names, "live"), plan, None, str(base)), "written": False}
    jsonschema.Draft202012Validator(TOOLS[0].output_schema).validate(result)
    assert result["merged"] is False and result["base"] == {"directory": str(base)}
    assert result["counts"] == {"one side": 4, "lines merged": 1}
    call = {"capsule_ids": list(names), "into": "live"}
    printed = text(result, call)
    assert "  src/m.py: lines merged (cap_one, cap_two)" in printed
    assert "  CONFLICT docs/new.md: conflict: kept by cap_two while its directory docs is symlink -> /etc" in printed
    assert "  pair cap_one + cap_two: conflict at docs/new.md (1 shared)" in printed
    assert printed.endswith("refused: 1 conflict(s); nothing was made or written\n") and not succeeded(result, call)
    spec = TOOLS[0]
    assert [spec.scope_for(args) for args in ({"capsule_ids": names}, {"into": "live"},
                                              {"into": "live", "dry_run": True})] == ["exec", "promote", "exec"]
    assert set(spec.scopes) == {"exec", "promote"}  # what tools/list over HTTP shows it under


def test_the_base_read_by_the_plan_is_the_live_check_s_state(tmp_path: Path) -> None:
    """Over the workspace itself, the live check's states are the plan's reads (merge._lower_recorded):
    they must be the text ``changeset.base_state`` reads afresh, at every merged path, absent ones too."""
    base = tmp_path / "base"
    plan = read_plan(str(base), _sides(base, tmp_path / "one", tmp_path / "two"), None)
    (base / "docs").chmod(0o750)
    with RootView.open(str(base)) as live:
        fresh = {path: changeset.base_state(live, path) for path in plan.lower}
    texts = {path: changeset.state_text(view_side(state), None, state.digest) for path, state in plan.lower.items()}
    assert texts["added.txt"] == "absent" and '"blake3"' in texts["src/m.py"]
    assert {path: text for path, text in texts.items() if path != "docs"} == {
        path: text for path, text in fresh.items() if path != "docs"}
    assert texts["docs"] != fresh["docs"]  # a mode changed since the plan was read is seen


def test_the_stat_cache_spares_the_base_s_bytes_where_one_side_changed_a_path(tmp_path: Path) -> None:
    """A base file hashed by an earlier merge and not written since is known by its digest alone where
    at most one side changed it; where both did, its bytes are read for ``git merge-file``.  The merge,
    its ops from the base and the live check's states are those of a plan that read every byte."""
    base, state = tmp_path / "base", tmp_path / "state"
    first = _sides(base, tmp_path / "one", tmp_path / "two")
    cold = read_plan(str(base), first, None)

    def again() -> list[Side]:  # read_plan closed the roots
        return [Side(s.name, os.open(tmp_path / s.name, os.O_RDONLY | os.O_DIRECTORY), s.changes) for s in first]

    learning = StatCache.load(state, str(base))
    learning.since_ns = time.time_ns() + 2 * RACY_NS  # as a merge long after the files were written
    read_plan(str(base), again(), None, learning)
    learning.save(state)
    warm = read_plan(str(base), again(), None, StatCache.load(state, str(base)))
    assert [path for path, one in warm.lower.items() if one.kind == "file" and one.data is None] == [
        "docs/a.md", "src/gone.py"]  # one side each; src/m.py was changed by both
    assert warm.lower["src/m.py"].data == BASE
    assert {p: (o.state, o.how) for p, o in warm.outcomes.items()} == {
        p: (o.state, o.how) for p, o in cold.outcomes.items()}
    assert [(op.action, op.path) for op in ops_of(warm, warm.base)] == [
        (op.action, op.path) for op in ops_of(cold, cold.base)]
    with RootView.open(str(base)) as live:
        assert {p: changeset.state_text(view_side(one), None, one.digest) for p, one in warm.lower.items()} == {
            p: changeset.base_state(live, p) for p in warm.lower}


def test_an_ancestor_s_change_both_inputs_undid_merges_with_the_base_directory_s_bytes(tmp_path: Path) -> None:
    """Where only the common ancestor names a path (both inputs put the base directory's bytes back, which
    the helper does not list), the merge holds the base directory's file: its bytes are read, cache or not."""
    base, ancestor, one, two, state = (tmp_path / name for name in ("base", "ancestor", "one", "two", "state"))
    _tree(base, {"p.txt": b"base\n", "q.txt": b"q\n"})
    for copy in (ancestor, one, two):
        shutil.copytree(base, copy)
    _tree(ancestor, {"p.txt": b"ancestor\n"})
    _tree(two, {"q.txt": b"two\n"})
    warm = StatCache.load(state, str(base))
    warm.since_ns = time.time_ns() + 2 * RACY_NS
    for path in ("p.txt", "q.txt"):
        warm.add(path, os.lstat(base / path), digest_of((base / path).read_bytes()))

    def root(path: Path) -> int:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    plan = read_plan(str(base), [Side("one", root(one), []), Side("two", root(two), [Change("q.txt", "modified",
                     "file")])], Side("anc", root(ancestor), [Change("p.txt", "modified", "file")]), warm)
    undone = plan.outcomes["p.txt"]
    assert undone.how == "same change" and undone.state is not None and undone.state.data == b"base\n"
    assert plan.lower["q.txt"].data is None and plan.outcomes["q.txt"].how == "one side"  # known by its digest
    assert [(op.action, op.path) for op in ops_of(plan, plan.base)] == [("write", "p.txt"), ("write", "q.txt")]


def test_a_merge_of_many_files_is_written_whole_by_its_writers(tmp_path: Path) -> None:
    """merge_write._apply writes the files WRITERS at a time: every merged path holds its merged state after."""
    base, one, two, target = (tmp_path / name for name in ("base", "one", "two", "target"))
    _tree(base, {f"d{d}/f{i}.txt": b"%d %d\n" % (d, i) for d in range(3) for i in range(12)})
    for copy in (one, two, target):
        shutil.copytree(base, copy, symlinks=True)
    _tree(one, {**{f"d0/f{i}.txt": b"one %d\n" % i for i in range(12)}, "d3/new.txt": b"new\n"})
    _tree(two, {f"d1/f{i}.txt": b"two %d\n" % i for i in range(12)})
    (two / "d2" / "f0.txt").unlink()
    (two / "link").symlink_to("d0")
    changes = [[Change(f"d0/f{i}.txt", "modified", "file") for i in range(12)] + [Change("d3", "added", "dir"),
                Change("d3/new.txt", "added", "file")],
               [Change(f"d1/f{i}.txt", "modified", "file") for i in range(12)] + [
                Change("d2/f0.txt", "deleted", "file"), Change("link", "added", "symlink")]]
    sides = [Side(name, os.open(root, os.O_RDONLY | os.O_DIRECTORY), listed)
             for name, root, listed in zip(("one", "two"), (one, two), changes, strict=True)]
    plan = read_plan(str(base), sides, None)
    assert not plan.conflicts and len(plan.changed) == 28  # 24 edits, a directory and its file, a delete, a link
    contents = {o.path: o.state for o in plan.outcomes.values() if o.state is not None}
    dated = [o.path for o in plan.changed if o.state is not None and o.state.kind == "file"]
    with RootView.open(str(target)) as view:
        mtimes = _apply(view, ops_of(plan, plan.base), contents, plan.base)
    assert sorted(mtimes) == sorted(dated)
    for path, state in contents.items():
        got = target / path
        if state.kind is None:
            assert not os.path.lexists(got), path
        elif state.kind == "symlink":
            assert os.readlink(got) == state.target
        elif state.kind == "file":
            assert got.read_bytes() == state.data and os.stat(got).st_mtime_ns == mtimes[path], path
    assert sorted(name for name in os.listdir(target / "d1") if name.startswith(".ccw-merge")) == []


def test_a_merge_written_into_a_copy_of_its_first_side_journals_the_mtimes_its_files_hold(tmp_path: Path) -> None:
    """merge_write.write into a view holding the first side (as a fork of it does): only the second side's
    files are written, and every journaled row's mtime is the mtime its file holds, the first side's kept
    files' taken from the plan's reads (Plan.mtimes), not stat'ed again."""
    base, one, two, target = (tmp_path / name for name in ("base", "one", "two", "target"))
    _tree(base, {f"d{d}/f{i}.txt": b"%d %d\n" % (d, i) for d in range(2) for i in range(6)})
    for copy in (one, two):
        shutil.copytree(base, copy, symlinks=True)
    _tree(one, {f"d0/f{i}.txt": b"one %d\n" % i for i in range(6)})
    _tree(two, {**{f"d1/f{i}.txt": b"two %d\n" % i for i in range(6)}, "d2/new.txt": b"new\n"})
    shutil.copytree(one, target, symlinks=True)  # copy2 keeps each file's mtime, as a fork shows its parent's
    changes = [[Change(f"d0/f{i}.txt", "modified", "file") for i in range(6)],
               [Change(f"d1/f{i}.txt", "modified", "file") for i in range(6)] + [
                Change("d2", "added", "dir"), Change("d2/new.txt", "added", "file")]]
    sides = [Side(name, os.open(root, os.O_RDONLY | os.O_DIRECTORY), listed)
             for name, root, listed in zip(("one", "two"), (one, two), changes, strict=True)]
    plan = read_plan(str(base), sides, None)
    kept = {f"d0/f{i}.txt": os.stat(one / f"d0/f{i}.txt").st_mtime_ns for i in range(6)}
    assert plan.mtimes["one"] == kept
    state = StateDir(tmp_path / "state")
    Journal(state).add_capsule(CapsuleRecord(capsule_id="cap_merged", spec=CapsuleSpec(workspace=str(base)),
                                             parent=None, created_at="", clock="", isolation={}, mount="",
                                             base_fingerprint=None, destroyed_at=None))
    untouched = {path: os.stat(target / path).st_mtime_ns for path in kept}
    changed = write(state, "cap_merged", os.open(target, os.O_RDONLY | os.O_DIRECTORY), plan, {},
                    plan.sides["one"], {**kept, "d0/f0.txt": 1})  # a kept mtime is taken as given
    assert changed == sorted(one.path for one in plan.changed) and len(changed) == 14
    assert {path: os.stat(target / path).st_mtime_ns for path in kept} == untouched  # none was rewritten
    rows = {row["path"]: row for row in Journal(state).writes("cap_merged")}
    assert rows["d0/f0.txt"]["mtime_ns"] == 1 and rows["d2"]["action"] == "chmod"
    for path, row in rows.items():
        if row["action"] == "write" and path != "d0/f0.txt":
            assert (target / path).read_bytes() == plan.outcomes[path].state.data  # type: ignore[union-attr]
            assert os.stat(target / path).st_mtime_ns == row["mtime_ns"], path
    state.close()


def test_a_side_read_in_one_open_a_file_states_what_expand_states(tmp_path: Path) -> None:
    """merge_plan.read_side reads the files listed as modified or added in one open each, and leaves
    expand the rest: its states and the base's under them are expand's, for a file below a replaced
    directory (expand names it with the directory's descendants) and for a file listed that is a
    symlink by the time it is read."""
    base, one = tmp_path / "base", tmp_path / "one"
    _tree(base, {"f.txt": b"f\n", "d/x.txt": b"x\n", "e/y.txt": b"y\n"})
    shutil.copytree(base, one, symlinks=True)
    (one / "f.txt").write_bytes(b"f changed\n")
    (one / "f.txt").chmod(0o600)
    shutil.rmtree(one / "d")
    _tree(one, {"d/new.txt": b"new\n", "g.txt": b"added\n"})
    (one / "e" / "y.txt").unlink()
    (one / "e" / "y.txt").symlink_to("../f.txt")  # listed below as a modified file: stale
    changes = [Change("d", "opaque", "dir", 0o755), Change("d/new.txt", "added", "file", 0o644),
               Change("e/y.txt", "modified", "file", 0o644), Change("f.txt", "modified", "file", 0o600),
               Change("g.txt", "added", "file", 0o644)]
    infos: dict[str, os.stat_result] = {}
    with RootView.open(str(base)) as low:
        read = read_side(low, Side("one", os.open(one, os.O_RDONLY | os.O_DIRECTORY), changes), infos)
        with RootView.open(str(one)) as view:
            expected = changeset.expand(changes, low, view)
    assert read.named == {entry.path: entry.new for entry in expected}
    assert read.olds == {entry.path: entry.old for entry in expected}
    assert sorted(read.named) == ["d", "d/new.txt", "d/x.txt", "e/y.txt", "f.txt", "g.txt"]
    assert read.states["f.txt"] == State("file", 0o600, b"f changed\n") and read.states["d/x.txt"] == ABSENT
    assert read.states["e/y.txt"] == State("symlink", read.named["e/y.txt"].mode, None, "../f.txt")  # type: ignore[union-attr]
    assert sorted(read.mtimes) == ["d/new.txt", "f.txt", "g.txt"]
    assert read.mtimes["f.txt"] == os.stat(one / "f.txt").st_mtime_ns
    assert sorted(infos) == ["d/x.txt", "e/y.txt", "f.txt"]


def test_a_merge_with_no_file_to_write_deletes_and_sets_modes_only(tmp_path: Path) -> None:
    """Deletes, then modes, with no write between them: a mode change is never taken for a delete."""
    base, one, two, target = (tmp_path / name for name in ("base", "one", "two", "target"))
    _tree(base, {"a.txt": b"a\n", "b.txt": b"b\n"})
    for copy in (one, two, target):
        shutil.copytree(base, copy, symlinks=True)
    (one / "a.txt").chmod(0o755)
    (two / "b.txt").unlink()
    sides = [Side("one", os.open(one, os.O_RDONLY | os.O_DIRECTORY), [Change("a.txt", "mode_changed", "file", 0o755)]),
             Side("two", os.open(two, os.O_RDONLY | os.O_DIRECTORY), [Change("b.txt", "deleted", "file")])]
    plan = read_plan(str(base), sides, None)
    ops = ops_of(plan, plan.base)
    assert [(op.action, op.path) for op in ops] == [("delete", "b.txt"), ("chmod", "a.txt")]
    contents = {o.path: o.state for o in plan.outcomes.values() if o.state is not None}
    with RootView.open(str(target)) as view:
        assert _apply(view, ops, contents, plan.base) == {}
    assert sorted(os.listdir(target)) == ["a.txt"] and (target / "a.txt").stat().st_mode & 0o777 == 0o755


def test_a_file_the_start_holds_is_truncated_in_place_and_given_the_merged_mode(tmp_path: Path) -> None:
    """merge_write._Writer opens a file the view holds with O_TRUNC: a longer old file holds the merged bytes
    alone after, with the merged mode (not the one it kept), and the mtime journaled is the one it holds."""
    (tmp_path / "a.txt").write_bytes(b"old and longer than the merge\n")
    (tmp_path / "a.txt").chmod(0o600)
    start = {"a.txt": State("file", 0o600, b"old and longer than the merge\n")}
    contents = {"a.txt": State("file", 0o755, b"new\n")}
    with RootView.open(str(tmp_path)) as view:
        mtimes = _apply(view, [Op("write", "a.txt", 0o755)], contents, start)
    got = os.stat(tmp_path / "a.txt")
    assert (tmp_path / "a.txt").read_bytes() == b"new\n" and got.st_mode & 0o7777 == 0o755
    assert mtimes == {"a.txt": got.st_mtime_ns}


def test_a_file_the_start_holds_that_is_now_a_fifo_is_never_written_through(tmp_path: Path) -> None:
    """Where the view holds a FIFO at a path the merge read as a file (the workspace moved under the fork),
    the truncating open neither blocks (no reader: refused) nor writes into it (a reader: CONFLICT)."""
    os.mkfifo(tmp_path / "a.txt")
    start, contents = {"a.txt": State("file", 0o644, b"old\n")}, {"a.txt": State("file", 0o644, b"new\n")}
    with RootView.open(str(tmp_path)) as view:
        with pytest.raises(CcwError):
            _apply(view, [Op("write", "a.txt", 0o644)], contents, start)
        reader = os.open(tmp_path / "a.txt", os.O_RDONLY | os.O_NONBLOCK)
        try:
            with pytest.raises(CcwError) as refused:
                _apply(view, [Op("write", "a.txt", 0o644)], contents, start)
            assert refused.value.code == "CONFLICT" and refused.value.details == {"path": "a.txt"}
            assert os.read(reader, 16) == b""  # nothing was written into it (and no writer holds it open)
        finally:
            os.close(reader)
    assert stat.S_ISFIFO(os.lstat(tmp_path / "a.txt").st_mode)


def test_a_pair_of_three_clashing_only_where_git_ignores_commutes_as_the_merge_does(tmp_path: Path) -> None:
    """Of three inputs, two that each compiled their own ``.pyc`` (bytes that differ, at a path the
    workspace's git ignores) merge cleanly, as merge._ignored_conflicts lets such a path pass; their
    pair must then say ``commute`` too, as it does when the two are merged alone, not a conflict at
    the ``.pyc`` that stops nothing."""
    from mcp_server.capsules.merge import _ignored_conflicts

    base = tmp_path / "base"
    _tree(base, {"m.py": BASE, ".gitignore": b"__pycache__/\n"})
    subprocess.run(["git", "-C", str(base), "init", "-q"], check=True)
    views = {name: tmp_path / name for name in ("one", "two", "three")}
    for view in views.values():
        shutil.copytree(base, view, symlinks=True)
    _tree(views["one"], {"m.py": _edit(BASE, 1, b"one\n"), "__pycache__/m.pyc": b"\x00one"})
    _tree(views["two"], {"m.py": _edit(BASE, 29, b"two\n"), "__pycache__/m.pyc": b"\x00two"})
    _tree(views["three"], {"new.txt": b"new\n"})
    compiled = [Change("m.py", "modified", "file"), Change("__pycache__", "added", "dir"),
                Change("__pycache__/m.pyc", "added", "file")]
    changes = {"one": compiled, "two": compiled, "three": [Change("new.txt", "added", "file")]}
    names = list(views)
    plan = read_plan(str(base), [Side(name, os.open(views[name], os.O_RDONLY | os.O_DIRECTORY), changes[name])
                                 for name in names], None)
    _ignored_conflicts(plan, names, str(base))
    assert not plan.conflicts
    result = report(Question(tuple(names)), plan, None, str(base))
    assert [(p["capsules"], p["verdict"], p["conflicts"]) for p in result["pairs"]] == [
        (["one", "two"], "commute", []), (["one", "three"], "commute", []), (["two", "three"], "commute", [])]

"""mcp_server/capsules/carried.py without a helper: a long diff cut at a file's end, what is
left out as ignored named once per directory, and the notes an answer carries."""

from __future__ import annotations

import subprocess
from pathlib import Path

from mcp_server.capsules import carried
from mcp_server.core import unidiff
from mcp_server.fs.changeset import Entry, Side
from sandbox import rawnames


def _change(path: str, lines: int) -> unidiff.FileChange:
    return unidiff.FileChange(path, None, b"".join(b"%d\n" % i for i in range(lines)), None, 0o100644)


def test_a_long_diff_is_cut_at_the_end_of_a_file_and_still_applies(tmp_path: Path) -> None:
    changes = [_change("c.txt", 10), _change("a.txt", 400), _change("b.txt", 400)]
    whole, none_left = carried.unified(changes, None)
    assert none_left == [] and whole == unidiff.render_all(changes).decode()
    first = len(unidiff.render(changes[1]))
    text, left = carried.unified(changes, first + 10)  # a.txt fits, b.txt would not
    assert text == unidiff.render(changes[1]).decode() and left == ["b.txt", "c.txt"]
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    applied = subprocess.run(["git", "apply", "-"], cwd=tmp_path, input=text.encode(), capture_output=True, check=False)
    assert applied.returncode == 0, applied.stderr
    assert (tmp_path / "a.txt").read_bytes() == changes[1].new and not (tmp_path / "b.txt").exists()
    assert carried.unified(changes, first - 1) == ("", ["a.txt", "b.txt", "c.txt"])  # the first file alone is too long
    note = carried.cut_note(left, len(text))
    assert note.startswith(f"cut at {len(text)} chars: 2 file(s) not shown (b.txt, c.txt); ask for them with paths")


def _side(kind: str) -> Side:
    return Side(kind, 0o755 if kind == "dir" else 0o644)


def test_ignored_paths_are_named_once_per_directory_and_counted_by_file() -> None:
    made = [(".pytest_cache", "dir"), (".pytest_cache/v", "dir"), (".pytest_cache/v/x", "file"),
            (".pytest_cache/.gitignore", "file"), ("src/__pycache__", "dir"), ("src/__pycache__/m.pyc", "file"),
            ("src/m.py", "file"), ("build.so", "file")]
    entries = [Entry(path, None, _side(kind), False) for path, kind in made]
    left = [path for path, _ in made if path != "src/m.py"]
    ignored, files = carried.ignored_paths(entries, left)
    assert ignored == [".pytest_cache/", "src/__pycache__/", "build.so"] and files == 4
    assert carried.ignored_notes([], 0) == []
    [note] = carried.ignored_notes(ignored, files)
    assert note.startswith("ignored, not shown: 4 files in .pytest_cache/, src/__pycache__/, build.so (")


def test_a_moved_workspace_is_a_note_naming_its_paths_and_many_paths_are_counted() -> None:
    assert carried.moved_notes([]) == []
    [note] = carried.moved_notes([f"f{i}" for i in range(carried.NAMED + 3)])
    assert note.startswith(f"workspace moved: it changed at {carried.NAMED + 3} path(s) since the capsule changed them")
    assert f"f{carried.NAMED - 1}, and 3 more)" in note and "REPO_CHANGED" in note


def test_names_that_are_not_utf8_are_notes_naming_them_escaped_with_what_promotion_does() -> None:
    assert carried.not_utf8_notes((0, ()), (0, ())) == []
    left_out, walked = carried.not_utf8_notes((2, ("n\\xff.txt", "o\\xfe")), (1, ("d/x\\xfd",)))
    assert left_out.startswith("not UTF-8, not shown: 2 name(s) the capsule changed, n\\xff.txt, o\\xfe (each byte")
    assert "capsule_promote refuses the whole promotion" in left_out
    assert 'printf \\"n\\\\377.txtx\\"' in left_out  # the rename of the first, its byte read back from \xff
    assert walked.startswith("not UTF-8, shown in git's quoting: 1 path(s) of a directory the capsule deleted, "
                             "d/x\\xfd")
    assert walked.endswith(rawnames.IN_WORKSPACE)
    assert "..." in carried.not_utf8_notes((rawnames.SHOWN + 1, ("a\\xff",) * rawnames.SHOWN), (0, ()))[0]


def test_devices_sockets_and_fifos_are_a_note_as_no_diff_shows_them() -> None:
    # Found in a trial: a capsule's FIFO was in no diff (git has no such file), yet
    # promotion refused the whole change for it, with nothing in the diff to say why.
    assert carried.special_notes([Entry("f.txt", None, _side("file"), False)]) == []
    made = [Entry(f"p{i}", None, Side("other", 0o644), False) for i in range(carried.MAX_SPECIAL_NAMED + 1)]
    [note] = carried.special_notes([Entry("f.txt", None, _side("file"), False), *made])
    assert note.startswith(f"not shown: {len(made)} device(s), socket(s) or FIFO(s) the capsule made, p0, p1, ")
    assert f"p{carried.MAX_SPECIAL_NAMED - 1} ...;" in note and "capsule_promote refuses" in note

"""The diff renderer's output applies with ``git apply`` and reproduces the new tree."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_server.core.unidiff import FileChange, git_blob_id, numstat, render, render_all

lines = st.lists(st.sampled_from([b"a\n", b"b\n", b"c\n", b"\r\n", b"x y\n", b"tail"]), max_size=12)
contents = st.one_of(st.none(), lines.map(b"".join), st.binary(max_size=64).map(lambda b: b + b"\0"))


def _git(cwd: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True, env=env, check=False)


def _apply(tmp: Path, changes: list[FileChange]) -> None:
    repo = tmp / "repo"
    repo.mkdir()
    assert _git(repo, "init", "-q").returncode == 0
    for c in changes:
        if c.old is not None:
            target = repo / c.path
            target.parent.mkdir(parents=True, exist_ok=True)
            if c.old_mode == 0o120000:
                os.symlink(c.old, target)
            else:
                target.write_bytes(c.old)
                os.chmod(target, (c.old_mode or 0o100644) & 0o777)
    patch = render_all(changes)
    result = _git(repo, "apply", "--allow-empty", "--whitespace=nowarn", "-", data=patch)
    assert result.returncode == 0, (patch, result.stderr)
    for c in changes:
        target = repo / c.path
        if c.new is None:
            assert not os.path.lexists(target)
        elif c.new_mode == 0o120000:
            assert os.readlink(target).encode() == c.new
        else:
            assert target.read_bytes() == c.new
            assert (os.stat(target).st_mode & 0o111 != 0) == ((c.new_mode or 0o100644) & 0o111 != 0)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(contents, contents, st.booleans()), min_size=1, max_size=4))
def test_random_changes_apply_with_git(tmp_path_factory: object,
                                       pairs: list[tuple[bytes | None, bytes | None, bool]]) -> None:
    changes = []
    for i, (old, new, exe) in enumerate(pairs):
        if old is None and new is None:
            continue
        mode = 0o100755 if exe else 0o100644
        changes.append(FileChange(f"d{i % 2}/f{i}.txt", old, new, 0o100644 if old is not None else None,
                                  mode if new is not None else None))
    if changes:
        _apply(tmp_path_factory.mktemp("u"), changes)  # type: ignore[attr-defined]


def test_symlink_mode_change_and_quoted_paths_apply(tmp_path: Path) -> None:
    changes = [
        FileChange("link", b"old-target", b"new-target", 0o120000, 0o120000),
        FileChange("run.sh", b"echo\n", b"echo\n", 0o100644, 0o100755),
        FileChange("sp ace/ü.txt", b"a\n", b"b\n", 0o100644, 0o100644),
        FileChange("new-link", None, b"somewhere", None, 0o120000),
    ]
    _apply(tmp_path, changes)


def test_unchanged_file_renders_nothing_and_numstat_counts() -> None:
    assert render(FileChange("a", b"x\n", b"x\n", 0o100644, 0o100644)) == b""
    assert numstat(FileChange("a", b"x\ny\n", b"x\nz\nw\n")) == (2, 1)
    assert numstat(FileChange("a", b"\0", b"")) == (None, None)
    assert git_blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"

"""sandbox/gitdirs.py, the helper's side of a capsule's git dirs (no root needed).

The front end reads a worktree's or submodule's ``.git`` file and names the git dir to
show (tests/test_gitdirs.py); that file is content an agent may have written, so the
helper checks each path again before it mounts an overlay over it: pinned by a
descriptor, named by its resolved path, outside the workspace, its lower dir and the
state dir, allowed by the expose rule, readable by the caller, and a git dir (HEAD,
objects/, refs/, none of them a symlink).  The overlays themselves are
vm-tests/test_devmachine_worktree.py's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import gitdirs
from sandbox.errors import CcwError
from sandbox.meta import Capsule
from sandbox.mounts import Bind
from sandbox.spec import CapsuleSpec
from tests.support.descriptors import naming_under

UID, GID = os.getuid(), os.getgid()


def _gitdir(path: Path) -> Path:
    (path / "objects").mkdir(parents=True)
    (path / "refs").mkdir()
    (path / "HEAD").write_text("ref: refs/heads/main\n")
    return path


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    ws, state = tmp_path / "ws", tmp_path / "state"
    ws.mkdir()
    state.mkdir()
    return {"ws": ws, "state": state, "repo": _gitdir(tmp_path / "repo" / ".git" / "worktrees" / "feat")}


def _pin(paths: list[Path], places: dict[str, Path]) -> list[tuple[int, str]]:
    ws = str(places["ws"])
    with gitdirs.pinned([str(p) for p in paths], ws, ws, UID, GID, str(places["state"])) as held:
        return [(os.fstat(fd).st_ino, real) for fd, real in held]


def _refused(paths: list[Path], places: dict[str, Path]) -> CcwError:
    with pytest.raises(CcwError) as caught:
        _pin(paths, places)
    # Every descriptor taken is closed again: none names the test's dirs or a path it gave.
    assert naming_under(places["ws"].parent, *paths) == {}
    return caught.value


def test_a_git_dir_is_pinned_as_named(places: dict[str, Path]) -> None:
    repo = places["repo"]
    assert _pin([repo], places) == [(os.stat(repo).st_ino, str(repo))]


def test_a_git_dir_named_through_a_symlink_is_refused(places: dict[str, Path], tmp_path: Path) -> None:
    # The jail shows it at the named path: a link would put the overlay somewhere else.
    (tmp_path / "link").symlink_to(places["repo"])
    error = _refused([tmp_path / "link"], places)
    assert error.code == "INVALID_ARGUMENT" and "resolved path" in error.message
    assert error.details == {"argument": "gitdir", "path": str(places["repo"])}


@pytest.mark.parametrize("where", ["inside the workspace", "holding the workspace", "inside the state dir"])
def test_a_git_dir_overlapping_the_workspace_or_the_state_dir_is_refused(places: dict[str, Path], where: str) -> None:
    path = {"inside the workspace": places["ws"] / ".git",
            "holding the workspace": places["ws"].parent,
            "inside the state dir": places["state"] / "capsules" / "x"}[where]
    if not path.exists():
        _gitdir(path)
    error = _refused([path], places)
    assert error.code == "PERMISSION_DENIED" and "overlaps" in error.message


def test_a_system_directory_is_refused_by_the_expose_rule(places: dict[str, Path]) -> None:
    error = _refused([Path("/etc")], places)
    assert error.code == "PERMISSION_DENIED" and "overlaps" not in error.message


@pytest.mark.parametrize(("break_it", "why"), [
    (lambda g: (g / "HEAD").unlink(), "it has no HEAD"),
    (lambda g: ((g / "HEAD").unlink(), (g / "HEAD").mkdir()), "its HEAD is not a file"),
    (lambda g: ((g / "refs").rmdir(), (g / "refs").write_text("")), "its refs is not a directory"),
    # A marker that is a symlink is not followed: it could name anything on the host.
    (lambda g: ((g / "objects").rmdir(), (g / "objects").symlink_to("/usr")), "its objects is not a directory"),
])
def test_only_a_git_dir_is_shown(places: dict[str, Path], break_it: Callable[[Path], object], why: str) -> None:
    break_it(places["repo"])
    error = _refused([places["repo"]], places)
    assert error.code == "INVALID_ARGUMENT" and error.message.endswith(f"is not a git dir: {why}")


def test_a_missing_git_dir_and_a_bad_second_one_close_what_was_pinned(places: dict[str, Path], tmp_path: Path) -> None:
    error = _refused([places["repo"], tmp_path / "gone"], places)
    assert error.code == "NOT_FOUND" and "must be an existing directory" in error.message


def test_the_overlay_dirs_take_the_host_git_dirs_mode(places: dict[str, Path], tmp_path: Path) -> None:
    repo = places["repo"]
    repo.chmod(0o750)
    data = tmp_path / "capsule"
    data.mkdir()
    gitdirs.make_dirs(str(data), 1, [os.stat(repo)], rootless=False)
    upper, work = os.stat(data / "gitdir-0-upper"), os.stat(data / "gitdir-0-work")
    assert (stat.S_IMODE(upper.st_mode), upper.st_uid, upper.st_gid) == (0o750, UID, GID)
    assert stat.S_IMODE(work.st_mode) == 0o700
    gitdirs.make_dirs(str(data), 1, [os.stat(repo)], rootless=False)  # again, after a restart: no error


def test_the_jail_shows_each_overlay_read_write_at_the_git_dirs_own_path() -> None:
    spec = CapsuleSpec(workspace="/w", gitdirs=("/r/.git/worktrees/a", "/s/.git/modules/m"))
    capsule = Capsule(capsule_id="c-1", root="/st/capsules/c-1", spec=spec,
                      meta={"gitdirs": [["/r/.git/worktrees/a"], ["/s/.git/modules/m"]]})
    assert gitdirs.binds(capsule) == (Bind("/st/capsules/c-1/gitdir-0-merged", "/r/.git/worktrees/a", writable=True),
                                      Bind("/st/capsules/c-1/gitdir-1-merged", "/s/.git/modules/m", writable=True))
    assert gitdirs.layers(capsule) == [["/r/.git/worktrees/a"], ["/s/.git/modules/m"]]
    assert gitdirs.describe(capsule) == [{"path": "/r/.git/worktrees/a", "copy_on_write": True},
                                         {"path": "/s/.git/modules/m", "copy_on_write": True}]

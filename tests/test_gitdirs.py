"""A workspace's ``.git`` file (worktree, submodule): which git dir the capsule shows, and what
a hostile ``.git`` file gets (mcp_server/capsules/gitdirs.py; the helper's side is
sandbox/gitdirs.py, shown in vm-tests/test_devmachine_worktree.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mcp_server.capsules.gitdirs import MAX_FILE, find, parse_gitfile, read_small, ref_paths
from sandbox.homes import Home


def _homes(tmp_path: Path) -> tuple[Home, ...]:
    home = tmp_path / "home" / "ann"
    if not (home / ".ssh").exists():
        (home / ".ssh").mkdir(parents=True)
        (home / ".ssh" / "id_ed25519").write_text("secret")
    return (Home("ann", os.getuid(), str(home)),)


def _fake_gitdir(path: Path) -> Path:
    """A directory with what makes a git dir: HEAD, objects/, refs/."""
    (path / "objects").mkdir(parents=True, exist_ok=True)
    (path / "refs").mkdir(exist_ok=True)
    (path / "HEAD").write_text("ref: refs/heads/main\n")
    return path


def _workspace(tmp_path: Path, dotgit: bytes | str) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / ".git").write_bytes(dotgit.encode() if isinstance(dotgit, str) else dotgit)
    return ws


def test_parse_takes_relative_paths_from_the_file_s_directory() -> None:
    assert parse_gitfile(b"gitdir: ../.git/modules/sub\n", "/super/sub", ".git") == "/super/.git/modules/sub"
    assert parse_gitfile(b"gitdir: /repo/.git/worktrees/wt\r\n", "/wt", ".git") == "/repo/.git/worktrees/wt"
    assert parse_gitfile(b"../..\n", "/repo/.git/worktrees/wt", "commondir") == "/repo/.git"
    assert parse_gitfile(b"/elsewhere/.git", "/repo/.git/worktrees/wt", "commondir") == "/elsewhere/.git"


@pytest.mark.parametrize("data", [b"", b"gitdir:", b"gitdir: \n", b"nonsense /repo/.git\n", b"gitdir: /a\nb\n",
                                  b"gitdir: /a\0b", b"gitdir: \xff\xfe"])
def test_parse_refuses_what_names_no_path(data: bytes) -> None:
    with pytest.raises(ValueError):
        parse_gitfile(data, "/ws", ".git")


def test_a_real_worktree_shows_the_common_dir(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.fail("git is needed (it is part of the test image)")
    repo, wt = tmp_path / "repo", tmp_path / "wt"
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@b", "GIT_COMMITTER_NAME": "a",
           "GIT_COMMITTER_EMAIL": "a@b"}
    for argv in (["git", "init", "-q", str(repo)], ["git", "-C", str(repo), "commit", "-q", "--allow-empty", "-m", "x"],
                 ["git", "-C", str(repo), "worktree", "add", "-q", str(wt)]):
        subprocess.run(argv, check=True, env=env)
    homes = _homes(tmp_path)
    found = find(str(wt), os.getuid(), homes)
    assert (found.gitdir, found.note) == (str(repo / ".git"), None)
    assert find(str(repo), os.getuid(), homes).gitdir is None  # .git/ is in the workspace


def test_a_submodule_s_gitdir_is_shown_itself(tmp_path: Path) -> None:
    modules = _fake_gitdir(tmp_path / "super" / ".git" / "modules" / "sub")
    ws = tmp_path / "super" / "sub"
    ws.mkdir()
    (ws / ".git").write_text("gitdir: ../.git/modules/sub\n")
    assert find(str(ws), os.getuid(), _homes(tmp_path)).gitdir == str(modules)


def test_no_dot_git_or_a_directory_needs_nothing(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    assert find(str(tmp_path / "plain"), os.getuid(), ()).gitdir is None
    assert find(str(tmp_path / "plain"), os.getuid(), ()).note is None


def _note(tmp_path: Path, ws: Path) -> str:
    found = find(str(ws), os.getuid(), _homes(tmp_path))
    assert found.gitdir is None
    assert found.note is not None and found.note.startswith("git will not work in this capsule: ")
    return found.note


def test_a_gitdir_naming_a_key_store_is_refused(tmp_path: Path) -> None:
    homes = _homes(tmp_path)
    ssh = Path(homes[0].path) / ".ssh"
    _fake_gitdir(ssh)  # even when it looks like a git dir
    assert ".ssh" in _note(tmp_path, _workspace(tmp_path, f"gitdir: {ssh}\n"))


def test_a_gitdir_naming_a_home_or_a_system_dir_is_refused(tmp_path: Path) -> None:
    homes = _homes(tmp_path)
    for target in (homes[0].path, "/etc", "/root/.ssh", "/proc/self"):
        ws = _workspace(tmp_path, f"gitdir: {target}\n")
        _note(tmp_path, ws)
        shutil.rmtree(ws)


def test_a_symlink_to_a_secret_is_judged_where_it_leads(tmp_path: Path) -> None:
    homes = _homes(tmp_path)
    _fake_gitdir(Path(homes[0].path) / ".ssh")
    (tmp_path / "innocent").symlink_to(Path(homes[0].path) / ".ssh")
    assert ".ssh" in _note(tmp_path, _workspace(tmp_path, f"gitdir: {tmp_path / 'innocent'}\n"))


def test_a_commondir_leading_to_a_secret_is_refused(tmp_path: Path) -> None:
    homes = _homes(tmp_path)
    _fake_gitdir(Path(homes[0].path) / ".ssh")
    admin = _fake_gitdir(tmp_path / "admin")
    (admin / "commondir").write_text(f"{homes[0].path}/.ssh\n")
    assert ".ssh" in _note(tmp_path, _workspace(tmp_path, f"gitdir: {admin}\n"))


def test_a_gitdir_outside_its_common_dir_is_refused(tmp_path: Path) -> None:
    common = _fake_gitdir(tmp_path / "common")
    admin = _fake_gitdir(tmp_path / "admin")
    (admin / "commondir").write_text(f"{common}\n")
    assert "outside its common dir" in _note(tmp_path, _workspace(tmp_path, f"gitdir: {admin}\n"))


def test_a_gitdir_inside_the_workspace_or_not_a_git_dir_is_refused(tmp_path: Path) -> None:
    ws = _workspace(tmp_path, "gitdir: inner\n")
    _fake_gitdir(ws / "inner")
    assert "overlap" in _note(tmp_path, ws)
    shutil.rmtree(ws)
    (tmp_path / "notgit").mkdir()
    assert "not a git dir" in _note(tmp_path, _workspace(tmp_path, f"gitdir: {tmp_path / 'notgit'}\n"))


def test_a_huge_dot_git_file_is_not_read(tmp_path: Path) -> None:
    gitdir = _fake_gitdir(tmp_path / "g")
    assert "larger than" in _note(tmp_path, _workspace(tmp_path, f"gitdir: {gitdir}\n" + "x" * (MAX_FILE + 1)))


def test_a_fifo_or_a_symlink_as_dot_git_is_not_opened(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.mkfifo(ws / ".git")  # opening it for reading would block without O_NONBLOCK
    assert "not a regular file" in _note(tmp_path, ws)
    os.unlink(ws / ".git")
    (ws / ".git").symlink_to(_fake_gitdir(tmp_path / "g"))
    assert "symlink" in _note(tmp_path, ws)


def test_read_small_refuses_devices(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a regular file"):
        read_small("/dev/zero")
    assert read_small(str(tmp_path / "absent")) is None


def test_ref_paths_are_what_a_commit_or_branch_moves() -> None:
    paths = ["objects/ab/cdef", "refs/heads/feat", "worktrees/wt/HEAD", "worktrees/wt/index", "packed-refs",
             "HEAD", "logs/HEAD", "worktrees/wt/refs/bisect/bad", "ORIG_HEAD", "refs", "COMMIT_EDITMSG"]
    assert ref_paths(paths) == ["HEAD", "packed-refs", "refs/heads/feat", "worktrees/wt/HEAD",
                                "worktrees/wt/refs/bisect/bad"]


def test_changes_reply_carries_git_dirs_only_when_the_capsule_shows_some() -> None:
    from sandbox.replies import Change, ChangesReply, GitdirChanges

    plain = ChangesReply((Change("a", "added", "file", 0o644, 1),))
    assert "gitdirs" not in plain.to_args() and ChangesReply.from_args(plain.to_args()) == plain
    shown = ChangesReply((), (GitdirChanges("/repo/.git",
                                            (Change("refs/heads/feat", "modified", "file", 0o644, 41),)),))
    assert ChangesReply.from_args(shown.to_args()) == shown


def test_left_behind_carries_branches_and_tags_and_refuses_other_refs() -> None:
    from mcp_server.capsules.gitdirs import left_behind, listing
    from sandbox.errors import CcwError
    from sandbox.replies import Change, GitdirChanges

    data = GitdirChanges("/repo/.git", (Change("objects/ab", "added", "dir"), Change("objects/ab/cd", "added", "file"),
                                        Change("worktrees/wt/index", "modified", "file")))
    assert left_behind(None) == [] and left_behind([GitdirChanges("/repo/.git", ())]) == []
    assert left_behind([data]) == [{"gitdir": "/repo/.git", "count": 2,
                                    "paths": ["objects/ab/cd", "worktrees/wt/index"], "refs": []}]
    # A branch or tag added or changed is carried (capsules/gitpromote.py); a deleted one, another
    # namespace or a name git would read as a refspec is refused.
    carried = GitdirChanges("/repo/.git", (Change("refs/heads/feat", "modified", "file"),
                                           Change("refs/tags/v1", "added", "file")))
    assert left_behind([carried])[0]["refs"] == ["refs/heads/feat", "refs/tags/v1"]
    for odd in ("refs/stash", "refs/heads/a:refs/heads/main", "HEAD", "worktrees/wt/HEAD", "packed-refs"):
        with pytest.raises(CcwError):
            left_behind([GitdirChanges("/repo/.git", (Change(odd, "modified", "file"),))])
    moved = GitdirChanges("/repo/.git", (*data.changes, Change("refs/heads/feat", "deleted", "file")))
    assert listing([moved]) == [{"gitdir": "/repo/.git", "count": 3, "refs": ["refs/heads/feat"],
                                 "paths": ["objects/ab/cd", "worktrees/wt/index", "refs/heads/feat"]}]
    with pytest.raises(CcwError) as raised:
        left_behind([moved])
    assert raised.value.code == "UNSUPPORTED" and raised.value.details == {"gitdir": "/repo/.git",
                                                                           "refs": ["refs/heads/feat"]}


def test_meta_json_git_dir_stacks_are_checked(tmp_path: Path) -> None:
    from sandbox import meta

    good = {"owner_uid": 1, "owner_gid": 1, "lowers": ["/ws"], "ancestors": [], "created_at": "t", "parent": None,
            "gitdirs": [["/repo/.git"]]}
    (tmp_path / "upper").mkdir()
    assert meta._check(str(tmp_path), good) == ""
    for bad in ([["relative"]], [[]], ["/repo/.git"], "x"):
        assert "gitdirs" in meta._check(str(tmp_path), {**good, "gitdirs": bad})

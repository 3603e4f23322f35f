"""mcp_server/capsules/gitowner.py: root's ``as_branch``, and its promotion of a worktree
capsule's commits, over a checkout another uid owns.

Root's git writes the branch's objects, ref and reflog as root.  Without giving back what it
made, ``refs/heads/ccw`` (for ``ccw/fix``) and each new ``objects/ab`` stayed root's 0755
directories, and the owner's own git then failed to make a branch beside it or to add an
object there ("insufficient permission for adding an object to repository database").
The worktree capsule's promotion also asked the fork's git, in the jail, which refused the
checkout as root's git does ("dubious ownership"), so its commits could not be promoted.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support import realprojects

NOBODY = 65534  # the owner: the nobody_dir fixture's tree is given to it


def _git_as_owner(repo: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=60,
                          user=NOBODY, group=NOBODY, extra_groups=[], cwd="/",
                          env={"PATH": os.environ["PATH"], "HOME": str(home)})


def _owned_repo(nobody_dir: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """A repository with one commit, and a home with the owner's git identity, all nobody's; root's
    git trusts it (safe.directory), as a CI step sets."""
    repo = nobody_dir / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    realprojects.git(repo, "init", "-q", "-b", "main")
    realprojects.git(repo, "add", "-A")
    realprojects.git(repo, "-c", "user.name=o", "-c", "user.email=o@x", "commit", "-q", "-m", "initial")
    owner_home = nobody_dir / "home"
    owner_home.mkdir()
    (owner_home / ".gitconfig").write_text("[user]\n\tname = owner\n\temail = o@x\n")
    for dirpath, dirnames, filenames in os.walk(nobody_dir):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, NOBODY, NOBODY)
    root_home = nobody_dir / "root-home"  # root's git trusts the checkout, as a CI step sets
    root_home.mkdir()
    (root_home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {repo}\n")
    monkeypatch.setenv("HOME", str(root_home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(root_home / ".config"))
    return repo, owner_home


def _roots(git_dir: Path, dirs_before: set[Path], *files: Path) -> tuple[set[Path], list[str]]:
    """The directories made in ``git_dir`` since, and what of them (and of ``files``) root owns."""
    new_dirs = {p for p in git_dir.rglob("*") if p.is_dir()} - dirs_before
    entries = [*new_dirs, *(q for d in new_dirs for q in d.iterdir()), *files]
    return new_dirs, [str(p.relative_to(git_dir)) for p in entries if p.lstat().st_uid == 0]


def test_roots_branch_leaves_the_owners_git_dir_the_owners(tools: Any, nobody_dir: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    repo, owner_home = _owned_repo(nobody_dir, monkeypatch)
    git_dir = repo / ".git"
    dirs_before = {p for p in git_dir.rglob("*") if p.is_dir()}

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(repo)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": [
            "sh", "-c", "for i in $(seq 1 40); do echo $i > f$i.txt; done"]})
        return await t.call("capsule_promote", {"capsule_id": cap, "as_branch": "ccw/fix"})

    made = tools.run(scenario)
    assert made["promoted"] and made["branch"]["ref"] == "refs/heads/ccw/fix", made
    new_dirs, roots = _roots(git_dir, dirs_before, git_dir / "refs/heads/ccw/fix")
    assert git_dir / "refs/heads/ccw" in new_dirs and any(p.parent == git_dir / "objects" for p in new_dirs)
    assert roots == [], roots
    # The owner's own git goes on: a branch beside it, objects in the directories it made.
    assert _git_as_owner(repo, owner_home, "branch", "ccw/other", "ccw/fix").returncode == 0
    for i in range(1, 41):
        (repo / f"f{i}.txt").write_text(f"the owner's {i}\n")
    added = _git_as_owner(repo, owner_home, "add", "-A")
    assert added.returncode == 0, added.stderr
    committed = _git_as_owner(repo, owner_home, "commit", "-q", "-m", "the owner's")
    assert committed.returncode == 0, committed.stderr
    assert _git_as_owner(repo, owner_home, "fsck", "--no-progress").returncode == 0


def test_roots_promotion_of_a_worktree_capsules_commits(tools: Any, nobody_dir: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    repo, owner_home = _owned_repo(nobody_dir, monkeypatch)
    tree = nobody_dir / "tree"
    added = _git_as_owner(repo, owner_home, "worktree", "add", "-q", "-b", "feature", str(tree))
    assert added.returncode == 0, added.stderr
    root_home = Path(os.environ["HOME"])
    (root_home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {repo}\n\tdirectory = {tree}\n")
    git_dir = repo / ".git"
    dirs_before = {p for p in git_dir.rglob("*") if p.is_dir()}
    commit = ("for i in $(seq 1 40); do echo $i > f$i.txt; done && git -c safe.directory='*' add -A && "
              "git -c safe.directory='*' -c user.name=c -c user.email=c@x commit -q -m 'in the capsule'")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(tree)}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", commit]})
        assert ran["exit_code"] == 0, ran["stderr"]
        return await t.call("capsule_promote", {"capsule_id": cap})

    promoted = tools.run(scenario)
    assert promoted["promoted"], promoted
    assert [m["ref"] for m in promoted["git"][0]["promoted_refs"]] == ["refs/heads/feature"], promoted["git"]
    assert realprojects.git(repo, "log", "-1", "--format=%s", "feature").strip() == "in the capsule"
    _new_dirs, roots = _roots(git_dir, dirs_before, git_dir / "refs/heads/feature")
    assert roots == [], roots  # the fetch keeps a pack, in objects/pack, which the owner can still replace
    assert _git_as_owner(repo, owner_home, "branch", "beside", "feature").returncode == 0
    assert _git_as_owner(repo, owner_home, "fsck", "--no-progress").returncode == 0

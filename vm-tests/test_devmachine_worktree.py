"""A git worktree, and a submodule, as a capsule's workspace (issue 25 item 2), as root and as an
unprivileged user through the rootless helper.

more-itertools' prepared checkout is the main repository; ``git worktree add`` makes the
workspace, whose ``.git`` file names ``repo/.git/worktrees/wt``.  In the capsule git
works (status, add, commit, log, in a fork too) on a copy-on-write view of the
repository's ``.git`` (sandbox/gitdirs.py); the host repository (refs, objects, HEAD, the
worktree's staged index) does not change until promotion.  Promotion carries the commit
and a new tag to the host (capsules/gitpromote.py: a bundle fetched with fsck, a
fast-forward check, update-ref) with the file, and leaves the rest of the git dir behind,
listed; a ref it cannot carry is refused (UNSUPPORTED), a branch the host moved meanwhile
too (REPO_CHANGED), both before anything is written.  A hostile capsule's ref names,
non-commit ids, config and hooks never reach the host.  A submodule checked out as the
workspace (``gitdir: ../.git/modules/sub``) works the same way.  A ``.git`` file naming a
key store is refused by the front end (a note, no git dir) and by the helper (a
hand-made spec), and the capsule cannot read it.
"""

from __future__ import annotations

import hashlib
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import CcwError
from tests.support import realprojects
from tests.support.agent_loop import scenario_command
from tests.support.users import run_script_as

PROJECT = realprojects.MORE_ITERTOOLS
EDIT = PROJECT.harmless[1]
IDENTITY = "git -c user.name=agent -c user.email=agent@example.com"
Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]

def _repos(base: Path) -> dict[str, str]:
    """The main repository, its worktree, a superproject whose submodule is a workspace, a hostile workspace."""
    repo = realprojects.pristine(PROJECT, base / "repo")
    wt, sup = base / "wt", base / "super"
    realprojects.git(repo, "worktree", "add", "-q", "-b", "feat", str(wt))
    sup.mkdir()
    realprojects.git(sup, "init", "-q", "-b", "main")
    realprojects.git(sup, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(repo), "sub")
    realprojects.git(sup, "commit", "-q", "-m", "add sub")
    hostile = base / "hostile"
    hostile.mkdir()
    (base / "scratch").mkdir()
    return {"repo": str(repo), "wt": str(wt), "sub": str(sup / "sub"), "super": str(sup), "hostile": str(hostile),
            "scratch": str(base / "scratch"), "orig": realprojects.git(repo, "rev-parse", "feat").strip()}


def _git_state(gitdir: Path) -> dict[str, str]:
    """Every file of a git dir but the worktrees' index files (a host git may refresh their stat cache)
    by path, with a hash of its bytes."""
    out = {}
    for path in sorted(gitdir.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.name != "index":
            out[str(path.relative_to(gitdir))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


async def _sh(call: Call, cap: str, script: str) -> dict[str, Any]:
    ran = await call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]})
    return {"exit": ran["exit_code"], "out": ran["stdout"], "err": ran["stderr"]}


async def _promote(call: Call, cap: str, dry_run: bool = False) -> dict[str, Any]:
    try:
        return await call("capsule_promote", {"capsule_id": cap, "dry_run": dry_run})
    except CcwError as exc:
        return {"error": exc.code, "message": exc.message, "details": exc.details}


async def scenario(call: Call, paths: dict[str, str]) -> dict[str, Any]:
    """The whole story through ``call`` (a ToolRunner's or a real MCP client's); what it saw."""
    out: dict[str, Any] = {}
    made = await call("capsule_create", {"workspace": paths["wt"]})
    cap = made["capsule_id"]
    out["git"], out["shown"] = made.get("git"), made["isolation"]["filesystem"].get("gitdirs")
    out["status"] = await _sh(call, cap, "git status --porcelain=v1 -b")
    out["commit"] = await _sh(call, cap, f"printf 'capsule edit\\n' >> {EDIT.path} && git add {EDIT.path} && "
                              f"{IDENTITY} commit -q -m 'made in a capsule' && git log -1 --format=%s")
    out["diff_git"] = (await call("capsule_diff", {"capsule_id": cap, "format": "stat"})).get("git")
    witness = await call("capsule_witness", {"capsule_id": cap})
    replayed = await call("capsule_replay", {"witness_id": witness["witness_id"]})
    out["replay"] = {key: replayed.get(key) for key in ("replay_ok", "gitdirs", "mismatches")}
    fork = (await call("capsule_fork", {"capsule_id": cap}))["capsule_id"]
    out["fork_log"] = await _sh(call, fork, "git log -1 --format=%s && git status --porcelain")
    await call("capsule_destroy", {"capsule_id": fork})
    out["host_before"] = _git_state(Path(paths["repo"]) / ".git")
    # A ref outside refs/heads and refs/tags is refused, nothing written; a tag promotes.
    out["odd_ref"] = await _sh(call, cap, "git update-ref refs/ccw-test/x HEAD && git tag capsule-tag")
    out["refused"] = await _promote(call, cap)
    out["unodd"] = await _sh(call, cap, "git update-ref -d refs/ccw-test/x && git status --porcelain")
    # The host moves the branch meanwhile: the capsule's commit no longer follows, nothing written.
    realprojects.git(Path(paths["wt"]), "commit", "-q", "--allow-empty", "-m", "moved on the host")
    out["host_moved"] = _git_state(Path(paths["repo"]) / ".git")
    out["conflict_dry"] = await _promote(call, cap, dry_run=True)  # said "would promote" before
    out["host_after_dry"] = _git_state(Path(paths["repo"]) / ".git")
    out["conflict"] = await _promote(call, cap)
    out["file_after_conflict"] = realprojects.run(["cat", EDIT.path], cwd=Path(paths["wt"]))
    realprojects.git(Path(paths["repo"]), "update-ref", "refs/heads/feat", paths["orig"])
    out["promoted"] = await _promote(call, cap)
    await call("capsule_destroy", {"capsule_id": cap})

    sub = await call("capsule_create", {"workspace": paths["sub"]})
    out["sub_git"] = sub.get("git")
    out["sub_commit"] = await _sh(call, sub["capsule_id"], f"git status -b --porcelain && {IDENTITY} commit -q "
                                  "--allow-empty -m sub-capsule && git log -1 --format=%s")
    await call("capsule_destroy", {"capsule_id": sub["capsule_id"]})

    if paths.get("secret"):
        bad = await call("capsule_create", {"workspace": paths["hostile"]})
        out["hostile_git"], out["hostile_shown"] = bad.get("git"), bad["isolation"]["filesystem"].get("gitdirs")
        out["hostile_read"] = await _sh(call, bad["capsule_id"], f"cat {paths['secret']}/id_ed25519; git status")
        await call("capsule_destroy", {"capsule_id": bad["capsule_id"]})
    return out


def _check(out: dict[str, Any], paths: dict[str, str], before: dict[str, str]) -> None:
    repo, wt = Path(paths["repo"]), Path(paths["wt"])
    gitdir = str(repo / ".git")
    assert out["git"] == {"gitdir": gitdir}, out["git"]
    assert out["shown"] == [{"path": gitdir, "copy_on_write": True}], out["shown"]
    assert out["status"]["exit"] == 0 and out["status"]["out"].startswith("## feat"), out["status"]
    assert out["commit"] == {"exit": 0, "out": "made in a capsule\n", "err": ""}, out["commit"]
    # The diff lists the git dir's changes apart, with the ref the commit moved.
    [diff_git] = out["diff_git"]
    assert diff_git["gitdir"] == gitdir and diff_git["refs"] == ["refs/heads/feat"], diff_git
    assert any(p.startswith("objects/") for p in diff_git["paths"]), diff_git
    # A witness names the git dir but does not carry it: the replay's git finds no repository, and says why.
    replay = out["replay"]
    assert replay["gitdirs"]["not_shown"] == [gitdir] and "does not carry" in replay["gitdirs"]["reason"], replay
    assert replay["replay_ok"] is False and any(m["kind"] == "exec" for m in replay["mismatches"]), replay
    assert out["fork_log"]["exit"] == 0 and out["fork_log"]["out"] == "made in a capsule\n", out["fork_log"]
    # Until promotion the host repository did not change: refs, objects, HEAD (the capsule's commit,
    # its fork, witness and replay included).
    assert out["host_before"] == before
    # A ref promotion cannot carry: refused, nothing written.
    assert out["odd_ref"]["exit"] == 0 and out["unodd"] == {"exit": 0, "out": "", "err": ""}, out
    refused = out["refused"]
    assert refused.get("error") == "UNSUPPORTED", refused
    assert refused["details"] == {"gitdir": gitdir, "refs": ["refs/ccw-test/x"]}, refused
    # The host's branch moved: REPO_CHANGED, the file untouched; a dry run says so, fetching nothing.
    assert out["conflict_dry"] == out["conflict"], out["conflict_dry"]
    assert out["host_after_dry"] == out["host_moved"]
    assert out["conflict"].get("error") == "REPO_CHANGED", out["conflict"]
    assert out["conflict"]["details"] == {"refs": ["refs/heads/feat"]}, out["conflict"]
    assert "capsule edit" not in out["file_after_conflict"]
    # Promoted: the file, the commit on the branch (a fast-forward) and the new tag; the host's
    # worktree is as clean as the capsule's.
    promoted = out["promoted"]
    assert promoted.get("promoted") is True and promoted["applied"] == [EDIT.path], promoted
    [git] = promoted["git"]
    assert git["gitdir"] == gitdir and "worktrees/wt/index" in git["paths"], git
    new = realprojects.git(repo, "rev-parse", "feat").strip()
    assert git["promoted_refs"] == [{"ref": "refs/heads/feat", "old": paths["orig"], "new": new},
                                    {"ref": "refs/tags/capsule-tag", "old": None, "new": new}], git
    assert (realprojects.git(wt, "log", "-2", "--format=%s")
            == f"made in a capsule\n{PROJECT.name} {PROJECT.version} as published\n")
    assert realprojects.git(repo, "rev-parse", "capsule-tag").strip() == new
    assert (wt / EDIT.path).read_text().endswith("capsule edit\n")
    assert realprojects.git(wt, "status", "--porcelain") == ""
    assert "capsule edit" in realprojects.git(repo, "show", f"{new}:{EDIT.path}")
    # The submodule: its gitdir under the superproject's .git/modules is shown, git commits in it.
    sub_gitdir = str(Path(paths["super"]) / ".git" / "modules" / "sub")
    assert out["sub_git"] == {"gitdir": sub_gitdir}, out["sub_git"]
    assert out["sub_commit"]["exit"] == 0 and out["sub_commit"]["out"].endswith("sub-capsule\n"), out["sub_commit"]
    assert "sub-capsule" not in realprojects.git(Path(paths["sub"]), "log", "--format=%s")




@pytest.fixture
def key_owner(root_required: None) -> Iterator[Path]:
    """A login user (not --system: their homes are what the secret rule knows) whose ~/.ssh looks like
    a git dir and holds a key."""
    name = f"ccwwt{secrets.token_hex(4)}"
    base = Path(tempfile.mkdtemp(prefix="ccw-wt-home-", dir="/var/tmp"))
    base.chmod(0o755)
    home = base / name
    for attempt in range(10):  # other tests add users too: /etc/passwd's lock may be held a moment
        made = subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell",
                               "/usr/sbin/nologin", name], capture_output=True, text=True, check=False)
        if made.returncode == 0:
            break
        time.sleep(0.2 * (attempt + 1))
    assert made.returncode == 0, made.stderr
    try:
        ssh = home / ".ssh"
        for sub in ("objects", "refs"):
            (ssh / sub).mkdir(parents=True)
        (ssh / "HEAD").write_text("ref: refs/heads/main\n")
        (ssh / "id_ed25519").write_text("PRIVATE KEY\n")
        subprocess.run(["chmod", "-R", "a+rX", str(home)], check=True)  # readable: only the rule keeps it out
        yield ssh
    finally:
        subprocess.run(["userdel", name], check=True, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_worktree_and_submodule_as_root(tools: Any, tmp_path: Path, key_owner: Path) -> None:
    paths = _repos(tmp_path)
    paths["secret"] = str(key_owner)
    Path(paths["hostile"], ".git").write_text(f"gitdir: {key_owner}\n")
    before = _git_state(Path(paths["repo"]) / ".git")
    out = tools.run(lambda t: scenario(t.call, paths))
    _check(out, paths, before)
    # A .git file naming a key store: a note, no git dir, the key unreadable in the capsule.
    assert out["hostile_git"]["note"].startswith("git will not work in this capsule: "), out["hostile_git"]
    assert ".ssh" in out["hostile_git"]["note"] and out["hostile_shown"] is None, out
    read = out["hostile_read"]
    assert "PRIVATE KEY" not in read["out"] and "No such file" in read["err"], read


def test_the_helper_refuses_a_spec_naming_a_key_store(tools: Any, tmp_path: Path, key_owner: Path) -> None:
    """The front end's note is not the boundary: a hand-made spec reaches the helper's own check."""
    from sandbox.spec import CapsuleSpec

    ws = tmp_path / "ws"
    ws.mkdir()

    async def create(t: Any) -> Any:
        return await t.ctx.capsules.create(CapsuleSpec(workspace=str(ws), gitdirs=(str(key_owner),)))

    with pytest.raises(CcwError) as raised:
        tools.run(create)
    assert raised.value.code == "PERMISSION_DENIED" and ".ssh" in raised.value.message, raised.value
    with open("/proc/self/mountinfo") as mounts:
        assert str(key_owner) not in mounts.read()
    # A git dir named through a link is refused too: the jail would show it where the link says.
    repo = realprojects.pristine(PROJECT, tmp_path / "repo")
    (tmp_path / "link").symlink_to(repo / ".git")

    async def linked(t: Any) -> Any:
        return await t.ctx.capsules.create(CapsuleSpec(workspace=str(ws), gitdirs=(str(tmp_path / "link"),)))

    with pytest.raises(CcwError) as raised:
        tools.run(linked)
    assert raised.value.code == "INVALID_ARGUMENT" and "resolved path" in raised.value.message, raised.value


def test_worktree_and_submodule_as_an_unprivileged_user(user_dir: tuple[int, int, Path]) -> None:
    uid, gid, home = user_dir
    paths = _repos(home)
    subprocess.run(["chown", "-R", f"{uid}:{gid}", *(paths[k] for k in ("repo", "wt", "super", "scratch"))],
                   check=True)
    before = _git_state(Path(paths["repo"]) / ".git")
    out = run_script_as(uid, gid, scenario_command("test_devmachine_worktree", paths), home)
    _check(out, paths, before)


def test_a_restarted_helper_mounts_git_dirs_again(tools: Any, tmp_path: Path) -> None:
    """A new helper (a new front end's) remounts a capsule's git dir overlay, and a fork's stacked on
    its parent's, on first use; the parent thaws when its fork goes, and destroying leaves no mount."""
    paths = _repos(tmp_path)

    async def first(t: Any) -> tuple[str, str]:
        cap = (await t.call("capsule_create", {"workspace": paths["wt"]}))["capsule_id"]
        made = await _sh(t.call, cap, f"{IDENTITY} commit -q --allow-empty -m before-restart")
        assert made["exit"] == 0, made
        return cap, (await t.call("capsule_fork", {"capsule_id": cap}))["capsule_id"]

    cap, fork = tools.run(first)

    async def second(t: Any) -> dict[str, Any]:
        out = {"fork": await _sh(t.call, fork,
                                 f"{IDENTITY} commit -q --allow-empty -m in-fork && git log -2 --format=%s")}
        await t.call("capsule_destroy", {"capsule_id": fork})
        out["parent"] = await _sh(t.call, cap,
                                  f"{IDENTITY} commit -q --allow-empty -m after-thaw && git log -3 --format=%s")
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(second)
    assert out["fork"] == {"exit": 0, "out": "in-fork\nbefore-restart\n", "err": ""}, out["fork"]
    assert out["parent"]["exit"] == 0 and out["parent"]["out"].startswith("after-thaw\nbefore-restart\n"), out
    assert "in-fork" not in out["parent"]["out"]
    assert realprojects.git(Path(paths["repo"]), "rev-parse", "feat").strip() == paths["orig"]
    with open("/proc/self/mountinfo") as mounts:
        assert not [line for line in mounts if str(tmp_path / "state") in line], "a capsule's mount was left"


def test_what_a_hostile_capsule_s_git_leaves_is_not_carried(tools: Any, tmp_path: Path) -> None:
    """Ref names and ids are the capsule's: a name that reads as a refspec, a branch naming a blob and
    config or hooks written in the git dir never reach the host; nothing is written on a refusal."""
    paths = _repos(tmp_path)
    repo, wt = Path(paths["repo"]), Path(paths["wt"])
    before = _git_state(repo / ".git")
    refspec = (f"mkdir -p {repo}/.git/refs/heads/a:refs/heads "
               f"&& git rev-parse HEAD > {repo}/.git/refs/heads/a:refs/heads/main")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(wt)}))["capsule_id"]
        out = {"main": await _sh(t.call, cap,
                                 f"{IDENTITY} commit -q --allow-empty -m x && git update-ref refs/heads/main HEAD")}
        out["elsewhere"] = await _promote(t.call, cap)  # main is checked out in the repository's own worktree
        out["unmain"] = await _sh(t.call, cap, f"git update-ref refs/heads/main {paths['orig']} "
                                               f"&& git reset -q --soft {paths['orig']}")
        out["edit"] = await _sh(t.call, cap, f"printf 'capsule edit\\n' >> {EDIT.path} && {refspec}")
        out["refspec"] = await _promote(t.call, cap)
        out["blob"] = await _sh(t.call, cap, f"rm -r {repo}/.git/refs/heads/a:refs && "  # git refuses, files do not
                                f"git hash-object -w {EDIT.path} > {repo}/.git/refs/heads/blobby")
        out["blobby"] = await _promote(t.call, cap)
        out["config"] = await _sh(t.call, cap, f"rm {repo}/.git/refs/heads/blobby "
                                  "&& git config core.pager 'touch /tmp/pwned' "
                                  "&& printf '#!/bin/sh\\ntouch /tmp/pwned\\n' "
                                  "> $(git rev-parse --git-common-dir)/hooks/post-commit")
        out["promoted"] = await _promote(t.call, cap)
        return out

    out = tools.run(scenario)
    assert all(out[k]["exit"] == 0 for k in ("main", "unmain", "edit", "blob", "config")), out
    assert out["elsewhere"].get("error") == "UNSUPPORTED", out["elsewhere"]
    assert out["elsewhere"]["details"] == {"refs": ["refs/heads/main"]}, out["elsewhere"]
    assert (out["refspec"].get("error") == "UNSUPPORTED"
            and "refs/heads/a:refs/heads/main" in out["refspec"]["message"]), out
    assert (out["blobby"].get("error") == "UNSUPPORTED"
            and out["blobby"]["details"] == {"refs": ["refs/heads/blobby"]}), out
    after = _git_state(repo / ".git")  # objects fetched for the refused branch, unreferenced; nothing else
    assert {p: h for p, h in after.items() if p in before} == before
    assert all(p.startswith("objects/") for p in set(after) - set(before)), sorted(set(after) - set(before))
    promoted = out["promoted"]
    assert promoted.get("promoted") is True and promoted["applied"] == [EDIT.path], promoted
    assert ({"config", "hooks/post-commit"} <= set(promoted["git"][0]["paths"])
            and "promoted_refs" not in promoted["git"][0])
    assert ("pwned" not in (repo / ".git" / "config").read_text()
            and not (repo / ".git" / "hooks" / "post-commit").exists())
    assert realprojects.git(repo, "for-each-ref", "--format=%(refname)") == "refs/heads/feat\nrefs/heads/main\n"

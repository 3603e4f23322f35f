"""capsule_merge as a way out of the capsules (issue 39): what a merge's inputs can make it do, as root.

A merge takes several capsules' changes; none of them, nor their combination, may get
onto the host what promotion would refuse of one capsule:

- one capsule turns ``docs/`` into a symlink to a directory outside the workspace while
  another adds ``docs/new.md``: merged as they are, the add would be written through the
  link.  The merge refuses it as a conflict on ``docs/new.md``, nothing made or written;
- a capsule that sets a setuid bit, or adds a ``.git`` hook, merged with an innocent one
  into the live tree: the merge is clean, and its promotion is refused with the hazard
  named, as capsule_promote refuses it, the tree untouched;
- a capsule made to look like another's descendant (created over the workspace and
  given the parent's edit by hand, or created over a copy of the parent's view as its
  base) cannot make the merge use the parent as the base: the base is what the service
  recorded, so the first is merged against the workspace (and conflicts where the
  parent's own edit is), the second refused for having another base;
- at a path the workspace's git ignores (``build/``), one capsule makes ``build`` a link
  while another writes ``build/pwn``: a conflict there does not count, yet nothing can be
  kept beneath a link; it stays a conflict, reported by the dry run as by the merge;
- sparse files, which cost the jail no disk at any size: a merge reads every input's
  changed files into memory and is refused (TOO_LARGE) before reading past its budget;
  a promotion or a branch of a file over the read cap is refused, where one past
  Linux's largest single read was written cut short.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

from sandbox.errors import CcwError

GIT_ENV = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "host",
           "GIT_AUTHOR_EMAIL": "host@example.invalid", "GIT_COMMITTER_NAME": "host",
           "GIT_COMMITTER_EMAIL": "host@example.invalid"}
LINES = "".join(f"line {i}\n" for i in range(1, 21))


def _git(ws: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(ws), *args], env={**os.environ, **GIT_ENV}, capture_output=True,
                          text=True, check=True).stdout


def _workspace(require: Any, tmp_path: Path) -> Path:
    require(shutil.which("git") is not None, "needs git")
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "a.md").write_text("a\n")
    (ws / "m.txt").write_text(LINES)
    (ws / "tool.sh").write_text("#!/bin/sh\necho tool\n")
    _git(ws, "init", "-q", "-b", "main")
    _git(ws, "add", "-A")
    _git(ws, "commit", "-q", "-m", "base")
    return ws


def _sh(script: str) -> list[str]:
    return ["sh", "-c", script]


async def _forks(t: Any, ws: Path, first: str, second: str) -> tuple[str, str]:
    parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    one, two = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
    for capsule_id, script in ((one, first), (two, second)):
        done = await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": _sh(script)})
        assert done["exit_code"] == 0, done["stderr"]
    return one, two


def test_a_merge_never_writes_through_a_symlink_another_input_made(tools: Any, require: Any, tmp_path: Path) -> None:
    ws = _workspace(require, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()

    async def scenario(t: Any) -> dict[str, Any]:
        one, two = await _forks(t, ws, f"rm -r docs && ln -s {outside} docs", "echo planted > docs/new.md")
        return {"ids": (one, two), "live": await t.call("capsule_merge", {"capsule_ids": [one, two], "into": "live"}),
                "new": await t.call("capsule_merge", {"capsule_ids": [one, two]})}

    out = tools.run(scenario)
    one, two = out["ids"]
    for merged in (out["live"], out["new"]):
        assert merged["merged"] is False and merged["written"] is False and "capsule_id" not in merged
        [clash] = merged["conflicts"]
        assert clash["path"] == "docs/new.md" and f"its directory docs is symlink -> {outside}" in clash["how"], clash
        assert clash["capsules"] == [one, two]
    assert list(outside.iterdir()) == [] and (ws / "docs").is_dir() and not (ws / "docs").is_symlink()
    assert _git(ws, "status", "--porcelain") == ""


def test_a_setuid_bit_or_a_git_hook_in_a_merge_is_refused_as_promotion_refuses_it(
        tools: Any, require: Any, tmp_path: Path) -> None:
    ws = _workspace(require, tmp_path)
    hook = ws / ".git" / "hooks" / "post-checkout"

    async def scenario(t: Any) -> dict[str, Any]:
        edit = "sed -i 's/^line 3$/line three/' m.txt"
        setuid = await _forks(t, ws, "chmod 4755 tool.sh", edit)
        hooked = await _forks(t, ws, f"printf '#!/bin/sh\\ntouch {tmp_path}/ran\\n' > .git/hooks/post-checkout && "
                              "chmod +x .git/hooks/post-checkout", edit)
        return {name: await t.call("capsule_merge", {"capsule_ids": list(ids), "into": "live"})
                for name, ids in (("setuid", setuid), ("hook", hooked))}

    out = tools.run(scenario)
    for name, kind, path in (("setuid", "setuid", "tool.sh"), ("hook", "git_control", ".git/hooks/post-checkout")):
        merged = out[name]
        assert merged["merged"] is True and merged["written"] is False, merged
        report = merged["promote"]["policy_report"]
        assert merged["promote"]["promoted"] is False and report["hazards_ok"] is False, report
        assert [(h["kind"], h["path"], h["allowed"]) for h in report["hazards"]] == [(kind, path, False)], report
    assert _git(ws, "status", "--porcelain") == "" and not hook.exists()
    assert not stat.S_IMODE(os.stat(ws / "tool.sh").st_mode) & stat.S_ISUID


def test_a_capsule_made_to_look_like_a_descendant_merges_against_its_real_base(
        tools: Any, require: Any, tmp_path: Path) -> None:
    ws = _workspace(require, tmp_path)
    copy = tmp_path / "parent-view"

    async def scenario(t: Any) -> dict[str, Any]:
        parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": parent, "cmd": _sh("sed -i 's/^line 5$/line five/' m.txt")})
        shutil.copytree(ws, copy, symlinks=True)
        (copy / "m.txt").write_text(LINES.replace("line 5\n", "line five\n"))
        [fork] = (await t.call("capsule_fork", {"capsule_id": parent, "count": 1}))["capsule_ids"]
        await t.call("capsule_exec", {"capsule_id": fork, "cmd": _sh("sed -i 's/^line 15$/line fifteen/' m.txt")})
        # Made over the workspace, given the parent's edit by hand, then its own over it.
        lookalike = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": lookalike, "cmd": _sh("sed -i 's/^line 5$/line FIVE!/' m.txt")})
        # Made over a copy of the parent's view as its base.
        over_copy = (await t.call("capsule_create", {"workspace": str(ws), "base": str(copy)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": over_copy, "cmd": _sh("sed -i 's/^line 1$/line one/' m.txt")})
        merged = await t.call("capsule_merge", {"capsule_ids": [fork, lookalike], "dry_run": True})
        refused: CcwError | None = None
        try:
            await t.call("capsule_merge", {"capsule_ids": [fork, over_copy], "dry_run": True})
        except CcwError as exc:
            refused = exc
        return {"merged": merged, "refused": refused, "ids": (fork, lookalike, over_copy)}

    out = tools.run(scenario)
    fork, lookalike, over_copy = out["ids"]
    merged = out["merged"]
    assert merged["base"] == {"directory": str(ws)}, merged["base"]
    [clash] = merged["conflicts"]
    [hunk] = clash["hunks"]
    assert (clash["path"], hunk["line"], hunk["base"], hunk["ours"], hunk["theirs"]) == (
        "m.txt", 5, "line 5\n", "line five\n", "line FIVE!\n"), clash
    assert clash["capsules"] == [fork, lookalike]
    refused = out["refused"]
    assert refused is not None and refused.code == "INVALID_ARGUMENT", refused
    assert f"{over_copy} was not made over the same base and workspace as {fork}" in refused.message


def test_the_policies_judge_what_the_inputs_ran_not_only_the_merged_capsule(
        tools: Any, require: Any, tmp_path: Path) -> None:
    """An input that read a path a policy denies is refused in a merge as in its own promotion:
    the merged capsule ran nothing, and its inputs' runs are judged with it."""
    ws = _workspace(require, tmp_path)
    (ws / "secret.txt").write_text("the key\n")
    rules = {"deny_paths": ["secret.txt"]}

    async def scenario(t: Any) -> dict[str, Any]:
        await t.call("policy_set", {"name": "no-secret", "rules": rules})
        snoop, edit = await _forks(t, ws, "cat secret.txt > /dev/null && echo snooped >> m.txt",
                                   "sed -i 's/^line 3$/line three/' m.txt")
        alone = await t.call("capsule_promote", {"capsule_id": snoop, "dry_run": True, "policies": ["no-secret"]})
        merged = await t.call("capsule_merge", {"capsule_ids": [snoop, edit], "into": "live",
                                                "policies": ["no-secret"]})
        # Merged into a new capsule with the snooper second (the new one is a fork of the first,
        # whose line holds no snooping), then promoted: its inputs' runs are judged all the same.
        made = (await t.call("capsule_merge", {"capsule_ids": [edit, snoop], "into": "new"}))["capsule_id"]
        later = await t.call("capsule_promote", {"capsule_id": made, "policies": ["no-secret"]})
        forked = (await t.call("capsule_fork", {"capsule_id": made}))["capsule_id"]
        from_fork = await t.call("capsule_promote", {"capsule_id": forked, "dry_run": True, "policies": ["no-secret"]})
        return {"alone": alone, "merged": merged, "later": later, "from_fork": from_fork}

    out = tools.run(scenario)
    for key in ("later", "from_fork"):
        report = out[key]["policy_report"]
        assert out[key]["promoted"] is False and report["deny_paths"] == ["secret.txt"], (key, report)
    alone = out["alone"]["policy_report"]
    assert alone["paths_ok"] is False and alone["deny_paths"] == ["secret.txt"], alone
    merged = out["merged"]
    assert merged["merged"] is True and merged["written"] is False and merged["promote"]["promoted"] is False
    report = merged["promote"]["policy_report"]
    assert report["paths_ok"] is False and report["deny_paths"] == ["secret.txt"], report
    assert (ws / "m.txt").read_text() == LINES


def test_an_ignored_file_beneath_another_inputs_link_stays_a_conflict(tools: Any, require: Any,
                                                                     tmp_path: Path) -> None:
    ws = _workspace(require, tmp_path)
    (ws / ".gitignore").write_text("build/\n")
    (ws / "build").mkdir()
    (ws / "build" / "keep.o").write_text("o\n")
    _git(ws, "add", ".gitignore")
    _git(ws, "commit", "-q", "-m", "ignore build")
    outside = tmp_path / "outside"
    outside.mkdir()

    async def scenario(t: Any) -> dict[str, Any]:
        one, two = await _forks(t, ws, f"rm -r build && ln -s {outside} build", "echo planted > build/pwn")
        asked = [("new", True), ("new", False), ("live", True), ("live", False)]
        return {"ids": (one, two), **{f"{into}-{dry}": await t.call("capsule_merge", {
            "capsule_ids": [one, two], "into": into, "dry_run": dry}) for into, dry in asked}}

    out = tools.run(scenario)
    one, two = out.pop("ids")
    for name, merged in out.items():
        assert merged["merged"] is False and merged["written"] is False and "capsule_id" not in merged, (name, merged)
        [clash] = merged["conflicts"]
        assert clash["path"] == "build/pwn" and f"its directory build is symlink -> {outside}" in clash["how"], clash
        assert clash["capsules"] == [one, two], clash
    assert list(outside.iterdir()) == [] and (ws / "build").is_dir() and not (ws / "build").is_symlink()
    assert _git(ws, "status", "--porcelain") == ""


def _refusal(call: Any) -> Any:
    async def refused() -> CcwError | None:
        try:
            await call()
        except CcwError as exc:
            return exc
        return None
    return refused


def test_sparse_files_of_any_size_are_refused_unread_by_merge_promotion_and_branch(
        tools: Any, require: Any, tmp_path: Path) -> None:
    ws = _workspace(require, tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        two, edit = await _forks(t, ws, "truncate -s 1100M a.bin && truncate -s 1100M b.bin",
                                 "sed -i 's/^line 3$/line three/' m.txt")
        huge = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        made = await t.call("capsule_exec", {"capsule_id": huge, "cmd": _sh("truncate -s 3G huge.bin")})
        assert made["exit_code"] == 0, made["stderr"]
        out = {name: await _refusal(lambda args=args, tool=tool: t.call(tool, args))()
               for name, tool, args in (
                   ("merge", "capsule_merge", {"capsule_ids": [two, edit], "into": "live"}),
                   ("promote", "capsule_promote", {"capsule_id": huge}),
                   ("branch", "capsule_promote", {"capsule_id": huge, "as_branch": "ccw/huge"}))}
        out["capsules"] = len((await t.call("capsule_list", {}))["capsules"])
        return out

    out = tools.run(scenario)
    assert out["merge"] is not None and out["merge"].code == "TOO_LARGE", out["merge"]
    assert "more than a merge holds in memory" in out["merge"].message
    for name in ("promote", "branch"):
        refused = out[name]
        assert refused is not None and refused.code == "TOO_LARGE", (name, refused)
        assert refused.details["path"] == "huge.bin" and refused.details["size"] == 3 << 30, refused.details
    assert out["capsules"] == 4  # the forks' parent, its two forks and huge's: no merged capsule was made
    assert _git(ws, "status", "--porcelain") == "" and not (ws / "huge.bin").exists()
    assert _git(ws, "branch", "--list", "ccw/huge") == ""

"""capsule_merge against ``git merge`` over seeded random scenarios, as root (issue 39: git's rules).

Each scenario is a small tree (text files with repeated lines, a CRLF file, one without a
final newline, an empty one, a binary, an executable, two symlinks, nested directories)
and two random sets of changes to it: lines edited, inserted and deleted near each other
or apart, the final newline and CRLF toggled, modes, symlinks retargeted, files turned
into symlinks or directories and back, deletes, one path added on both sides with equal
or different bytes.  The scenarios sit in directories of their own in one workspace; two
forks of one capsule each make one side's changes.  ``git merge`` (merge-ort) merges the
same changes, committed on two branches of a repository holding one scenario.

Per scenario, ccw and git must agree on where it conflicts (git names a file/directory
clash at the file, ccw may name the path kept below it: one path holds the other), and
where neither conflicts the merged capsule must hold git's merged tree: each file's bytes
and executable bit, each symlink's target.  The capsules' conflicting scenarios are made
equal on both sides first (the second fork given the first's tree there), since any
conflict refuses the whole merge.  Left out, as ccw differs from git on purpose: renames
(git detects them; ccw merges a delete and an add) and permission bits other than the
executable one (git records none of them; ccw keeps them).  ``_sync`` and ``_dump`` run
in the jail too, their source passed to ``python3 -c``.
"""

from __future__ import annotations

import base64
import copy
import inspect
import json
import os
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

BLOCKS = (41, 55, 58)  # seeds BLOCK * 1000 on: each held a clash ccw once merged unlike git
COUNT = 40  # scenarios a block
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "core.autocrlf=false",
       "-c", "gc.auto=0", "-c", "init.defaultBranch=main"]
NEW_PATHS = ["new.txt", "d/new.txt", "n/new.txt", "n/m/deep.txt", "t1.txt/inner.txt"]
NEW_DATA = [b"fresh\n", b"fresh\nline2\n", b"other\n", b"\x00binary-new", b""]
TEXT_CHANGES = ["edit", "edit", "edit", "insert", "insert", "drop", "append", "newline", "crlf", "empty", "twice"]
Tree = dict[str, tuple[Any, ...]]  # path -> ("file", bytes, mode) | ("link", target)


def _base(rng: random.Random) -> Tree:
    def lines(tag: str, count: int) -> bytes:
        return b"".join(b"same\n" if rng.random() < 0.2 else f"{tag}{i}\n".encode() for i in range(count))
    return {"t1.txt": ("file", lines("a", 8), 0o644), "t2.txt": ("file", lines("b", 6), 0o644),
            "d/t3.txt": ("file", lines("c", 6), 0o644), "d/e/t4.txt": ("file", lines("e", 4), 0o644),
            "bin.dat": ("file", b"\x00\x01BIN" + rng.randbytes(8), 0o644),
            "run.sh": ("file", b"#!/bin/sh\necho hi\n", 0o755), "link": ("link", "t1.txt"), "dlink": ("link", "d"),
            "crlf.txt": ("file", b"x\r\ny\r\nz\r\n", 0o644), "nonl.txt": ("file", b"p\nq\nr", 0o644),
            "empty.txt": ("file", b"", 0o644)}


def _put(tree: Tree, path: str, value: tuple[Any, ...]) -> None:
    """``value`` at ``path``: whatever was there or below goes, and no parent stays a file or link."""
    parts = path.split("/")
    for i in range(1, len(parts)):
        tree.pop("/".join(parts[:i]), None)
    for other in [p for p in tree if p == path or p.startswith(path + "/")]:
        del tree[other]
    tree[path] = value


def _text_change(rng: random.Random, data: bytes, kind: str) -> bytes:
    lines = data.splitlines(keepends=True)
    at = rng.randrange(len(lines) + 1)
    if kind == "edit" and lines:
        lines[min(at, len(lines) - 1)] = rng.choice([b"EDIT\n", b"edit%d\n" % at, b"same\n"])
    elif kind == "insert":
        lines.insert(at, rng.choice([b"INS\n", b"ins2\n", b"same\n"]))
    elif kind == "drop" and lines:
        del lines[min(at, len(lines) - 1)]
    elif kind == "twice" and lines:
        lines[min(at, len(lines) - 1):at + 1] = [b"same\n", b"same\n"]
    elif kind == "append":
        lines.append(b"tail\n")
    whole = b"".join(lines)
    if kind == "newline":
        return whole[:-1] if whole.endswith(b"\n") else whole + b"\n"
    if kind == "crlf":
        return whole.replace(b"\r\n", b"\n") if b"\r\n" in whole else whole.replace(b"\n", b"\r\n")
    if kind == "empty":
        return b"" if whole else b"filled\n"
    return whole


def _change(rng: random.Random, tree: Tree, focus: list[str]) -> str:
    """One random change to ``tree`` (renames and non-executable modes left out: see the docstring), and its label."""
    files = [p for p, v in tree.items() if v[0] == "file"]
    links = [p for p, v in tree.items() if v[0] == "link"]

    def pick(pool: list[str]) -> str:
        near = [p for p in focus if p in pool]
        return rng.choice(near) if near and rng.random() < 0.7 else rng.choice(pool)
    kind = rng.choice([*TEXT_CHANGES, "binary", "delete", "exec", "retarget", "to_link", "to_file", "to_dir",
                       "dir_to_file", "add", "add", "add_link"])
    if kind in TEXT_CHANGES and files:
        path = pick(files)
        tree[path] = ("file", _text_change(rng, tree[path][1], kind), tree[path][2])
    elif kind == "binary":
        _put(tree, path := "bin.dat", ("file", b"\x00\x01BIN" + rng.randbytes(8), 0o644))
    elif kind == "delete" and tree:
        path = pick([*tree, "d", "d/e"])
        for other in [p for p in tree if p == path or p.startswith(path + "/")]:
            del tree[other]
    elif kind == "exec" and files:
        path = pick(files)
        tree[path] = ("file", tree[path][1], tree[path][2] ^ 0o111)
    elif kind in ("retarget", "to_file") and links:
        path = pick(links)
        tree[path] = ("link", rng.choice(["t2.txt", "nowhere"])) if kind == "retarget" else \
            ("file", rng.choice(NEW_DATA), 0o644)
    elif kind in ("to_link", "to_dir") and files:
        path = pick(files)
        if kind == "to_link":
            _put(tree, path, ("link", rng.choice(["t2.txt", "nowhere"])))
        else:
            _put(tree, path + "/inner.txt", ("file", rng.choice(NEW_DATA), 0o644))
    elif kind == "dir_to_file":
        _put(tree, path := rng.choice(["d", "d/e"]), ("file", rng.choice(NEW_DATA), 0o644))
    elif kind in ("add", "add_link"):
        path = pick(NEW_PATHS)
        _put(tree, path, ("file", rng.choice(NEW_DATA), rng.choice([0o644, 0o755])) if kind == "add" else
             ("link", rng.choice(["t1.txt", "nowhere"])))
    else:
        return "nothing"
    return f"{kind} {path}"


def _scenario(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    base = _base(rng)
    ours, theirs = copy.deepcopy(base), copy.deepcopy(base)
    told = [_change(rng, ours, []) for _ in range(rng.randint(1, 3))]
    focus = [label.split(" ", 1)[-1] for label in told]
    if rng.random() < 0.15:  # the same change on both sides, maybe with more on one
        theirs = copy.deepcopy(ours)
        told += [_change(rng, theirs, focus)] if rng.random() < 0.5 else []
    else:
        told += [_change(rng, theirs, focus if rng.random() < 0.7 else []) for _ in range(rng.randint(1, 3))]
    return {"name": f"s{seed}", "base": base, "ours": ours, "theirs": theirs, "told": told}


def _wire(tree: Tree) -> dict[str, list[Any]]:
    return {p: ["file", base64.b64encode(v[1]).decode(), v[2]] if v[0] == "file" else list(v) for p, v in tree.items()}


def _sync(root: str, target: dict[str, list[Any]]) -> None:
    """Make the tree under ``root`` hold ``target`` (its ``_wire`` form; directories implied), touching
    only what differs: a file rewritten in place, as an editor saves it (runs in the jail too)."""
    import base64
    import os
    import shutil
    import stat
    dirs = {p.rsplit("/", i)[0] for p in target for i in range(1, p.count("/") + 1)}
    for where, subdirs, names in os.walk(root, topdown=False):
        rel = os.path.relpath(where, root)
        for name in names + subdirs:
            path = name if rel == "." else f"{rel}/{name}"
            if path == ".git" or path.startswith(".git/"):
                continue
            mode = os.lstat(os.path.join(root, path)).st_mode
            if stat.S_ISDIR(mode):
                if path not in dirs:
                    shutil.rmtree(os.path.join(root, path))
            elif path not in target or target[path][0] != ("link" if stat.S_ISLNK(mode) else "file"):
                os.unlink(os.path.join(root, path))
    for path, want in sorted(target.items()):
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        if want[0] == "link":
            if not (os.path.islink(full) and os.readlink(full) == want[1]):
                if os.path.lexists(full):
                    os.unlink(full)
                os.symlink(want[1], full)
            continue
        data = base64.b64decode(want[1])
        there = os.path.lexists(full)
        if there:
            with open(full, "rb") as file:
                there = file.read() == data or None
        if not there:
            with open(full, "wb" if there is False else "r+b") as file:
                file.write(data)
                file.truncate()
        if stat.S_IMODE(os.lstat(full).st_mode) != want[2]:
            os.chmod(full, want[2])


def _dump(root: str) -> dict[str, list[Any]]:
    """Every file (sha256, executable bit) and symlink (target) under ``root`` (runs in the jail too)."""
    import hashlib
    import os
    import stat
    out: dict[str, list[Any]] = {}
    for where, subdirs, names in os.walk(root):
        for name in names + subdirs:
            full = os.path.join(where, name)
            mode = os.lstat(full).st_mode
            path = os.path.relpath(full, root)
            if path == ".git" or path.startswith(".git/"):
                continue
            if stat.S_ISLNK(mode):
                out[path] = ["link", os.readlink(full)]
            elif stat.S_ISREG(mode):
                with open(full, "rb") as file:
                    out[path] = ["file", hashlib.sha256(file.read()).hexdigest(), bool(mode & 0o100)]
    return out


JAIL_SYNC = "from __future__ import annotations\n" + inspect.getsource(_sync) + """
import json, sys
for name, target in json.loads(sys.argv[1]):
    _sync(name, target)
"""
JAIL_DUMP = "from __future__ import annotations\n" + inspect.getsource(_dump) + """
import json, sys
print(json.dumps({name: _dump(name) for name in json.loads(sys.argv[1])}))
"""


def _git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run([*GIT, *args], cwd=repo, env=env, capture_output=True, check=check)


def _git_merge(repo: Path, one: dict[str, Any]) -> tuple[set[str], dict[str, list[Any]]]:
    """The paths ``git merge`` leaves unmerged (a clash's file moved aside, ``path~side``, named as ``path``),
    and its merged tree in ``_dump``'s form."""
    repo.mkdir()
    _git(repo, "init", "-q")
    for branch, tree in (("main", one["base"]), ("ours", one["ours"]), ("theirs", one["theirs"])):
        if branch != "main":
            _git(repo, "checkout", "-q", "-B", branch, "main")
        _sync(str(repo), _wire(tree))
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "--allow-empty", "-m", branch)
    _git(repo, "checkout", "-q", "ours")
    merged = _git(repo, "merge", "-q", "--no-edit", "theirs", check=False).returncode == 0
    unmerged = {line.split("\t", 1)[1].split("~")[0]
                for line in _git(repo, "ls-files", "-u", "-z").stdout.decode().split("\0") if line}
    assert merged != bool(unmerged), one["told"]
    return unmerged, _dump(str(repo)) if merged else {}


def _agree(ccw: set[str], git: set[str]) -> bool:
    """Each side's conflicts are the other's, or a path above or below one of them."""
    def near(one: str, other: str) -> bool:
        return one == other or one.startswith(other + "/") or other.startswith(one + "/")
    return all(any(near(c, g) for g in git) for c in ccw) and all(any(near(c, g) for c in ccw) for g in git)


def test_capsule_merge_agrees_with_git_merge_on_random_scenarios(tools: Any, require: Any, tmp_path: Path) -> None:
    require(shutil.which("git") is not None, "needs git")
    scenarios = [_scenario(seed) for block in BLOCKS for seed in range(block * 1000, block * 1000 + COUNT)]
    git = {one["name"]: _git_merge(tmp_path / one["name"], one) for one in scenarios}
    ws = tmp_path / "ws"
    for one in scenarios:
        (ws / one["name"]).mkdir(parents=True)
        _sync(str(ws / one["name"]), _wire(one["base"]))

    async def scenario(t: Any) -> dict[str, Any]:
        async def apply(capsule_id: str, side: str, names: set[str]) -> None:
            jobs = json.dumps([[one["name"], _wire(one[side])] for one in scenarios if one["name"] in names])
            done = await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["python3", "-c", JAIL_SYNC, jobs]})
            assert done["exit_code"] == 0, done["stderr"]

        parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ours, theirs = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
        every = {one["name"] for one in scenarios}
        await apply(ours, "ours", every)
        await apply(theirs, "theirs", every)
        dry = await t.call("capsule_merge", {"capsule_ids": [ours, theirs], "dry_run": True})
        clashing = {c["path"].split("/", 1)[0] for c in dry["conflicts"]}
        await apply(theirs, "ours", clashing)  # the merge refuses whole: those scenarios made equal
        made = await t.call("capsule_merge", {"capsule_ids": [ours, theirs], "into": "new"})
        assert made["merged"], made["conflicts"][:3]
        trees: dict[str, Any] = {}
        names = sorted(every - clashing)
        for start in range(0, len(names), 10):
            batch = json.dumps(names[start:start + 10])
            done = await t.call("capsule_exec", {"capsule_id": made["capsule_id"],
                                                 "cmd": ["python3", "-c", JAIL_DUMP, batch]})
            assert done["exit_code"] == 0 and not done["truncated"]["stdout"], done["stderr"]
            trees.update(json.loads(done["stdout"]))
        for capsule_id in (made["capsule_id"], ours, theirs, parent):
            await t.call("capsule_destroy", {"capsule_id": capsule_id})
        return {"dry": dry, "trees": trees}

    out = tools.run(scenario)
    conflicts: dict[str, set[str]] = {one["name"]: set() for one in scenarios}
    for clash in out["dry"]["conflicts"]:
        name, path = clash["path"].split("/", 1)
        conflicts[name].add(path)
    differ = []
    for one in scenarios:
        name, (unmerged, tree) = one["name"], git[one["name"]]
        if not _agree(conflicts[name], unmerged):
            differ.append(f"{name} {one['told']}: ccw conflicts {sorted(conflicts[name])}, git {sorted(unmerged)}")
        elif not unmerged and out["trees"][name] != tree:
            wrong = sorted(p for p in {*tree, *out["trees"][name]} if tree.get(p) != out["trees"][name].get(p))
            differ.append(f"{name} {one['told']}: merged trees differ at {wrong}")
    assert differ == [], "\n".join(differ)
    # the seeds reach both outcomes
    assert 10 < sum(1 for c in conflicts.values() if c) < len(scenarios) - 10, conflicts

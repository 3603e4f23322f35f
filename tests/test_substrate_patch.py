"""The strict patch applier against `git apply`, on a corpus generated from real files.

A git repository is seeded with real source files (hypothesis's own sources, installed
beside the tests), then ~90 commits of random but realistic edits follow: lines
inserted, deleted, replaced and moved, files added, deleted, renamed, made executable,
CRLF files and files without a final newline.  The corpus is every commit's `git diff`
and its reverse, `git format-patch` output, patches applied to the wrong commit (so
hunks must move or fail), and mutated copies.  For each case the applier and
`git apply` must make the same decision, and on success leave byte-identical files.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import hypothesis
import pytest

from mcp_server.core.patch import parse_patch
from mcp_server.core.patch_apply import apply
from sandbox.errors import CcwError

N_COMMITS = 90
SEED = 20261125


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(
        GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@e", GIT_AUTHOR_DATE="2026-01-01T00:00:00Z",
        GIT_COMMITTER_DATE="2026-01-01T00:00:00Z", GIT_CONFIG_GLOBAL="/dev/null",
        GIT_CONFIG_SYSTEM="/dev/null",
    )
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=check, env=env)


def _sources() -> list[Path]:
    root = Path(hypothesis.__file__).parent
    files = sorted(p for p in root.rglob("*.py") if 500 < p.stat().st_size < 40_000)
    return files[:30]


def _edit(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    lines = data.splitlines(keepends=True)
    for _ in range(rng.randint(1, 4)):
        op = rng.random()
        at = rng.randint(0, len(lines))
        if op < 0.35 or not lines:
            lines[at:at] = rng.sample(pool, rng.randint(1, 4))
        elif op < 0.6:
            del lines[at:at + rng.randint(1, 5)]
        elif op < 0.85:
            lines[at:at + 1] = [rng.choice(pool)]
        else:
            chunk = lines[at:at + rng.randint(2, 6)]
            del lines[at:at + len(chunk)]
            dest = rng.randint(0, len(lines))
            lines[dest:dest] = chunk
    out = b"".join(lines)
    if rng.random() < 0.05:
        out = out.rstrip(b"\n")
    return out


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    rng = random.Random(SEED)
    repo = tmp_path_factory.mktemp("patchrepo")
    git(repo, "init", "-q")
    git(repo, "config", "core.autocrlf", "false")
    pool: list[bytes] = []
    for src in _sources():
        dest = repo / "src" / src.name.replace("_", "", 1)
        dest.parent.mkdir(exist_ok=True)
        data = src.read_bytes()
        dest.write_bytes(data)
        pool.extend(data.splitlines(keepends=True))
    (repo / "crlf.txt").write_bytes(b"".join(line.rstrip(b"\n") + b"\r\n" for line in pool[:60]))
    (repo / "nonl.txt").write_bytes(b"one\ntwo\nthree")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "c0")
    commits = [git(repo, "rev-parse", "HEAD").stdout.decode().strip()]
    for n in range(1, N_COMMITS):
        files = sorted(p for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts)
        for path in rng.sample(files, rng.randint(1, 3)):
            path.write_bytes(_edit(rng, path.read_bytes(), pool))
        roll = rng.random()
        if roll < 0.08:
            (repo / "src" / f"new{n}.py").write_bytes(b"".join(rng.sample(pool, rng.randint(0, 30))))
        elif roll < 0.14 and len(files) > 10:
            rng.choice(files).unlink()
        elif roll < 0.2:
            victim = rng.choice(files)
            victim.rename(victim.with_name(f"moved{n}_{victim.name}"))
        elif roll < 0.25:
            victim = rng.choice(files)
            victim.chmod(0o755 if not os.access(victim, os.X_OK) else 0o644)
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"c{n}", "--allow-empty")
        commits.append(git(repo, "rev-parse", "HEAD").stdout.decode().strip())
    return repo, commits


def _tree(repo: Path) -> dict[str, tuple[bytes, bool]]:
    out = {}
    for path in repo.rglob("*"):
        if path.is_file() and ".git" not in path.relative_to(repo).parts:
            out[str(path.relative_to(repo))] = (path.read_bytes(), os.access(path, os.X_OK))
    return out


def _mutate(rng: random.Random, patch: bytes) -> bytes:
    lines = patch.split(b"\n")
    body = [i for i, line in enumerate(lines) if line[:1] in (b" ", b"-") and not line.startswith(b"---")]
    if not body:
        return patch
    i = rng.choice(body)
    lines[i] = lines[i][:1] + b"XX" + lines[i][1:]
    return b"\n".join(lines)


def _check(repo: Path, base: str, patch: bytes) -> tuple[bool, bool]:
    """Apply ``patch`` at commit ``base`` both ways; return (accepted, same result)."""
    git(repo, "checkout", "-qf", base)
    git(repo, "clean", "-qfdx")
    before = _tree(repo)

    def read(path: str) -> tuple[bytes, int] | None:
        item = before.get(path)
        if item is None:
            return None
        return item[0], 0o100755 if item[1] else 0o100644

    try:
        result = apply(parse_patch(patch), read)
        ours_ok = not result.rejects
    except CcwError:
        result, ours_ok = None, False
    proc = subprocess.run(["git", "-C", str(repo), "apply", "-"], input=patch, capture_output=True)
    git_ok = proc.returncode == 0
    after = _tree(repo)
    if not git_ok:
        assert after == before
    if ours_ok != git_ok:
        return git_ok, False
    if not git_ok:
        return False, True
    assert result is not None
    expected = dict(before)
    for path, item in result.files.items():
        if item is None:
            expected.pop(path, None)
        else:
            expected[path] = (item[0], bool(item[1] & 0o100))
    return True, expected == after


def test_applier_agrees_with_git_apply(corpus: tuple[Path, list[str]], tmp_path: Path) -> None:
    repo, commits = corpus
    rng = random.Random(SEED + 1)
    cases: list[tuple[str, str, bytes]] = []
    for k in range(1, len(commits)):
        forward = git(repo, "diff", "--binary", commits[k - 1], commits[k]).stdout
        cases.append((f"forward {k}", commits[k - 1], forward))
        cases.append((f"reverse {k}", commits[k], git(repo, "diff", commits[k], commits[k - 1]).stdout))
        if k >= 2 and k % 2 == 0:
            cases.append((f"skewed {k}", commits[k - 2], forward))
        if k % 3 == 0:
            cases.append((f"mutated {k}", commits[k - 1], _mutate(rng, forward)))
        if k % 4 == 0:
            cases.append((f"reapplied {k}", commits[k], forward))
    out = tmp_path / "fp"
    git(repo, "format-patch", "-q", "-o", str(out), f"{commits[0]}..{commits[30]}")
    for k, name in enumerate(sorted(os.listdir(out))):
        cases.append((f"format-patch {name}", commits[k], (out / name).read_bytes()))
    accepted = rejected = 0
    disagreements = []
    for label, base, patch in cases:
        ok, same = _check(repo, base, patch)
        accepted += ok
        rejected += not ok
        if not same:
            disagreements.append(label)
    shutil.rmtree(out)
    assert len(cases) >= 200
    assert not disagreements, disagreements
    print(f"{len(cases)} cases: {accepted} accepted, {rejected} rejected")
    assert accepted >= 150 and rejected >= 20, (accepted, rejected)


def test_rejects_are_structured_and_sorted() -> None:
    patch = (
        b"--- a/b.txt\n+++ b/b.txt\n@@ -1,2 +1,2 @@\n-x\n+y\n z\n@@ -5,2 +5,2 @@\n q\n-r\n+s\n"
        b"--- a/a.txt\n+++ b/a.txt\n@@ -1 +1 @@\n-nope\n+yes\n"
    )
    files = {"a.txt": b"hello\n", "b.txt": b"x\nz\n"}
    result = apply(parse_patch(patch), lambda p: (files[p], 0o100644) if p in files else None)
    assert result.rejects == [
        {"path": "a.txt", "hunks": [{"index": 0, "reason": "context_mismatch"}]},
        {"path": "b.txt", "hunks": [{"index": 1, "reason": "context_mismatch"}]},
    ]


def test_crlf_and_missing_newline_are_byte_exact() -> None:
    patch = b"--- a/f\n+++ b/f\n@@ -1,2 +1,2 @@\n a\r\n-b\r\n\\ No newline at end of file\n+c\n"
    files = {"f": b"a\r\nb\r\n"}
    assert apply(parse_patch(patch), lambda p: (files[p], 0o100644)).rejects
    files = {"f": b"a\r\nb\r"}
    result = apply(parse_patch(patch), lambda p: (files[p], 0o100644))
    assert result.files == {"f": (b"a\r\nc\n", 0o100644)}


def test_parent_escape_in_patch_is_refused() -> None:
    with pytest.raises(CcwError) as info:
        parse_patch(b"--- a/../x\n+++ b/../x\n@@ -1 +1 @@\n-a\n+b\n")
    assert info.value.code == "PERMISSION_DENIED"


def test_binary_literal_patches_agree_with_git(tmp_path: Path) -> None:
    from mcp_server.core.unidiff import FileChange, render_all

    repo = tmp_path / "bin"
    repo.mkdir()
    git(repo, "init", "-q")
    old, new = bytes(range(256)) * 4, b"\0new binary\0" * 50
    (repo / "img.bin").write_bytes(old)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bin")
    base = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    patch = render_all([
        FileChange("img.bin", old, new, 0o100644, 0o100644),
        FileChange("added.bin", None, b"\0\1\2", None, 0o100644),
    ])
    assert _check(repo, base, patch) == (True, True)
    (repo / "img.bin").write_bytes(old + b"drift")
    git(repo, "commit", "-qam", "drift")
    drifted = git(repo, "rev-parse", "HEAD").stdout.decode().strip()
    assert _check(repo, drifted, patch) == (False, True)

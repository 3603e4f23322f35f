"""What a capsule's change does to its base commit's tree, as git records it (pure logic).

capsules/branch.py commits a capsule's change onto a branch: the base commit's tree with
each path the capsule changed recorded as ``git add`` would record the capsule's file
there.  The change comes as the Promoter's ops (``changeset.promote_ops``), the very
ones promotion's policies and hazard checks judged; this module turns them into index
edits.  Git's rules, which the ops do not follow one for one:

- Git records files and symlinks only.  A directory is the paths under it: ``mkdir``
  and a directory's ``chmod`` record nothing (an empty directory is not in a commit),
  and deleting one removes every path under it.
- A file's mode is ``100755`` when its owner may execute it, else ``100644``; git keeps
  no other bit (a setuid bit, had ``allow_hazards`` let one through, is not recorded).
  A symlink is ``120000`` whose blob is its target, never what it points at.
- A path replaced by another kind (file to directory, directory to symlink) arrives as
  a delete before the write, so the old path and everything under it go first.
- No path in a tree may have a ``.git`` component (git refuses them in any case:
  ``.GIT`` too).  Changes there, a commit made in the capsule's ``.git`` or a nested
  repository, are left out and listed (``GIT_DIR``), as promotion leaves a git dir's
  contents to git.
- A submodule (a gitlink, ``160000``) is another repository's commit: a change inside
  one cannot be recorded in this tree, so it is refused (UNSUPPORTED), never dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mcp_server.fs.promote import Op
from sandbox.errors import CcwError

GITLINK = "160000"
SYMLINK = "120000"
GIT_DIR = "git dir"  # the reason a path is left out


@dataclass
class Edits:
    """The index edits: paths to drop from the base tree, then paths to record (path, mode,
    ``symlink``: the blob is the link's target) from the capsule, and the paths left out."""

    remove: list[str] = field(default_factory=list)
    add: list[tuple[str, str]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)


def file_mode(mode: int | None) -> str:
    """Git's mode for a regular file with permission bits ``mode``."""
    return "100755" if (mode or 0) & 0o100 else "100644"


def in_git_dir(path: str) -> bool:
    """Whether a component of ``path`` is ``.git`` (casefolded, as git compares it)."""
    return any(part.casefold() == ".git" for part in path.split("/"))


def _under(base: Mapping[str, str], path: str) -> list[str]:
    prefix = path + "/"
    return [p for p in base if p.startswith(prefix)]


def _gitlink_above(base: Mapping[str, str], path: str) -> str | None:
    parts = path.split("/")
    for i in range(1, len(parts)):
        parent = "/".join(parts[:i])
        if base.get(parent) == GITLINK:
            return parent
    return None


def edits(base: Mapping[str, str], ops: Sequence[Op], kinds: Mapping[str, str]) -> Edits:
    """The edits that make ``base`` (path -> git mode, from ``git ls-tree -r``) hold the capsule's
    change ``ops``; ``kinds`` gives each op's path its kind in the capsule (file, dir, symlink)."""
    out = Edits()
    tree = dict(base)  # as edited so far: a later op sees what an earlier one removed
    recorded: dict[str, str] = {}
    for op in ops:
        if in_git_dir(op.path):
            if op.path not in out.left_out:
                out.left_out.append(op.path)
            continue
        if op.action == "delete":
            for gone in [op.path, *_under(tree, op.path)]:
                if tree.pop(gone, None) is not None:
                    out.remove.append(gone)
            for gone in [op.path, *_under(recorded, op.path)]:
                recorded.pop(gone, None)
            continue
        kind = kinds.get(op.path)
        if kind == "dir" or op.action == "mkdir":
            continue
        link = _gitlink_above(tree, op.path)
        if link is not None:
            raise CcwError("UNSUPPORTED", f"{op.path!r} is inside the submodule {link!r}: a branch of this "
                           "repository cannot record it; no branch was made. Commit it in the submodule, or "
                           "leave it out (exclude)", {"path": op.path, "submodule": link})
        recorded[op.path] = SYMLINK if kind == "symlink" or op.action == "symlink" else file_mode(op.mode)
        tree[op.path] = recorded[op.path]
    out.add = sorted(recorded.items(), key=lambda item: item[0].encode("utf-8", "surrogateescape"))
    return out


def index_info(edits_: Edits, oids: Mapping[str, str], zero: str) -> bytes:
    """``git update-index -z --index-info`` input: every removal first, then every path recorded
    with its blob (``oids``); ``zero``: the null object id of the repository's hash."""
    lines = [f"0 {zero}\t".encode() + path.encode("utf-8", "surrogateescape") + b"\0" for path in edits_.remove]
    lines += [f"{mode} {oids[path]}\t".encode() + path.encode("utf-8", "surrogateescape") + b"\0"
              for path, mode in edits_.add]
    return b"".join(lines)


def parse_ls_tree(raw: bytes) -> dict[str, str]:
    """``git ls-tree -r -z`` output: path -> mode."""
    out = {}
    for record in raw.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        out[path.decode("utf-8", "surrogateescape")] = meta.split(b" ", 1)[0].decode()
    return out

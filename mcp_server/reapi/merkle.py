"""A file tree as a REAPI input root: a Merkle tree of ``Directory`` messages, SHA-256.

Some facts about REAPI's trees, as this module builds them:

- A blob is named by its digest, ``(sha256 hex, size)``; a ``Directory`` is itself a
  blob (its serialised bytes), so the root's digest names the whole tree, and two trees
  that share a subdirectory share its blobs.  SHA-256 is the one digest function every
  REAPI server accepts.
- Servers may check that a Directory is canonical: files, directories and symlinks each
  sorted by name (code-point order, which is UTF-8 byte order), no duplicate names, and
  serialised deterministically.  An empty directory is a real node (its Directory is
  the empty message, digest of zero bytes).
- A file carries only its digest and its executable bit; owners, other mode bits and
  times are not part of the tree (``node_properties`` could carry them; ccw does not
  send them, so a command that depends on them is not hermetic).
- A symlink is a node with its target, which the server may refuse when absolute
  (``symlink_absolute_path_strategy`` in its capabilities).  Fifos, sockets and
  devices have no node at all, so a tree holding one is refused here.

The tree is built from ``entries``, a flat map from relative POSIX path to what is
there, so a caller can lay a change's files over a scanned base before hashing.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from mcp_server.reapi.protos import re_pb2
from sandbox.errors import CcwError

DigestKey = tuple[str, int]
READ_CHUNK = 1 << 20


def key(digest: re_pb2.Digest) -> DigestKey:
    """A digest as a hashable ``(hash, size)``."""
    return (digest.hash, digest.size_bytes)


def digest_bytes(data: bytes) -> re_pb2.Digest:
    """The SHA-256 digest of ``data``."""
    return re_pb2.Digest(hash=hashlib.sha256(data).hexdigest(), size_bytes=len(data))


def digest_file(path: Path) -> re_pb2.Digest:
    """The SHA-256 digest of a file's contents, read in chunks."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as source:
        while chunk := source.read(READ_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return re_pb2.Digest(hash=sha.hexdigest(), size_bytes=size)


@dataclass(frozen=True)
class FileEntry:
    """A regular file: its bytes (``data``) or where to read them (``path``), and its x bit.

    ``digest``: the file's digest when already known (a base scanned once for many trees).
    """

    data: bytes | None = None
    path: Path | None = None
    executable: bool = False
    digest: re_pb2.Digest | None = None


@dataclass(frozen=True)
class SymlinkEntry:
    """A symlink and its target, as written."""

    target: str


@dataclass(frozen=True)
class DirEntry:
    """A directory, needed only for an empty one (others follow from their contents)."""


Entry = FileEntry | SymlinkEntry | DirEntry


@dataclass
class InputTree:
    """A built tree: the root's digest and every blob under it (Directory bytes or file sources)."""

    root: re_pb2.Digest
    blobs: dict[DigestKey, bytes | Path] = field(default_factory=dict)
    directories: int = 0

    def digests(self) -> list[re_pb2.Digest]:
        """Every blob's digest, the root's first."""
        root = key(self.root)
        rest = [re_pb2.Digest(hash=h, size_bytes=s) for (h, s) in self.blobs if (h, s) != root]
        return [self.root, *rest]


def scan_directory(root: Path) -> dict[str, Entry]:
    """Every file, symlink and empty directory under ``root``, by relative POSIX path."""
    entries: dict[str, Entry] = {}
    # os.walk lists a symlink to a directory among ``dirnames`` but does not enter it
    # (followlinks=False); lstat below makes it a symlink node.
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        relative = PurePosixPath(here.relative_to(root).as_posix())
        if not dirnames and not filenames and here != root:
            entries[str(relative)] = DirEntry()
        for name in [*dirnames, *filenames]:
            path = here / name
            info = path.lstat()
            where = str(relative / name)
            if stat.S_ISLNK(info.st_mode):
                entries[where] = SymlinkEntry(os.readlink(path))
            elif stat.S_ISREG(info.st_mode):
                entries[where] = FileEntry(path=path, executable=bool(info.st_mode & stat.S_IXUSR))
            elif not stat.S_ISDIR(info.st_mode):
                raise CcwError("INVALID_ARGUMENT", f"{path} is neither a file, a directory nor a "
                                                   "symlink: REAPI trees cannot hold it")  # fmt: skip
    return entries


@dataclass
class _Node:
    files: dict[str, FileEntry] = field(default_factory=dict)
    symlinks: dict[str, str] = field(default_factory=dict)
    children: dict[str, _Node] = field(default_factory=dict)


def _insert(root: _Node, where: str, entry: Entry) -> None:
    parts = PurePosixPath(where).parts
    if not parts or parts[0] == "/" or ".." in parts or str(PurePosixPath(where)) != where:
        raise CcwError("INVALID_ARGUMENT", f"tree path {where!r} must be relative and normalised")
    node = root
    for part in parts[:-1]:
        node = node.children.setdefault(part, _Node())
    name = parts[-1]
    if isinstance(entry, FileEntry):
        node.files[name] = entry
    elif isinstance(entry, SymlinkEntry):
        node.symlinks[name] = entry.target
    else:
        node.children.setdefault(name, _Node())


def _seal(node: _Node, tree: InputTree) -> re_pb2.Digest:
    """Hash ``node``'s subtree bottom-up, adding its blobs to ``tree``; the Directory's digest."""
    directory = re_pb2.Directory()
    names = [*node.files, *node.symlinks, *node.children]
    if len(names) != len(set(names)):
        raise CcwError("INVALID_ARGUMENT", f"a name is both a file/symlink and a directory: {sorted(names)}")
    for name in sorted(node.files):
        entry = node.files[name]
        source: bytes | Path
        if entry.data is not None:
            digest, source = digest_bytes(entry.data), entry.data
        elif entry.path is not None:
            digest, source = entry.digest or digest_file(entry.path), entry.path
        else:
            raise CcwError("INVALID_ARGUMENT", f"file {name!r} has neither data nor path")
        tree.blobs.setdefault(key(digest), source)
        directory.files.add(name=name, digest=digest, is_executable=entry.executable)
    for name in sorted(node.children):
        directory.directories.add(name=name, digest=_seal(node.children[name], tree))
    for name in sorted(node.symlinks):
        directory.symlinks.add(name=name, target=node.symlinks[name])
    data = directory.SerializeToString(deterministic=True)
    digest = digest_bytes(data)
    tree.blobs.setdefault(key(digest), data)
    tree.directories += 1
    return digest


def build_tree(entries: Mapping[str, Entry]) -> InputTree:
    """The Merkle tree of ``entries`` (relative POSIX path → entry)."""
    root = _Node()
    for where, entry in entries.items():
        _insert(root, where, entry)
    tree = InputTree(root=re_pb2.Digest())
    tree.root = _seal(root, tree)
    return tree


def digested(entries: Mapping[str, Entry]) -> dict[str, Entry]:
    """``entries`` with every file's digest computed once (for trees built over and over)."""
    return {where: FileEntry(path=e.path, executable=e.executable, digest=digest_file(e.path))
            if isinstance(e, FileEntry) and e.path is not None and e.digest is None else e
            for where, e in entries.items()}  # fmt: skip


def tree_of_directory(root: Path) -> InputTree:
    """The Merkle tree of the directory at ``root``."""
    return build_tree(scan_directory(root))


def output_tree(tree: InputTree) -> re_pb2.Tree:
    """``tree`` as REAPI's ``Tree`` message (an output directory): the root Directory and every one below it once."""
    def directory(digest: re_pb2.Digest) -> re_pb2.Directory:
        data = tree.blobs[key(digest)]
        return re_pb2.Directory.FromString(data if isinstance(data, bytes) else data.read_bytes())

    root = directory(tree.root)
    children, seen = [], set()
    pending = [node.digest for node in root.directories]
    while pending:
        digest = pending.pop(0)
        if key(digest) in seen:
            continue
        seen.add(key(digest))
        child = directory(digest)
        children.append(child)
        pending.extend(node.digest for node in child.directories)
    return re_pb2.Tree(root=root, children=children)

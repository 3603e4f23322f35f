"""A worker's side of the CAS: lay an input root out on disk, and upload a run's outputs.

Some facts about fetching an input root:

- ``GetTree`` streams every Directory under a root in pages, so one call replaces a
  read per directory; the files are then read by digest, each distinct blob once
  (``BatchReadBlobs`` for many small ones at a time, ByteStream for a large one), and
  with a cache only the blobs the host has not seen before.
- Names in a Directory come from the client: a worker must refuse ``..``, ``/`` and
  empty names, or an input root could write outside its directory.  Symlinks are made
  as given; what they point at is resolved by the command at run time, inside the
  worker's jail.
- Only the executable bit travels; files are written 0644 or 0755.
- ``output_paths`` are relative to the working directory; an output that the run did
  not make is simply absent from the ActionResult (REAPI's rule), not an error.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shutil
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from mcp_server.reapi.client import ReapiClient
from mcp_server.reapi.merkle import digest_bytes, digest_file, key
from mcp_server.reapi.protos import re_pb2
from sandbox.errors import CcwError


def _safe_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise CcwError("INVALID_ARGUMENT", f"input root holds an unsafe name {name!r}")
    return name


# A blob's name in the cache is its digest's: only a SHA-256's hex digits can be one.
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _checked(digest: re_pb2.Digest) -> None:
    # A Directory is the REAPI client's, and an empty blob is never read from the CAS
    # (client.read_blob), so nothing else checks a file digest before it names a file.
    if not _SHA256.fullmatch(digest.hash) or digest.size_bytes < 0:
        raise CcwError("INVALID_ARGUMENT", f"input root names {digest.hash[:80]!r}/{digest.size_bytes}, which is "
                       "not a SHA-256 digest (64 lowercase hex digits and a size of 0 or more)")


def fetch_directories(client: ReapiClient, root: re_pb2.Digest) -> dict[tuple[str, int], re_pb2.Directory]:
    """Every Directory under ``root`` (root included), by digest; INVALID_ARGUMENT when a digest
    in them is no SHA-256."""
    _checked(root)
    if root.size_bytes == 0:
        return {key(root): re_pb2.Directory()}
    found = {}
    for directory in client.get_tree(root):
        for node in (*directory.files, *directory.directories):
            _checked(node.digest)
        found[key(digest_bytes(directory.SerializeToString(deterministic=True)))] = directory
    return found


class BlobCache:
    """A host's input files by digest and executable bit, hard-linked into every lease's input root.

    Leases on one host share it, so a lease reads from the CAS only what the host has
    not seen.  Past ``max_bytes`` the least recently used files go, down to 90% of it,
    but only when no lease is laying out links (``lease``): a file picked as cached
    must still be there to link.  Removing a cache entry never breaks a running lease:
    its input root holds its own links to the same inodes.  Use is tracked in memory
    (touching a file would change the mtime the lease's command sees, and atime is not
    kept reliably under relatime); at start, older files count as less recently used.
    """

    def __init__(self, root: Path, max_bytes: int | None = None) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.max_bytes = root, max_bytes
        self._lock = threading.Lock()
        self._active = 0
        self._tick = 0
        self._entries: dict[str, tuple[int, int]] = {}  # name: (last use, size)
        found = []
        for entry in os.scandir(root):
            if entry.name.startswith(".part-"):  # a write a killed bot left half done
                os.unlink(entry.path)
                continue
            stat = entry.stat(follow_symlinks=False)
            found.append((stat.st_mtime_ns, entry.name, stat.st_size))
        for _, name, size in sorted(found):
            self._entries[name] = (self._next(), size)
        self.evicted = 0

    def _next(self) -> int:
        self._tick += 1
        return self._tick

    @staticmethod
    def name(digest: re_pb2.Digest, executable: bool) -> str:
        return f"{digest.hash}-{digest.size_bytes}-{'x' if executable else 'r'}"

    def has(self, digest: re_pb2.Digest, executable: bool) -> bool:
        with self._lock:
            return self.name(digest, executable) in self._entries

    @property
    def size(self) -> int:
        with self._lock:
            return sum(size for _, size in self._entries.values())

    def store(self, digest: re_pb2.Digest, executable: bool, data: bytes) -> None:
        """Put a blob in as a file of its own mode (written aside, then renamed: leases share it)."""
        name = self.name(digest, executable)
        if self.has(digest, executable):
            return
        fd, temporary = tempfile.mkstemp(dir=self.root, prefix=".part-")
        with open(fd, "wb") as sink:
            sink.write(data)
        os.chmod(temporary, 0o755 if executable else 0o644)
        os.replace(temporary, self.root / name)
        with self._lock:
            self._entries[name] = (self._next(), len(data))

    def link(self, digest: re_pb2.Digest, executable: bool, path: Path) -> None:
        """``path`` as a hard link to the cached file (a copy where links cannot go: another filesystem, link limit)."""
        name = self.name(digest, executable)
        source = self.root / name
        try:
            os.link(source, path)
        except OSError:
            shutil.copy2(source, path)
        with self._lock:
            self._entries[name] = (self._next(), digest.size_bytes)

    @contextlib.contextmanager
    def lease(self) -> Iterator[None]:
        """While a lease picks and links cached files: nothing is evicted until the last such lease is done."""
        with self._lock:
            self._active += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if self._active == 0:
                    self._evict()

    def _evict(self) -> None:
        total = sum(size for _, size in self._entries.values())
        if self.max_bytes is None or total <= self.max_bytes:
            return
        for name, (_, size) in sorted(self._entries.items(), key=lambda item: item[1][0]):
            if total <= self.max_bytes * 0.9:
                break
            try:
                os.unlink(self.root / name)
            except FileNotFoundError:
                pass
            del self._entries[name]
            total -= size
            self.evicted += 1


def fetch_input_root(client: ReapiClient, root: re_pb2.Digest, dest: Path, cache: BlobCache | None = None) -> int:
    """Write the tree ``root`` names into the empty directory ``dest``; the number of files written.

    The blobs come many per ``BatchReadBlobs``.  With ``cache`` (a BlobCache on the same
    filesystem as ``dest``) every file is a hard link to a cached copy keyed by digest
    and executable bit, and only blobs not cached yet are read: trials over one base
    fetch only what their subset changed.  The links are safe to share because a
    capsule never writes its lower directory (overlayfs copies up first).
    """
    with cache.lease() if cache is not None else contextlib.nullcontext():
        return _fetch(client, root, dest, cache)[0]


@dataclass
class _Laid:
    """An input root on disk: where, which tree, and that tree's Directories (to sync it from)."""

    path: Path
    root: re_pb2.Digest
    directories: dict[tuple[str, int], re_pb2.Directory]


class InputRoots:
    """Input roots kept on disk between leases, each brought to the next lease's tree by what differs.

    Laying a real project's tree out costs a lease 100 to 200 ms (a project with its
    ``.venv``: some 2,500 links and 250 directories, and ext4's mkdir is the slow part),
    while the trials of one search differ from each other in a few files.  So a lease
    takes a kept root (one of the same tree if there is one, else the last returned),
    removes what the new tree does not hold, skips every subtree whose digest is
    unchanged, and links what is new.  Reuse is safe because a capsule never writes its
    lower directory; a lease that fails is not kept, and neither is a root a sync broke.
    """

    def __init__(self, root: Path, cache: BlobCache, keep: int = 1) -> None:
        shutil.rmtree(root, ignore_errors=True)  # roots a killed bot left: their trees are unknown
        root.mkdir(parents=True)
        self.root, self.cache, self.keep = root, cache, max(1, keep)
        self._idle: list[_Laid] = []
        self._lock = threading.Lock()
        self._names = itertools.count()
        self.reused = 0  # leases served by a kept root

    @contextlib.contextmanager
    def checkout(self, client: ReapiClient, digest: re_pb2.Digest) -> Iterator[Path]:
        """The tree ``digest`` names, laid out for the block (which must not write to it)."""
        with self._lock:
            same = [laid for laid in self._idle if key(laid.root) == key(digest)]
            old = (same or self._idle)[-1] if self._idle else None
            if old is not None:
                self._idle.remove(old)
        path = old.path if old is not None else self.root / f"root-{next(self._names)}"
        try:
            if old is None:
                path.mkdir()
            with self.cache.lease():
                _, directories = _fetch(client, digest, path, self.cache, old)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        if old is not None:
            self.reused += 1
        kept = False
        try:
            yield path
            kept = True
        finally:
            self._give_back(_Laid(path, digest, directories) if kept else None, path)

    def _give_back(self, laid: _Laid | None, path: Path) -> None:
        dropped = [path] if laid is None else []
        with self._lock:
            if laid is not None:
                self._idle.append(laid)
            while len(self._idle) > self.keep:
                dropped.append(self._idle.pop(0).path)
        for gone in dropped:
            shutil.rmtree(gone, ignore_errors=True)


def _fetch(client: ReapiClient, root: re_pb2.Digest, dest: Path, cache: BlobCache | None,
           old: _Laid | None = None) -> tuple[int, dict[tuple[str, int], re_pb2.Directory]]:  # fmt: skip
    """Lay ``root`` out in ``dest`` (empty, or holding ``old``'s tree); files written, and the tree's Directories."""
    directories = fetch_directories(client, root)
    nodes = {(key(n.digest), n.is_executable): n.digest for d in directories.values() for n in d.files}
    data: dict[tuple[str, int], bytes] = {}
    if cache is not None:
        wanted = {key(d): d for (k, x), d in nodes.items() if not cache.has(d, x)}
    else:
        wanted = {k: d for (k, _), d in nodes.items()}
    for digest, blob in client.read_blobs(wanted.values()):
        if cache is None:
            data[key(digest)] = blob
            continue
        for executable in (False, True):
            if (key(digest), executable) in nodes:
                cache.store(digest, executable, blob)
    layout = _Layout(directories, cache, data, old.directories if old is not None else {})
    if old is None:
        layout.lay_out(root, dest)
    elif key(old.root) != key(root):
        layout.sync(old.directories[key(old.root)], root, dest)
    return layout.written, directories


class _Layout:
    """Puts a fetched tree on disk: a directory laid out afresh, or synced from the older tree it holds."""

    def __init__(self, directories: dict[tuple[str, int], re_pb2.Directory], cache: BlobCache | None,
                 data: dict[tuple[str, int], bytes], old: dict[tuple[str, int], re_pb2.Directory]) -> None:  # fmt: skip
        self.directories, self.cache, self.data, self.old = directories, cache, data, old
        self.written = 0  # files put

    def directory(self, digest: re_pb2.Digest) -> re_pb2.Directory:
        found = self.directories.get(key(digest))
        if found is None:
            raise CcwError("NOT_FOUND", f"GetTree did not return Directory {digest.hash}/{digest.size_bytes}")
        return found

    def put(self, node: re_pb2.FileNode, path: Path) -> None:
        if self.cache is not None:
            self.cache.link(node.digest, node.is_executable, path)
        else:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o755 if node.is_executable else 0o644)  # fmt: skip
            with open(fd, "wb") as sink:
                sink.write(self.data[key(node.digest)])
        self.written += 1

    def lay_out(self, digest: re_pb2.Digest, here: Path) -> None:
        """Every entry of the Directory ``digest`` into the empty directory ``here``."""
        found = self.directory(digest)
        for node in found.files:
            self.put(node, here / _safe_name(node.name))
        for link in found.symlinks:
            os.symlink(link.target, here / _safe_name(link.name))
        for child in found.directories:
            sub = here / _safe_name(child.name)
            sub.mkdir()
            self.lay_out(child.digest, sub)

    def sync(self, was: re_pb2.Directory, digest: re_pb2.Digest, here: Path) -> None:
        """``here`` holds the Directory ``was``: make it the Directory ``digest``.

        Remove what the new Directory does not hold as it is, recurse into the
        subdirectories that changed, then add what is new (a name may change kind).
        """
        now = self.directory(digest)
        files = {node.name: node for node in now.files}
        links = {link.name: link.target for link in now.symlinks}
        subdirectories = {child.name: child.digest for child in now.directories}
        for node in was.files:
            new = files.get(node.name)
            if new is not None and key(new.digest) == key(node.digest) and new.is_executable == node.is_executable:
                del files[node.name]
            else:
                os.unlink(here / node.name)
        for link in was.symlinks:
            if links.get(link.name) == link.target:
                del links[link.name]
            else:
                os.unlink(here / link.name)
        for child in was.directories:
            below = subdirectories.pop(child.name, None)
            if below is None:
                shutil.rmtree(here / child.name)
            elif key(below) != key(child.digest):
                self.sync(self.old[key(child.digest)], below, here / child.name)
        for node in files.values():
            self.put(node, here / _safe_name(node.name))
        for name, target in links.items():
            os.symlink(target, here / _safe_name(name))
        for name, below in subdirectories.items():
            sub = here / _safe_name(name)
            sub.mkdir()
            self.lay_out(below, sub)


def upload_outputs(client: ReapiClient, workdir: Path, command: re_pb2.Command) -> list[re_pb2.OutputFile]:
    """Upload the regular files among the command's outputs; their OutputFile entries.

    Files only: vm-tests' plain-subprocess bot uses it.  ccw-bot (bot/runner.py) also sends
    output directories, a ``Tree`` each.
    """
    outputs: list[re_pb2.OutputFile] = []
    for relative in [*command.output_paths, *command.output_files]:
        path = workdir / relative
        if not path.is_file() or path.is_symlink():
            continue
        digest = digest_file(path)
        client.upload({key(digest): path})
        outputs.append(re_pb2.OutputFile(path=relative, digest=digest,
                                         is_executable=os.access(path, os.X_OK)))  # fmt: skip
    return outputs

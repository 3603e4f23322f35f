"""The blake3 of each file of a tree, kept while the file's lstat says it was not written since (git's index).

capsule_merge needs the merge base's state at every path either input changed, but the
bytes of a base file only where two inputs changed it; elsewhere a digest does (the
live check compares digests, a one-sided change needs only "is it the base's?").  This
cache gives that digest for the price of an ``lstat``.  Some facts about file
timestamps, which its correctness rests on:

- A write, truncate, chmod, chown, link or rename of a file sets its ctime to the
  current time, and no call lets a user set ctime (``utimensat`` sets mtime and atime
  only).  An inode number is reused only once its file is gone, and the new file's ctime
  is when it was made.  So while a path's (dev, inode, size, mtime_ns, ctime_ns) are
  what they were when it was hashed, its bytes are the bytes hashed: that tuple is the key.
- Except within one tick: the time written is the kernel's coarse clock (1 to 10 ms),
  truncated to the filesystem's granularity (a nanosecond on ext4, xfs, btrfs and tmpfs,
  a second on some, two seconds for FAT's mtime).  A file hashed, then rewritten at the
  same size within the same granule keeps every field of the key.  Git calls this "racy
  git", and re-hashes an entry whose mtime is not older than the index's own write.  The
  rule here is the same with a margin: a digest is kept only for a file whose mtime and
  ctime are more than ``RACY_NS`` older than the clock read before the file was stat'ed
  (``StatCache.since_ns``).  Any later write then stamps a ctime no granule can fold into
  the old one, so a key that still matches was made before every write the file had.
- A file rewritten between its ``lstat`` and its read is hashed with its new bytes under
  its old key; that key never matches again (the write moved its ctime), so the wrong
  digest is never used.
- What the rule cannot see: the clock set back by more than ``RACY_NS`` (a ctime can
  then repeat), a filesystem that does not keep ctime (some FUSE ones) or serves stale
  attributes (NFS's attribute cache), and root editing the disk beneath the filesystem.

One JSON file per tree in the state dir (``statcache/``), read and written as a private
file (fs/privatefile.py: the state dir's owner alone); it is rewritten only when a merge
hashed files it did not know, so a merge over an unchanged base writes nothing.  A file
that is unreadable, corrupt or too large is an empty cache: it only ever saves reads.
"""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import blake3

from mcp_server.fs.privatefile import read_private, replace_private, state_dir_fd
from sandbox.errors import CcwError

RACY_NS = 3_000_000_000  # more than FAT's two-second mtime and a clock tick
LIMIT = 32 << 20  # bytes of one tree's cache file; a larger one is dropped
MAX_ENTRIES = 200_000  # past this, a save keeps only what the merge saving it looked at

Key = tuple[int, int, int, int, int]  # dev, inode, size, mtime_ns, ctime_ns


def key_of(info: os.stat_result) -> Key:
    """The stat fields that move when a file is written (see the module's docstring)."""
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns


def digest_of(data: bytes) -> str:
    """A file's digest as the cache keeps it and changeset.state_text writes it: blake3, hex."""
    return blake3.blake3(data).hexdigest()


class StatCache:
    """Digests of one tree's files by path, each trusted while its file's stat key is unchanged."""

    def __init__(self, tree: str, entries: dict[str, tuple[Key, str]] | None = None) -> None:
        self.tree = tree
        self.since_ns = time.time_ns()  # read before any file is stat'ed under this cache
        self._entries = entries or {}
        self._seen: set[str] = set()
        self._added = False

    def digest(self, path: str, info: os.stat_result) -> str | None:
        """``path``'s digest if its file's stat (``info``) is the one it was hashed under."""
        if not stat.S_ISREG(info.st_mode):
            return None
        self._seen.add(path)
        kept = self._entries.get(path)
        return kept[1] if kept is not None and kept[0] == key_of(info) else None

    def add(self, path: str, info: os.stat_result, digest: str) -> None:
        """Keep ``digest`` of the file that ``info`` (an lstat taken before its read) describes,
        unless a write within the racy margin could hide behind the same key."""
        cutoff = self.since_ns - RACY_NS
        self._seen.add(path)
        if stat.S_ISREG(info.st_mode) and info.st_mtime_ns < cutoff and info.st_ctime_ns < cutoff:
            self._entries[path] = (key_of(info), digest)
            self._added = True

    @staticmethod
    def _name(tree: str) -> str:
        return blake3.blake3(os.fsencode(tree)).hexdigest()[:32] + ".json"

    @classmethod
    def load(cls, state_dir: str | Path, tree: str) -> StatCache:
        """The cache of ``tree`` kept in ``state_dir`` (empty if there is none, or it cannot be used)."""
        where = Path(state_dir) / "statcache"
        try:
            with state_dir_fd(where) as fd:
                raw = read_private(fd, cls._name(tree), str(where / cls._name(tree)), LIMIT, "stat cache")
            kept = json.loads(raw) if raw else {}
            if kept.get("tree") != tree:
                return cls(tree)
            return cls(tree, {path: (tuple(one[:5]), one[5]) for path, one in kept["entries"].items()})
        except (CcwError, ValueError, KeyError, TypeError, IndexError):
            return cls(tree)  # an unusable cache only costs reads

    def save(self, state_dir: str | Path) -> None:
        """Write the cache back if this use hashed files it did not know."""
        if not self._added:
            return
        entries = self._entries
        if len(entries) > MAX_ENTRIES:
            entries = {path: one for path, one in entries.items() if path in self._seen}
        where = Path(state_dir) / "statcache"
        text = json.dumps({"tree": self.tree, "entries": {path: [*key, digest] for path, (key, digest)
                                                          in entries.items()}}, separators=(",", ":"))
        with state_dir_fd(where) as fd:
            replace_private(fd, self._name(self.tree), str(where / self._name(self.tree)), text.encode(), "stat cache")
        self._added = False

"""What a capsule changed: its upper dir(s) read against its lower layers.

The overlayfs facts this follows (whiteouts, opaque directories, no redirects or
metacopy, a fork's uppers stacked) are sandbox/overlay.py's essay; this module is the
scan that relies on them, split from it along that seam.  The trees it reads are the
jail's work, hence hostile: every entry is looked at by its name in a directory
descriptor, with no-follow on the entry itself.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence

from sandbox.checks import kind_of
from sandbox.errors import from_oserror
from sandbox.overlay import is_opaque, is_whiteout
from sandbox.replies import Change


def _same_bytes(a: tuple[int, str], b: tuple[int, str]) -> bool:
    """Whether two files, each a name in a directory descriptor, hold the same bytes."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    fd_a = os.open(a[1], flags, dir_fd=a[0])
    try:
        fd_b = os.open(b[1], flags, dir_fd=b[0])
        try:
            while True:
                chunk_a = os.read(fd_a, 1 << 16)
                chunk_b = os.read(fd_b, 1 << 16)
                if chunk_a != chunk_b:
                    return False
                if not chunk_a:
                    return True
        finally:
            os.close(fd_b)
    finally:
        os.close(fd_a)


def _entry_change(rel: str, at: tuple[int, str], st: os.stat_result,
                  base: tuple[int, str, os.stat_result] | None, mtimes: bool = False) -> Change | None:
    """Classify one non-directory upper entry (``at``: its directory's descriptor and its name)
    against the base entry below it (``_Below.lookup``'s)."""
    ftype = kind_of(st.st_mode)
    mode: int | None = stat.S_IMODE(st.st_mode)
    size = st.st_size if ftype == "file" else None
    target = os.readlink(at[1], dir_fd=at[0]) if ftype == "symlink" else None
    if ftype == "symlink":
        mode = None  # symlink permission bits mean nothing on Linux
    if base is None:
        return Change(rel, "added", ftype, mode, size, target, st.st_mtime_ns if mtimes and size is not None else None)
    base_fd, base_name, base_st = base
    if stat.S_IFMT(base_st.st_mode) != stat.S_IFMT(st.st_mode):
        return Change(rel, "type_changed", ftype, mode, size, target)
    if ftype == "symlink":
        if os.readlink(base_name, dir_fd=base_fd) == target:
            return None
        return Change(rel, "modified", ftype, None, None, target)
    if ftype == "file":
        same = base_st.st_size == st.st_size and _same_bytes(at, (base_fd, base_name))
    else:
        same = base_st.st_rdev == st.st_rdev
    if not same:
        return Change(rel, "modified", ftype, mode, size, None, st.st_mtime_ns if mtimes else None)
    if stat.S_IMODE(base_st.st_mode) != mode:
        return Change(rel, "mode_changed", ftype, mode, size)
    return None  # copied up (opened for write, touched) but equal in bytes and mode


def collect_changes(upper: str | Sequence[str], lowers: Sequence[str],
                    unlisted: list[str] | None = None, mtimes: bool = False) -> list[Change]:
    """What the upper dir(s) change relative to ``lowers``, sorted by path bytes (``mtimes``: an added or
    modified file's with its mtime, which a merge journals unread); with ``unlisted``, the paths the rules
    below leave out gathered there (unsorted): files copied up unchanged and whiteouts over nothing in
    the base, which hide what a layer stacked under these uppers shows (capsules/merge_write.py).

    ``upper`` is one upper dir, or a stack of them top first (a fork: its own upper over
    its parents'), read as the single layer they make together.  Rules:

    * a whiteout is ``deleted`` (type of the base entry) when the base has the path,
      and nothing otherwise; a deleted directory is one entry, its contents implied;
    * an opaque directory over a base directory is ``opaque``; what is inside it is
      listed as ``added``;
    * a non-dir replaced by a dir or the reverse, or a file by a symlink, is
      ``type_changed`` (the new type);
    * a file with other bytes is ``modified`` (mode carries the new permission bits);
      equal bytes but other permission bits is ``mode_changed``; equal bytes and equal
      bits is *unchanged* and not listed, even though it was copied up (mtime-only and
      owner-only changes are not listed);
    * a symlink is compared by its target, recorded with ``readlink`` and never followed;
    * a directory copied up only because something below it changed is not listed; one
      whose permission bits changed is ``mode_changed``.  The root itself is never listed.
    """
    uppers = [upper] if isinstance(upper, str) else list(upper)
    changes: list[Change] = []
    # Each frame: directory rel path, upper layers that contribute to it, whether the
    # base is still visible under it (False below an opaque dir).
    stack: list[tuple[str, list[str], bool]] = [("", uppers, True)]
    while stack:
        rel_dir, layers, base_visible = stack.pop()
        # Each entry is looked at by its name in its directory's descriptor, not by a path
        # walked from the root: a merge lists thousands of entries in a few directories.
        with _Layers(rel_dir, layers) as here, _Below(lowers, rel_dir if base_visible else None) as under:
            for name, index in here.topmost.items():
                rel = f"{rel_dir}/{name}" if rel_dir else name
                at = (here.fds[index], name)
                st = os.stat(name, dir_fd=at[0], follow_symlinks=False)
                base = under.lookup(name)
                if is_whiteout(st):
                    if base is not None:
                        changes.append(Change(rel, "deleted", kind_of(base[2].st_mode)))
                    elif unlisted is not None:
                        unlisted.append(rel)
                    continue
                if not stat.S_ISDIR(st.st_mode):
                    change = _entry_change(rel, at, st, base, mtimes)
                    if change is None and unlisted is not None:
                        unlisted.append(rel)
                else:
                    path = os.path.join(layers[index], rel)
                    below, child_base_visible = _showing_through(layers, index, rel,
                                                                 base_visible and not is_opaque(path))
                    change = _dir_change(rel, stat.S_IMODE(st.st_mode), base, child_base_visible)
                    stack.append((rel, below, child_base_visible and base is not None))
                if change is not None:
                    changes.append(change)
    changes.sort(key=lambda change: os.fsencode(change.path))
    return changes


def _open_dir(path: str) -> int | None:
    """A descriptor of the directory at ``path`` (followed as ``listdir`` and a walk through it
    follow it), None where nothing is, or something that is not a directory."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise from_oserror(exc, "open directory", path) from exc


class _Layers:
    """Directory ``rel_dir`` of each upper layer that has it, open (``fds``: by layer index), and
    each name in them with the index of the topmost layer holding it (``topmost``)."""

    def __init__(self, rel_dir: str, layers: list[str]) -> None:
        self.fds: dict[int, int] = {}
        self.topmost: dict[str, int] = {}
        try:
            for index, layer in enumerate(layers):
                dir_path = os.path.join(layer, rel_dir) if rel_dir else layer
                fd = _open_dir(dir_path)
                if fd is None:
                    continue
                self.fds[index] = fd
                try:
                    names = os.listdir(fd)
                except OSError as exc:
                    raise from_oserror(exc, "listdir", dir_path) from exc
                for name in names:
                    self.topmost.setdefault(name, index)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds.clear()

    def __enter__(self) -> _Layers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Below:
    """``lower_lookup`` of each name in one directory, through that directory of each lower layer
    opened once: a lower without the directory holds none of its names (the lookup goes on
    below it), one where it is no directory hides them all (it stops, as ENOTDIR stops it).
    ``rel_dir`` None: the base does not show there, every lookup is None."""

    def __init__(self, lowers: Sequence[str], rel_dir: str | None) -> None:
        self.fds: list[int] = []
        self.paths: list[str] = []  # each descriptor's directory, for errors
        if rel_dir is None:
            return
        try:
            for lower in lowers:
                path = os.path.join(lower, rel_dir) if rel_dir else lower
                try:
                    self.fds.append(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))
                    self.paths.append(path)
                except FileNotFoundError:
                    continue
                except NotADirectoryError:
                    break
                except OSError as exc:
                    raise from_oserror(exc, "open directory", path) from exc
        except BaseException:
            self.close()
            raise

    def lookup(self, name: str) -> tuple[int, str, os.stat_result] | None:
        """The entry ``name`` in the topmost lower holding it: its directory's descriptor, its name and
        its lstat; None where no lower has it, or it is a whiteout."""
        for fd, path in zip(self.fds, self.paths, strict=True):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise from_oserror(exc, "lstat", os.path.join(path, name)) from exc
            return None if is_whiteout(st) else (fd, name, st)
        return None

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds.clear()

    def __enter__(self) -> _Below:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _showing_through(layers: list[str], index: int, rel: str, base_visible: bool) -> tuple[list[str], bool]:
    """For the directory ``rel`` found in ``layers[index]``: the layers that contribute to it
    (it, and the directories at ``rel`` below it), and whether the base still shows."""
    below = [layers[index]]
    if not base_visible:
        return below, False
    for deeper in layers[index + 1 :]:
        deeper_path = os.path.join(deeper, rel)
        try:
            deeper_st = os.lstat(deeper_path)
        except (FileNotFoundError, NotADirectoryError):
            continue
        if not stat.S_ISDIR(deeper_st.st_mode):
            return below, False  # a whiteout or a non-dir hides the rest
        below.append(deeper)
        if is_opaque(deeper_path):
            return below, False
    return below, True


def _dir_change(rel: str, mode: int, base: tuple[int, str, os.stat_result] | None,
                base_visible: bool) -> Change | None:
    """The change a directory in the upper layers makes, if any (see collect_changes)."""
    if base is None:
        return Change(rel, "added", "dir", mode)
    if not stat.S_ISDIR(base[2].st_mode):
        return Change(rel, "type_changed", "dir", mode)
    if not base_visible:
        return Change(rel, "opaque", "dir", mode)
    if stat.S_IMODE(base[2].st_mode) != mode:
        return Change(rel, "mode_changed", "dir", mode)
    return None

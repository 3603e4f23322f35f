"""fs/statcache: a file's digest is given for its lstat while the file is unchanged, never after a
write (in place, same size, mtime put back), never for a file written within the racy margin,
and the cache survives in the state dir only as a private file, rewritten only when it learned."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from mcp_server.fs.statcache import RACY_NS, StatCache, digest_of


def _later(cache: StatCache) -> StatCache:
    """The cache as a merge run ``RACY_NS`` after its files' last writes sees it: past the racy margin."""
    cache.since_ns = time.time_ns() + 2 * RACY_NS
    return cache


def _rewritten(path: Path, data: bytes) -> os.stat_result:
    """``path`` rewritten in place with ``data`` (its size), its mtime put back: only its ctime tells."""
    before = os.lstat(path)
    while True:
        path.write_bytes(data)
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        after = os.lstat(path)
        if after.st_ctime_ns != before.st_ctime_ns:  # a write in the same clock tick is the racy case
            return after
        time.sleep(0.01)


def test_a_file_hashed_once_is_known_by_its_lstat_until_it_is_written(tmp_path: Path) -> None:
    tree, state = tmp_path / "tree", tmp_path / "state"
    tree.mkdir()
    file = tree / "a.txt"
    file.write_bytes(b"one\n")
    cache = _later(StatCache.load(state, str(tree)))
    assert cache.digest("a.txt", os.lstat(file)) is None
    cache.add("a.txt", os.lstat(file), digest_of(b"one\n"))
    cache.save(state)
    again = StatCache.load(state, str(tree))
    assert again.digest("a.txt", os.lstat(file)) == digest_of(b"one\n")
    moved = _rewritten(file, b"two\n")
    assert moved.st_size == 4 and moved.st_mtime_ns == os.lstat(file).st_mtime_ns
    assert again.digest("a.txt", moved) is None
    assert StatCache.load(state, str(tmp_path)).digest("a.txt", moved) is None  # another tree's cache is its own


def test_a_file_written_within_the_racy_margin_is_not_kept(tmp_path: Path) -> None:
    """Written just before the cache's clock reading, a file could be rewritten in the same tick at the
    same size after it is hashed: it is hashed again next time, as git re-hashes a racy entry."""
    state = tmp_path / "state"
    file = tmp_path / "a.txt"
    file.write_bytes(b"one\n")
    cache = StatCache.load(state, str(tmp_path))
    cache.add("a.txt", os.lstat(file), digest_of(b"one\n"))
    assert cache.digest("a.txt", os.lstat(file)) is None
    cache.save(state)
    assert not (state / "statcache").exists() or os.listdir(state / "statcache") == []  # nothing learned


def test_the_cache_file_is_private_and_a_corrupt_one_is_an_empty_cache(tmp_path: Path) -> None:
    state = tmp_path / "state"
    file = tmp_path / "a.txt"
    file.write_bytes(b"one\n")
    cache = _later(StatCache.load(state, str(tmp_path)))
    cache.add("a.txt", os.lstat(file), digest_of(b"one\n"))
    cache.save(state)
    [saved] = (state / "statcache").iterdir()
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600 and stat.S_IMODE(saved.parent.stat().st_mode) == 0o700
    written = saved.stat().st_mtime_ns
    known = StatCache.load(state, str(tmp_path))
    assert known.digest("a.txt", os.lstat(file)) == digest_of(b"one\n")
    known.save(state)  # learned nothing: not rewritten
    assert saved.stat().st_mtime_ns == written
    saved.write_text('{"tree": ')
    assert StatCache.load(state, str(tmp_path)).digest("a.txt", os.lstat(file)) is None
    assert StatCache.load(state, str(tmp_path)).digest("missing", os.lstat(tmp_path)) is None  # not a file

"""Searching for a secret's bytes where a person, a capsule or its journal could read them (issue 38).

Credential tests put a known value in the secret store and then look for its bytes
everywhere else: the files of the state dir (bar the store itself), the workspace, the
journal's events.  What a capsule sees (its environment, /proc) is searched from inside
it, by ``IN_CAPSULE``, which takes the value in hex so that its own argv never holds it.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

STORE_FILE = "secrets.json"  # fs/secretstore.py's file: the one place the value is kept

# python3 -c IN_CAPSULE HEX: prints the paths under /proc, /tmp, $HOME and the cwd whose bytes hold the value.
IN_CAPSULE = """
import os, sys
value = bytes.fromhex(sys.argv[1])
found = []
def look(path):
    try:
        with open(path, 'rb') as f:
            if value in f.read(1 << 24):
                found.append(path)
    except OSError:
        pass
for pid in os.listdir('/proc'):
    if pid.isdigit():
        for name in ('environ', 'cmdline'):
            look(f'/proc/{pid}/{name}')
for top in ('/tmp', os.environ.get('HOME', '/tmp'), '.'):
    for folder, dirs, names in os.walk(top):
        for name in names:
            path = os.path.join(folder, name)
            if os.path.isfile(path) and not os.path.islink(path):
                look(path)
print(found)
"""


def files_holding(root: Path, needles: bytes | tuple[bytes, ...], skip: set[str]) -> list[str]:
    """The regular files under ``root`` (not named in ``skip``) whose bytes hold ``needles``
    (one value, or any of several: each file is read once for all of them).

    Only a file's data is read (``SEEK_DATA``/``SEEK_HOLE``): a capsule's disk image is an
    8 GiB sparse file with a few hundred KiB in it, and its bytes are the capsule's files;
    reading the holes (zeros, which hold no needle) once cost a test 200 of its 230 s."""
    wanted = (needles,) if isinstance(needles, bytes) else needles
    found = []
    for folder, _dirs, names in os.walk(root):
        for name in names:
            path = Path(folder, name)
            if name in skip or not path.is_file() or path.is_symlink():
                continue
            try:
                if _holds(path, wanted):
                    found.append(str(path))
            except OSError:
                continue
    return found


def _holds(path: Path, needles: tuple[bytes, ...], chunk: int = 1 << 22) -> bool:
    """Whether the data extents of ``path`` hold any of ``needles`` (a match may span two reads, not a hole)."""
    overlap = max(map(len, needles)) - 1
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        end, offset = os.fstat(fd).st_size, 0
        while offset < end:
            try:
                offset = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError:  # ENXIO: no data past offset
                return False
            hole = os.lseek(fd, offset, os.SEEK_HOLE)
            tail = b""
            while offset < hole:
                data = os.pread(fd, min(chunk, hole - offset), offset)
                if not data:
                    break
                window = tail + data
                if any(needle in window for needle in needles):
                    return True
                tail, offset = window[-overlap:] if overlap else b"", offset + len(data)
        return False
    finally:
        os.close(fd)


def events_holding(db_path: Path, needle: bytes) -> list[str]:
    """The kinds of the journal's events whose data holds ``needle``."""
    with sqlite3.connect(db_path) as db:
        rows = db.execute("SELECT kind, data FROM events").fetchall()
    return [kind for kind, data in rows if needle in str(data).encode()]

"""A service's output, kept in the state dir as a bounded ring that a reader follows by cursor.

A service prints for as long as it runs, so its output cannot be kept whole, nor in the
front end's memory alone (a restarted front end still shows what a lost service said
last).  Each service has two files under ``<state>/services/<capsule_id>/``:
``<name>.log`` (the newer half) and ``<name>.log.1`` (the older), each at most half of
``LIMIT``; when the newer is full it becomes the older, and the oldest half is gone.
A small ``<name>.log.json`` says where in the whole stream each file starts, so a cursor
(a byte offset in everything the service ever printed, stdout and stderr as they came)
stays meaningful across turns: ``read(since=cursor)`` answers what followed it, and says
how much was lost when the cursor fell out of the ring.  Each start of the service
appends a line saying so, so one log tells the story of its restarts.  A stopped service's
ring stays (``kept`` names them) until its capsule is destroyed (``forget``).

Writes come from one task (the service's), reads from any call; a read sees a prefix of
what was written, never a torn record, because the offsets file is replaced (rename)
after the data it describes is written.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import wrap_oserror

LIMIT = 1 << 20  # bytes kept per service, both files together
READ_MAX = 256 * 1024  # bytes one read answers at most (the newest, when more is asked for)


@dataclass(frozen=True)
class Slice:
    """Part of a service's output: ``text`` from ``start`` to ``cursor``; ``lost`` bytes before
    ``start`` that the caller asked for but the ring no longer holds."""

    text: str
    start: int
    cursor: int
    lost: int

    def to_json(self) -> dict[str, object]:
        return {"text": self.text, "start": self.start, "cursor": self.cursor, "lost": self.lost}


class LogRing:
    """One service's output on disk: append, and read by cursor or by last lines."""

    def __init__(self, directory: Path, name: str, limit: int = LIMIT) -> None:
        self.path = directory / f"{name}.log"
        self.older = directory / f"{name}.log.1"
        self.offsets = directory / f"{name}.log.json"
        self.half = max(limit // 2, 1)
        with wrap_oserror("make the services' log dir", str(directory), "check the state dir's permissions"):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._older_start, self._start = self._load()

    def _load(self) -> tuple[int, int]:
        try:
            data = json.loads(self.offsets.read_text())
            return int(data["older_start"]), int(data["start"])
        except (OSError, ValueError, KeyError, TypeError):
            return 0, 0

    @property
    def end(self) -> int:
        """The cursor after everything written so far."""
        return self._start + _size(self.path)

    def append(self, data: bytes) -> None:
        """Add output; the older half goes when the newer is full."""
        if not data:
            return
        if _size(self.path) + len(data) > self.half and _size(self.path) > 0:
            self._older_start, self._start = self._start, self.end
            os.replace(self.path, self.older)
        with open(self.path, "ab") as out:
            out.write(data[-self.half :] if len(data) > self.half else data)
        if len(data) > self.half:  # a burst bigger than a half keeps only its end
            self._start += len(data) - self.half
        self._save()

    def _save(self) -> None:
        temp = self.offsets.with_suffix(".json.tmp")
        temp.write_text(json.dumps({"older_start": self._older_start, "start": self._start}))
        os.replace(temp, self.offsets)

    def read(self, since: int | None = None, tail: int | None = None) -> Slice:
        """What followed ``since`` (None: all that is kept), at most ``READ_MAX`` bytes (the
        newest), or with ``tail`` only its last ``tail`` lines."""
        older = _read(self.older) if self._older_start < self._start else b""
        first = self._start - len(older)
        data = older + _read(self.path)
        end = first + len(data)
        want = first if since is None else max(min(since, end), 0)
        lost = max(first - want, 0)
        start = max(want, first)
        chunk = data[start - first :]
        if tail is not None:
            lines = chunk.splitlines(keepends=True)[-tail:] if tail > 0 else []
            kept = b"".join(lines)
            start += len(chunk) - len(kept)
            chunk = kept
        if len(chunk) > READ_MAX:
            start += len(chunk) - READ_MAX
            chunk = chunk[-READ_MAX:]
        return Slice(chunk.decode(errors="replace"), start, end, lost)

    def remove(self) -> None:
        """Forget the output (the service was stopped for good, or its capsule destroyed)."""
        for path in (self.path, self.older, self.offsets):
            path.unlink(missing_ok=True)


def kept(directory: Path) -> list[str]:
    """The services of a capsule's log dir that have a ring, by name."""
    try:
        return sorted(path.name.removesuffix(".log") for path in directory.glob("*.log"))
    except FileNotFoundError:
        return []


def forget(directory: Path) -> None:
    """Remove a capsule's log dir, every ring in it (the capsule is destroyed)."""
    shutil.rmtree(directory, ignore_errors=True)  # what is left of a destroyed capsule is read by no one


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""

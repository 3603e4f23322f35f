"""This host's processes as /proc shows them, for tests that check a command is running,
or has ended, by its command line."""

from __future__ import annotations

from pathlib import Path


def running_pids(argv: list[str]) -> list[int]:
    """Pids whose command line is ``argv`` (this host's /proc)."""
    wanted = "\0".join(argv).encode() + b"\0"
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == wanted:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids

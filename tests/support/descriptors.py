"""File descriptors as a test sees them from outside."""

from __future__ import annotations

import os


def is_closed(fd: int) -> bool:
    """``fd`` is not open in this process (a refused request must close what it was passed)."""
    try:
        os.fstat(fd)
    except OSError:
        return True
    return False


def open_descriptors() -> dict[int, str]:
    """This process's open descriptors, each with what it names (readlink of /proc/self/fd):
    a number reused for something else reads as another entry."""
    found = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed since the listing (the listing's own descriptor, or a thread's)
    return found


def naming_under(root: str | os.PathLike[str], *exactly: str | os.PathLike[str]) -> dict[int, str]:
    """This process's descriptors that name something under ``root`` (or one of ``exactly``
    itself), by number: what a test's own code may have left open there.  Not the whole set
    before and after: threads an earlier test left on the worker (xdist) open and close
    descriptors of their own meanwhile, but none of theirs names the test's own directory."""
    top = os.path.realpath(root)
    named = {os.path.realpath(path) for path in exactly}
    return {fd: target for fd, target in open_descriptors().items()
            if target == top or target.startswith(top + "/") or target in named}

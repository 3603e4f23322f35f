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

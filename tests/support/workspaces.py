"""Small workspaces for tests: a directory holding a few named text files."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def make_workspace(path: Path, files: Mapping[str, str], owner: tuple[int, int] | None = None) -> Path:
    """Make the directory ``path`` holding ``files`` (relative name: text); with ``owner``
    (uid, gid), the directory and its files are that user's, for a test run as that user."""
    path.mkdir()
    for name, text in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    if owner is not None:
        for target in (path, *path.rglob("*")):
            os.lchown(target, *owner)
    return path

"""Shared fixtures for tests that run anywhere, without root."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A fresh CCW_STATE_DIR."""
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def _no_user_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests must not pick up a developer's own ccw settings.
    for name in list(os.environ):
        if name.startswith(("CCW_", "MCP_", "SYN_")) and name != "CCW_MUST_WORK":
            monkeypatch.delenv(name, raising=False)

"""Tests that need root and a real kernel.

They skip on a host that cannot run them, except when ``CCW_MUST_WORK=1`` (CI sets it):
then a missing privilege or kernel feature fails the test instead (bubblewrap's
``BWRAP_MUST_WORK`` habit).  Use the ``require`` fixture, ``require(condition, why)``, for every such check.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MUST_WORK = os.environ.get("CCW_MUST_WORK") == "1"


def require(condition: bool, why: str) -> None:
    """Skip (or, under CCW_MUST_WORK=1, fail) unless ``condition`` holds."""
    if condition:
        return
    if MUST_WORK:
        pytest.fail(f"CCW_MUST_WORK=1 but {why}")
    pytest.skip(why)


@pytest.fixture(name="require")
def require_fixture() -> object:
    """The ``require`` function, for tests (test modules cannot import conftest)."""
    return require


@pytest.fixture
def root_required() -> None:
    """The test needs to run as root."""
    require(os.geteuid() == 0, "needs root")

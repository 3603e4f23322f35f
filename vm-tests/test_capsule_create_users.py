"""capsule_create's service part (mcp_server/capsules/create.py) run as a user who may not write the directory.

The front end runs as its caller, so it asks the kernel before the helper is asked, and
names what a rootless helper cannot see: the directory's owner on the host (in the
helper's user namespace the caller is 0 and root's files are 65534's), with the ways
forward.  tests/test_capsule_create.py has the rest, run as this test's own uid.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
OTHER = 47_315  # no account needed: setpriv takes numbers

SCRIPT = """
import json, os, sys, trio
sys.path.insert(0, os.getcwd())
from mcp_server.capsules.create import Asked, create
from mcp_server.capsules.service import CapsuleService
from mcp_server.state import State
from sandbox.errors import CcwError
from tests.support.call_hooks import Hooks

asked = []

async def helper():
    asked.append(True)
    raise CcwError("UNAVAILABLE", "the helper was asked")

service = CapsuleService(State(sys.argv[2]), helper, Hooks())
try:
    trio.run(create, service, Asked(workspace=sys.argv[1], base=(sys.argv[3:] or [None])[0]), {"PATH": ""})
except CcwError as exc:
    print(json.dumps({"code": exc.code, "message": exc.message, "asked": asked}))
"""


@pytest.fixture
def public(root_required: None) -> Iterator[Path]:
    """A directory every user can search (pytest's tmp_path is 0700), with a state dir for OTHER."""
    path = Path(tempfile.mkdtemp(prefix="ccw-create-"))
    path.chmod(0o755)
    (path / "state").mkdir(mode=0o700)
    os.chown(path / "state", OTHER, OTHER)
    yield path
    shutil.rmtree(path)


def test_a_directory_of_roots_is_refused_naming_its_owner_before_the_helper_is_asked(
        public: Path, run_as: Callable[..., Any]) -> None:
    ws = public / "rootrepo"
    ws.mkdir(mode=0o755)  # root's, as /srv/rootrepo was in the trial
    out = run_as(OTHER, OTHER, SCRIPT, str(ws), str(public / "state"), cwd=str(ROOT))
    assert out["code"] == "PERMISSION_DENIED" and out["asked"] == [], out
    assert out["message"].startswith(f"uid {OTHER} may not write {str(ws)!r}, owned by uid 0 (root); "), out
    assert "clone or copy it to a directory you own" in out["message"]
    os.chown(ws, OTHER, OTHER)  # now the caller's: the helper is asked
    out = run_as(OTHER, OTHER, SCRIPT, str(ws), str(public / "state"), cwd=str(ROOT))
    assert (out["code"], out["asked"]) == ("UNAVAILABLE", [True]), out


def test_with_a_base_a_directory_of_roots_is_only_where_the_base_is_shown(
        public: Path, run_as: Callable[..., Any]) -> None:
    # A replay's capsule: its base shown at a recorded path the caller may not write, which
    # nothing reads or writes on the host (sandbox/hostdirs.py), so the helper is asked.
    ws, base = public / "rootrepo", public / "snapshot"
    ws.mkdir(mode=0o755)
    base.mkdir(mode=0o700)
    os.chown(base, OTHER, OTHER)
    out = run_as(OTHER, OTHER, SCRIPT, str(ws), str(public / "state"), str(base), cwd=str(ROOT))
    assert (out["code"], out["asked"]) == ("UNAVAILABLE", [True]), out
    os.chown(base, 0, 0)  # a base the caller may not read is still refused here
    out = run_as(OTHER, OTHER, SCRIPT, str(ws), str(public / "state"), str(base), cwd=str(ROOT))
    assert out["code"] == "PERMISSION_DENIED" and out["asked"] == [], out
    assert out["message"].startswith(f"uid {OTHER} may not read {str(base)!r}, owned by uid 0 (root); "), out

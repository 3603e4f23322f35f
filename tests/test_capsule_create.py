"""capsule_create's service part (mcp_server/capsules/create.py) against a helper that only
makes capsules: the paths resolved before the helper sees them, the directory rule applied
before it is asked, a worktree's git dir found, and toolchains found from the caller's PATH.
A path that is relative, or whose real name is not UTF-8, is refused by name before the
helper is asked (core/hostpaths.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.capsules.create import Asked, Made, create
from mcp_server.capsules.service import CapsuleService
from mcp_server.core.expose import Need
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.ops import CreateRequest, OpRequest
from sandbox.replies import CreateReply
from tests.support.call_hooks import Hooks


class MakingHelper:
    """Makes a capsule for each create request, as the helper would, and keeps the requests."""

    def __init__(self) -> None:
        self.requests: list[CreateRequest] = []

    async def call(self, request: OpRequest, on_progress: Any = None) -> CreateReply:
        assert isinstance(request, CreateRequest), request  # create asks nothing else of it
        self.requests.append(request)
        return CreateReply(capsule_id=f"cap_{len(self.requests)}", mount="/m", workspace=request.spec.workspace,
                           created_at="", clock="", isolation={})


def _make(tmp_path: Path, asked: Asked, env: dict[str, str],
          helper: MakingHelper | None = None) -> tuple[Made, MakingHelper]:
    helper = helper if helper is not None else MakingHelper()

    async def get_helper() -> MakingHelper:
        return helper

    service = CapsuleService(State(tmp_path / "state"), get_helper, Hooks())  # type: ignore[arg-type]
    return trio.run(create, service, asked, env), helper


def test_the_helper_and_the_journal_get_the_resolved_workspace(tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (tmp_path / "link").symlink_to(workspace)
    made, helper = _make(tmp_path, Asked(workspace=f"{tmp_path}/link/", env_whitelist=("LANG",)), {"PATH": ""})
    [request] = helper.requests
    assert request.spec.workspace == str(workspace.resolve()) and request.spec.given_base is None
    assert request.spec.env_whitelist == ("LANG",)
    assert made.record.workspace == str(workspace.resolve()) and made.record.capsule_id == "cap_1"
    assert made.git.gitdir is None and made.git.note is None and made.exposed == ()


@pytest.mark.parametrize("workspace", ["/etc", "/", "/usr/../etc", "/tmp/a\x00b"])
def test_a_refused_directory_is_refused_before_the_helper_is_asked(tmp_path: Path, workspace: str) -> None:
    helper = MakingHelper()
    with pytest.raises(CcwError) as refused:
        _make(tmp_path, Asked(workspace=workspace), {}, helper)
    assert refused.value.code in ("PERMISSION_DENIED", "INVALID_ARGUMENT") and "workspace" in refused.value.message
    assert helper.requests == []


def test_a_base_elsewhere_is_the_lower_dir_and_checked_too(tmp_path: Path) -> None:
    workspace, base = tmp_path / "ws", tmp_path / "snapshot"
    workspace.mkdir()
    base.mkdir()
    made, helper = _make(tmp_path, Asked(workspace=str(workspace), base=str(base)), {})
    assert helper.requests[0].spec.given_base == str(base) and made.record.spec.lower == str(base)
    with pytest.raises(CcwError) as refused:
        _make(tmp_path, Asked(workspace=str(workspace), base="/etc"), {})
    assert "base" in refused.value.message


def test_a_worktree_shows_its_common_git_dir(tmp_path: Path) -> None:
    main, tree = tmp_path / "main", tmp_path / "tree"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main"]
    subprocess.run([*git, "init", "-q", str(main)], check=True)
    subprocess.run([*git, "-C", str(main), "commit", "-q", "--allow-empty", "-m", "one"], check=True)
    subprocess.run([*git, "-C", str(main), "worktree", "add", "-q", str(tree)], check=True)
    made, helper = _make(tmp_path, Asked(workspace=str(tree)), {})
    assert made.git.gitdir == str((main / ".git").resolve())
    assert helper.requests[0].spec.gitdirs == (made.git.gitdir,)


def test_toolchains_are_found_from_the_callers_path_unless_auto_expose_is_off(tmp_path: Path) -> None:
    node = tmp_path / "home/.nvm/versions/node/v20.1.0"
    (node / "bin").mkdir(parents=True)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = {"PATH": f"{node}/bin:/usr/bin", "HOME": str(tmp_path / "home")}
    made, helper = _make(tmp_path, Asked(workspace=str(workspace)), env)
    assert made.exposed == (Need(str(node), f"PATH entry {node}/bin"),)
    assert helper.requests[0].spec.expose == (str(node),)
    # Another caller's PATH, or auto_expose off: nothing found, nothing shown.
    assert _make(tmp_path, Asked(workspace=str(workspace)), {"PATH": "/usr/bin"})[0].exposed == ()
    assert _make(tmp_path, Asked(workspace=str(workspace), auto_expose=False), env)[0].exposed == ()
    assert os.path.isdir(node)  # nothing it found was touched


def _not_utf8_dir(tmp_path: Path) -> str:
    """A directory named with the byte 0xff (os.mkdir(b"w\\xff")), as Python names it."""
    os.mkdir(os.fsencode(tmp_path) + b"/w\xff")
    return f"{tmp_path}/w\udcff"


def _refused(tmp_path: Path, asked: Asked) -> CcwError:
    helper = MakingHelper()
    with pytest.raises(CcwError) as refused:
        _make(tmp_path, asked, {"PATH": ""}, helper)
    assert helper.requests == []  # refused before the helper is asked
    return refused.value


def test_a_name_that_is_not_utf8_is_refused_by_name_with_the_way_out(tmp_path: Path) -> None:
    bad = _not_utf8_dir(tmp_path)
    error = _refused(tmp_path, Asked(workspace=bad))
    assert error.code == "INVALID_ARGUMENT"
    assert error.message.startswith(f"workspace '{tmp_path}/w\\xff' is not UTF-8 text")
    assert "rename the directory" in error.message and "canonical JSON" not in error.message
    assert error.details == {"argument": "workspace", "path": f"{tmp_path}/w\\xff"}
    # A UTF-8 symlink does not help, as the message says: the workspace is its real name.
    (tmp_path / "link").symlink_to(os.fsencode(bad))
    assert _refused(tmp_path, Asked(workspace=str(tmp_path / "link"))).message == error.message
    ws = tmp_path / "ws"
    ws.mkdir()
    base = _refused(tmp_path, Asked(workspace=str(ws), base=bad))
    assert base.details["argument"] == "base" and base.message.startswith("base ")
    exposed = _refused(tmp_path, Asked(workspace=str(ws), expose=(bad,)))
    assert exposed.details["argument"] == "expose"


def test_a_name_that_is_not_utf8_but_leads_to_one_that_is_works(tmp_path: Path) -> None:
    ws = tmp_path / "wé"
    ws.mkdir()
    os.symlink(os.fsencode(ws), os.fsencode(tmp_path) + b"/l\xff")
    made, helper = _make(tmp_path, Asked(workspace=f"{tmp_path}/l\udcff"), {"PATH": ""})
    assert helper.requests[0].spec.workspace == str(ws) == made.record.workspace


def test_a_toolchain_found_under_a_name_that_is_not_utf8_is_left_out(tmp_path: Path) -> None:
    bad = _not_utf8_dir(tmp_path)
    os.mkdir(os.fsencode(bad) + b"/bin")
    ws = tmp_path / "ws"
    ws.mkdir()
    made, helper = _make(tmp_path, Asked(workspace=str(ws)), {"PATH": f"{bad}/bin", "HOME": str(tmp_path)})
    assert made.exposed == () and helper.requests[0].spec.expose == ()


@pytest.mark.parametrize("field", ["workspace", "base"])
def test_a_relative_path_over_mcp_is_refused_naming_the_argument(tmp_path: Path, field: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "proj").mkdir()
    monkeypatch.chdir(tmp_path)  # it exists from the front end's cwd, which means nothing to a client
    asked = Asked(workspace="proj") if field == "workspace" else Asked(workspace=str(tmp_path / "proj"), base="proj")
    error = _refused(tmp_path, asked)
    assert error.code == "INVALID_ARGUMENT" and error.details == {"argument": field, "path": "proj"}
    assert error.message.startswith(f"{field} 'proj' is a relative path; give an absolute one")

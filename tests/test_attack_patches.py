"""workspace_apply_patch given patches that try to write outside the workspace (issue 9).

Headers with ``../``, absolute ``+++ /etc/x``, ``a/../../x``, quoted and octal-escaped
names, Windows separators, renames and copies out of the tree, a patch that creates a
symlink and then writes through it, and edits or deletions through symlinks planted in
the workspace.  Each must be refused (a CcwError that is not INTERNAL, or rejects with
``applied: false``) or stay inside the workspace; the canary beside it stays
byte-identical.  The patches and the canary are tests/support/canary.py's, which
``vm-tests/test_attack_capsules.py`` sends to a capsule too.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from mcp_server.config import TOOLSETS
from mcp_server.tools.registry import Registry
from sandbox.errors import CcwError
from tests.support.canary import SECRET, hostile_patches, plant, tree_digest
from tests.support.realprojects import git

REGISTRY = Registry.load(TOOLSETS)


def outcome(spec_name: str, ctx: Any, args: dict[str, Any]) -> str:
    """'schema', 'error:CODE', 'rejected' or 'applied'; never an unstructured failure."""
    spec = REGISTRY.lookup(spec_name)
    assert spec is not None
    if any(True for _ in jsonschema.Draft202012Validator(spec.input_schema).iter_errors(args)):
        return "schema"
    try:
        result = trio.run(spec.handler, ctx, args)
    except CcwError as exc:
        assert exc.code != "INTERNAL", (args, exc)
        return f"error:{exc.code}"
    jsonschema.Draft202012Validator(spec.output_schema).validate(result)
    assert SECRET not in str(result)
    return "applied" if result["applied"] else "rejected"


@pytest.mark.parametrize("name", sorted(hostile_patches("/canary")))
def test_hostile_patch_stays_inside_the_workspace(direct_ctx: Any, tmp_path: Path, name: str) -> None:
    ws = Path(direct_ctx.config.workspace)
    canary = tmp_path / "canary"
    plant(ws, canary)
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "init")
    before = tree_digest(tmp_path, skip=("ws", "state"))
    patch = hostile_patches(str(canary))[name]
    result = outcome("workspace_apply_patch", direct_ctx, {"patch": patch})
    assert tree_digest(tmp_path, skip=("ws", "state")) == before, (name, result)
    assert (canary / "secret.txt").read_text() == SECRET + "\n"
    assert not Path("/etc/ccw-attack").exists()
    # What did apply landed inside the workspace, and no symlink was followed.
    assert os.readlink(ws / "out") == str(canary) and os.readlink(ws / "outfile") == str(canary / "secret.txt")
    # No regular file in the workspace came to hold the canary's bytes (a copy or rename
    # through a link would).
    for dirpath, _dirs, files in os.walk(ws):
        for file in files:
            path = Path(dirpath) / file
            assert path.is_symlink() or SECRET not in path.read_text(errors="replace"), (name, path)
    if name not in APPLIES_INSIDE:
        assert result != "applied", (name, result)


# Patches that may apply because every name they write stays inside the workspace: '-p1'
# turns "/etc/x" into "etc/x" as git apply does, a backslash or a drive colon is an ordinary
# POSIX name byte, and a symlink (copied, re-moded, deleted) is handled as a link, never followed.
APPLIES_INSIDE = {
    "absolute_new", "absolute_canary_new", "no_prefix_dotdot", "windows", "drive", "nul_in_name",
    "copy_from_canary", "git_dir", "dir_then_file", "mode_change_link", "delete_the_link_target",
    "edit_through_file_link",
}

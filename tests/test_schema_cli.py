"""``ccw-mcp --validate`` / ``python -m mcp_server --validate``: output and the three exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).parent / "schema_fixtures"


def run(*args: str, module: str = "mcp_server", env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "SYN_", "MCP_"))}
    full_env.update({"CCW_SCHEMAS_DIR": str(FIXTURES / "jsonschema")} if env is None else env)
    return subprocess.run(
        [sys.executable, "-m", module, *args], cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=60,
    )


@pytest.mark.parametrize("module", ["mcp_server", "mcp_server.validate_cli"])
def test_valid_file_exits_0(module: str) -> None:
    done = run("--validate", str(FIXTURES / "examples/SynestheticAsset_Example1.json"), module=module)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"ok": True}


def test_invalid_file_exits_1_with_sorted_pointer_errors() -> None:
    done = run("--validate", str(FIXTURES / "examples/Shader_Broken.json"), "--schema", "shader")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout) == {
        "ok": False,
        "reason": "validation_failed",
        "errors": [
            {"path": "", "msg": "'fragment_shader' is a required property"},
            {"path": "/uniforms/0/default", "msg": "'zero' is not of type 'number'"},
        ],
    }


def test_file_naming_no_schema_exits_1(tmp_path: Path) -> None:
    asset = tmp_path / "asset.json"
    asset.write_text('{"name": "x"}')
    done = run("--validate", str(asset))
    assert done.returncode == 1
    assert "no schema" in json.loads(done.stdout)["errors"][0]["msg"]


def test_unreadable_or_unparsable_file_exits_2(tmp_path: Path) -> None:
    missing = run("--validate", str(tmp_path / "missing.json"))
    assert missing.returncode == 2 and "cannot read" in json.loads(missing.stdout)["errors"][0]["msg"]
    broken = run("--validate", str(FIXTURES / "examples/Truncated_Example.json"), "--schema", "shader")
    assert broken.returncode == 2 and "is not JSON" in json.loads(broken.stdout)["errors"][0]["msg"]


def test_ccw_own_schemas_by_default(tmp_path: Path) -> None:
    call = tmp_path / "call.json"
    call.write_text('{"base": {"a": 1}}')
    done = run("--validate", str(call), "--schema", "tool.diff_assets.input", env={})
    assert done.returncode == 1
    assert json.loads(done.stdout)["errors"] == [{"path": "", "msg": "'new' is a required property"}]

"""The layers of issues 14 and 27, as import-linter contracts (pyproject.toml, [tool.importlinter]).

``./dev test`` runs ``lint-imports`` before pytest; this test runs it too, one contract at
a time, so that a plain ``pytest`` run checks the layers and names the contract broken.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def test_the_six_contracts_are_declared() -> None:
    assert [c["id"] for c in CONTRACTS] == [
        "helper-never-imports-front-end",
        "front-end-uses-public-surface",
        "core-does-no-io",
        "tool-families-independent",
        "front-end-layers",
        "events-know-no-tool",
    ]


@pytest.mark.parametrize("contract", [c["id"] for c in CONTRACTS])
def test_contract_is_kept(contract: str) -> None:
    # --no-cache: the check writes nothing into the tree.
    proc = subprocess.run(
        [str(LINT_IMPORTS), "--no-logo", "--no-cache", "--contract", contract],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0, f"contract {contract} broken:\n{proc.stdout}{proc.stderr}"
    assert "1 kept, 0 broken" in proc.stdout, proc.stdout


def test_every_tool_family_module_is_held_independent() -> None:
    """Every module of mcp_server/tools/ that declares tools (a module-level ``TOOLS``) is one
    of contract 4's, so a new family cannot import another unnoticed (tools/run.py once
    imported tools/capsule.py for capsule_exec's result, now tools/exec_result.py's)."""
    families = {f"mcp_server.tools.{path.stem}" for path in (ROOT / "mcp_server" / "tools").glob("*.py")
                if any(isinstance(node, (ast.Assign, ast.AnnAssign)) and "TOOLS" in _targets(node)
                       for node in ast.parse(path.read_text(encoding="utf-8")).body)}
    contract = next(c for c in CONTRACTS if c["id"] == "tool-families-independent")
    assert families and families == set(contract["modules"]), families ^ set(contract["modules"])


def _targets(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {target.id for target in targets if isinstance(target, ast.Name)}

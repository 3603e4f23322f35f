"""The layers of issues 14 and 27, as import-linter contracts (pyproject.toml, [tool.importlinter]).

``./dev test`` runs ``lint-imports`` before pytest; this test runs it too, one contract at
a time, so that a plain ``pytest`` run checks the layers and names the contract broken.
"""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["importlinter"]["contracts"]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def test_the_five_contracts_are_declared() -> None:
    assert [c["id"] for c in CONTRACTS] == [
        "helper-never-imports-front-end",
        "front-end-uses-public-surface",
        "core-does-no-io",
        "tool-families-independent",
        "front-end-layers",
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

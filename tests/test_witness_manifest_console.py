"""mcp_server/core/witness_manifest.py: an interactive run's steps (``execs[].console``) in a
witness, which its replay types by: what ccw writes passes, a hostile one is refused naming
the field before any replay reads it."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_server.core.witness_manifest import check
from sandbox.checks import MAX_STDIN
from sandbox.errors import CcwError
from tests.support import witness_craft as craft


def _manifest(console: Any) -> dict[str, Any]:
    entry, _ = craft.exec_entry(1, ["python3", "-q"], stdout=b">>> ")
    entry["console"] = console
    return craft.manifest("/home/u/project", [entry], {})


def test_the_steps_ccw_records_pass() -> None:
    check(_manifest({"tty": True, "steps": [[4, 8], [30, 9]], "eof": 52}))
    check(_manifest({"tty": False, "steps": [], "eof": None}))


@pytest.mark.parametrize("console", [
    {"tty": True, "steps": [[4]], "eof": None},  # a step without its length
    {"tty": True, "steps": [[4, 8, 1]], "eof": None},
    {"tty": True, "steps": [[4, MAX_STDIN + 1]], "eof": None},  # more than any stdin holds
    {"tty": True, "steps": [[-1, 8]], "eof": None},
    {"tty": True, "steps": [[4.0, 8]], "eof": None},
    {"tty": True, "steps": [["4", 8]], "eof": None},
    {"tty": True, "steps": [[4, 8]], "eof": -1},
    {"tty": "yes", "steps": [], "eof": None},
    {"steps": [], "eof": None},
    "tty",
])
def test_hostile_steps_are_refused_naming_the_field(console: Any) -> None:
    with pytest.raises(CcwError) as refused:
        check(_manifest(console))
    assert refused.value.code == "INVALID_ARGUMENT"
    assert any(error["field"].startswith("/execs/0/console") for error in refused.value.details["errors"]), \
        refused.value.details

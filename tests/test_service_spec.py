"""capsules/service_spec.py: what a service's spec accepts, what it keeps, what a witness gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcp_server.capsules.service_spec import Ready, ServiceSpec, SpecTable
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.spec import Limits


def test_ready_takes_exactly_one_condition_and_a_line_is_plain_text() -> None:
    assert Ready.from_json({"port": 8080}).describe() == "port 8080 accepting"
    assert Ready.from_json({"line": "(a+)+$"}).describe() == "a line containing '(a+)+$'"  # text, not a pattern
    for bad in ({}, {"port": 1, "path": "/tmp/x"}):
        with pytest.raises(CcwError) as refused:
            Ready.from_json(bad)
        assert refused.value.code == "INVALID_ARGUMENT"


def test_a_spec_is_kept_with_the_values_given_and_witnessed_without_them(tmp_path: Path) -> None:
    spec = ServiceSpec("cap_1", "db", ("postgres", "-D", "data"), "/w", {"PGPORT": "5433"},
                       Ready(port=5433, timeout_ms=9000), Limits(memory_mb=256), "on-failure")
    table = SpecTable(State(tmp_path))
    table.save(spec, "2026-01-01T00:00:00Z")
    [(kept, created)] = table.all()
    assert kept == spec and created == "2026-01-01T00:00:00Z"
    witnessed = spec.for_witness()
    assert witnessed["env"] == ["PGPORT"] and "5433" not in str(witnessed["env"])
    assert ServiceSpec.from_json("cap_2", witnessed).env is None  # a replay takes the replayer's values
    table.remove("cap_1", "db")
    assert table.all() == []


def test_names_and_restart_policies_are_checked() -> None:
    for name, restart in (("Web", "no"), ("web", "sometimes")):
        with pytest.raises(CcwError):
            ServiceSpec("cap_1", name, ("x",), restart=restart)

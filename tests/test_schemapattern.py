"""A schema's ``$`` is the end of the string: an argument or witness field ending in a newline fails ``^…$``.

mcp_server/core/schemapattern.py; the witness's fields are in tests/test_witness_manifest.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from mcp_server.config import Config
from mcp_server.core.schemapattern import Validator, ecma
from mcp_server.server import CcwServer
from mcp_server.state import State


@pytest.mark.parametrize(("pattern", "python"), [
    ("^cap_[0-9]+$", r"^cap_[0-9]+\Z"),
    ("^(a|b$)$", r"^(a|b\Z)\Z"),
    (r"^\$[$]$", r"^\$[$]\Z"),  # escaped, and in a class: a dollar sign itself
    (r"^[^\]$]+$", r"^[^\]$]+\Z"),  # an escaped ] keeps the class open
    ("^a\\\\$", "^a\\\\\\Z"),  # an escaped backslash, then the end
])
def test_each_bare_dollar_becomes_the_end_of_the_string(pattern: str, python: str) -> None:
    assert ecma(pattern) == python


def test_a_trailing_newline_fails_the_pattern_that_jsonschema_alone_let_through() -> None:
    schema = {"type": "string", "pattern": "^cap_[0-9A-Za-z_]{1,64}$"}
    assert Draft202012Validator(schema).is_valid("cap_abc\n")  # Python's $, before a final newline
    assert not Validator(schema).is_valid("cap_abc\n")
    assert Validator(schema).is_valid("cap_abc") and not Validator(schema).is_valid("xcap_abc")
    [error] = Validator(schema).iter_errors("cap_abc\n")
    assert error.message == "'cap_abc\\n' does not match '^cap_[0-9A-Za-z_]{1,64}$'"


def test_a_tools_id_argument_with_a_newline_is_refused_by_its_schema(tmp_path: Path) -> None:
    server = CcwServer(Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state")}), State(tmp_path / "state"))
    spec = server.tools.registry.lookup("capsule_diff")
    assert spec is not None
    assert server.argument_errors(spec, {"capsule_id": "cap_abc"}) == []
    assert [e["path"] for e in server.argument_errors(spec, {"capsule_id": "cap_abc\n"})] == ["/capsule_id"]


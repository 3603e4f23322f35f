"""The one capsule spec, id grammar and cwd rule (sandbox/spec.py, sandbox/checks.py)."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.checks import CAPSULE_ID_RE, DISK_MB_MIN, check_capsule_id
from sandbox.errors import CcwError, ProtocolError
from sandbox.homes import login_homes
from sandbox.ops import OPS
from sandbox.spec import CapsuleSpec, Limits, resolve_cwd


def test_generated_ids_match_the_one_grammar() -> None:
    assert CAPSULE_ID_RE.fullmatch("cap_1700000000000_0a1b2c3d")
    assert check_capsule_id("cap_1") == "cap_1"
    for bad in ("cap_", "cap_../x", "cap_" + "a" * 65, "CAP_1", "cap_1/..", 5, None):
        with pytest.raises(CcwError) as info:
            check_capsule_id(bad)
        assert info.value.code == "INVALID_ARGUMENT"


def test_spec_round_trips_through_json() -> None:
    spec = CapsuleSpec(
        workspace="/w", given_base="/snap", clock_offset_sec=-60, env_whitelist=("CI", "PYTHONPATH"),
        limits=Limits(memory_mb=512, disk_mb=DISK_MB_MIN), network="none",
    )
    assert CapsuleSpec.from_json(spec.to_json()) == spec
    assert spec.lower == "/snap"
    plain = CapsuleSpec(workspace="/w")
    assert plain.lower == "/w"
    # What the front end sends today for a capsule without a base: no "base" key.
    assert plain.to_json() == {"workspace": "/w", "clock_offset_sec": 0, "env_whitelist": [], "limits": {},
                               "network": "none"}
    assert CapsuleSpec.from_json({"workspace": "/w"}) == plain


def test_spec_whitelist_is_sorted_and_unique() -> None:
    spec = CapsuleSpec.from_json({"workspace": "/w", "env_whitelist": ["B", "A", "B"]})
    assert spec.env_whitelist == ("A", "B")


@pytest.mark.parametrize(
    ("value", "field"),
    [
        ({"workspace": "rel"}, "workspace"),
        ({"workspace": "/w", "clock_offset_sec": 1.5}, "clock_offset_sec"),
        ({"workspace": "/w", "env_whitelist": ["1A"]}, "env_whitelist"),
        ({"workspace": "/w", "limits": {"memory_mb": 0}}, "limits.memory_mb"),
        ({"workspace": "/w", "network": "host"}, "network"),
    ],
)
def test_a_bad_spec_names_its_field(value: dict[str, Any], field: str) -> None:
    with pytest.raises(ProtocolError) as info:
        CapsuleSpec.from_json(value)
    assert info.value.code == "INVALID_ARGUMENT" and info.value.details == {"argument": field}


def test_a_spec_with_unknown_or_missing_fields_is_refused() -> None:
    for value in ({}, {"workspace": "/w", "owner_uid": 0}, ["/w"]):
        with pytest.raises(ProtocolError):
            CapsuleSpec.from_json(value)


def test_the_create_op_checks_exactly_the_spec() -> None:
    create = OPS["create"]
    wire = {"given_base": "base"}  # the one field the wire names otherwise (docs/names.md: base)
    assert set(create.required) | set(create.optional) == {wire.get(f, f) for f in CapsuleSpec.__dataclass_fields__}


def test_limits_leave_unset_ones_out() -> None:
    assert Limits(pids_max=5).to_json() == {"pids_max": 5}
    assert Limits.from_json({}) == Limits()
    with pytest.raises(ProtocolError):
        Limits.from_json({"swap_mb": 1})


def test_cwd_rule() -> None:
    assert resolve_cwd(None, "/w") == "/w"
    assert resolve_cwd("", "/w") == "/w"
    assert resolve_cwd("sub/../x", "/w") == "/w/x"
    assert resolve_cwd("/w/a", "/w") == "/w/a"
    for bad in ("../../etc", "/etc", "/wx", "a\x00b"):
        with pytest.raises(CcwError) as info:
            resolve_cwd(bad, "/w")
        assert info.value.code == "INVALID_ARGUMENT"


def test_the_journal_keeps_a_record_s_spec_in_its_old_columns(tmp_path: Any) -> None:
    from mcp_server.journal import Journal
    from mcp_server.journal_records import CapsuleRecord
    from mcp_server.state import State

    state = State(tmp_path / "state")
    try:
        journal = Journal(state)
        spec = CapsuleSpec(workspace="/ws", given_base="/snap", clock_offset_sec=5, env_whitelist=("A", "B"),
                           limits=Limits(pids_max=9))
        exposed = CapsuleSpec(workspace="/ws", expose=("/home/u/.pyenv/versions/3.12.1",), gitdirs=("/repo/.git",))
        for capsule_id, one in (("cap_1", spec), ("cap_2", CapsuleSpec(workspace="/ws")), ("cap_3", exposed)):
            record = CapsuleRecord(capsule_id=capsule_id, spec=one, parent=None, created_at="t", clock="c",
                                   isolation={"x": 1}, mount="/m", base_fingerprint=None, destroyed_at=None)
            journal.add_capsule(record)
            assert journal.capsule(capsule_id) == record
        row = dict(state.execute("SELECT * FROM capsules WHERE capsule_id = 'cap_1'")[0])
        assert row == {
            "capsule_id": "cap_1", "workspace": "/ws", "base": "/snap", "parent": None, "created_at": "t",
            "clock": "c", "clock_offset_sec": 5, "env_whitelist": '["A", "B"]', "limits": '{"pids_max": 9}',
            "network": "none", "isolation": '{"x": 1}', "mount": "/m", "base_fingerprint": None,
            "destroyed_at": None, "generation": 0, "volatile": None, "expose": None,
            "gitdirs": None, "merged_from": None,
        }
        assert state.execute("SELECT base FROM capsules WHERE capsule_id = 'cap_2'")[0][0] == "/ws"
        # The exposed toolchains: a JSON list, NULL when none (cap_1 above).
        assert state.execute("SELECT expose FROM capsules WHERE capsule_id = 'cap_3'")[0][0] == \
            '["/home/u/.pyenv/versions/3.12.1"]'
        # A worktree's git dir, likewise (scratch capsules made from the record show it too).
        assert state.execute("SELECT gitdirs FROM capsules WHERE capsule_id = 'cap_3'")[0][0] == '["/repo/.git"]'
    finally:
        state.close()


def test_login_homes_are_root_and_the_login_range(tmp_path: Any) -> None:
    defs = tmp_path / "login.defs"
    defs.write_text("# comment\nUID_MIN\t\t 1000\nUID_MAX 60000\n")
    homes = login_homes(str(defs))
    assert any(home.uid == 0 for home in homes)
    assert all(home.uid == 0 or 1000 <= home.uid <= 60000 for home in homes)
    assert all(home.path.startswith("/") and home.path != "/" for home in homes)
    defs.write_text("UID_MIN 0\n")  # every account a login user: "/" homes still never count
    assert all(home.path != "/" for home in login_homes(str(defs)))


def test_login_homes_are_read_again_when_their_sources_change(tmp_path: Any) -> None:
    defs = tmp_path / "login.defs"
    defs.write_text("UID_MIN 1000\nUID_MAX 60000\n")
    first = login_homes(str(defs))
    assert login_homes(str(defs)) is first  # unchanged sources: the answer kept
    defs.write_text("UID_MIN 70000\nUID_MAX 70001\n")  # a new size and mtime: read again
    assert [home.uid for home in login_homes(str(defs))] == [0]

"""Network policies (allow_hosts/deny_hosts), the journal's network column, and replay's network comparison."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mcp_server.core import replaydiff
from mcp_server.core.netrules import parse_network
from mcp_server.core.policy import CapsuleFacts, CombinedRules, ExecFacts, evaluate
from mcp_server.fs.policy import builtin_policies, validate_policy
from mcp_server.journal import Journal
from mcp_server.journal_records import CapsuleRecord, helper_network, network_from_column
from mcp_server.state import State
from sandbox.errors import CcwError
from sandbox.spec import CapsuleSpec


def _record(host: str, port: int, allowed: bool = True, address: str | None = None,
            protocol: str = "https") -> dict[str, Any]:
    return {"host": host, "port": port, "protocol": protocol, "allowed": allowed, "rule": None, "reason": None,
            "address": address, "bytes_out": 0, "bytes_in": 0, "cut": None}


def _facts(*execs: list[dict[str, Any]]) -> CapsuleFacts:
    facts = CapsuleFacts(workspace="/w", home="/home/u")
    for seq, records in enumerate(execs, 1):
        facts.execs.append(ExecFacts(seq, ["pip", "install"], 1, 1, network=records))
    return facts


def _policy(name: str, **rules: Any) -> dict[str, Any]:
    policy = {"name": name, "rules": rules}
    validate_policy(policy)
    return policy


def test_allow_hosts_refuses_a_connection_outside_them_and_names_exec_host_port_rule() -> None:
    rules = CombinedRules.combine([_policy("p", allow_hosts=["pypi.org:443", "*.pythonhosted.org"])])
    facts = _facts([_record("pypi.org", 443), _record("files.pythonhosted.org", 443)],
                   [_record("evil.example", 443), _record("denied.example", 80, allowed=False)])
    report = evaluate(rules, facts, [], None)
    assert report["passed"] is False and report["network_ok"] is False
    # The denied attempt reached nothing: only the allowed connection is a violation.
    assert [(v["exec"], v["host"], v["port"], v["rule"]) for v in report["network_violations"]] == [
        (2, "evil.example", 443, "allow_hosts")]
    assert "evil.example:443" in report["details"]


def test_deny_hosts_matches_by_name_or_by_the_address_reached() -> None:
    rules = CombinedRules.combine([_policy("p", deny_hosts=["10.0.0.0/8", "*.corp.example"])])
    facts = _facts([_record("git.corp.example", 22, protocol="socks5"),
                    _record("mirror.example", 443, address="10.1.2.3"), _record("pypi.org", 443, address="1.2.3.4")])
    report = evaluate(rules, facts, [], None)
    hits = [(v["host"], v["matched"]) for v in report["network_violations"]]
    assert hits == [("git.corp.example", "*.corp.example"), ("mirror.example", "10.0.0.0/8")]


def test_strict_refuses_any_network_use_unless_another_policy_allows_it() -> None:
    strict = builtin_policies()["strict"]
    assert strict["rules"]["allow_hosts"] == []
    facts = _facts([_record("pypi.org", 443)])
    alone = CombinedRules.combine([strict])
    assert [v["rule"] for v in evaluate(alone, facts, [], True)["network_violations"]] == ["allow_hosts"]
    with_pypi = CombinedRules.combine([strict, _policy("pypi", allow_hosts=["pypi.org:443"])])
    assert with_pypi.allow_hosts == ["pypi.org:443"]
    assert evaluate(with_pypi, facts, [], True)["network_ok"] is True
    # A capsule that used no network passes strict's network rule.
    assert evaluate(alone, _facts([]), [], True)["network_ok"] is True


def test_no_network_rule_means_no_network_judgement() -> None:
    rules = CombinedRules.combine([_policy("p", max_cpu_ms=10)])
    assert rules.allow_hosts is None
    assert evaluate(rules, _facts([_record("anything.example", 443)]), [], None)["network_ok"] is True


def test_a_bad_host_rule_is_refused_with_the_grammar() -> None:
    with pytest.raises(CcwError) as err:
        _policy("p", allow_hosts=["pypi.org:99999"])
    assert err.value.code == "INVALID_ARGUMENT"


def test_journal_keeps_the_allowlist_and_reads_old_none_rows(tmp_path: Path) -> None:
    journal = Journal(State(tmp_path / "state"))
    network = parse_network({"allow": ["PyPI.org:443", "10.0.0.0/8"], "max_bytes": 1000})
    for capsule_id, spec in (("cap_a", network), ("cap_b", None)):
        journal.add_capsule(CapsuleRecord(
            capsule_id=capsule_id, spec=CapsuleSpec(workspace=str(tmp_path), network=helper_network(spec)),
            parent=None, created_at="t", clock="t", isolation={}, mount="/m", base_fingerprint=None,
            destroyed_at=None, network_spec=spec))
    with_rules, without = journal.capsule("cap_a"), journal.capsule("cap_b")
    assert with_rules is not None and without is not None
    assert with_rules.network_spec == network and with_rules.spec.network == "egress"
    assert with_rules.network == {"allow": ["10.0.0.0/8", "pypi.org:443"], "max_bytes": 1000, "max_connections": 512}
    assert without.network_spec is None and without.network == "none" and without.spec.network == "none"
    row = journal.state.execute("SELECT network FROM capsules WHERE capsule_id = 'cap_a'")[0]
    assert json.loads(row["network"])["allow"] == ["10.0.0.0/8", "pypi.org:443"]
    # What a witness keeps ("none" or the object) reads back the same way.
    assert network_from_column(with_rules.network) == network and network_from_column("none") is None


def test_replay_compares_distinct_places_not_bytes_or_order() -> None:
    recorded = {"seq": 3, "argv": ["curl"],
                "touched": {"network": [_record("a.example", 443), _record("b.example", 80)]}}
    same = [_record("b.example", 80), {**_record("a.example", 443), "bytes_in": 99}, _record("a.example", 443)]
    assert replaydiff.network_mismatch(recorded, same) is None
    other = [_record("a.example", 443), _record("b.example", 80, allowed=False)]
    mismatch = replaydiff.network_mismatch(recorded, other)
    assert mismatch is not None and mismatch["field"] == "network" and mismatch["exec"] == 3
    assert mismatch["expected_only"] == [["b.example", 80, "https", True]]
    assert mismatch["actual_only"] == [["b.example", 80, "https", False]]
    # Records made before allowlists (no touched.network) agree with a replay of network none.
    assert replaydiff.network_mismatch({"seq": 1, "argv": [], "touched": {}}, None) is None

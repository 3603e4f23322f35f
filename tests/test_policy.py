"""Policies: schema validation, combination, deny globs, resources, and the policy tools."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mcp_server.cli.policy_report import policy_lines
from mcp_server.core.policy import (
    CapsuleFacts,
    CombinedRules,
    ExecFacts,
    RequiredTestOutcome,
    evaluate,
    glob_match,
)
from mcp_server.fs.policy import builtin_policies, validate_policy
from sandbox.errors import CcwError


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.py", "a.py", True),
        ("*.py", "src/a.py", False),
        ("**/*.py", "src/a.py", True),
        ("**/*.py", "a.py", True),
        ("src/**", "src/x/y", True),
        ("src/**", "srcx/y", False),
        ("/home/u/.ssh/**", "/home/u/.ssh/id_rsa", True),
        ("/home/u/.ssh/**", "/home/u/.sshx/id", False),
        ("**/id_rsa*", "deep/er/id_rsa.pub", True),
        ("a/?/c", "a/b/c", True),
        ("a/?/c", "a/bb/c", False),
        ("[!a]*", "b.txt", True),
        ("[!a]*", "a.txt", False),
        (".env", ".env", True),
        ("**/.env", "x/.env.local", False),
    ],
)
def test_glob_semantics(pattern: str, path: str, expected: bool) -> None:
    assert glob_match(pattern, path) is expected


def test_builtins_are_valid_and_present() -> None:
    builtins = builtin_policies()
    assert {"baseline", "strict"} <= set(builtins)
    assert builtins["strict"]["rules"]["require_replay_ok"] is True


def test_unknown_rule_is_rejected_with_the_known_ones() -> None:
    with pytest.raises(CcwError) as info:
        validate_policy({"name": "x", "rules": {"max_rss": 1}})
    assert info.value.code == "INVALID_ARGUMENT"
    assert "max_rss_mb" in info.value.message and info.value.details["unknown_rules"] == ["max_rss"]


def test_schema_violations_are_listed() -> None:
    with pytest.raises(CcwError) as info:
        validate_policy({"name": "x", "rules": {"max_rss_mb": -1, "require_tests": [[]]}})
    paths = [e["path"] for e in info.value.details["errors"]]
    assert "/rules/max_rss_mb" in paths and "/rules/require_tests/0" in paths


def test_combination_takes_the_strictest() -> None:
    rules = CombinedRules.combine(
        [
            {"rules": {"max_rss_mb": 100, "deny_paths": ["b"], "require_tests": ["t1"]}},
            {"rules": {"max_rss_mb": 50, "max_cpu_ms": 10, "deny_paths": ["a", "b"], "require_replay_ok": True}},
        ]
    )
    assert (rules.max_rss_mb, rules.max_cpu_ms) == (50, 10)
    assert rules.deny_paths == ["a", "b"] and rules.require_tests == ["t1"] and rules.require_replay_ok


def _facts(**paths: set[str]) -> CapsuleFacts:
    return CapsuleFacts(
        workspace="/w",
        home="/home/u",
        execs=[ExecFacts(1, ["make"], cpu_ms=500, rss_max_kb=300 * 1024), ExecFacts(2, ["x"], None, None)],
        paths={k.replace("__", "/"): v for k, v in paths.items()},
    )


def test_each_rule_kind_names_its_cause() -> None:
    rules = CombinedRules(max_rss_mb=200, max_cpu_ms=1000, deny_paths=["**/*.pem", "/w/secret/**"])
    facts = _facts(**{"src__a.py": {"written"}, "k.pem": {"read"}, "secret__x": {"changed"}})
    report = evaluate(rules, facts, [RequiredTestOutcome("pytest", 1, stderr_tail="boom")], replay_ok=None)
    assert report["passed"] is False
    assert report["deny_paths"] == ["k.pem", "secret/x"]
    assert report["paths_ok"] is False and report["tests_ok"] is False
    rules_hit = sorted((v["exec"], v["rule"]) for v in report["resource_violations"])
    # exec 1 peaked at 300 MiB > 200; exec 2 measured nothing, which fails closed.
    assert rules_hit == [(1, "max_rss_mb"), (2, "max_cpu_ms"), (2, "max_rss_mb")]
    assert report["test_failures"][0]["cmd"] == "pytest"
    assert "denied path" in report["details"] and "required test" in report["details"]
    assert report["replay_ok"] is None


def test_clean_capsule_passes_and_replay_requirement_is_enforced() -> None:
    facts = CapsuleFacts(workspace="/w", home="/h", execs=[ExecFacts(1, ["t"], 5, 1024)], paths={"a": {"written"}})
    ok = evaluate(CombinedRules(max_rss_mb=10), facts, [RequiredTestOutcome(["true"], 0)], replay_ok=None)
    assert ok["passed"] and ok["details"] == "All checks passed"
    need = CombinedRules(require_replay_ok=True)
    assert evaluate(need, facts, [], replay_ok=None)["passed"] is False
    assert evaluate(need, facts, [], replay_ok=False,
                    replay_details="exec 1 stdout")["details"].endswith("exec 1 stdout")
    assert evaluate(need, facts, [], replay_ok=True)["passed"] is True


def test_policy_tools_store_list_get_and_protect_builtins(direct_ctx: Any, call_tool: Any) -> None:
    rules = {"max_rss_mb": 512, "deny_paths": ["~/.ssh/*"], "require_tests": ["uv run pytest -q", ["mypy", "."]]}
    assert call_tool(direct_ctx, "policy/set", {"name": "custom", "rules": rules}) == {"ok": True, "name": "custom"}
    got = call_tool(direct_ctx, "policy_get", {"name": "custom"})
    assert got["rules"] == rules and got["source"] == "stored"
    names = [(p["name"], p["builtin"], p["overridden"]) for p in call_tool(direct_ctx, "policy_list", {})["policies"]]
    assert names == [("baseline", True, False), ("custom", False, False), ("strict", True, False)]
    with pytest.raises(CcwError) as info:
        call_tool(direct_ctx, "policy_set", {"name": "strict", "rules": {}})
    assert info.value.code == "CONFLICT" and "override_builtin" in info.value.message
    call_tool(direct_ctx, "policy_set", {"name": "strict", "rules": {"max_cpu_ms": 1}, "override_builtin": True})
    assert call_tool(direct_ctx, "policy_get", {"name": "strict"})["rules"] == {"max_cpu_ms": 1}
    with pytest.raises(CcwError) as missing:
        call_tool(direct_ctx, "policy_get", {"name": "nope"})
    assert missing.value.code == "NOT_FOUND" and "baseline" in missing.value.message
    with pytest.raises(CcwError) as unknown:
        call_tool(direct_ctx, "policy_set", {"name": "bad", "rules": {"max_rss": 1}})
    assert "known rules" in unknown.value.message


def test_identical_output_is_a_separate_rule_that_fails_only_when_asked() -> None:
    facts = CapsuleFacts(workspace="/w", home="/h", execs=[ExecFacts(1, ["pytest"], 5, 1024)])
    strict = CombinedRules.combine([builtin_policies()["strict"]])
    assert strict.needs_replay and not strict.require_identical_output
    # A test runner's durations: the replay did the same, the output differed.
    durations = evaluate(CombinedRules(require_replay_ok=True), facts, [], replay_ok=True, output_identical=False)
    assert durations["passed"] is True and durations["output_identical"] is False
    same = CombinedRules.combine([{"rules": {"require_identical_output": True}}, {"rules": {}}])
    assert same.require_identical_output and same.needs_replay and not same.require_replay_ok
    refused = evaluate(same, facts, [], replay_ok=True, output_identical=False, output_details="exec 1 stdout (-a; +b)")
    assert refused["passed"] is False
    assert refused["details"].endswith("requires identical output: exec 1 stdout (-a; +b)")
    assert evaluate(same, facts, [], replay_ok=True, output_identical=True)["passed"] is True
    assert evaluate(same, facts, [], replay_ok=None, output_identical=None)["passed"] is False
    validate_policy({"name": "same-output", "rules": {"require_identical_output": True}})
    with pytest.raises(CcwError):
        validate_policy({"name": "bad", "rules": {"require_identical_output": "yes"}})


def _rootless_exec(seq: int = 1, largest_mb: int = 30) -> ExecFacts:
    """An exec run by a rootless helper: CPU from the init's rusage, no total memory."""
    return ExecFacts(seq, ["pytest", "-q"], cpu_ms=800, rss_max_kb=None, rss_max_process_kb=largest_mb * 1024,
                     unavailable={"rss_max_kb": "no memory cgroup: mkdir of the exec's cgroup failed with EACCES"})


def test_builtin_baseline_passes_an_unmeasured_total_and_says_why() -> None:
    rules = CombinedRules.combine([builtin_policies()["baseline"]])
    facts = CapsuleFacts(workspace="/w", home="/h", execs=[_rootless_exec()], paths={"a.py": {"changed"}})
    report = evaluate(rules, facts, [], replay_ok=None)
    assert report["passed"] and report["resource_ok"] and report["resource_violations"] == []
    [note] = report["resource_unmeasured"]
    assert (note["exec"], note["rule"], note["figure"], note["largest_process_mb"]) == (
        1, "max_rss_mb", "rss_max_kb", 30)
    assert "no memory cgroup" in note["reason"]
    assert "rss_max_kb not measured" in report["details"] and "if_unmeasured: pass" in report["details"]


def test_builtin_strict_refuses_an_unmeasured_total_naming_it() -> None:
    rules = CombinedRules.combine([builtin_policies()["strict"]])
    facts = CapsuleFacts(workspace="/w", home="/h", execs=[_rootless_exec()], paths={"a.py": {"changed"}})
    report = evaluate(rules, facts, [], replay_ok=True)
    assert not report["passed"] and not report["resource_ok"] and report["resource_unmeasured"] == []
    [refused] = report["resource_violations"]
    assert (refused["rule"], refused["figure"], refused["value"]) == ("max_rss_mb", "rss_max_kb", None)
    assert "rss_max_kb (the exec's total memory) was not measured" in report["details"]
    assert "if_unmeasured: refuse" in report["details"] and "no memory cgroup" in refused["reason"]


def test_a_reason_every_exec_shares_is_given_once_and_each_exec_only_names_it() -> None:
    rules = CombinedRules.combine([builtin_policies()["strict"]])
    standing = ("no memory cgroup: mkdir of the exec's cgroup failed with EACCES (Permission denied) in every "
                "hierarchy (memory, pids); run the helper as root, or delegate a cgroup v2 subtree to it")
    execs = [ExecFacts(seq, ["npm", "test"], cpu_ms=800, rss_max_kb=None, rss_max_process_kb=30 * 1024,
                       unavailable={"rss_max_kb": standing}) for seq in (1, 2, 3)]
    report = evaluate(rules, CapsuleFacts(workspace="/w", home="/h", execs=execs), [], replay_ok=True)
    violations = report["resource_violations"]
    assert [(v["exec"], v["why"]) for v in violations] == [(n, "no memory cgroup") for n in (1, 2, 3)]
    assert report["unmeasured_causes"] == {"no memory cgroup": standing}
    text = json.dumps(report)
    assert text.count("mkdir of the exec's cgroup") == 2  # the cause, in unmeasured_causes and in details
    assert text.count("if_unmeasured: refuse") == 1
    assert ("3 resource violation(s): rss_max_kb (the exec's total memory) was not measured for exec(s) 1, 2, 3: "
            f"{standing}; the policy refuses figures it cannot check (if_unmeasured: refuse)") in report["details"]
    lines = policy_lines(report)  # what ccw capsule promote prints: the first clause of the cause, as before
    assert ("resources: max_rss_mb 2048 cannot be checked: rss_max_kb (the exec's total memory) was not measured "
            "for exec(s) 1, 2, 3 (no memory cgroup: mkdir of the exec's cgroup failed with EACCES (Permission "
            "denied) in every hierarchy (memory, pids)); the largest single process peaked at 30.0 MiB; the policy "
            "refuses what it cannot check (if_unmeasured: refuse)") in lines, lines
    baseline = evaluate(CombinedRules.combine([builtin_policies()["baseline"]]),
                        CapsuleFacts(workspace="/w", home="/h", execs=execs), [], replay_ok=None)
    assert [note["why"] for note in baseline["resource_unmeasured"]] == ["no memory cgroup"] * 3
    assert json.dumps(baseline).count("mkdir of the exec's cgroup") == 2
    assert f"if_unmeasured: pass); first: rss_max_kb (the exec's total memory) was not measured for exec(s) 1, 2, " \
           f"3: {standing}" in baseline["details"]


def test_execs_of_other_capsules_are_named_with_their_capsule() -> None:
    # A merged capsule's promotion judges its inputs' runs, and a fork's its ancestors': each
    # capsule counts its own, so two "exec 1"s were told apart by nothing, and the cause of the
    # second was looked up as the first's.
    rules = CombinedRules.combine([builtin_policies()["strict"]])
    own = ExecFacts(1, ["make"], cpu_ms=5, rss_max_kb=None, unavailable={"rss_max_kb": "cut short: it was cancelled"})
    other = ExecFacts(1, ["npm", "test"], cpu_ms=5, rss_max_kb=None, capsule_id="cap_input",
                      unavailable={"rss_max_kb": "no memory cgroup: mkdir of the exec's cgroup failed with EACCES"},
                      network=[{"host": "example.org", "port": 443, "allowed": True}])
    report = evaluate(rules, CapsuleFacts(workspace="/w", home="/h", execs=[own, other]), [], replay_ok=True)
    named = [(v.get("capsule_id"), v["exec"], v["why"]) for v in report["resource_violations"]]
    assert named == [(None, 1, "cut short: it was cancelled"), ("cap_input", 1, "no memory cgroup")], named
    assert report["unmeasured_causes"] == {
        "no memory cgroup": "no memory cgroup: mkdir of the exec's cgroup failed with EACCES"}
    assert any("exec 1 of cap_input (npm test)" in v["reason"] for v in report["resource_violations"])
    network = report["network_violations"]
    assert [(v["capsule_id"], v["exec"]) for v in network] == [("cap_input", 1)], network
    assert network[0]["reason"].startswith("exec 1 of cap_input connected to example.org:443"), network
    lines = policy_lines(report)
    assert any("was not measured for exec(s) 1, 1 of cap_input (" in line for line in lines), lines


def test_a_single_process_over_the_ceiling_is_a_violation_whatever_if_unmeasured_says() -> None:
    rules = CombinedRules(max_rss_mb=100, if_unmeasured="pass")
    facts = CapsuleFacts(workspace="/w", home="/h", execs=[_rootless_exec(largest_mb=150)])
    report = evaluate(rules, facts, [], replay_ok=None)
    [broken] = report["resource_violations"]
    assert broken["value"] == 150 and "single process" in broken["reason"]
    assert not report["passed"] and report["resource_unmeasured"] == []


def test_cpu_from_rusage_is_checked_like_a_cgroups() -> None:
    facts = CapsuleFacts(workspace="/w", home="/h", execs=[_rootless_exec()])
    assert evaluate(CombinedRules(max_cpu_ms=1000), facts, [], replay_ok=None)["passed"]
    over = evaluate(CombinedRules(max_cpu_ms=500), facts, [], replay_ok=None)["resource_violations"]
    assert [(v["rule"], v["value"]) for v in over] == [("max_cpu_ms", 800)]


@pytest.mark.parametrize(
    ("decisions", "combined"),
    [([], "refuse"), (["pass"], "pass"), (["pass", "refuse"], "refuse"), (["pass", None], "refuse"),
     (["pass", "no ceiling"], "pass"), (["no ceiling"], "refuse")],
)
def test_unmeasured_figures_pass_only_if_every_policy_says_so(decisions: list[str | None], combined: str) -> None:
    """``None``: a ceiling and no word on it (the default, refuse); "no ceiling": a policy
    with neither (only require_tests), which has no say."""
    def policy(decision: str | None) -> dict[str, Any]:
        if decision is None:
            return {"rules": {"max_cpu_ms": 1000}}
        if decision == "no ceiling":
            return {"rules": {"require_tests": ["pytest -q"]}}
        return {"rules": {"if_unmeasured": decision}}

    assert CombinedRules.combine([policy(d) for d in decisions]).if_unmeasured == combined


def test_if_unmeasured_takes_only_its_two_values() -> None:
    validate_policy({"name": "x", "rules": {"if_unmeasured": "pass"}})
    with pytest.raises(CcwError) as info:
        validate_policy({"name": "x", "rules": {"if_unmeasured": "ignore"}})
    assert info.value.details["errors"][0]["path"] == "/rules/if_unmeasured"


def test_volatile_globs_combine_as_a_union_and_must_be_relative() -> None:
    rules = CombinedRules.combine([{"rules": {"volatile": [".nyc_output/*.json"]}},
                                   {"rules": {"volatile": ["coverage/*.tmp", ".nyc_output/*.json"]}}, {"rules": {}}])
    assert rules.volatile == [".nyc_output/*.json", "coverage/*.tmp"]
    assert not rules.needs_replay  # globs alone ask for no replay
    validate_policy({"name": "cov", "rules": {"volatile": [".nyc_output/*.json"], "require_replay_ok": True}})
    for bad in ("/etc/*", "../up/*.json", "a/../b", ""):
        with pytest.raises(CcwError) as caught:
            validate_policy({"name": "cov", "rules": {"volatile": [bad]}})
        assert caught.value.code == "INVALID_ARGUMENT", bad


def test_expose_globs_limit_the_toolchains_a_promoted_capsule_showed() -> None:
    facts = CapsuleFacts(workspace="/srv/p", home="/home/dev",
                         exposed=["/home/dev/.pyenv/versions/3.12.1", "/opt/node-20/bin"])
    anything = evaluate(CombinedRules.combine([{"rules": {}}]), facts, [], None)
    assert anything["expose_ok"] is True and anything["passed"] is True
    rules = CombinedRules.combine([{"rules": {"expose": ["~/.pyenv/versions/**"]}}, {"rules": {}}])
    report = evaluate(rules, facts, [], None)
    assert report["passed"] is False and report["expose_ok"] is False
    assert [v["path"] for v in report["expose_violations"]] == ["/opt/node-20/bin"]
    assert "shown dir(s) the policies do not allow" in report["details"]
    both = CombinedRules.combine([{"rules": {"expose": ["~/.pyenv/versions/**"]}}, {"rules": {"expose": ["/opt/**"]}}])
    assert evaluate(both, facts, [], None)["expose_ok"] is True
    assert evaluate(CombinedRules.combine([{"rules": {"expose": []}}]), CapsuleFacts("/srv/p", "/h"), [],
                    None)["passed"]
    for bad in ("relative/dir", "", "~user/x"):
        with pytest.raises(CcwError):
            validate_policy({"name": "tc", "rules": {"expose": [bad]}})

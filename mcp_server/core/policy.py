"""Promotion policies: combining them and judging a capsule against them.

The policy files (schema, built-in policies) and validating a policy against the schema
are ``mcp_server.fs.policy``.

Pure logic: the caller gathers the facts (the capsule's execs with their usage, the paths
it read, wrote and changed, the results of required tests and of the replay) and
``evaluate`` turns them into seed 003's ``policy_report``.

Choices made here:
- Several policies combine as the strictest of each: the lowest resource ceilings, the
  union of denied globs and required tests, replay required if any policy requires it.
- A resource figure that could not be measured (``null``, e.g. the total memory of a
  rootless exec, which has no memory cgroup) cannot show a ceiling was kept.  The policy
  decides, explicitly, with ``if_unmeasured``: ``refuse`` makes it a violation that names
  the figure and why it is missing; ``pass`` lets the check pass and lists it in the
  report's ``resource_unmeasured`` with the reason.  Combined, ``refuse`` wins; with no
  policy saying anything, ``refuse`` (fail closed).  A policy that sets no ceiling and
  no ``if_unmeasured`` (say, only ``require_tests``) has no say: it governs no ceiling,
  and its silence must not turn ``baseline``'s ``pass`` into a refusal.
- ``max_rss_mb`` is about the exec's total memory (``rss_max_kb``: its memory cgroup's
  peak, all processes together).  Without one, ``rss_max_process_kb`` (the largest
  single process, from wait4 rusage) is a lower bound of the total: above the ceiling,
  it proves a violation; below, it proves nothing, and the total counts as unmeasured.
  ``max_cpu_ms`` takes ``cpu_ms`` from either source: the cgroup's counter and the
  rusage of every process the jail's init reaped are the same sum.
- ``replay_ok`` is ``null`` when no policy required a replay and none was run: a
  replay re-runs every exec, too costly to do unasked, and ``true`` would claim a check
  that did not happen.  It means the same exit codes, signals, timeouts, files written
  and changes (core/replaydiff.py); output is not part of it.  ``require_identical_output``
  asks, in addition, that every exec print the same bytes (``output_identical``), which
  a test runner printing durations never does.
- ``deny_paths`` globs: ``*`` and ``?`` stay inside one path segment, ``**`` spans any
  number of segments (zero included), ``~`` is the caller's home directory.  A glob that
  is absolute (after ``~`` expansion) matches the absolute path of each file
  (workspace + relative path); a relative glob matches the repo-relative path.
- Hazards (core/hazards.py: setuid bits, git hooks and config, files tools run by
  themselves) are judged under every policy, ``baseline`` included, and no policy can
  allow them: a standing allowance would let the next capsule's hook through unseen.
  Only the promotion itself allows them, by kind (``allow_hazards``), after a review.
  They come first in ``details``, being what matters most when they are there.
- ``expose`` globs name the toolchain directories (outside the workspace) a capsule may
  have shown its runs: what the results were built with is part of what is promoted.
  Absolute, ``~`` for the caller's home; combined, the union; absent everywhere, any.
  A violation fails ``expose_ok`` and is listed in ``expose_violations``.
- ``volatile`` globs (core/volatile.py) are the policy's own word on which written paths
  its replay may find named differently; the capsule's globs never count there (the
  agent may not decide what its own check ignores).  Combined: the union.
- ``allow_hosts`` / ``deny_hosts`` use the capsule allowlist's rule grammar
  (core/netrules.py) and judge the connections the runs *made* (``touched.network``
  records with ``allowed: true``): denied attempts reached nothing.  Combined: unions.
  Once any policy has ``allow_hosts`` (even ``[]``, as ``strict`` has), every allowed
  connection must match one of the union's rules; any allowed connection matching a
  ``deny_hosts`` rule is a violation.  A connection matches by the host it asked for or
  by the address the proxy reached (a name rule never matches an address, nor the
  other way round, as in the allowlist).  Here a rule without a port matches any port
  (``Rule.matches``: ``deny_hosts: ["*.corp.example"]`` must catch ssh to it too),
  while in a capsule's allowlist it allows 80 and 443 only (``Rule.allows``); and the
  allowlist's refusal of the host and private space (core/netspace.py) is the proxy's,
  so a policy only ever sees connections that got past it.
"""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from mcp_server.core.hazards import Hazard, report_reasons
from mcp_server.core.netrules import Rule, normalize_host, parse_rules
from sandbox.usage_words import refusal_head

RULE_NAMES = ("allow_hosts", "deny_hosts", "deny_paths", "if_unmeasured", "max_cpu_ms", "max_rss_mb",
              "require_identical_output", "require_replay_ok", "require_tests", "volatile", "expose",
              "network")  # network: for capsules naming the policy, not promotion (capsules/policy.py)


@functools.lru_cache(maxsize=512)
def _glob_regex(pattern: str) -> re.Pattern[str]:
    parts = []
    segments = pattern.split("/")
    for i, segment in enumerate(segments):
        last = i == len(segments) - 1
        if segment == "**":
            # Any number of whole segments, including none.
            parts.append(".*" if last else "(?:[^/]*/)*")
            continue
        parts.append(_segment(segment) + ("" if last else "/"))
    return re.compile("".join(parts) + r"\Z", re.DOTALL)


def _segment(segment: str) -> str:
    out = []
    i = 0
    while i < len(segment):
        ch = segment[i]
        if ch == "*":
            out.append("[^/]*")
        elif ch == "?":
            out.append("[^/]")
        elif ch == "[":
            end = segment.find("]", i + 2 if i + 1 < len(segment) and segment[i + 1] in "!^" else i + 1)
            if end == -1:
                out.append(re.escape(ch))
            else:
                body = segment[i + 1 : end]
                if body[:1] in ("!", "^"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                i = end
        else:
            out.append(re.escape(ch))
        i += 1
    return "".join(out)


def glob_match(pattern: str, path: str) -> bool:
    """True if ``path`` matches ``pattern`` with segment-aware ``*`` and spanning ``**``."""
    return _glob_regex(pattern).match(path) is not None


@dataclass
class ExecFacts:
    """What the journal knows of one exec, as the rules need it."""

    seq: int
    argv: list[str]
    cpu_ms: int | None
    rss_max_kb: int | None
    rss_max_process_kb: int | None = None  # the largest single process (rusage), where known
    unavailable: dict[str, str] = field(default_factory=dict)  # figure -> why it is null
    network: list[dict[str, Any]] = field(default_factory=list)  # its touched.network records ([]: none)
    # The capsule that ran it, where not the one judged (an ancestor's, a merged input's): each
    # capsule counts its own runs, so "exec 3" alone would name one of several.
    capsule_id: str | None = None

    @property
    def name(self) -> str:
        """How a report names it: "exec 3", or "exec 3 of cap_…" for another capsule's."""
        return f"exec {self.seq}" + (f" of {self.capsule_id}" if self.capsule_id else "")

    def keys(self) -> dict[str, Any]:
        """The fields that name it in a report's item (its seq, and its capsule where not the one judged)."""
        return {"exec": self.seq, **({"capsule_id": self.capsule_id} if self.capsule_id else {})}


@dataclass
class RequiredTestOutcome:
    """One required test command run in the capsule."""

    cmd: str | list[str]
    exit_code: int | None
    timed_out: bool = False
    stderr_tail: str = ""


@dataclass
class CapsuleFacts:
    """Everything ``evaluate`` judges."""

    workspace: str
    home: str
    execs: list[ExecFacts] = field(default_factory=list)
    paths: dict[str, set[str]] = field(default_factory=dict)  # repo-relative path -> {"read", "written", "changed"}
    read_unavailable: str | None = None  # why some exec's read set is unknown
    hazards: list[Hazard] = field(default_factory=list)  # what the promotion would carry out (core/hazards.py)
    exposed: list[str] = field(default_factory=list)  # dirs outside the workspace its jails showed (CapsuleSpec.expose)


@dataclass
class CombinedRules:
    """Several policies folded into one set of rules (the strictest of each)."""

    max_rss_mb: int | None = None
    max_cpu_ms: int | None = None
    deny_paths: list[str] = field(default_factory=list)
    require_tests: list[str | list[str]] = field(default_factory=list)
    require_replay_ok: bool = False
    require_identical_output: bool = False
    if_unmeasured: str = "refuse"  # or "pass": what a ceiling does with a figure that was not measured
    allow_hosts: list[str] | None = None  # None: no policy limits where connections go
    deny_hosts: list[str] = field(default_factory=list)
    volatile: list[str] = field(default_factory=list)  # globs the policies' replay leaves out (core/volatile.py)
    expose: list[str] | None = None  # globs of the toolchain dirs a capsule may have shown; None: any

    @property
    def needs_replay(self) -> bool:
        """Whether judging these rules takes a replay."""
        return self.require_replay_ok or self.require_identical_output

    @classmethod
    def combine(cls, policies: Iterable[dict[str, Any]]) -> CombinedRules:
        """Fold policies: lowest ceilings, union of globs and tests, replay if any wants it,
        unmeasured figures passed only if every policy with a ceiling or a say says so."""
        out = cls()
        decisions = []
        for policy in policies:
            rules = policy["rules"]
            if "if_unmeasured" in rules or "max_rss_mb" in rules or "max_cpu_ms" in rules:
                decisions.append(rules.get("if_unmeasured", "refuse"))
            for key in ("max_rss_mb", "max_cpu_ms"):
                if key in rules:
                    current = getattr(out, key)
                    setattr(out, key, rules[key] if current is None else min(current, rules[key]))
            for glob in rules.get("deny_paths", []):
                if glob not in out.deny_paths:
                    out.deny_paths.append(glob)
            for test in rules.get("require_tests", []):
                if test not in out.require_tests:
                    out.require_tests.append(test)
            if "allow_hosts" in rules:
                out.allow_hosts = sorted(set(out.allow_hosts or ()) | set(rules["allow_hosts"]))
            out.deny_hosts = sorted(set(out.deny_hosts) | set(rules.get("deny_hosts", ())))
            out.volatile = sorted(set(out.volatile) | set(rules.get("volatile", ())))
            if "expose" in rules:
                out.expose = sorted(set(out.expose or ()) | set(rules["expose"]))
            out.require_replay_ok = out.require_replay_ok or bool(rules.get("require_replay_ok"))
            out.require_identical_output = out.require_identical_output or bool(rules.get("require_identical_output"))
        out.deny_paths.sort()
        out.if_unmeasured = "pass" if decisions and all(d == "pass" for d in decisions) else "refuse"
        return out


def _expand(glob: str, home: str) -> str:
    if glob == "~" or glob.startswith("~/"):
        return home.rstrip("/") + glob[1:]
    return glob


def denied_paths(rules: CombinedRules, facts: CapsuleFacts) -> list[dict[str, Any]]:
    """Every (path, how it was touched, glob) where a touched path matches a denied glob."""
    hits = []
    globs = [(g, _expand(g, facts.home)) for g in rules.deny_paths]
    for rel in sorted(facts.paths, key=lambda p: p.encode()):
        absolute = posixpath.join(facts.workspace, rel)
        for original, glob in globs:
            target = absolute if glob.startswith("/") else rel
            if glob_match(glob, target):
                hits.append({"path": rel, "glob": original, "how": sorted(facts.paths[rel])})
                break
    return hits


def expose_violations(rules: CombinedRules, facts: CapsuleFacts) -> list[dict[str, str]]:
    """Each directory the capsule showed that no ``expose`` glob of the policies names."""
    if rules.expose is None:
        return []
    globs = [_expand(glob, facts.home) for glob in rules.expose]
    return [{"path": path, "reason": f"the capsule showed {path}, which no expose glob of the policies names "
                                     f"({', '.join(rules.expose) or 'none'})"}
            for path in sorted(facts.exposed) if not any(glob_match(glob, path) for glob in globs)]


def _matching(rules: Sequence[Rule], record: dict[str, Any]) -> str | None:
    """The first rule the connection matches, by its host or by the address reached."""
    for target in (record.get("host"), record.get("address")):
        if not isinstance(target, str):
            continue
        host, _ = normalize_host(target)
        if host is None:
            continue
        for rule in rules:
            if rule.matches(host, record["port"]):
                return rule.text
    return None


def network_violations(rules: CombinedRules, facts: CapsuleFacts) -> list[dict[str, Any]]:
    """Each connection a run made that the policies' allow_hosts/deny_hosts refuse (once per exec and place)."""
    allow = None if rules.allow_hosts is None else parse_rules(rules.allow_hosts)
    deny = parse_rules(rules.deny_hosts)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for ex in facts.execs:
        for record in ex.network:
            if not record.get("allowed"):
                continue
            place = f"{record['host']}:{record['port']}"
            denied = _matching(deny, record)
            if denied is not None:
                out.setdefault((ex.capsule_id or "", ex.seq, record["host"], record["port"], "deny_hosts"), {
                    **ex.keys(), "host": record["host"], "port": record["port"], "rule": "deny_hosts",
                    "matched": denied,
                    "reason": f"{ex.name} connected to {place}, which deny_hosts {denied} refuses"})
            elif allow is not None and _matching(allow, record) is None:
                out.setdefault((ex.capsule_id or "", ex.seq, record["host"], record["port"], "allow_hosts"), {
                    **ex.keys(), "host": record["host"], "port": record["port"], "rule": "allow_hosts",
                    "matched": None, "reason": f"{ex.name} connected to {place}, which no allow_hosts rule of "
                                               f"the policies names ({', '.join(rules.allow_hosts or ()) or 'none'})"})
    return [out[key] for key in sorted(out)]


FIGURE_MEANINGS = {"rss_max_kb": "the exec's total memory", "cpu_ms": "the exec's CPU time"}
_REASON_CAP = 300  # characters of a helper's reason kept in a report


def _short(reason: str) -> str:
    return reason if len(reason) <= _REASON_CAP else reason[: _REASON_CAP - 1] + "…"


def resource_violations(rules: CombinedRules, facts: CapsuleFacts) -> list[dict[str, Any]]:
    """Each exec that broke a resource ceiling, or could not be shown to keep it and the
    rules refuse unmeasured figures (``details`` says once that they do)."""
    broken, unmeasured = resource_checks(rules, facts)
    if rules.if_unmeasured == "refuse":
        broken += [{**item, "value": None} for item in unmeasured]
        broken.sort(key=lambda v: (v.get("capsule_id", ""), v["exec"], v["rule"]))
    return broken


def item_exec(item: dict[str, Any]) -> str:
    """The exec a report's item names, as text: "3", or "3 of cap_…" (``ExecFacts.keys``)."""
    return str(item["exec"]) + (f" of {item['capsule_id']}" if "capsule_id" in item else "")


def unmeasured_causes(items: list[dict[str, Any]], facts: CapsuleFacts) -> dict[str, str]:
    """The whole reason behind each ``why`` that ``items`` (unmeasured figures) only name, once:
    a helper's standing cgroup refusal is the same for every exec (sandbox/exec_usage.py)."""
    execs = {(ex.capsule_id, ex.seq): ex for ex in facts.execs}
    causes: dict[str, str] = {}
    for item in items:
        whole = _short(execs[item.get("capsule_id"), item["exec"]].unavailable.get(item["figure"], item["why"]))
        if whole != item["why"]:
            causes.setdefault(item["why"], whole)
    return causes


def _unmeasured_clause(items: list[dict[str, Any]], causes: dict[str, str]) -> str:
    """The first item's figure and why, and every exec that lacks it for the same reason."""
    first = items[0]
    execs = [item_exec(item) for item in items if (item["figure"], item["why"]) == (first["figure"], first["why"])]
    return (f"{first['figure']} ({FIGURE_MEANINGS[first['figure']]}) was not measured for exec(s) {', '.join(execs)}: "
            f"{causes.get(first['why'], first['why'])}")


def resource_checks(rules: CombinedRules, facts: CapsuleFacts) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(ceilings broken, ceilings whose figure was not measured), one entry per exec and rule."""
    broken: list[dict[str, Any]] = []
    unmeasured: list[dict[str, Any]] = []
    for ex in facts.execs:
        label = f"{ex.name} ({' '.join(ex.argv)[:80]})"
        checks = (
            ("max_rss_mb", rules.max_rss_mb, None if ex.rss_max_kb is None else ex.rss_max_kb / 1024, "rss_max_kb"),
            ("max_cpu_ms", rules.max_cpu_ms, ex.cpu_ms, "cpu_ms"),
        )
        for rule, limit, value, figure in checks:
            if limit is None:
                continue
            if value is not None:
                if value > limit:
                    broken.append({**ex.keys(), "rule": rule, "limit": limit, "value": round(value, 3),
                                   "reason": f"{label} used {round(value, 3)} > {limit}"})
                continue
            single = None if figure != "rss_max_kb" or ex.rss_max_process_kb is None else ex.rss_max_process_kb / 1024
            if single is not None and single > limit:
                # The total is at least its largest process: the ceiling was broken.
                broken.append({**ex.keys(), "rule": rule, "limit": limit, "value": round(single, 3),
                               "reason": f"{label} had a single process at {round(single, 3)} MiB > {limit} "
                                         "(rss_max_process_kb; the total was not measured and is at least that)"})
                continue
            reason = ex.unavailable.get(figure, "no reason was recorded")
            why = refusal_head(figure, reason) or _short(reason)  # a standing refusal's whole: unmeasured_causes
            reason = f"{figure} ({FIGURE_MEANINGS[figure]}) was not measured for {label}: {why}"
            entry: dict[str, Any] = {**ex.keys(), "rule": rule, "limit": limit, "figure": figure, "why": why}
            if single is not None:
                entry["largest_process_mb"] = round(single, 3)
                reason += f"; its largest single process peaked at {round(single, 1)} MiB"
            unmeasured.append({**entry, "reason": reason})
    return broken, unmeasured


def _notes(rules: CombinedRules, facts: CapsuleFacts, passed_unmeasured: list[dict[str, Any]],
           causes: dict[str, str]) -> list[str]:
    """The report's notes on checks that passed with less than the full facts."""
    notes = []
    if passed_unmeasured:
        figures = sorted({u["figure"] for u in passed_unmeasured})
        notes.append(f"note: {', '.join(figures)} not measured for {len(passed_unmeasured)} check(s), passed as the "
                     f"policy allows (if_unmeasured: pass); first: {_unmeasured_clause(passed_unmeasured, causes)}")
    if facts.read_unavailable and rules.deny_paths:
        notes.append(f"note: read sets unavailable ({facts.read_unavailable}); "
                     "deny_paths checked against writes and changes only")
    return notes


def _failed_checks(reached: list[dict[str, Any]], unexposed: list[dict[str, str]], denied: list[dict[str, Any]],
                   violations: list[dict[str, Any]], failures: list[dict[str, Any]],
                   causes: dict[str, str]) -> list[str]:
    """The report's reasons for the checks that failed on the capsule's own facts, first of each named."""
    reasons = []
    if reached:
        reasons.append(f"{len(reached)} connection(s) the policies refuse: {reached[0]['reason']}")
    if unexposed:
        reasons.append(f"{len(unexposed)} shown dir(s) the policies do not allow: {unexposed[0]['reason']}")
    if denied:
        reasons.append(f"{len(denied)} denied path(s), first {denied[0]['path']} (matches {denied[0]['glob']})")
    if violations and "figure" in violations[0]:  # not measured, for every exec it names at once
        unmeasured = [v for v in violations if "figure" in v]
        reasons.append(f"{len(violations)} resource violation(s): {_unmeasured_clause(unmeasured, causes)}; "
                       "the policy refuses figures it cannot check (if_unmeasured: refuse)")
    elif violations:
        reasons.append(f"{len(violations)} resource violation(s): {violations[0]['reason']}")
    if failures:
        reasons.append(f"{len(failures)} required test(s) failed, "
                       f"first {failures[0]['cmd']!r} exit {failures[0]['exit_code']}")
    return reasons


def evaluate(
    rules: CombinedRules,
    facts: CapsuleFacts,
    tests: Sequence[RequiredTestOutcome],
    replay_ok: bool | None,
    replay_details: str = "",
    output_identical: bool | None = None,
    output_details: str = "",
) -> dict[str, Any]:
    """Seed 003's policy_report for these facts (plus ``output_identical``)."""
    denied = denied_paths(rules, facts)
    violations = resource_violations(rules, facts)
    reached = network_violations(rules, facts)
    unexposed = expose_violations(rules, facts)
    passed_unmeasured = resource_checks(rules, facts)[1] if rules.if_unmeasured == "pass" else []
    causes = unmeasured_causes([v for v in violations if "figure" in v] + passed_unmeasured, facts)
    failures = [
        {"cmd": t.cmd, "exit_code": t.exit_code, "timed_out": t.timed_out, "stderr_tail": t.stderr_tail}
        for t in tests
        if t.exit_code != 0 or t.timed_out
    ]
    tests_ok, paths_ok, resource_ok = not failures, not denied, not violations
    replay_pass = (replay_ok is True) if rules.require_replay_ok else (replay_ok is not False)
    # Output that differs fails only a policy that asks for identical output.
    output_pass = output_identical is True if rules.require_identical_output else True
    network_ok, expose_ok = not reached, not unexposed
    hazards_ok = all(h.allowed for h in facts.hazards)
    passed = (tests_ok and paths_ok and resource_ok and replay_pass and output_pass and network_ok and expose_ok
              and hazards_ok)
    reasons, hazard_notes = report_reasons(facts.hazards)
    reasons += _failed_checks(reached, unexposed, denied, violations, failures, causes)
    if not replay_pass:
        reasons.append("replay did not reproduce the capsule's runs"
                       + (f": {replay_details}" if replay_details else ""))
    if not output_pass:
        reasons.append("replay printed different output and a policy requires identical output"
                       + (f": {output_details}" if output_details else ""))
    reasons += _notes(rules, facts, passed_unmeasured, causes) + hazard_notes
    return {
        "passed": passed,
        "tests_ok": tests_ok,
        "replay_ok": replay_ok,  # null when no policy asked for a replay and none was run
        "output_identical": output_identical,  # likewise
        "resource_ok": resource_ok,
        "paths_ok": paths_ok,
        "network_ok": network_ok,
        "network_violations": reached,
        "expose_ok": expose_ok,
        "expose_violations": unexposed,
        "hazards_ok": hazards_ok,  # every hazard found was allowed (allow_hazards), or none was found
        "hazards": [h.to_json() for h in facts.hazards],
        "deny_paths": [d["path"] for d in denied],
        "denied": denied,
        "resource_violations": violations,
        "resource_unmeasured": passed_unmeasured,  # ceilings passed without their figure (if_unmeasured: pass)
        **({"unmeasured_causes": causes} if causes else {}),  # each why those name, whole, once
        "test_failures": failures,
        "details": "All checks passed" if passed and not reasons else "; ".join(reasons) or "All checks passed",
    }

"""How ``ccw capsule promote`` explains a policy report: one line per failed check, then its
notes and what to do about them (the hazards to allow, the figures a rootless helper cannot
measure and the policy that passes them)."""

from __future__ import annotations

from typing import Any

from mcp_server.core.policy import FIGURE_MEANINGS, item_exec


def policy_lines(report: dict[str, Any]) -> list[str]:
    """One line per failed check of a policy report, then its notes and what to do about them."""
    lines = _hazard_lines(report.get("hazards", []))
    for failure in report["test_failures"]:
        lines.append(f"tests: {failure['cmd']!r} exited {failure['exit_code']}"
                     + (" (timed out)" if failure.get("timed_out") else ""))
    for denied in report.get("denied", []):
        lines.append(f"paths: {denied['path']} ({'/'.join(denied['how'])}) matches denied {denied['glob']}")
    violations = report["resource_violations"]
    refused = [v for v in violations if "figure" in v]
    for violation in violations:
        if "figure" not in violation:
            lines.append(f"resources ({violation['rule']} {violation['limit']}): {violation['reason']}")
    causes = report.get("unmeasured_causes", {})
    lines += [f"resources: {line}; the policy refuses what it cannot check (if_unmeasured: refuse)"
              for line in _unmeasured_lines(refused, causes)]
    lines += [f"replay: {clause.removeprefix('replay ')}" for clause in report["details"].split("; ")
              if clause.startswith("replay")]
    lines += [f"note: {line}; passed, as the policy allows (if_unmeasured: pass)"
              for line in _unmeasured_lines(report.get("resource_unmeasured", []), causes)]
    if "read sets unavailable" in report["details"]:
        lines.append("note: files read are not traced here (rootless: no fanotify), so deny_paths "
                     "was checked against the files written and changed only")
    if refused:
        lines.append("fix: figures a rootless helper cannot measure need a helper with cgroups (the "
                     "ccw-helper service, README 'System service'), or a policy that passes them "
                     "(if_unmeasured: pass, as --policy baseline has)")
    return lines


_HAZARDS_SHOWN = 12  # a new repository in a capsule brings a dozen hooks; --json has them all


def _hazard_lines(found: list[dict[str, Any]]) -> list[str]:
    """One line per hazard (refused, or allowed and so noted), then how to allow those refused."""
    lines = []
    for hazard in found[:_HAZARDS_SHOWN]:
        head = "note: allowed hazard" if hazard["allowed"] else "hazard"
        lines.append(f"{head} {hazard['kind']}: {hazard['path']} ({hazard['action']}): {hazard['reason']}")
    if len(found) > _HAZARDS_SHOWN:
        lines.append(f"… and {len(found) - _HAZARDS_SHOWN} more hazard(s) (--json lists each)")
    refused = sorted({h["kind"] for h in found if not h["allowed"]})
    if refused:
        lines.append("fix: undo them in the capsule, or, once reviewed (ccw capsule diff), promote them anyway with "
                     + " ".join(f"--allow-hazard {kind}" for kind in refused))
    return lines


def _unmeasured_lines(items: list[dict[str, Any]], causes: dict[str, str]) -> list[str]:
    """One line per ceiling whose figure was not measured, for all the execs concerned (``causes``:
    the report's ``unmeasured_causes``, the whole of each ``why`` the items name)."""
    by_rule: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for item in items:
        by_rule.setdefault((item["rule"], item["figure"]), []).append(item)
    lines = []
    for (rule, figure), group in sorted(by_rule.items()):
        execs = ", ".join(item_exec(item) for item in group)
        why = causes.get(group[0]["why"], group[0]["why"]).split("; ")[0]  # its first clause: what was missing
        line = (f"{rule} {group[0]['limit']} cannot be checked: {figure} ({FIGURE_MEANINGS[figure]}) was not "
                f"measured for exec(s) {execs} ({why})")
        largest = [item["largest_process_mb"] for item in group if "largest_process_mb" in item]
        if largest:
            line += f"; the largest single process peaked at {max(largest):.1f} MiB"
        lines.append(line)
    return lines

"""Every cause the kernel probe (sandbox/probe.py) can name has a fix text in ``ccw doctor``.

The causes are read from the probe's source: every string that can reach a
``Finding``'s ``cause`` (directly, through a conditional, a local variable, or a
function of the module such as ``userns_cause``).  A cause without a fix text would
otherwise show up first on a machine where that feature is missing.
"""

from __future__ import annotations

import ast
import errno
import inspect
import os

import pytest

from mcp_server import doctor
from sandbox import egress, probe

SOURCE = ast.parse(inspect.getsource(probe))
FUNCTIONS = {node.name: node for node in ast.walk(SOURCE) if isinstance(node, ast.FunctionDef)}


def _enclosing(target: ast.AST) -> ast.FunctionDef:
    inner = [f for f in FUNCTIONS.values() if any(node is target for node in ast.walk(f))]
    return min(inner, key=lambda f: len(list(ast.walk(f))))  # the innermost


def _strings(expr: ast.AST, scope: ast.FunctionDef, seen: set[str]) -> set[str]:
    """The string constants ``expr`` can evaluate to, following names and module functions."""
    found: set[str] = set()
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
        found.add(expr.value)
    elif isinstance(expr, ast.IfExp):
        found |= _strings(expr.body, scope, seen) | _strings(expr.orelse, scope, seen)
    elif isinstance(expr, ast.Name) and expr.id not in seen:
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == expr.id for t in node.targets):
                found |= _strings(node.value, scope, seen | {expr.id})
    elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id in FUNCTIONS:
        called = FUNCTIONS[expr.func.id]
        if called.name not in seen:
            for node in ast.walk(called):
                if isinstance(node, ast.Return) and node.value is not None:
                    found |= _strings(node.value, called, seen | {called.name})
    return found


def probe_causes() -> set[str]:
    """Every cause a Finding of sandbox/probe.py can carry."""
    causes: set[str] = set()
    for node in ast.walk(SOURCE):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Finding":
            given = [*node.args[3:4], *(k.value for k in node.keywords if k.arg == "cause")]
            for expr in given:
                causes |= _strings(expr, _enclosing(node), set())
    return causes


def test_the_probe_names_its_causes() -> None:
    causes = probe_causes()
    # The scan sees the causes behind conditionals, variables and userns_cause().
    assert {"no_seccomp", "no_time_namespace", "no_namespace", "needs_root", "no_overlay_userxattr",
            "no_cgroup_delegation", "landlock_disabled"} <= causes


def test_every_cause_the_probe_can_name_has_a_fix() -> None:
    for cause in sorted(probe_causes()):
        finding = probe.Finding("namespace.pid", False, "seen", cause)
        fix = doctor.fix_for(finding)
        assert fix and "no fix is known" not in fix, cause
    assert set(doctor.FIXES) <= probe_causes(), "fix texts for causes the probe never names"


def test_an_unknown_cause_still_makes_a_row() -> None:
    check = doctor.check_of(probe.Finding("overlayfs", False, "seen", "a_cause_from_elsewhere"))
    assert check.fix is not None and "a_cause_from_elsewhere" in check.fix
    assert (check.ok, check.detail, check.required_for) == (False, "seen", "both")
    assert doctor.check_of(probe.Finding("bubblewrap", None, "informational")).fix is None


@pytest.mark.parametrize(("code", "cause", "words"), [
    (errno.EOPNOTSUPP, "no_veth", "modprobe veth"),
    (errno.EAFNOSUPPORT, "no_egress", "CONFIG_PACKET"),
])
def test_an_egress_kit_that_cannot_be_built_says_why_and_how_to_fix(
        monkeypatch: pytest.MonkeyPatch, code: int, cause: str, words: str) -> None:
    def refused() -> egress.Kit:
        raise OSError(code, f"create veth ccw0 (peer eth0): {os.strerror(code)}")  # as netlink.py says it

    monkeypatch.setattr(egress, "build", refused)  # the forked probe child inherits it
    finding = probe._egress_network(rootless=False, userns_ok=True)
    assert (finding.ok, finding.cause) == (False, cause)
    assert "create veth ccw0" in finding.detail
    check = doctor.check_of(finding)
    assert check.fix is not None and words in check.fix and "network none" in check.fix
    assert check.required_for == ""  # optional: capsules still run with network none


def test_the_egress_probe_waits_for_a_user_namespace_when_rootless() -> None:
    finding = probe._egress_network(rootless=True, userns_ok=False)
    assert (finding.ok, finding.cause) == (False, probe.userns_cause())
    assert "needs a user namespace first" in finding.detail


def test_a_root_callers_jail_without_idmapped_host_trees_says_what_it_loses(monkeypatch: pytest.MonkeyPatch) -> None:
    from sandbox import idmap

    monkeypatch.setattr(idmap, "host_trees", lambda: None)  # the forked probe child inherits it
    monkeypatch.setattr(idmap, "why_not", lambda: "the host's system trees cannot be idmapped (Invalid argument)")
    finding = probe._idmapped_mounts(privileged=True)
    assert (finding.ok, finding.cause) == (False, "no_idmapped_mounts")
    assert finding.detail == "the host's system trees cannot be idmapped (Invalid argument)"
    fix = doctor.check_of(finding).fix
    assert fix is not None and "keeps no file capability" in fix and "6.15" in fix
    assert probe._idmapped_mounts(privileged=False).ok is None  # rootless: nothing to scope

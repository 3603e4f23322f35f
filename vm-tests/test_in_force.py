"""sandbox/in_force.py on the real kernel: a capsule's isolation report names a cgroup
hierarchy only where an exec's cgroup can be made, for the root helper and for a rootless
one (an unprivileged user in its own user namespace, as ``ccw-helper --rootless`` runs).

Each run compares the report with what ``ExecCgroup.ahead`` really gets, in the same
process: the hierarchies it made a cgroup in, and those that refused it.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOBODY = 65534

SCRIPT = textwrap.dedent("""
    import json, os, sys
    sys.path.insert(0, {root!r})
    from sandbox import syscalls
    if {rootless!r}:
        uid, gid = os.getuid(), os.getgid()
        syscalls.unshare(syscalls.CLONE_NEWUSER)
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {{uid}} 1"), ("gid_map", f"0 {{gid}} 1")):
            with open(f"/proc/self/{{name}}", "w") as f:
                f.write(text)
    from sandbox import cgroups, in_force
    from sandbox.exec_cgroup import ExecCgroup
    report = in_force.isolation({rootless!r})
    layout = cgroups.detect_layout()
    refused = {{}}
    cg = ExecCgroup.ahead(layout, "in-force-test", refused, open_files=False)
    made = sorted(h.mount_point for h in cg.dirs)
    cg.teardown()
    print(json.dumps({{"cgroups": report["cgroups"], "unavailable": report.get("cgroups_unavailable", {{}}),
                      "made": made, "refused": sorted(refused), "jail": sorted(report["jail"])}}))
""")


def _report(rootless: bool, require: Callable[[bool, str], None]) -> dict[str, Any]:
    script = SCRIPT.format(root=str(ROOT), rootless=rootless)
    who: dict[str, Any] = {"user": NOBODY, "group": NOBODY, "extra_groups": []} if rootless else {}
    proc = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True, text=True, timeout=60,
                          cwd="/", **who)
    require("Operation not permitted" not in proc.stderr or proc.returncode == 0,
            f"unprivileged user namespaces are not allowed here: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr
    return dict(json.loads(proc.stdout))


def _in_force(report: dict[str, Any]) -> set[str]:
    """The mount points the report says serve a resource."""
    return {value.split(" ", 2)[2] for value in report["cgroups"].values()
            if isinstance(value, str) and value.startswith("cgroup v")}


def test_a_rootless_helper_reports_only_the_cgroups_its_execs_get(nobody_dir: Path,
                                                                 require: Callable[[bool, str], None]) -> None:
    require(os.path.exists("/usr/bin/python3"), "needs /usr/bin/python3 for the unprivileged user")
    out = _report(True, require)
    assert out["refused"], out  # this host delegates nothing to uid 65534
    assert _in_force(out) == set(out["made"]), out
    for resource, why in out["unavailable"].items():
        assert out["cgroups"][resource] is None and why.endswith(" (rootless, no delegated cgroup v2 subtree)")
        assert why.startswith("the helper may not make a cgroup in /sys/fs/cgroup/"), why


def test_the_root_helper_reports_the_cgroups_its_execs_get(root_required: None,
                                                          require: Callable[[bool, str], None]) -> None:
    out = _report(False, require)
    assert out["made"] and _in_force(out) == set(out["made"]) and out["unavailable"] == {}, out
    assert "network_egress" not in out["jail"] and "seccomp" in out["jail"]  # the capsule's own report says which

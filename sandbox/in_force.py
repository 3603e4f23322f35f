"""What the helper puts in force: each room's own report, for ``hello`` and a capsule's ``isolation``.

Each room says what it does (contain.py for the jail, idmap.py for the host's trees as a
root caller's jail sees them, cgroups.py, fanotify.py, overlay.py), and the capsule disks
are added.  The helper's ``hello`` sends it all (built in ``python -m sandbox``), and every
capsule's ``isolation`` report carries its jail, host trees, cgroups and fanotify parts.
A room whose report fails is reported as unavailable with the reason, never fatal: the
rooms are imported by name, so one that cannot even be imported is reported too.  What
*works* here, probed for real, is ``ccw doctor``'s (sandbox/probe.py).

One probe is the report's own: a cgroup hierarchy is in force only where the helper can
make an exec's cgroup, so each one a resource names is tried once, by making a cgroup
where an exec's parent goes and removing it (``_usable_cgroups``).  A mounted hierarchy
says nothing: a rootless helper sees every v1 hierarchy and may write in none, and its
capsules' reports named cgroups that every exec then failed to make with EACCES.

A capsule's report leaves out the jail's ``network`` and ``network_egress``: the
capsule's own ``network_mechanism`` says which of the two it has.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sandbox.disk import Disks

# The rooms that report what they put in force: (key in hello's mechanisms, module).
_REPORTERS = (("jail", "contain"), ("host_trees", "idmap"), ("cgroups", "cgroups"), ("fanotify", "fanotify"),
              ("overlay", "overlay"))
_ISOLATION = ("jail", "host_trees", "cgroups", "fanotify")  # the helper-wide part of a capsule's isolation
_CAPSULE_SAYS = ("network", "network_egress")  # the jail's, said by a capsule's own network_mechanism


def _room_report(module_name: str) -> Any:
    try:
        module = __import__(f"sandbox.{module_name}", fromlist=["mechanisms"])
    except ImportError as exc:
        return {"available": False, "reason": f"not installed: {exc}"}
    try:
        return module.mechanisms()
    except Exception as exc:  # a probe failing must not keep the helper down
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}


def isolation(rootless: bool = False) -> dict[str, Any]:
    """The helper-wide part of a capsule's ``isolation`` report: jail, host trees, cgroups, fanotify."""
    report = {key: _room_report(module) for key, module in _REPORTERS if key in _ISOLATION}
    if isinstance(report.get("jail"), dict):
        report["jail"] = {key: value for key, value in report["jail"].items() if key not in _CAPSULE_SAYS}
    if isinstance(report.get("cgroups"), dict):
        report.update(_usable_cgroups(report["cgroups"], rootless))
    return report


def mechanisms(rootless: bool, disks: Disks | None, disk_reason: str | None) -> dict[str, Any]:
    """What the helper puts in force, for ``hello``: each room's report, the disks, and
    cgroup hierarchies it cannot write dropped with the reason."""
    mechanisms: dict[str, Any] = {"user_namespace": rootless}
    for key, module in _REPORTERS:
        mechanisms[key] = _room_report(module)
    if isinstance(mechanisms.get("cgroups"), dict):
        mechanisms.update(_usable_cgroups(mechanisms["cgroups"], rootless))
    mechanisms["disk"] = ({"available": True, "default_mb": disks.default_mb, "kind": "ext4 image on a loop device"}
                          if disks is not None else {"available": False, "reason": disk_reason})
    return mechanisms


def _usable_cgroups(report: dict[str, Any], rootless: bool) -> dict[str, Any]:
    """The cgroups report with each hierarchy the helper cannot make an exec's cgroup in set to
    None, and (``cgroups_unavailable``) why: tried once per hierarchy (module docstring)."""
    from sandbox import cgroups
    from sandbox.exec_cgroup import PARENT_NAME

    layout = cgroups.detect_layout()
    usable = dict(report)
    reasons: dict[str, str] = {}
    tried: dict[str, bool] = {}
    for resource, value in report.items():
        hierarchy = layout.for_resource(resource)
        if not (isinstance(value, str) and value.startswith("cgroup v")) or hierarchy is None:
            continue  # not served by a cgroup (io from the jail's rusage), or by none
        parent = os.path.join(hierarchy.base, PARENT_NAME)  # where an exec's cgroup goes (exec_cgroup.py)
        where = parent if os.path.isdir(parent) else hierarchy.base
        if where not in tried:
            tried[where] = cgroups.can_create_child(where)
        if not tried[where]:
            usable[resource] = None
            why = " (rootless, no delegated cgroup v2 subtree)" if rootless else ""
            reasons[resource] = f"the helper may not make a cgroup in {where}{why}"
    return {"cgroups": usable, **({"cgroups_unavailable": reasons} if reasons else {})}

"""What the helper puts in force: each room's own report, for ``hello`` and a capsule's ``isolation``.

Each room says what it does (contain.py for the jail, idmap.py for the host's trees as a
root caller's jail sees them, cgroups.py, fanotify.py, overlay.py), and the capsule disks
are added.  The helper's ``hello`` sends it all (built in ``python -m sandbox``), and every
capsule's ``isolation`` report carries its jail, host trees, cgroups and fanotify parts.
A room whose report fails is reported as unavailable with the reason, never fatal: the
rooms are imported by name, so one that cannot even be imported is reported too.  What
*works* here, probed for real, is ``ccw doctor``'s (sandbox/probe.py).
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


def _room_report(module_name: str) -> Any:
    try:
        module = __import__(f"sandbox.{module_name}", fromlist=["mechanisms"])
    except ImportError as exc:
        return {"available": False, "reason": f"not installed: {exc}"}
    try:
        return module.mechanisms()
    except Exception as exc:  # a probe failing must not keep the helper down
        return {"available": False, "reason": f"{type(exc).__name__}: {exc}"}


def isolation() -> dict[str, Any]:
    """The helper-wide part of a capsule's ``isolation`` report: jail, host trees, cgroups, fanotify."""
    return {key: _room_report(module) for key, module in _REPORTERS if key in _ISOLATION}


def mechanisms(rootless: bool, disks: Disks | None, disk_reason: str | None) -> dict[str, Any]:
    """What the helper puts in force, for ``hello``: each room's report, the disks, and
    cgroup hierarchies it cannot write dropped with the reason."""
    mechanisms: dict[str, Any] = {"user_namespace": rootless}
    for key, module in _REPORTERS:
        mechanisms[key] = _room_report(module)
    if isinstance(mechanisms.get("cgroups"), dict):
        _drop_unwritable_cgroups(mechanisms)
    mechanisms["disk"] = ({"available": True, "default_mb": disks.default_mb, "kind": "ext4 image on a loop device"}
                          if disks is not None else {"available": False, "reason": disk_reason})
    return mechanisms


def _drop_unwritable_cgroups(mechanisms: dict[str, Any]) -> None:
    # A hierarchy that is mounted but whose cgroup we cannot create children in (rootless
    # without a delegated subtree, a read-only cgroupfs) is not in force: say None and why.
    from sandbox import cgroups

    layout = cgroups.detect_layout()
    report = dict(mechanisms["cgroups"])
    reasons: dict[str, str] = {}
    for resource, value in report.items():
        hierarchy = layout.for_resource(resource)
        if value is None or hierarchy is None:
            continue
        if not os.access(hierarchy.base, os.W_OK | os.X_OK):
            report[resource] = None
            why = " (rootless, no delegated cgroup v2 subtree)" if mechanisms["user_namespace"] else ""
            reasons[resource] = f"{hierarchy.base} is not writable by the helper{why}"
    mechanisms["cgroups"] = report
    if reasons:
        mechanisms["cgroups_unavailable"] = reasons

"""A capsule's record: ``meta.json`` (who owns it and how to mount it again) and its runtime state.

``meta.json`` lives at ``<state_dir>/capsules/<id>/meta.json`` and is the only part of a
capsule that says what the other dirs mean, so recovery after a crash trusts nothing
else.  It is written with rename-over (not fsynced: a killed helper loses nothing, the
page cache survives it) and read back strictly: a field of the wrong type, a parent
that disagrees with the ancestors, or an upper dir (or disk image) that is gone makes
the capsule unrecoverable, and ``load`` says why.

What the capsule was made from is its ``CapsuleSpec`` (sandbox/spec.py), stored as the
spec's own JSON under ``"spec"`` (version 2).  Version 1 files, written before there was
a spec type, held the spec's fields at the top level (``limits`` without ``disk_mb``);
``load`` reads both, and the next write of a capsule's meta is a new capsule's, so old
files are never rewritten.  Beside the spec: the owner, the overlay's lower stack
(``lowers``, top first), the ids of the ``ancestors`` (``parent`` first), the size of
the capsule's own disk as made (``disk_mb``; None for none) and ``created_at``.  A fork
made with donors (manager.py) records their ids (``donors``, top first), and every fork
how many of its lowers are capsules' uppers above the base (``layers_above_base``): one
per ancestor, plus the donors' layers stacked into it or into an ancestor.  Files
written before donors existed hold neither field; theirs is one layer per ancestor.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandbox import checks
from sandbox.errors import CcwError, ProtocolError
from sandbox.replies import CapsuleSummary
from sandbox.spec import CapsuleSpec

if TYPE_CHECKING:
    from sandbox.jail_end import Ending

VERSION = 2
_V1_SPEC_FIELDS = ("workspace", "base", "clock_offset_sec", "env_whitelist", "limits", "network")
ON_DISK = frozenset({"upper", "work", "tmp", "home"})  # what a capsule disk holds


def now_iso(offset_sec: int = 0) -> str:
    """The time now (shifted by ``offset_sec``), as meta.json and replies write it."""
    now = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=offset_sec)
    return now.isoformat(timespec="microseconds")


@dataclass
class Capsule:
    """A capsule known to this helper: its meta.json plus runtime state."""

    capsule_id: str
    root: str  # <state_dir>/capsules/<id>
    meta: dict[str, Any]  # meta.json but the spec
    spec: CapsuleSpec
    mounted: bool = False
    busy: bool = False
    disk_ready: bool = False
    children: set[str] = field(default_factory=set)
    ending: Ending | None = None  # what is left of the last exec after its reply (jail_end.py)
    # services.Run values (that module imports this one): running services by name, the exec now.
    services: dict[str, Any] = field(default_factory=dict)
    exec_run: Any = None
    paused: bool = False  # frozen by freeze(); takes no new run
    destroying: bool = False  # destroy has begun: a run spawned now is killed at once

    def ended_by(self, ending: Ending) -> None:
        """Note the last exec's end: what sets up over the capsule again waits for it."""
        self.ending = ending

    @property
    def disk_mb(self) -> int | None:
        """The size of the capsule's own disk, or None for a capsule without one."""
        value = self.meta.get("disk_mb")
        return value if isinstance(value, int) else None

    def path(self, name: str) -> str:
        """One of upper, work, merged, tmp, home, meta.json, disk, disk.img, gitdir-<i>-upper|work|merged."""
        on_disk = name in ON_DISK or (name.startswith("gitdir-") and not name.endswith("-merged"))
        if on_disk and self.disk_mb is not None:
            return os.path.join(self.root, "disk", name)
        return os.path.join(self.root, name)

    @property
    def ancestors(self) -> list[str]:
        """The ids of the parent, grandparent, ... (empty for a capsule that is no fork)."""
        return list(self.meta["ancestors"])

    @property
    def donors(self) -> list[str]:
        """The ids of the capsules whose own layers this fork stacked above its parent's, top first."""
        return list(self.meta.get("donors") or [])

    @property
    def lowers(self) -> list[str]:
        """The overlay's lower stack, top first: capsules' uppers (ancestors', donors'), then the base."""
        return list(self.meta["lowers"])

    @property
    def layers_above_base(self) -> int:
        """How many of the lowers are capsules' uppers (each ancestor's, each donor's own)."""
        value = self.meta.get("layers_above_base")
        return value if isinstance(value, int) else len(self.ancestors)

    @property
    def base_lowers(self) -> list[str]:
        """The lower layers below the capsules' uppers: the workspace or the base."""
        return self.lowers[self.layers_above_base :]

    def summary(self) -> CapsuleSummary:
        """The capsule as ``list`` shows it."""
        state = ("paused" if self.paused else "busy" if self.busy else "frozen" if self.children
                 else "ready" if self.mounted else "unmounted")
        return CapsuleSummary(self.capsule_id, self.spec.workspace, self.meta["parent"], self.meta["created_at"], state,
                              tuple(sorted(self.services)) or None,
                              tuple(sorted(child for child in self.children if child)) or None)


def save(path: str, meta: dict[str, Any], spec: CapsuleSpec) -> None:
    """Write ``meta`` and ``spec`` to ``path`` by rename-over: a reader sees the old file or the new one."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as file:
        json.dump({**meta, "version": VERSION, "spec": spec.to_json()}, file, sort_keys=True)
    os.rename(tmp, path)


def load(root: str, capsule_id: str) -> tuple[dict[str, Any], CapsuleSpec] | str:
    """meta.json (but the spec) and the spec, if valid and the upper dir holds the data; else why not."""
    try:
        with open(os.path.join(root, "meta.json"), encoding="utf-8") as file:
            meta = json.load(file)
    except (OSError, ValueError) as exc:
        return f"meta.json unreadable: {exc}"
    if not isinstance(meta, dict) or meta.get("capsule_id") != capsule_id or meta.get("version") not in (1, VERSION):
        return "meta.json is not this capsule's"
    if meta.pop("version") == 1:
        spec_json = {key: meta.pop(key) for key in _V1_SPEC_FIELDS if key in meta}
    else:
        spec_json = meta.pop("spec", None)
    try:
        spec = CapsuleSpec.from_json(spec_json)
    except CcwError as exc:
        return f"meta.json holds no valid spec: {exc.message}"
    why = _check(root, meta)
    return why if why else (meta, spec)


def _check(root: str, meta: dict[str, Any]) -> str:
    expected = {"owner_uid": int, "owner_gid": int, "lowers": list, "ancestors": list, "created_at": str}
    for key, kind in expected.items():
        if not isinstance(meta.get(key), kind):
            return f"meta.json field {key} is missing or not a {kind.__name__}"
    if not meta["lowers"] or not all(isinstance(p, str) and p.startswith("/") for p in meta["lowers"]):
        return "meta.json lowers are not absolute paths"
    if len(meta["ancestors"]) >= len(meta["lowers"]):
        return "meta.json has more ancestors than lower layers"
    if (meta.get("parent") or None) != (meta["ancestors"][0] if meta["ancestors"] else None):
        return "meta.json parent and ancestors disagree"
    why = _check_donors(meta)
    if why:
        return why
    stacks = meta.get("gitdirs", [])
    if not isinstance(stacks, list) or not all(
            isinstance(stack, list) and stack and all(isinstance(p, str) and p.startswith("/") for p in stack)
            for stack in stacks):
        return "meta.json gitdirs are not lists of absolute paths"
    disk_mb = meta.get("disk_mb")
    if disk_mb is not None and (not isinstance(disk_mb, int) or isinstance(disk_mb, bool)):
        return "meta.json disk_mb is not an integer"
    if disk_mb is not None:
        if not os.path.isfile(os.path.join(root, "disk.img")):
            return "the disk image holding the upper dir is gone"
    elif not os.path.isdir(os.path.join(root, "upper")):
        return "the upper dir is gone"
    return ""


def _check_donors(meta: dict[str, Any]) -> str:
    """Why meta.json's ``donors`` or ``layers_above_base`` is wrong; "" when both are right or absent."""
    donors = meta.get("donors", [])
    try:
        checks.capsule_ids("donors", donors)
    except ProtocolError as exc:
        return f"meta.json {exc.message}"
    if donors and (not meta["ancestors"] or meta["ancestors"][0] in donors):
        return "meta.json donors belong to a fork, none its parent"
    layers = meta.get("layers_above_base", len(meta["ancestors"]))
    if not isinstance(layers, int) or isinstance(layers, bool) or not (
            len(meta["ancestors"]) <= layers < len(meta["lowers"])):
        return "meta.json layers_above_base is not a count of lowers above the base, at least one per ancestor"
    return ""

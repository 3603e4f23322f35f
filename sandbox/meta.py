"""A capsule's record: ``meta.json`` (who owns it and how to mount it again) and its runtime state.

``meta.json`` lives at ``<state_dir>/capsules/<id>/meta.json`` and is the only part of a
capsule that says what the other dirs mean, so recovery after a crash trusts nothing
else.  It is written with rename-over (not fsynced: a killed helper loses nothing, the
page cache survives it) and read back strictly: a field of the wrong type, a parent
that disagrees with the ancestors, or an upper dir (or disk image) that is gone makes
the capsule unrecoverable, and ``load`` says why.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
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
    meta: dict[str, Any]
    mounted: bool = False
    busy: bool = False
    disk_ready: bool = False
    children: set[str] = field(default_factory=set)

    @property
    def disk_mb(self) -> int | None:
        """The size of the capsule's own disk, or None for a capsule without one."""
        value = self.meta.get("disk_mb")
        return value if isinstance(value, int) else None

    def path(self, name: str) -> str:
        """One of upper, work, merged, tmp, home, meta.json, disk, disk.img."""
        if name in ON_DISK and self.disk_mb is not None:
            return os.path.join(self.root, "disk", name)
        return os.path.join(self.root, name)

    @property
    def ancestors(self) -> list[str]:
        """The ids of the parent, grandparent, ... (empty for a capsule that is no fork)."""
        return list(self.meta["ancestors"])

    @property
    def lowers(self) -> list[str]:
        """The overlay's lower stack, top first: ancestors' uppers, then the base."""
        return list(self.meta["lowers"])

    @property
    def base_lowers(self) -> list[str]:
        """The lower layers below the ancestors' uppers: the workspace or the base."""
        return self.lowers[len(self.ancestors) :]

    def summary(self) -> dict[str, Any]:
        """The capsule as ``list`` shows it."""
        state = "busy" if self.busy else "frozen" if self.children else "ready" if self.mounted else "unmounted"
        return {
            "capsule_id": self.capsule_id,
            "workspace": self.meta["workspace"],
            "parent": self.meta["parent"],
            "created_at": self.meta["created_at"],
            "state": state,
        }


def save(path: str, meta: dict[str, Any]) -> None:
    """Write ``meta`` to ``path`` by rename-over: a reader sees the old file or the new one."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as file:
        json.dump(meta, file, sort_keys=True)
    os.rename(tmp, path)


def load(root: str, capsule_id: str) -> tuple[dict[str, Any] | None, str]:
    """meta.json if it is valid and the upper dir holds the data, else (None, why)."""
    try:
        with open(os.path.join(root, "meta.json"), encoding="utf-8") as file:
            meta = json.load(file)
    except (OSError, ValueError) as exc:
        return None, f"meta.json unreadable: {exc}"
    expected = {"owner_uid": int, "owner_gid": int, "workspace": str, "lowers": list, "ancestors": list,
                "clock_offset_sec": int, "env_whitelist": list, "limits": dict, "network": str, "created_at": str}
    if not isinstance(meta, dict) or meta.get("capsule_id") != capsule_id or meta.get("version") != VERSION:
        return None, "meta.json is not this capsule's"
    for key, kind in expected.items():
        if not isinstance(meta.get(key), kind):
            return None, f"meta.json field {key} is missing or not a {kind.__name__}"
    if not meta["lowers"] or not all(isinstance(p, str) and p.startswith("/") for p in meta["lowers"]):
        return None, "meta.json lowers are not absolute paths"
    if len(meta["ancestors"]) >= len(meta["lowers"]):
        return None, "meta.json has more ancestors than lower layers"
    if (meta.get("parent") or None) != (meta["ancestors"][0] if meta["ancestors"] else None):
        return None, "meta.json parent and ancestors disagree"
    disk_mb = meta.get("disk_mb")
    if disk_mb is not None and (not isinstance(disk_mb, int) or isinstance(disk_mb, bool)):
        return None, "meta.json disk_mb is not an integer"
    if disk_mb is not None:
        if not os.path.isfile(os.path.join(root, "disk.img")):
            return None, "the disk image holding the upper dir is gone"
    elif not os.path.isdir(os.path.join(root, "upper")):
        return None, "the upper dir is gone"
    return meta, ""

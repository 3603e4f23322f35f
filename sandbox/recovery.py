"""At the helper's start: what a dead helper left under ``<state_dir>/capsules``, taken down or taken back.

CapsuleManager.recover (manager.py) calls ``recover_capsules`` once, before it serves
anyone, and registers what it returns.  It assumes it is the only helper using this
state dir.  It detaches every mount left under ``capsules/`` by a dead helper, deletes
``.new-*``/``.dead-*`` dirs (capsule_mounts.py: the half-made states are named) and
capsules whose meta.json is unreadable or whose upper dir (or disk image), parent or a
donor (fork_layers.py) is gone (meta.load says why), and keeps every other capsule, to
be mounted again (disk first, and the disks of the capsules whose uppers are its lower
layers) on first use (capsule_mounts.ensure_mounted).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil

from sandbox import access, capsule_mounts, gitdirs, overlay
from sandbox import meta as meta_json
from sandbox.meta import Capsule
from sandbox.mountinfo import mounts_under

log = logging.getLogger("ccw.capsules")

# The ids this helper makes (CapsuleManager._new_id): within checks.CAPSULE_ID_RE, the one
# grammar every side validates with; recovery knows its own capsule dirs by this narrower form.
ID_RE = re.compile(r"cap_\d{13}_[0-9a-f]{8}")


def recover_capsules(capsules_dir: str, rootless: bool) -> tuple[dict[str, Capsule], list[str]]:
    """Detach stale mounts, delete half-made and unrecoverable capsules; the rest by id
    (unmounted, the forks stacked on each noted as its children) and the names of the dirs removed."""
    for point in (stale := mounts_under(capsules_dir)):
        overlay.write_back(point)  # before any is unmounted: its docstring says why
    for point in stale:
        log.info("detaching stale mount %s", point)
        overlay.teardown(point)
    removed: list[str] = []
    found: dict[str, Capsule] = {}
    for name in sorted(os.listdir(capsules_dir)):  # parents sort before their forks
        root = os.path.join(capsules_dir, name)
        if name.startswith((".new-", ".dead-")):
            shutil.rmtree(root, ignore_errors=True)
            removed.append(name)
            continue
        if not ID_RE.fullmatch(name):
            continue  # not ours
        loaded = meta_json.load(root, name)
        if not isinstance(loaded, str):  # a fork's parent and donors are older: recovered already, if at all
            gone = [one for one in [loaded[0]["parent"], *loaded[0].get("donors", [])] if one and one not in found]
            loaded = f"its parent or donor {gone[0]} is gone" if gone else loaded
        if isinstance(loaded, str):
            log.warning("removing capsule %s: %s", name, loaded)
            capsule_mounts.remove(capsules_dir, root, name)
            removed.append(name)
            continue
        found[name] = _taken_back(Capsule(name, root, *loaded), rootless)
    for capsule in found.values():
        for one in [capsule.meta["parent"], *capsule.donors]:
            if one in found:
                found[one].children.add(capsule.capsule_id)
    return found, removed


def _taken_back(capsule: Capsule, rootless: bool) -> Capsule:
    """The dirs a recovered capsule needs before it is mounted again, made if missing."""
    if capsule.disk_mb is None:  # a capsule with a disk gets these when it is mounted
        access.make_private_dirs(capsule.root, capsule.meta["owner_uid"], capsule.meta["owner_gid"], exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.mkdir(capsule.path("work"), 0o700)
        gitdirs.make_dirs(capsule.root, len(gitdirs.layers(capsule)), (), rootless)
    with contextlib.suppress(FileExistsError):
        os.mkdir(capsule.path("merged"), 0o755)
    return capsule

"""A capsule's directory on disk, built under a name that says it is half-made.

``build`` makes ``<capsules>/.new-<id>``: ``merged`` (the mount point), and ``upper``,
``work``, ``tmp``, ``home`` and the git dirs' layers, either on the capsule's own disk
(``disk.img`` attached at ``disk/``, disk.py) or beside ``merged``; then ``meta.json``,
and one rename puts it in place.  A crash before the rename leaves a ``.new-`` dir,
which recovery (recovery.py) deletes; a failure here removes it at once.  The upper
dir's root takes the workspace root's owner and mode, because an overlay shows its
upper root's attributes as the merged root's (manager.py).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from typing import Any

from sandbox import disk, gitdirs, overlay
from sandbox import meta as meta_json
from sandbox.errors import from_oserror
from sandbox.mountinfo import mounts_under
from sandbox.spec import CapsuleSpec


def build(capsules_dir: str, meta: dict[str, Any], spec: CapsuleSpec, root_st: os.stat_result,
          gitdir_sts: list[os.stat_result], disks: disk.Disks | None, rootless: bool) -> str:
    """Make the capsule's dir for ``meta`` (its id in ``meta["capsule_id"]``) and rename it into
    place; its final path.  ``gitdir_sts``: each host git dir's attributes, for its layers."""
    capsule_id = meta["capsule_id"]
    building = os.path.join(capsules_dir, f".new-{capsule_id}")
    final = os.path.join(capsules_dir, capsule_id)
    data = building  # where upper, work, tmp and home go
    try:
        os.mkdir(building, 0o700)
        os.mkdir(os.path.join(building, "merged"), 0o755)
        if meta["disk_mb"] is not None:
            assert disks is not None
            data = os.path.join(building, "disk")
            os.mkdir(data, 0o700)
            mount_fd = disks.take(meta["disk_mb"], os.path.join(building, "disk.img"))
            try:
                disk.attach(mount_fd, data)
            finally:
                os.close(mount_fd)
            disks.start()
        else:
            for name, mode in disk.LAYOUT:
                os.mkdir(os.path.join(data, name))
                os.chmod(os.path.join(data, name), mode)
        os.chown(os.path.join(data, "home"), meta["owner_uid"], meta["owner_gid"])
        upper = os.path.join(data, "upper")
        # Rootless: a workspace owned by an unmapped uid shows as the overflow uid,
        # which cannot be chowned to; the merged root then shows as the helper's.
        with contextlib.suppress(OSError) if rootless else contextlib.nullcontext():
            os.chown(upper, root_st.st_uid, root_st.st_gid)
        os.chmod(upper, stat.S_IMODE(root_st.st_mode))
        gitdirs.make_dirs(data, len(gitdir_sts), gitdir_sts, rootless)
        meta_json.save(os.path.join(building, "meta.json"), meta, spec)
        os.rename(building, final)
    except BaseException as exc:
        for point in mounts_under(building):
            overlay.teardown(point)
        shutil.rmtree(building, ignore_errors=True)
        if isinstance(exc, OSError):
            raise from_oserror(exc, "create capsule dirs", building,
                               "check the state dir's space and permissions") from exc
        raise
    return final

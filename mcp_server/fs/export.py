"""Deterministic bundles for snapshot_export: same files, same bytes.

The bundle is a POSIX (pax) tar with entries in byte order of path, every header fixed:
mtime 0, uid/gid 0, no user or group names, mode 0644 or 0755 (executables), symlinks
as symlinks (mode 0777).  No directory entries are written (extraction creates them).
The archive is not compressed, because compressors embed timestamps or options that
vary between versions; its sha256 is reported beside it.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable

from mcp_server.core.paths import path_key

MODE_EXEC_BIT = 0o100
MODE_LINK = 0o120000


def tar_bundle(files: Iterable[tuple[str, bytes, int]]) -> bytes:
    """A tar of ``(path, content, git mode)`` triples, deterministic byte for byte."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, content, mode in sorted(files, key=lambda f: path_key(f[0])):
            info = tarfile.TarInfo(path)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if mode & 0o170000 == MODE_LINK:
                info.type = tarfile.SYMTYPE
                info.linkname = content.decode("utf-8", "surrogateescape")
                info.mode = 0o777
                archive.addfile(info)
                continue
            info.mode = 0o755 if mode & MODE_EXEC_BIT else 0o644
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return buffer.getvalue()

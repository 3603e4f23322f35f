"""What a ccw-bot lease asks for, read as hostile: its capsule marker and the paths it names.

Any REAPI client may send ccw-bot an Action, so everything a lease names is checked
before the bot acts on it, and a bad lease is answered with a status (INVALID_ARGUMENT,
PERMISSION_DENIED or FAILED_PRECONDITION) rather than an exception:

- The marker (``CCW_REAPI_CAPSULE``, JSON written by capsules/remote.py) is an object
  with known fields only, each checked by the capsule spec's own checks
  (sandbox/checks.py): ``workspace`` an absolute path, ``clock_offset_sec`` and ``limits``
  within the spec's bounds, ``replay`` a name inside the input root, ``expected_root``
  a short string.
- ``workspace`` is only where the jail shows the input root, which is always the
  capsule's lower layer: no host directory is read there.  It still may not be a
  system directory (``check_capsule_dir``, as the helper checks it again), since the
  jail's own /etc, /usr or /proc would be covered.
- Paths inside the input root (the replayed witness, the Command's working directory,
  its output paths) are repo-relative names (mcp_server/core/paths.py: no absolute path,
  no ``..``), and the witness is opened beneath the root through no symlink at all
  (openat2 ``RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS``) and must be a regular file: a
  lease can name only a file its own input root holds.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mcp_server.core import paths
from mcp_server.fs.view import RootView
from mcp_server.reapi.protos import re_pb2
from sandbox import checks, hostdirs
from sandbox.checks import MAX_CLOCK_OFFSET_SEC, MAX_PATH
from sandbox.errors import CcwError
from sandbox.spec import Limits

MAX_MARKER_BYTES = 64 * 1024
_FIELDS: dict[str, checks.Check] = {
    "workspace": checks.nullable(checks.abs_path),
    "clock_offset_sec": checks.nullable(checks.int_in(-MAX_CLOCK_OFFSET_SEC, MAX_CLOCK_OFFSET_SEC)),
    "limits": checks.nullable(checks.limits),
    "replay": checks.nullable(lambda name, value: checks.text(name, value, MAX_PATH)),
    "expected_root": checks.nullable(lambda name, value: checks.text(name, value, 256)),
}


@dataclass(frozen=True)
class Marker:
    """A lease's capsule marker, checked."""

    workspace: str | None = None  # where the jail shows the input root; None: the lease root itself
    clock_offset_sec: int = 0
    limits: Limits = field(default_factory=Limits)
    replay: str | None = None  # a witness file in the input root (normalised, relative)
    expected_root: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> Marker:
        """Read the marker's JSON (None or "": no marker); CcwError naming what is wrong."""
        if not text:
            return cls()
        if len(text.encode("utf-8", "surrogatepass")) > MAX_MARKER_BYTES:
            raise CcwError("INVALID_ARGUMENT", f"the marker is larger than {MAX_MARKER_BYTES} bytes")
        try:
            value: Any = json.loads(text)
        except ValueError as error:
            raise CcwError("INVALID_ARGUMENT", f"the marker is not JSON: {error}") from None
        checks.check_fields(value, {}, _FIELDS, "the marker")
        workspace = value.get("workspace")
        if workspace is not None:
            workspace = os.path.normpath(workspace)
            # Only a mount point in the jail (shown_only): homes are places like any other there.
            hostdirs.check_capsule_dir("workspace", workspace, os.getuid(), (), shown_only=True)
        replay = value.get("replay")
        return cls(workspace=workspace, clock_offset_sec=value.get("clock_offset_sec") or 0,
                   limits=Limits.from_json(value.get("limits") or {}),
                   replay=None if replay is None else inside_root(replay, "the replayed witness"),
                   expected_root=value.get("expected_root"))


def inside_root(path: str, what: str) -> str:
    """``path`` as a name inside the input root: relative, no ``..``; "." for the root."""
    try:
        return paths.normalize(path)
    except CcwError as error:
        raise CcwError(error.code, f"{what}: {error.message}", error.details) from None


def witness_file(root: Path, name: str) -> Path:
    """The path of the regular file ``name`` beneath ``root``, reached through no symlink.

    CcwError otherwise (NOT_FOUND; PERMISSION_DENIED for a symlink).  Nothing changes
    the root while the lease holds it, so the path names what was checked.
    """
    with RootView.open(str(root)) as view:
        fd = view.open_fd(name, os.O_PATH | os.O_NOFOLLOW, write=True, what="open the replayed witness")
        try:
            mode = os.fstat(fd).st_mode
        finally:
            os.close(fd)
    if not stat.S_ISREG(mode):
        raise CcwError("NOT_FOUND", f"the replayed witness {name!r} is not a regular file in the input root")
    return root / name


def check_command_paths(command: re_pb2.Command) -> str:
    """The Command's working directory ("" for the root) once it and every output path are names
    inside the input root (an output path is taken from the working directory)."""
    cwd = "" if not command.working_directory else inside_root(command.working_directory, "working_directory")
    for output in dict.fromkeys([*command.output_paths, *command.output_files, *command.output_directories]):
        inside_root(output, "an output path")
        inside_root(os.path.join(cwd, output), "an output path")
    return "" if cwd == paths.ROOT else cwd

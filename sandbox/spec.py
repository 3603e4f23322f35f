"""The capsule spec, and what an exec gets unless its request says otherwise.

A capsule is made from a ``CapsuleSpec``: the workspace it shows, the lower dir it shows
there (the workspace itself, or a materialised snapshot), the clock offset, which
environment variables a command may set, its limits and its network.  The front end
builds one from a tool call, sends it in a ``create`` request (``sandbox/ops.py``), the
helper stores it in the capsule's meta.json and the journal keeps it; each of them
reads and writes it through ``to_json`` / ``from_json`` here, never field by field.

A spec's fields are checked by the protocol's own checks (``sandbox/checks.py``), and
``sandbox/ops.py`` builds the create op from ``SPEC_REQUIRED`` / ``SPEC_OPTIONAL``, so a
spec read from a request and one read from a file obey the same bounds.  Where a
capsule may be made is the host-directory rule's (``sandbox/hostdirs.py``).
"""

from __future__ import annotations

import os
import posixpath
from dataclasses import dataclass, fields
from typing import Any

from sandbox.checks import (
    MAX_CLOCK_OFFSET_SEC,
    MAX_PATH,
    Check,
    abs_path,
    abs_paths,
    check_fields,
    env_names,
    int_in,
    limits,
    nullable,
    one_of,
    text,
)
from sandbox.errors import ProtocolError

# What a command gets unless its exec request says otherwise (the request's defaults,
# sandbox/ops.py: ExecRequest; the environment's, the helper's: exec_env below).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_HOME = "/home/ccw"  # where the jail shows the capsule's own $HOME
DEFAULT_LANG = "C.UTF-8"
DEFAULT_TIMEOUT_MS = 300_000
DEFAULT_OUTPUT_CAP = 1 << 20  # bytes per stream
DEFAULT_PROGRESS_MS = 1000  # the front end's journaled exec asks this; a request naming none gets no reports
# The namespaces every jail gets (a time namespace too, when a clock offset is asked for).
JAIL_NAMESPACES = ("mount", "pid", "net", "uts", "ipc", "cgroup")
# Every jail's hostname (its uts namespace's), the same on every host, so a witness replays
# alike; the jail's /etc/hosts names it (sandbox/mounts.py ETC_HOSTS).
JAIL_HOSTNAME = "ccw"
JAIL_HOST_ADDRESS = "127.0.1.1"  # its address there, on a line of its own as Debian writes it
# "none": an empty network namespace, lo only; "egress": the capsule's own namespaces whose
# only way out is the front end's proxies (sandbox/egress.py).  The allowlist is the front end's.
NETWORKS = ("none", "egress")

# The fields of a create request, i.e. of a spec's JSON (sandbox/ops.py's "create").
SPEC_REQUIRED: dict[str, Check] = {"workspace": abs_path}
SPEC_OPTIONAL: dict[str, Check] = {
    "base": nullable(abs_path),
    "clock_offset_sec": int_in(-MAX_CLOCK_OFFSET_SEC, MAX_CLOCK_OFFSET_SEC),
    "env_whitelist": env_names,
    "limits": limits,
    "network": one_of(*NETWORKS),
    "expose": abs_paths,
    "gitdirs": abs_paths,
}


# --- the spec ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Resource limits; None leaves a limit unset (the helper's default, or none).

    ``disk_mb`` is the size of the capsule's own disk when creating it (ignored per
    exec: the disk is the capsule's, fixed when it was made).
    """

    memory_mb: int | None = None
    pids_max: int | None = None
    cpu_ms: int | None = None
    disk_mb: int | None = None

    def to_json(self) -> dict[str, int]:
        """The wire form: only the limits that are set."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, value: Any, name: str = "limits") -> Limits:
        """Read and check a limits object (ProtocolError naming the field)."""
        limits(name, value)
        return cls(**value)


@dataclass(frozen=True)
class CapsuleSpec:
    """What a capsule is made of; the same on the wire, in meta.json and in the journal.

    The size of the capsule's own disk is ``limits.disk_mb`` (None: the helper's
    default), one place for it rather than a field of its own.
    """

    workspace: str  # where the jail shows the capsule's view (absolute)
    # The lower dir the caller gave when it is not the workspace itself (a snapshot); None: the
    # workspace.  ``lower`` is the one never None, and what a CapsuleRecord calls its ``base``.
    given_base: str | None = None  # on the wire and in meta.json: "base"
    clock_offset_sec: int = 0
    env_whitelist: tuple[str, ...] = ()  # sorted, unique
    limits: Limits = Limits()
    network: str = "none"
    # Host directories the jail shows read-only (toolchains under $HOME and the like),
    # sorted; the helper checks each again (hostdirs.check_expose_dir) before binding it.
    expose: tuple[str, ...] = ()
    # Git dirs outside the workspace that its .git file names (a worktree's common dir,
    # a submodule's gitdir), sorted; each is shown through the capsule's own overlay.
    gitdirs: tuple[str, ...] = ()

    @property
    def lower(self) -> str:
        """The directory the capsule's view starts from: the base, else the workspace."""
        return self.given_base if self.given_base is not None else self.workspace

    def to_json(self) -> dict[str, Any]:
        """The JSON object (a create request's arguments); ``base`` only when there is one."""
        out: dict[str, Any] = {
            "workspace": self.workspace,
            "clock_offset_sec": self.clock_offset_sec,
            "env_whitelist": list(self.env_whitelist),
            "limits": self.limits.to_json(),
            "network": self.network,
        }
        if self.given_base is not None:
            out["base"] = self.given_base
        # Only when set, so a spec without them reads as it always did (meta.json, journal).
        if self.expose:
            out["expose"] = list(self.expose)
        if self.gitdirs:
            out["gitdirs"] = list(self.gitdirs)
        return out

    @classmethod
    def from_json(cls, value: Any) -> CapsuleSpec:
        """Read and check a spec's JSON; absent optional fields take their defaults."""
        check_fields(value, SPEC_REQUIRED, SPEC_OPTIONAL, "capsule spec")
        return cls(
            workspace=value["workspace"],
            given_base=value.get("base"),
            clock_offset_sec=value.get("clock_offset_sec", 0),
            env_whitelist=tuple(sorted(set(value.get("env_whitelist", ())))),
            limits=Limits.from_json(value.get("limits", {})),
            network=value.get("network", "none"),
            expose=tuple(sorted(set(value.get("expose", ())))),
            gitdirs=tuple(sorted(set(value.get("gitdirs", ())))),
        )


# --- an exec's environment and cwd ---------------------------------------------------------


def exec_env(workspace: str, given: dict[str, str]) -> dict[str, str]:
    """A command's whole environment: ``given`` over PATH, HOME and LANG defaults.

    PATH starts with the workspace's ``.venv/bin``, as ``uv run`` and ``poetry run`` put
    the project's environment first (``pytest`` in a capsule is the project's pytest),
    whether or not it exists, so a run's environment does not depend on the host.  The
    helper applies it to every exec (execution.py); a REAPI Command carries it whole.
    """
    return {"PATH": f"{posixpath.join(workspace, '.venv', 'bin')}:{DEFAULT_PATH}", "HOME": DEFAULT_HOME,
            "LANG": DEFAULT_LANG, **given}


def resolve_cwd(cwd: str | None, workspace: str) -> str:
    """A command's working directory: the workspace, or a path inside it.

    None or "" is the workspace; a relative path is taken from the workspace; an
    absolute one must lie inside it.  Anything that leaves the workspace is refused.
    """
    if not cwd:
        return workspace
    text("cwd", cwd, MAX_PATH)
    joined = os.path.normpath(os.path.join(workspace, cwd))
    if joined != workspace and not joined.startswith(workspace.rstrip("/") + "/"):
        raise ProtocolError(
            f"cwd {cwd!r} is outside the workspace {workspace}; give a path relative to it", {"cwd": cwd}
        )
    return joined

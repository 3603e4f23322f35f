"""What a command in a capsule sees: its environment and its working directory.

- ``env_whitelist`` names variables of the server's own environment that pass into the
  capsule; HOME is always the capsule's own home, PATH and LANG get defaults if absent.
- ``cwd`` is relative to the workspace, or absolute inside it; default the workspace.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from sandbox.errors import CcwError

DEFAULT_TIMEOUT_MS = 300_000
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def exec_env(workspace: str, env_whitelist: Iterable[str]) -> dict[str, str]:
    """The environment of a command in the capsule: whitelisted variables, else defaults.

    PATH starts with the workspace's ``.venv/bin``, as ``uv run`` and ``poetry run`` put
    the project's environment first: ``pytest`` in a capsule is the project's pytest.
    Always there, present or not, so the environment of a run does not depend on the
    host (a replay sees the same PATH).
    """
    env = {k: os.environ[k] for k in env_whitelist if k in os.environ and k != "HOME"}
    env.setdefault("PATH", f"{os.path.join(workspace, '.venv', 'bin')}:{DEFAULT_PATH}")
    env.setdefault("LANG", "C.UTF-8")
    return env


def resolve_cwd(workspace: str, cwd: str | None) -> str:
    """The absolute working directory of a command asked to run in ``cwd`` (inside the workspace)."""
    if not cwd:
        return workspace
    joined = os.path.normpath(os.path.join(workspace, cwd))
    if joined != workspace and not joined.startswith(workspace.rstrip("/") + "/"):
        raise CcwError(
            "INVALID_ARGUMENT",
            f"cwd {cwd!r} is outside the workspace {workspace}; give a path relative to it",
            {"cwd": cwd},
        )
    return joined

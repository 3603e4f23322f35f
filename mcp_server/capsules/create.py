"""Making a capsule from what capsule_create was asked: the service's part of it.

The tool (tools/capsule.py) parses its arguments into an ``Asked``; ``create`` decides
what the capsule is, in this order (a call wrong in two ways hears of the first):

1. The workspace and base, ``~`` expanded and resolved (``realpath``), so that the
   journal's entries are canonical.  The helper resolves and checks them again.  A
   relative one, or one whose real name is not UTF-8, is refused (core/hostpaths.py says why).
2. The directory rule (``check_capsule_dir``): never a system directory or a home's
   secrets; and the caller's right to write the workspace, or with a base to read the base
   (the workspace is then only where the base is shown).  The helper applies both again;
   here they fail before any work is done, and a refusal can name the directory's owner,
   whom a rootless helper's namespace does not see (``_check_rights``).
3. The git dir a worktree's or submodule's ``.git`` file names, outside the workspace
   (capsules/gitdirs.py: a few bounded reads of small files), or why git will not work.
4. The toolchain dirs shown read-only (capsules/exposure.py): those asked for, and,
   unless ``auto_expose`` is false, those found from the caller's PATH and HOME.  The
   caller's environment is the one it lent, else ours (mcp_server/caller.py).  One asked
   for whose real name is not UTF-8 is refused; one found so is left out.
5. The network policy's defaults (``on_miss``, ``ask_timeout_ms``) where the call did
   not say them, then ``CapsuleService.create``.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import trio

from mcp_server.capsules import exposure
from mcp_server.capsules.gitdirs import Found
from mcp_server.capsules.gitdirs import find as find_gitdir
from mcp_server.capsules.policy import PolicyStore
from mcp_server.capsules.service import CapsuleService
from mcp_server.core import hostpaths
from mcp_server.core.expose import Need
from mcp_server.core.netrules import NetworkSpec
from mcp_server.core.paths import encoded as encoded_path
from mcp_server.journal_records import CapsuleRecord
from sandbox.homes import login_homes
from sandbox.hostdirs import check_capsule_dir, refusal
from sandbox.spec import CapsuleSpec, Limits


@dataclass(frozen=True)
class Asked:
    """capsule_create's arguments, parsed: the paths as the caller gave them, the rest typed."""

    workspace: str
    base: str | None = None  # None: the workspace itself
    clock_offset_sec: int = 0
    env_whitelist: tuple[str, ...] = ()
    limits: Limits = dataclasses.field(default_factory=Limits)
    expose: tuple[str, ...] = ()  # toolchain dirs asked for by name
    auto_expose: bool = True  # also those the caller's PATH and HOME lead to
    network: NetworkSpec | None = None  # parsed, presets expanded
    network_given: Any = None  # the argument as given: which of the policy's defaults it says itself
    volatile: tuple[str, ...] = ()  # globs its witnesses' replays leave out
    secrets: tuple[str, ...] = ()  # names in the state dir's store (capsules/capsecrets.py)


@dataclass(frozen=True)
class Made:
    """A capsule made: its record, its git dir (or why git will not work), what it shows read-only and why."""

    record: CapsuleRecord
    git: Found
    exposed: tuple[Need, ...]


def _real(path: str, what: str) -> str:
    encoded_path(path, what)
    expanded = hostpaths.absolute(os.path.expanduser(path), what)
    return hostpaths.utf8(os.path.realpath(expanded), what)


def _asked_exposed(paths: tuple[str, ...]) -> None:
    """Refuse, by name, a directory asked for whose real name is not UTF-8 (capsules/exposure.py
    refuses a relative one)."""
    for path in paths:
        if path.startswith("/"):
            hostpaths.utf8(os.path.realpath(path), "expose")


def _check_rights(path: str, mode: int, verb: str) -> None:
    """Refuse, with ``hostdirs.refusal``'s owner and ways forward, a directory the caller may not ``verb``.

    We run as the caller, so ``os.access`` asks the kernel what the helper's check will (ACLs
    and read-only mounts included).  A path that is not a directory is left to the helper's
    NOT_FOUND.
    """
    try:
        owner = os.stat(path).st_uid
    except OSError:
        return
    if not os.access(path, mode):
        raise refusal(path, os.getuid(), owner, verb)


async def create(capsules: CapsuleService, asked: Asked, env: Mapping[str, str]) -> Made:
    """Make and journal the capsule ``asked`` describes, for a caller whose environment is ``env``."""
    workspace = _real(asked.workspace, "workspace")
    base = _real(asked.base, "base") if asked.base else workspace
    homes, uid = login_homes(), os.getuid()
    check_capsule_dir("workspace", workspace, uid, homes, shown_only=base != workspace, given=asked.workspace)
    if base != workspace:
        check_capsule_dir("base", base, uid, homes, given=asked.base)
        _check_rights(base, os.R_OK | os.X_OK, "read")
    else:  # with a base the workspace is only where it is shown (sandbox/hostdirs.py)
        _check_rights(workspace, os.W_OK | os.X_OK, "write")
    git = find_gitdir(base, uid, homes)
    _asked_exposed(asked.expose)
    spec = CapsuleSpec(
        workspace=workspace,
        given_base=base if base != workspace else None,
        clock_offset_sec=asked.clock_offset_sec,
        env_whitelist=asked.env_whitelist,
        limits=asked.limits,
        gitdirs=(git.gitdir,) if git.gitdir is not None else (),
    )
    needs = await trio.to_thread.run_sync(exposure.plan, workspace, list(asked.expose), asked.auto_expose, env,
                                          uid, homes)
    # One found by itself that ccw cannot carry is left out, as a missing one is: a PATH
    # entry the caller never named is no reason to fail.
    needs = [need for need in needs if hostpaths.is_utf8(need.path)]
    spec = dataclasses.replace(spec, expose=tuple(sorted(need.path for need in needs)))
    network = PolicyStore(capsules.state).network_defaults(asked.network, asked.network_given)
    record = await capsules.create(spec, network, asked.volatile, asked.secrets)
    return Made(record, git, tuple(needs))

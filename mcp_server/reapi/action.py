"""An Action and its Command from a plain spec (no I/O): what ``Execute`` is asked to run.

The Action names its Command and input root by digest, so both must be in the CAS
before ``Execute``; ``ActionMessages.blobs`` carries the Command's bytes (and the
Action's, which servers also fetch from the CAS) to upload with the tree.  The
Action's digest is the action cache's key: the same argv, env, cwd, outputs, platform,
timeout and input root give the same key, which is how a repeated trial becomes a
cache hit.  REAPI asks for environment variables sorted by name and platform properties
by name then value; ``do_not_cache`` keeps a result out of the cache (flakiness runs)
and ``salt`` makes otherwise identical actions distinct keys.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mcp_server.reapi.merkle import DigestKey, digest_bytes, key
from mcp_server.reapi.protos import re_pb2
from sandbox.errors import CcwError


@dataclass(frozen=True)
class CommandSpec:
    """What to run: argv, the whole environment, cwd relative to the input root, outputs, platform."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    output_paths: Sequence[str] = ()
    platform: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ActionMessages:
    """The built Action, its Command, its digest, and the blobs to upload for them."""

    action: re_pb2.Action
    command: re_pb2.Command
    action_digest: re_pb2.Digest
    blobs: dict[DigestKey, bytes]


def platform_message(properties: Mapping[str, str]) -> re_pb2.Platform:
    """A Platform with its properties in REAPI's order."""
    platform = re_pb2.Platform()
    for name, value in sorted(properties.items()):
        platform.properties.add(name=name, value=value)
    return platform


def build_action(spec: CommandSpec, input_root: re_pb2.Digest, *, timeout_s: float | None = None,
                 do_not_cache: bool = False, salt: bytes = b"") -> ActionMessages:  # fmt: skip
    """The Action that runs ``spec`` over ``input_root``."""
    if not spec.argv:
        raise CcwError("INVALID_ARGUMENT", "a command needs at least argv[0]")
    if spec.cwd.startswith("/") or ".." in spec.cwd.split("/"):
        raise CcwError("INVALID_ARGUMENT", f"cwd {spec.cwd!r} must be relative to the input root")
    command = re_pb2.Command(
        arguments=list(spec.argv),
        output_paths=sorted(spec.output_paths),
        working_directory=spec.cwd,
        platform=platform_message(spec.platform),
    )
    for name, value in sorted(spec.env.items()):
        command.environment_variables.add(name=name, value=value)
    command_bytes = command.SerializeToString(deterministic=True)
    command_digest = digest_bytes(command_bytes)
    action = re_pb2.Action(
        command_digest=command_digest,
        input_root_digest=input_root,
        do_not_cache=do_not_cache,
        salt=salt,
        platform=platform_message(spec.platform),
    )
    if timeout_s is not None:
        action.timeout.FromNanoseconds(int(timeout_s * 1e9))
    action_bytes = action.SerializeToString(deterministic=True)
    action_digest = digest_bytes(action_bytes)
    blobs = {key(command_digest): command_bytes, key(action_digest): action_bytes}
    return ActionMessages(action, command, action_digest, blobs)

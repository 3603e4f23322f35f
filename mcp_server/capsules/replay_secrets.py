"""A witness of a capsule with secrets, replayed here or in another state dir (issue 38).

A capsule's runs found placeholders in its secrets' variables (capsules/capsecrets.py),
and its proxy swapped them for values bound to hosts.  A witness carries no value and no
placeholder (a placeholder means nothing to another proxy), only what the runs were
given: each secret's name and the hosts its binding named (``mark_witness``, under the
manifest's ``capsule.secrets``).  A replay then:

- **refuses a witness this state dir does not trust** (PERMISSION_DENIED, naming the
  secrets): one replayed with ``allow_untrusted`` was promised only the env, network and
  workspace its replayer passes, and a secret bound here would let its commands act as
  the person at the secret's hosts;
- **binds the replaying state dir's secret of the same name** when its binding names
  the same hosts: the replay's capsule gets fresh placeholders and, for the terminated
  hosts, a CA of its own, as a capsule made with ``secrets: [NAME]`` would
  (``given``; the files go with the replay: ``held``);
- **refuses, naming the secret**, when this state dir has no secret of that name
  (NOT_FOUND, with the ``ccw secret set NAME --host ...`` that makes it) or has one bound
  to other hosts (CONFLICT, naming the hosts that differ): a value here bound to other
  hosts would be sent where the witness's runs never sent one, and a run without the
  value would fail for a reason that is not the witness's.

The hosts, not the header or format, are what must agree: they say where a value may
go, which is what a replayer decides by binding it; how it is written into a request
changes nothing about who receives it.  Whether the replay may reach those hosts at
all is still its network's (the rules the replayer allows).
"""

from __future__ import annotations

import contextlib
import secrets as random
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import trio

from mcp_server.capsules import capsecrets
from mcp_server.egress.credentials import Credentials
from mcp_server.fs import castore
from mcp_server.fs.secretstore import SecretStore
from sandbox.errors import CcwError

MAX_HOSTS = 64


def recorded(root: Path, capsule_id: str) -> list[dict[str, Any]]:
    """What a witness of ``capsule_id`` says of its secrets: each name and its binding's hosts
    (``host:port``) as the store has them now; never a value.  A name the store no longer holds
    is recorded with no hosts (a replay then refuses it, naming it)."""
    names = capsecrets.recall(root, capsule_id)
    if not names:
        return []
    bound = {secret.binding.name: secret.binding for secret in SecretStore(root).secrets()}
    return [{"name": name, "hosts": bound[name].host_texts() if name in bound else []} for name in names]


def mark_witness(manifest: dict[str, Any], root: Path, capsule_id: str) -> None:
    """Put ``recorded`` into the manifest's ``capsule.secrets``; nothing for a capsule without secrets
    (a witness of one stays byte for byte as before)."""
    made = recorded(root, capsule_id)
    if made:
        manifest["capsule"]["secrets"] = made


def _parsed(manifest: Mapping[str, Any]) -> list[tuple[str, list[str]]]:
    """The witness's secrets as (name, hosts); INVALID_ARGUMENT for a malformed entry."""
    entries = manifest["capsule"].get("secrets", [])
    shape = "capsule.secrets must be a list of {name: NAME, hosts: [HOST:PORT, ...]}"
    if not isinstance(entries, list) or len(entries) > capsecrets.MAX_SECRETS:
        raise CcwError("INVALID_ARGUMENT", f"the witness's {shape}, at most {capsecrets.MAX_SECRETS}")
    parsed = []
    for entry in entries:
        name, hosts = (entry.get("name"), entry.get("hosts")) if isinstance(entry, dict) else (None, None)
        if (not isinstance(name, str) or not isinstance(hosts, list) or len(hosts) > MAX_HOSTS
                or not all(isinstance(host, str) for host in hosts)):
            raise CcwError("INVALID_ARGUMENT", f"the witness's {shape}: {str(entry)[:120]}")
        parsed.append((name, sorted(hosts)))
    return parsed


def check(root: Path, manifest: Mapping[str, Any]) -> list[str]:
    """The names of the witness's secrets, each bound here to the hosts it was bound to in its runs;
    NOT_FOUND or CONFLICT naming the first secret that is not, and how to bind it."""
    bound = {secret.binding.name: secret.binding for secret in SecretStore(root).secrets()}
    for name, hosts in _parsed(manifest):
        flags = " ".join(f"--host {host}" for host in hosts) or "--host HOST[:PORT]"
        binding = bound.get(name)
        if binding is None:
            raise CcwError("NOT_FOUND", f"the witness's runs used the secret {name} (bound to "
                           f"{', '.join(hosts) or 'hosts not recorded'}), and this state dir has no secret of that "
                           f"name: `ccw secret set {name} {flags}` makes it (its value from a prompt, --stdin, --file "
                           "or --command), then replay again", {"secret": name, "hosts": hosts})
        here = sorted(binding.host_texts())
        if here != hosts:
            differ = sorted(set(here) ^ set(hosts))
            raise CcwError("CONFLICT", f"this state dir's secret {name} is bound to {', '.join(here)}, and the "
                           f"witness's runs had it bound to {', '.join(hosts) or 'hosts not recorded'} (differing: "
                           f"{', '.join(differ)}): a replay sends a value only where its runs did.  `ccw secret set "
                           f"{name} {flags}` binds it so, or replay in a state dir where it is",
                           {"secret": name, "hosts": hosts, "bound_here": here, "differing": differ})
    return sorted(name for name, _hosts in _parsed(manifest))


async def given(root: Path, manifest: Mapping[str, Any], trusted: bool) -> Credentials | None:
    """The replay capsule's secrets: this state dir's, checked against the witness's (``check``),
    with fresh placeholders and a CA of the replay's own; None for a witness without secrets.
    PERMISSION_DENIED for one with secrets not ``trusted`` (signed by this state dir or a key it
    trusts): a witness replayed with allow_untrusted gets only what its replayer passes."""
    names = sorted(name for name, _hosts in _parsed(manifest))
    if names and not trusted:
        raise CcwError("PERMISSION_DENIED", f"the witness's runs used the secret(s) {', '.join(names)}, and it is "
                       "signed by neither this state dir nor a key it trusts: its commands get none of this state "
                       "dir's secrets (allow_untrusted gives them only the env, network and workspace you pass).  If "
                       "you trust whoever made it, `ccw witness trust KEY --name NAME` lets it replay here with them",
                       {"secrets": names})
    if not names:
        return None
    await trio.to_thread.run_sync(check, root, manifest)
    return await trio.to_thread.run_sync(capsecrets.credentials, root, names, random.token_hex(8))


def env(made: Credentials | None) -> dict[str, str]:
    """The replay's variables for its secrets: each name's placeholder, and the CA bundle's."""
    if made is None:
        return {}
    return {**made.capsule.env(), **(castore.bundle_env(made.bundle) if made.bundle is not None else {})}


@contextlib.asynccontextmanager
async def held(root: Path, holder: capsecrets.Holder, capsule_id: str,
               made: Credentials | None) -> AsyncIterator[None]:
    """The replay capsule's proxy holds ``made`` for the block; its CA's files are removed after."""
    if made is None:
        yield
        return
    holder.give_credentials(capsule_id, made)
    capsecrets.remember(root, capsule_id, made.capsule.bindings, made)
    try:
        yield
    finally:
        capsecrets.forget(root, capsule_id)

"""Which secrets a capsule was given at create, and its placeholders for them (issue 38).

``capsule_create {secrets: [NAME]}`` names secrets of the state dir's store
(fs/secretstore.py); the capsule's commands then find, in the variable of each name, a
placeholder (core/placeholders.py), and the capsule's proxy session swaps it for the
value where the secret's binding allows (egress/credentials.py).  Choices:

- **Only a capsule with an allowlist**: without one nothing leaves the capsule, so a
  placeholder could reach no host; asking is an error, not a silent no-op.
- **Unknown names are refused at create**, naming ``ccw secret list``: a typo found at
  the first request would be a 401 from someone else's server.
- **The names are kept, the placeholders are not.**  The names go in a small file of the
  state dir (``capsule-secrets/<capsule id>``, names only: a name is no secret); the
  placeholders live only in the front end's memory (``Networks``).  After the front end
  restarts, the capsule's next exec gets new placeholders from the names (the old ones
  mean nothing any more, to this proxy or any other).  A secret removed from the store
  meanwhile refuses that exec, naming it.
- **The value's length is read once per placeholder** (a placeholder is as long as its
  value: core/placeholders.py says why), so a secret whose value is a command runs it
  then, at create, and again at each request that needs the value.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import trio

from mcp_server.core.placeholders import CapsuleSecrets
from mcp_server.egress.credentials import Credentials
from mcp_server.fs.secretstore import SecretStore
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest

DIR_NAME = "capsule-secrets"
MAX_SECRETS = 64


class Holder(Protocol):
    """Where a process keeps its capsules' placeholders (capsules/networks.py ``Networks``)."""

    def credentials(self, capsule_id: str) -> Credentials | None: ...

    def give_credentials(self, capsule_id: str, credentials: Credentials) -> None: ...


async def for_create(root: Path, names: tuple[str, ...], allowlist: bool) -> Credentials | None:
    """The placeholders of a capsule being made with ``names`` (None for none); refused without an allowlist."""
    if not names:
        return None
    if not allowlist:
        raise CcwError("INVALID_ARGUMENT", "secrets need a network allowlist (network: [...] naming their hosts): "
                       "a capsule without one reaches no host to send them to", {"secrets": list(names)})
    return await trio.to_thread.run_sync(credentials, root, names)


async def env(root: Path, holder: Holder, capsule_id: str) -> dict[str, str]:
    """The capsule's secrets' variables, each name holding its placeholder; made anew from the
    names kept at create when this process has none yet (a restarted front end)."""
    given = holder.credentials(capsule_id)
    if given is None and (names := recall(root, capsule_id)):
        given = await trio.to_thread.run_sync(credentials, root, names)
        holder.give_credentials(capsule_id, given)
    return {} if given is None else given.capsule.env()


async def placed(root: Path, holder: Holder, allowlist: bool, request: ExecRequest) -> ExecRequest:
    """``request`` (an exec's or a service's) with the capsule's secrets' variables set to their
    placeholders, over any value the caller's environment gave a variable of that name."""
    ours = await env(root, holder, request.capsule_id) if allowlist else {}
    return dataclasses.replace(request, env={**(request.env or {}), **ours}) if ours else request


def credentials(root: Path, names: Iterable[str]) -> Credentials:
    """New placeholders for the secrets ``names`` of the store at ``root`` (blocking: a value may
    be a command's output); NOT_FOUND naming ``ccw secret list`` for a name it does not hold."""
    store = SecretStore(root)
    known = {secret.binding.name: secret for secret in store.secrets()}
    wanted = sorted(set(names))
    if len(wanted) > MAX_SECRETS:
        raise CcwError("INVALID_ARGUMENT", f"{len(wanted)} secrets asked for; a capsule takes at most {MAX_SECRETS}")
    missing = [name for name in wanted if name not in known]
    if missing:
        raise CcwError("NOT_FOUND", f"no secret called {', '.join(missing)} in this state dir: `ccw secret list` "
                       "shows the names, `ccw secret set NAME --host HOST` makes one", {"missing": missing})
    bindings = {name: known[name].binding for name in wanted}
    lengths = {name: len(store.value(name).reveal()) for name in wanted}
    return Credentials(CapsuleSecrets(bindings, lengths), lambda name: store.value(name).reveal())


def remember(root: Path, capsule_id: str, names: Iterable[str]) -> None:
    """Keep the capsule's secrets' names for a front end started later."""
    folder = os.path.join(root, DIR_NAME)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, capsule_id)
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(sorted(set(names)), out)
    os.replace(path + ".tmp", path)


def recall(root: Path, capsule_id: str) -> list[str]:
    """The names the capsule was given at create ([] if none)."""
    try:
        with open(os.path.join(root, DIR_NAME, capsule_id), encoding="utf-8") as found:
            names = json.load(found)
    except FileNotFoundError:
        return []
    return [str(name) for name in names]


def inherit(root: Path, parent_id: str, child_id: str) -> None:
    """A fork gets what its parent was given at create (its names; the secrets' variables are in
    the env whitelist it inherits, so without them a caller's own value of that name would
    pass), and new placeholders of its own at its first exec (``env``): a placeholder is
    unique to its capsule, so neither can be sent by the other."""
    try:
        with open(os.path.join(root, DIR_NAME, parent_id), "rb") as found:
            kept = found.read()
    except FileNotFoundError:
        return
    path = os.path.join(root, DIR_NAME, child_id)
    with open(path + ".tmp", "wb") as out:
        out.write(kept)
    os.replace(path + ".tmp", path)


def forget(root: Path, capsule_id: str) -> None:
    """The capsule is gone: its names too."""
    try:
        os.unlink(os.path.join(root, DIR_NAME, capsule_id))
    except FileNotFoundError:
        pass

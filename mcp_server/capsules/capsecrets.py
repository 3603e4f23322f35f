"""Which secrets a capsule was given at create, and its placeholders for them (issue 38).

``capsule_create {secrets: [NAME]}`` names secrets of the state dir's store
(fs/secretstore.py); the capsule's commands then find, in the variable of each name, a
placeholder (core/placeholders.py), and the capsule's proxy session swaps it for the
value where the secret's binding allows (egress/credentials.py).  Choices:

- **Only a capsule with an allowlist**: without one nothing leaves the capsule, so a
  placeholder could reach no host; asking is an error, not a silent no-op.
- **Unknown names are refused at create**, naming ``ccw secret list``: a typo found at
  the first request would be a 401 from someone else's server.
- **So is a secret no rule lets reach any of its hosts** (``stranded``): its placeholder
  could never be swapped, and the agent would learn it only from a refusal at the first
  request, if at all.  The error names each such secret, its hosts and the rule that
  admits one.  A capsule that asks on a miss (``on_miss: "ask"``) may get the host from
  a person at that request, so it is not refused.  Rules changed later (live, or a
  binding set again) are not judged here.
- **The names are kept, the placeholders are not.**  The names go in a small file of the
  state dir (``capsule-secrets/<capsule id>``, names only: a name is no secret); the
  placeholders live only in the front end's memory (``Networks``).  After the front end
  restarts, the capsule's next exec gets new placeholders from the names (the old ones
  mean nothing any more, to this proxy or any other).  A secret removed from the store
  meanwhile refuses that exec, naming it.
- **The value's length is read once per placeholder** (a placeholder is as long as its
  value: core/placeholders.py says why), so a secret whose value is a command runs it
  then, at create, and again at each request that needs the value.
- **A CA per capsule** (core/tlsca.py, kept by fs/castore.py), name-constrained to
  exactly the hosts its secrets are bound to, so the proxy can terminate its TLS to
  those hosts (egress/tlsterm.py).  Per capsule rather than one per state dir: a
  capsule's CA names only its own hosts, so a key leaked from one capsule's file
  signs for no host another capsule's secret is bound to; two capsules with different
  secrets never remake each other's CA (one shared CA would have to name every bound
  host, or be remade back and forth); and a binding changed later (``ccw secret set``)
  changes no running capsule's trust.  The capsule's hosts are read at create and the
  CA kept for them; a restarted front end loads the same CA (``load_or_make`` remakes
  it only if the hosts changed or it nears its end, and rewrites the bundle then).
  Keys live in ``capsule-tls/<id>.pem`` (0600, never shown to a jail); the bundle the
  jail trusts (the system's CAs, then the capsule's) in ``capsule-tls/<id>/``, a
  directory the capsule shows read-only (``CapsuleSpec.expose``) at the same path,
  with ``castore.BUNDLE_ENV`` naming it.  ``<id>`` is drawn at create, before the
  capsule has its own id, since what a capsule shows is fixed when it is made.
- **Hosts of https method/path rules too** (core/httprules.py): their requests must be
  read, so their CONNECTs are terminated like a bound host's.  A capsule made with such
  a rule and no secret gets the CA, the bundle and its variables, with no placeholders.
- **A rule added live names a new host: a new CA, appended** (``extend``).  A CA's name
  constraints are fixed when it is signed, and a process already running may have
  loaded the bundle, so the first CA is never remade for more hosts: a second CA,
  constrained to the added hosts alone, is made under its own file
  (``capsule-tls/<id>.<random>.pem``) and its certificate appended to the bundle, which
  so keeps every CA the capsule was given, each for its own hosts; the proxy signs a
  host's leaf with the CA that names it (``Authorities``).  A client that reads the
  bundle per connection (curl, git, a new Python process) trusts it at once; one that
  loaded it before the change does not, until it loads it again.  A capsule made with
  neither secrets nor https rules has no bundle shown (what a capsule shows is fixed at
  create, and giving every allowlist capsule one would override its own
  ``SSL_CERT_FILE``): an https method/path rule added to it live is refused, saying to
  make the capsule again with the rule (``terminable``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import os
import secrets as random
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import trio

from mcp_server.core.netrules import NetworkSpec, decide
from mcp_server.core.placeholders import CapsuleSecrets
from mcp_server.core.secretbind import Binding
from mcp_server.core.tlsca import Authority, host_set_id
from mcp_server.egress.credentials import Credentials
from mcp_server.fs import castore
from mcp_server.fs.secretstore import SecretStore
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest

DIR_NAME = "capsule-secrets"
TLS_DIR = "capsule-tls"
BUNDLE = "ca-bundle.pem"
MAX_SECRETS = 64


class Holder(Protocol):
    """Where a process keeps its capsules' placeholders (capsules/networks.py ``Networks``)."""

    def credentials(self, capsule_id: str) -> Credentials | None: ...

    def give_credentials(self, capsule_id: str, credentials: Credentials) -> None: ...


class Authorities:
    """A capsule's CAs (the one made at create, then one per live addition: ``extend``) as the
    proxy asks for leaves (egress/credentials.py ``LeafContexts``): each host's from the CA made for it."""

    def __init__(self) -> None:
        self._by_host: dict[str, castore.ServerContexts] = {}

    def add(self, authority: Authority, renew: Callable[[dt.datetime], Authority] | None = None) -> None:
        contexts = castore.ServerContexts(authority, renew)
        for host in authority.hosts:
            self._by_host.setdefault(host, contexts)

    def get(self, host: str, now: dt.datetime | None = None) -> ssl.SSLContext:
        """The context for ``host``'s leaf; CONFLICT if none of the capsule's CAs names it."""
        contexts = self._by_host.get(host)
        if contexts is None:
            raise CcwError("CONFLICT", f"none of this capsule's TLS CAs was made for {host}", {"host": host})
        return contexts.get(host, now)


def tls_hosts(network: NetworkSpec | None) -> frozenset[str]:
    """The hosts of ``network``'s https method/path rules: the proxy terminates their TLS to read their requests."""
    if network is None:
        return frozenset()
    return frozenset(rule.host for rule in network.allow if rule.is_http and rule.scheme == "https")


async def for_create(root: Path, names: tuple[str, ...], network: NetworkSpec | None,
                     https_hosts: Iterable[str] = ()) -> Credentials | None:
    """The placeholders and TLS CA of a capsule being made with ``names``, the allowlist ``network``
    and https method/path rules on ``https_hosts`` (``tls_hosts``); None for neither; secrets
    refused without an allowlist, or bound only to hosts it does not allow (``stranded``)."""
    https = frozenset(https_hosts)
    if not names and not https:
        return None
    if names and network is None:
        raise CcwError("INVALID_ARGUMENT", "secrets need a network allowlist (network: [...] naming their hosts): "
                       "a capsule without one reaches no host to send them to", {"secrets": list(names)})
    return await trio.to_thread.run_sync(functools.partial(credentials, root, names, random.token_hex(8),
                                                           [sorted(https)], network=network))


def stranded(bindings: Mapping[str, Binding], network: NetworkSpec) -> None:
    """INVALID_ARGUMENT if a secret of ``bindings`` is bound only to hosts no rule of ``network``
    allows (unless it asks on a miss), naming each, its hosts and the rule to add."""
    if network.on_miss == "ask":
        return
    unreached = {name: binding.host_texts() for name, binding in sorted(bindings.items())
                 if not any(decide(network, host, port).allowed for host, port in binding.hosts)}
    if not unreached:
        return
    said = "; ".join(f"secret {name} is bound to {', '.join(hosts)}" for name, hosts in unreached.items())
    first = next(iter(unreached.values()))[0].removeprefix("https://")
    raise CcwError("INVALID_ARGUMENT", f"{said}, and no rule of the capsule's network allows any of them, so its "
                   "placeholder would never be swapped for the value: add the host to the network (network: "
                   f'[..., "{first}"], or ccw capsule create --network {first}), or leave the secret out',
                   {"secrets": unreached, "allowed": network.rules_text()})


def whitelist(env_whitelist: Iterable[str], names: Iterable[str], tls: bool = False) -> tuple[str, ...]:
    """A capsule's env whitelist with its secrets' names and, if it has any or a CA (``tls``), the
    CA bundle's variables: the helper passes only whitelisted names."""
    wanted = set(names)
    return tuple(sorted({*env_whitelist, *wanted, *(castore.BUNDLE_ENV if wanted or tls else ())}))


def shown(expose: tuple[str, ...], given: Credentials | None) -> tuple[str, ...]:
    """A capsule's exposed directories with its CA bundle's (read-only in the jail, at the same path)."""
    if given is None or given.bundle is None:
        return expose
    return tuple(sorted({*expose, os.path.dirname(given.bundle)}))


async def env(root: Path, holder: Holder, capsule_id: str) -> dict[str, str]:
    """The capsule's secrets' variables, each name holding its placeholder, and the CA bundle's;
    made anew from what was kept at create when this process has none yet (a restarted front end)."""
    given = holder.credentials(capsule_id)
    if given is None and ((kept := _recalled(root, capsule_id))[0] or kept[1] is not None):
        given = await trio.to_thread.run_sync(credentials, root, *kept)
        holder.give_credentials(capsule_id, given)
    if given is None:
        return {}
    return {**given.capsule.env(), **(castore.bundle_env(given.bundle) if given.bundle is not None else {})}


async def placed(root: Path, holder: Holder, allowlist: bool, request: ExecRequest) -> ExecRequest:
    """``request`` (an exec's or a service's) with the capsule's secrets' variables set to their
    placeholders, over any value the caller's environment gave a variable of that name."""
    ours = await env(root, holder, request.capsule_id) if allowlist else {}
    return dataclasses.replace(request, env={**(request.env or {}), **ours}) if ours else request


def credentials(root: Path, names: Iterable[str], tls_id: str | None = None,
                cas: Sequence[Sequence[str]] = ((),), network: NetworkSpec | None = None) -> Credentials:
    """New placeholders for the secrets ``names`` of the store at ``root`` (blocking: a value may
    be a command's output), with the capsule's CAs ``tls_id`` loaded or made: the first for
    their hosts and ``cas[0]``, each later one for its ``cas`` entry alone (``extend``);
    NOT_FOUND naming ``ccw secret list`` for a name it does not hold; at create (``network``:
    the capsule's rules), ``stranded``'s refusal before any value is read or CA made."""
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
    if network is not None:
        stranded(bindings, network)
    lengths = {name: len(store.value(name).reveal()) for name in wanted}
    made = Credentials(CapsuleSecrets(bindings, lengths), lambda name: store.value(name).reveal())
    if tls_id is not None:
        hosts = {host for binding in bindings.values() for host, _port in binding.hosts}
        first, *later = cas or ((),)
        made.contexts, made.bundle = _authorities(root, tls_id, [sorted({*hosts, *first}), *later])
    return made


def _ca_file(tls_id: str, index: int, hosts: Sequence[str]) -> str:
    """The key file of the capsule's ``index``th CA: a later one's name carries its hosts' digest,
    so a fork and its parent (one ``tls_id``) adding different hosts never remake each other's."""
    if index == 0:
        return f"{tls_id}.pem"
    return f"{tls_id}.{host_set_id(hosts)}.pem"


def _authorities(root: Path, tls_id: str, cas: Sequence[Sequence[str]]) -> tuple[Authorities, str]:
    """The capsule's CAs, loaded or made, and its bundle (the system's CAs, then each of them) written;
    each renewed by the proxy when it nears its end (``_renewed``: core/tlsca.py's notes)."""
    held = Authorities()
    made, bundle = _loaded(root, tls_id, cas)
    for index, authority in enumerate(made):
        held.add(authority, functools.partial(_renewed, root, tls_id, cas, index))
    return held, bundle


def _loaded(root: Path, tls_id: str, cas: Sequence[Sequence[str]],
            now: dt.datetime | None = None) -> tuple[list[Authority], str]:
    made = [castore.load_or_make(root / TLS_DIR, hosts, now, name=_ca_file(tls_id, index, hosts))
            for index, hosts in enumerate(cas)]
    folder = root / TLS_DIR / tls_id
    return made, _write_bundle(folder, _appended(folder / BUNDLE, castore.bundle(made[0]),
                                                 [authority.cert_pem() for authority in made[1:]]))


def _renewed(root: Path, tls_id: str, cas: Sequence[Sequence[str]], index: int, now: dt.datetime) -> Authority:
    """The capsule's ``index``th CA made again (its file replaced: it was due) and the bundle rewritten with it."""
    return _loaded(root, tls_id, cas, now)[0][index]


def _appended(path: Path, base: bytes, later: Sequence[bytes]) -> bytes:
    """The bundle: ``base`` (the system's CAs and the first CA), what was appended to it before,
    then ``later``'s certificates it lacks.  What was appended before stays: a fork shares its
    parent's bundle, and a CA either was given live must stay trusted by both (rewritten
    whole only when ``base`` changed: the system's bundle did, or the first CA was remade)."""
    try:
        old = path.read_bytes()
    except FileNotFoundError:
        old = b""
    data = old if old.startswith(base) else base
    for cert in later:
        if cert not in data:
            data += cert
    return data


def terminable(root: Path, capsule_id: str) -> Callable[[NetworkSpec, NetworkSpec], NetworkSpec]:
    """A check of the capsule's rules ``old`` about to become ``network`` live (capsules/netlive.py):
    INVALID_ARGUMENT, saying to make the capsule again, if they add an https method/path rule
    for a new host to a capsule shown no CA bundle at create (it cannot be shown one later)."""
    def check(old: NetworkSpec, network: NetworkSpec) -> NetworkSpec:
        https = tls_hosts(network) - tls_hosts(old)
        if https and _recalled(root, capsule_id)[1] is None:
            raise CcwError("INVALID_ARGUMENT", f"capsule {capsule_id} was made without TLS termination (no secret "
                           "and no https method/path rule at create), and what it is shown cannot change while it "
                           "lives: make it again with the https rule (capsule_create network: [...]) to add "
                           f"{', '.join(sorted(https))}", {"hosts": sorted(https)})
        return network
    return check


async def extend(root: Path, holder: Holder, capsule_id: str, network: NetworkSpec) -> None:
    """The capsule's CAs after its rules changed live to ``network``: a new CA for the https
    method/path rules' hosts no CA of it names yet, appended to its bundle and kept."""
    names, tls_id, cas = _recalled(root, capsule_id)
    given = holder.credentials(capsule_id)
    covered = {host for hosts in cas for host in hosts}
    covered |= {host for binding in given.capsule.bindings.values() for host, _ in binding.hosts} if given else set()
    new = sorted(tls_hosts(network) - covered)
    if tls_id is None or not new:
        return
    cas = [*cas, new]
    contexts, _bundle = await trio.to_thread.run_sync(_authorities, root, tls_id, cas)
    _keep(root, capsule_id, names, tls_id, cas)
    if given is not None:
        given.contexts = contexts  # the proxy's next CONNECT asks for it (egress/tlsterm.py)


def _write_bundle(folder: Path, data: bytes) -> str:
    """The capsule's bundle at ``folder/BUNDLE`` (0644, in a 0755 directory the jail shows
    read-only), rewritten in one rename if it changed; its path."""
    path = folder / BUNDLE
    os.makedirs(folder, mode=0o755, exist_ok=True)
    try:
        if path.read_bytes() == data:
            return str(path)
    except FileNotFoundError:
        pass
    temporary = folder / f".{BUNDLE}.{os.getpid()}.tmp"
    with open(temporary, "wb") as out:
        out.write(data)
    os.chmod(temporary, 0o644)
    os.replace(temporary, path)
    return str(path)


def remember(root: Path, capsule_id: str, names: Iterable[str], given: Credentials | None = None,
             https_hosts: Iterable[str] = ()) -> None:
    """Keep the capsule's secrets' names (and its CA's id, and the https rules' hosts its first
    CA was made for) for a front end started later."""
    tls_id = None if given is None or given.bundle is None else os.path.basename(os.path.dirname(given.bundle))
    _keep(root, capsule_id, names, tls_id, [sorted(set(https_hosts))])


def _keep(root: Path, capsule_id: str, names: Iterable[str], tls_id: str | None,
          cas: Sequence[Sequence[str]]) -> None:
    folder = os.path.join(root, DIR_NAME)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    path = os.path.join(folder, capsule_id)
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        json.dump({"names": sorted(set(names)), "tls": tls_id, "cas": [list(hosts) for hosts in cas]}, out)
    os.replace(path + ".tmp", path)


def recall(root: Path, capsule_id: str) -> list[str]:
    """The names the capsule was given at create ([] if none)."""
    return _recalled(root, capsule_id)[0]


def _recalled(root: Path, capsule_id: str) -> tuple[list[str], str | None, list[list[str]]]:
    """The names the capsule was given at create, its CAs' id and the https hosts of each of its
    CAs (a list alone: kept before CAs were; no ``cas``: before rules had CAs)."""
    try:
        with open(os.path.join(root, DIR_NAME, capsule_id), encoding="utf-8") as found:
            kept = json.load(found)
    except FileNotFoundError:
        return [], None, [[]]
    if isinstance(kept, list):
        return [str(name) for name in kept], None, [[]]
    tls_id = kept.get("tls")
    cas = [[str(host) for host in hosts] for hosts in kept.get("cas") or [[]]]
    return [str(name) for name in kept.get("names", [])], None if tls_id is None else str(tls_id), cas


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
    """The capsule is gone: its names too, and its CA's key and bundle unless a capsule still
    uses them (a fork's kept file names its parent's CA: ``inherit``)."""
    _names, tls_id, _cas = _recalled(root, capsule_id)
    _remove(os.path.join(root, DIR_NAME, capsule_id))
    if tls_id is None or any(_recalled(root, other)[1] == tls_id for other in _kept(root)):
        return
    folder = os.path.join(root, TLS_DIR)
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        if name.startswith(f"{tls_id}.") and name.endswith((".pem", ".pem.lock")):  # every CA it was given
            _remove(os.path.join(folder, name))
    _remove(os.path.join(folder, tls_id, BUNDLE))
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(os.path.join(folder, tls_id))


def _kept(root: Path) -> list[str]:
    """The ids of the capsules whose secrets' names are kept."""
    try:
        return [name for name in os.listdir(os.path.join(root, DIR_NAME)) if not name.endswith(".tmp")]
    except FileNotFoundError:
        return []


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)

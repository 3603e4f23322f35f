"""A capsule's credentials at the proxy: the placeholders swapped in plain HTTP requests (issue 38).

core/placeholders.py decides, for one request head, where a value may go; this module is
what the proxy (egress/proxy.py) holds per capsule to use it, and what it does per request:

- **No placeholder, no cost.**  A head without ``placeholders.PREFIX`` in it, and without
  Basic auth (whose base64 hides it), is sent as it is, after one ``bytes.find`` and one
  search; only a head that may carry one is judged.
- **A value lives for one request.**  ``Credentials.judge`` fetches the values the
  rewrite puts in (the store's ``value``: a stored value, or a command run now, hence
  on a thread), puts them in the head, builds the response's masker from them and
  keeps nothing: the next request fetches again.  A value is in the rewritten head, the
  masker and the upstream socket's buffers, and nowhere this process keeps.
- **A placeholder where it may not go refuses the request** before any connection is
  made upstream: the record's reason begins with ``EXFILTRATION`` and names the secret
  and the place (a header's name, "the body", another host), never a value; the
  session tells the person watching at once (``Carrier.refuse``).
- **The body** is scanned as it passes (``body_attempt``): a placeholder in it ends the
  request (its head has gone by then; the upstream gets a cut body).  A placeholder
  split across two reads is not seen there; it carries no value either way.
- **CONNECT to a bound host is terminated** when the capsule has a CA (``contexts``,
  fs/castore.py ``ServerContexts`` for the capsule's name-constrained CA): each request
  inside is judged here as a plain one is (egress/tlsterm.py, egress/proxy.py).
  Without one, a tunnel to a bound host carries the placeholder, not the value, end to end.
- **Reverse routes** (``route``): ``/route/NAME/REST`` on the proxy's own address is a
  request for ``REST`` at the secret's bound upstream, with the value put in where its
  binding says, for clients that take a base URL and speak no proxy.  Only the
  capsule's own secrets have routes.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from mcp_server.core.placeholders import (
    FOUND,
    PREFIX,
    CapsuleSecrets,
    Exfiltration,
    ResponseMasker,
    rewrite_request,
)
from mcp_server.core.secretbind import BASIC_FORMATS
from mcp_server.egress.relay import Attempt

EXFILTRATION = "exfiltration attempt"
BASIC = re.compile(rb"^authorization:[ \t]*basic[ \t]", re.IGNORECASE | re.MULTILINE)
ROUTE = b"/route/"

# A secret's value now, by name (fs/secretstore ``SecretStore.value(name).reveal()``): it
# may run a command, so it is called on a thread.
Fetch = Callable[[str], bytes]


@dataclass(frozen=True)
class Judged:
    """One request head judged: the head to send (None: refused, ``reason`` says why) and the
    masker for its response (None: no value went in)."""

    head: bytes | None = field(repr=False)
    masker: Masker | None = field(default=None, repr=False)
    reason: str | None = None


class Masker:
    """Several ``ResponseMasker``s, one after the other, as one."""

    def __init__(self, *maskers: ResponseMasker) -> None:
        self._maskers = maskers

    def feed(self, data: bytes) -> bytes:
        """What may go to the jail now."""
        for masker in self._maskers:
            data = masker.feed(data)
        return data

    def close(self) -> bytes:
        """The rest: the stream has ended."""
        data = b""
        for masker in self._maskers:
            data = masker.feed(data) + masker.close()
        return data


def _basic_of(head: bytes) -> bytes | None:
    """The base64 of a head's Basic credentials, if it has them."""
    found = BASIC.search(head)
    return None if found is None else head[found.end():].split(b"\r\n", 1)[0].strip()


def _unbased(encoded: bytes | None) -> bytes:
    """Basic credentials' base64 decoded (nothing if it is none, or not base64)."""
    try:
        return base64.b64decode(encoded or b"", validate=True)
    except ValueError:
        return b""


def _decoded(value: bytes) -> bytes:
    """A header's value, and its Basic credentials decoded if it is Basic auth."""
    scheme, _, rest = value.partition(b" ")
    return value + b"\n" + _unbased(rest.strip()) if scheme.lower() == b"basic" else value


def _where(attempt: Exfiltration) -> str:
    who = f"the placeholder of secret {attempt.secret}" if attempt.secret else f"a {PREFIX} placeholder"
    return f"{who} in {attempt.where}"


class LeafContexts(Protocol):
    """A TLS server context presenting a leaf for a host (fs/castore.py ``ServerContexts``)."""

    def get(self, host: str, now: dt.datetime | None = None) -> ssl.SSLContext:
        """The context for ``host`` (at ``now``, else the clock's); CcwError if the capsule's CA was not made for it."""
        ...


class Credentials:
    """One capsule's secrets as its proxy uses them; no value is kept here."""

    def __init__(self, capsule: CapsuleSecrets, fetch: Fetch, contexts: LeafContexts | None = None) -> None:
        self.capsule = capsule
        self._fetch = fetch
        self.contexts = contexts  # the capsule's CA's leaves: CONNECTs to bound hosts are terminated
        self.bundle: str | None = None  # the CA bundle the capsule's clients trust (capsules/capsecrets.py)

    def judge(self, head: bytes, host: str, port: int, cleartext: bool = False) -> Judged:
        """``head`` (a whole request head) with its placeholders replaced where their bindings
        allow, or refused; ``host`` as netrules.normalize_host leaves it; ``cleartext``: the
        request goes upstream without TLS (a value its binding keeps inside TLS is then refused).
        Blocking (a value may come from a command): call it on a thread, and only for a head
        ``carries``.

        The downgrade refused: a value bound to port 443 or to a host written ``https://``
        (``Binding.tls_only``) was meant for HTTPS, and in a cleartext request it would cross
        the network unread by any certificate check, to whatever address the bound name
        resolves to (a steered DNS answer, an on-path reader): what a jail could ask for
        with ``http://NAME:443/`` or a plain ``/route/NAME/``."""
        fetched: dict[str, bytes] = {}
        downgraded: set[str] = set()

        def value(name: str) -> bytes:
            if cleartext and self.capsule.bindings[name].tls_only(host, port):
                downgraded.add(name)
                return b""  # never fetched: the request is refused below, whatever it held
            if name not in fetched:
                fetched[name] = self._fetch(name)
            return fetched[name]

        rewritten = rewrite_request(head, host, port, self.capsule, value)
        if rewritten.unsupported is not None:  # SigV4: refused, not an exfiltration
            return Judged(None, reason=rewritten.unsupported)
        if rewritten.problem is not None:
            return Judged(None, reason=f"{EXFILTRATION}? {rewritten.problem}, with a placeholder in it")
        if rewritten.head is None:
            return Judged(None, reason=f"{EXFILTRATION}: " + "; ".join(map(_where, rewritten.attempts)))
        if downgraded:
            names = ", ".join(sorted(downgraded))
            return Judged(None, reason=f"{EXFILTRATION}? the value of secret {names} would go to {host}:{port} in "
                                       f"cleartext HTTP; its binding keeps it inside TLS there (port 443, or a "
                                       f"host written https://): ask https://, which the proxy terminates")
        used = {name: fetched[name] for name in rewritten.used}
        if not used:
            return Judged(rewritten.head)
        # A server that echoes Authorization: Basic echoes the value in base64: that too.
        sent, was = _basic_of(rewritten.head), _basic_of(head)
        basic = ResponseMasker({sent: was} if sent and was and sent != was else {})
        return Judged(rewritten.head, Masker(self.capsule.response_masker(used), basic))

    def binds(self, host: str, port: int) -> bool:
        """Whether a secret of the capsule is bound to ``host:port`` (as netrules.normalize_host leaves it)."""
        return any(binding.binds(host, port) for binding in self.capsule.bindings.values())

    @staticmethod
    def carries(data: bytes) -> bool:
        """Whether the head ``data`` may hold a placeholder: its ``PREFIX`` (one ``bytes.find``),
        or Basic auth, where it travels in base64."""
        return PREFIX.encode() in data or BASIC.search(data) is not None

    @staticmethod
    def holds(data: bytes) -> bool:
        """Whether the head ``data`` holds a ``PREFIX`` run, in clear or in its Basic auth's base64."""
        return PREFIX.encode() in data or PREFIX.encode() in _unbased(_basic_of(data))

    def body_attempt(self, data: bytes, where: str = "the body") -> str | None:
        """The refusal's reason if a request body's bytes ``data`` (or its chunked trailers',
        ``where`` says) carry a placeholder."""
        if not self.carries(data):
            return None
        found = data[data.find(PREFIX.encode()):][:80]
        name = self.capsule.identify(found.split(b"&")[0].split(b"\"")[0])
        return f"{EXFILTRATION}: " + _where(Exfiltration(name, where))

    def dropped_attempt(self, headers: list[tuple[bytes, bytes]]) -> str | None:
        """The refusal's reason if a request header the proxy does not send on (``headers``:
        hop-by-hop ones, those ``Connection`` names, the client's ``Host``, a CONNECT's own)
        holds a placeholder, in clear or in Basic's base64.  Nothing swaps one there: dropped
        silently, it was a request that went without the value (the bound header named in
        ``Connection``) or a placeholder sent where no value goes, refused elsewhere."""
        for name, value in headers:
            found = FOUND.search(name + b"\n" + _decoded(value))
            if found is not None:
                shown = name[:64].decode("ascii", "replace")
                where = (f"header {shown}, which the proxy does not send on (hop-by-hop, named in Connection, "
                         "a CONNECT's, or Host, which the URL's replaces), so no value would go in")
                return f"{EXFILTRATION}: " + _where(Exfiltration(self.capsule.identify(found.group()), where))
        return None

    def route(self, target: bytes) -> tuple[str, str, int, bytes, str] | None:
        """A reverse route's secret, bound host, port, origin-form target and scheme upstream;
        None if ``target`` is no route of this capsule's.  ``/route/NAME/REST`` goes over
        TLS when the secret's first host keeps its value inside TLS (port 443, or written
        ``https://``: ``Binding.tls_only``), plain http otherwise;
        ``/route/NAME+https/REST`` goes over TLS whatever the port (the proxy verifies the
        upstream against the host's trust store either way)."""
        if not target.startswith(ROUTE):
            return None
        name, slash, rest = target[len(ROUTE):].partition(b"/")
        name, plus, tls = name.partition(b"+")
        binding = self.capsule.bindings.get(name.decode("ascii", "replace"))
        if binding is None or (plus and tls != b"https"):
            return None
        host, port = binding.hosts[0]
        scheme = "https" if plus or binding.tls_only(host, port) else "http"
        return binding.name, host, port, b"/" + rest if slash else b"/", scheme

    def routed(self, name: str, origin: str,
               headers: list[tuple[bytes, bytes]]) -> tuple[str, list[tuple[bytes, bytes]]]:
        """A request routed to secret ``name``'s upstream: its target and headers with the
        placeholder where the binding puts the value (``judge`` then swaps it); a header of
        that name the client sent goes, unless it holds this secret's placeholder already.

        That header is kept because Basic auth has a half the binding does not know: an index
        that wants ``__token__:VALUE`` refused the ``:VALUE`` a basic-password route made of
        it, though the client had sent ``__token__:$NAME``.  ``judge`` checks the kept header
        as any other."""
        binding = self.capsule.bindings[name]
        text = self.capsule.placeholders[binding.name].text
        if binding.query_param is not None:
            joined = "&" if "?" in origin else "?"
            return f"{origin}{joined}{binding.query_param}={text}", headers
        assert binding.header is not None
        own = [v for n, v in headers if n.lower() == binding.header.encode()]
        if len(own) == 1 and text.encode() in _decoded(own[0]):
            return origin, headers
        if binding.format in BASIC_FORMATS:
            pair = f"{text}:" if binding.format == "basic-user" else f":{text}"
            value = "Basic " + base64.b64encode(pair.encode()).decode()
        else:
            value = binding.format.replace("{}", text)
        kept = [(name, v) for name, v in headers if name.lower() != binding.header.encode()]
        return origin, [*kept, (binding.header.encode(), value.encode())]


@runtime_checkable
class Carrier(Protocol):
    """What the proxy asks of a session that may hold credentials (egress/session.py)."""

    @property
    def credentials(self) -> Credentials | None:
        """The capsule's credentials, or None (no secrets: the proxy swaps nothing)."""
        ...

    def refuse(self, attempt: Attempt, reason: str) -> None:
        """Turn an admitted attempt into a denial for ``reason`` and tell the watcher now."""
        ...

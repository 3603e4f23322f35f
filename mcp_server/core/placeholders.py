"""Placeholders: what a capsule holds instead of a secret, and the swap the proxy makes.

Pure logic (no I/O, sans-IO as h11 is): the egress proxy hands ``rewrite_request`` the
head of a request it terminated and gets back the head to send upstream, or a refusal
naming each place a placeholder was found where it may not go; it runs each response
through a ``ResponseMasker``.  The values come from a callable the caller passes
(fs/secretstore resolves them), used only for the secrets actually put in.

Some facts that decide the shape of a placeholder:

- **A placeholder is worth nothing by itself.**  The value enters a request only where
  ``rewrite_request`` puts it: the header, Basic-auth half or query parameter its
  binding names, on a request to a bound host:port whose ``Host`` names that host.
  Anything the jail does with a placeholder elsewhere (another header, the body, another
  host, half of it in one header and half in the next, base64 of it in a cookie) sends
  placeholder bytes, never the value.  Finding it there is reported so a person sees the
  attempt, but safety does not depend on finding every encoding of it.
- **Random, and unique to the capsule** (``CapsuleSecrets``): a placeholder leaked from
  one capsule (written into its tree and promoted, printed into a log) means nothing to
  another capsule's proxy session, and a jail cannot guess another capsule's.
- **A recognisable prefix** (``PREFIX``, ``ccwph_``) lets the proxy find candidates with
  one ``bytes.find`` per header instead of one search per secret, and lets a person
  reading a log see what a string is.  The rest is ``[A-Za-z0-9]``, which needs no
  escaping in a header, a URL or a Basic-auth user (no ``:``).
- **The real value's length, where it can be.**  Clients check tokens' shapes (a length
  check in an SDK, a fixed-width field), and a response that echoes the value is masked
  back to the placeholder: equal lengths keep a ``Content-Length`` true without
  reframing the body.  The cost is that the jail learns the value's length, which for a
  token is usually public (a format's documented length).  The floor is entropy: at
  least ``MIN_RANDOM`` random characters (22 of 62, about 131 bits), so a value shorter
  than ``PREFIX`` + 22 gets a longer placeholder (``Placeholder.same_length`` says so,
  and a masked echo of it changes the body's length: the proxy must reframe that).
  131 bits make a guess hopeless and a collision with ordinary traffic unheard of.
- **AWS SigV4 is not re-signed.**  A SigV4 request carries a signature computed in the
  capsule over the request with the secret key: a swapped value would not match it, and
  re-signing means holding the key's derivation here.  A placeholder inside a SigV4
  ``Authorization`` header or an ``X-Amz-*`` query parameter (a presigned URL) refuses
  the request with ``SIGV4`` as its reason (``Rewritten.unsupported``), not as an
  exfiltration.  A signature made with a placeholder as the secret key carries no
  placeholder at all: it goes out as it is and the server refuses it.
"""

from __future__ import annotations

import base64
import binascii
import functools
import re
import secrets
import string
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from mcp_server.core.netrules import normalize_host
from mcp_server.core.secretbind import AUTHORIZATION, Binding
from sandbox.errors import CcwError

PREFIX = "ccwph_"
ALPHABET = string.ascii_letters + string.digits
MIN_RANDOM = 22  # 22 * log2(62) ≈ 131 bits
FOUND = re.compile(re.escape(PREFIX).encode() + rb"[A-Za-z0-9]*")
UNSAFE_BYTES = (b"\r", b"\n", b"\0")
HEAD_END = b"\r\n\r\n"
SIGV4 = ("AWS SigV4 re-signing is not supported: the request carries a placeholder in {where}, and a SigV4 "
         "signature is computed in the capsule over the key, so no value can be swapped in; give such a client "
         "no ccw secret (ccw secret list)")
HEADER_NAME = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:")  # a header line starts with its name and a colon


@dataclass(frozen=True)
class Placeholder:
    """A capsule's stand-in for one secret."""

    text: str
    name: str  # the secret's name
    same_length: bool  # as long as the value was when the capsule was made


def make_placeholder(name: str, value_length: int) -> Placeholder:
    """A fresh random placeholder for a value of ``value_length`` bytes (see the module docstring)."""
    random_chars = max(MIN_RANDOM, value_length - len(PREFIX))
    text = PREFIX + "".join(secrets.choice(ALPHABET) for _ in range(random_chars))
    return Placeholder(text, name, len(text) == value_length)


class CapsuleSecrets:
    """One capsule's secrets: each binding, its placeholder, and the reverse map the proxy reads.

    Held only in the front end's memory, for the capsule's life; no value is kept here.
    """

    def __init__(self, bindings: Mapping[str, Binding], lengths: Mapping[str, int]) -> None:
        self.bindings = dict(bindings)
        self.placeholders = {name: make_placeholder(name, lengths[name]) for name in bindings}
        self.names = {p.text.encode(): name for name, p in self.placeholders.items()}  # placeholder -> secret

    def env(self) -> dict[str, str]:
        """The capsule's variables: each secret's name holding its placeholder."""
        return {name: p.text for name, p in self.placeholders.items()}

    def identify(self, found: bytes) -> str | None:
        """The secret whose placeholder ``found`` (a run from ``PREFIX`` on) is, contains or begins."""
        if found in self.names:
            return self.names[found]
        for text, name in self.names.items():
            if found.startswith(text) or text.startswith(found):
                return name
        return None

    def response_masker(self, values: Mapping[str, bytes]) -> ResponseMasker:
        """A masker turning each of ``values`` (name -> value) echoed in a response back into its placeholder."""
        pairs: dict[bytes, bytes] = {}
        for name, value in values.items():
            placeholder = self.placeholders[name].text.encode()
            pairs[value] = placeholder
            quoted = urllib.parse.quote(value, safe="").encode()
            if quoted != value:
                pairs[quoted] = placeholder
        return ResponseMasker(pairs)


@dataclass(frozen=True)
class Exfiltration:
    """A placeholder found where it may not go: which secret (None: an unknown ``PREFIX`` run) and where."""

    secret: str | None
    where: str


@dataclass(frozen=True)
class Rewritten:
    """``rewrite_request``'s answer: the head to send (None: refused), what was put in, and why not."""

    head: bytes | None = field(repr=False)  # it holds the values put in
    used: tuple[str, ...] = ()
    attempts: tuple[Exfiltration, ...] = ()
    problem: str | None = None  # a head that cannot be judged (bare CR, folded header, no end)
    unsupported: str | None = None  # a use of a placeholder ccw does not serve (SIGV4)


class _Judge:
    """One request's walk: what is allowed where, what was found, what to put in."""

    def __init__(self, capsule: CapsuleSecrets, host: str, port: int, host_ok: bool) -> None:
        self.capsule, self.host, self.port, self.host_ok = capsule, host, port, host_ok
        self.attempts: list[Exfiltration] = []
        self.used: list[str] = []
        self.sigv4: str | None = None  # where a SigV4 request carries a placeholder

    def scan(self, data: bytes, where: str) -> None:
        """Report every ``PREFIX`` run in ``data``: none may be there."""
        for match in FOUND.finditer(data):
            self.attempts.append(Exfiltration(self.capsule.identify(match.group()), where))

    def take(self, data: bytes, where: str, fits: Callable[[Binding], bool]) -> str | None:
        """The secret whose placeholder ``data`` is exactly, if its binding ``fits`` here; else report."""
        name = self.capsule.names.get(data)
        if name is None:
            self.scan(data, where)
            return None
        binding = self.capsule.bindings[name]
        if not fits(binding):
            self.attempts.append(Exfiltration(name, where))
        elif not binding.binds(self.host, self.port):
            self.attempts.append(Exfiltration(name, f"{where}, to {self.host}:{self.port}, a host it is not bound to"))
        elif not self.host_ok:
            self.attempts.append(Exfiltration(name, f"{where}, with a Host header or target naming another host"))
        else:
            self.used.append(name)
            return name
        return None


def _split_head(data: bytes) -> tuple[list[bytes], bytes] | str:
    """The head's lines and what follows it, or why the head cannot be judged."""
    end = data.find(HEAD_END)
    if end == -1:
        return "the request head is incomplete"
    lines = data[:end].split(b"\r\n")
    for line in lines:
        if any(bad in line for bad in UNSAFE_BYTES):
            return "the request head has a bare CR, LF or NUL inside a line"
    for line in lines[1:]:
        if line[:1] in (b" ", b"\t"):
            return "the request head folds a header onto a continuation line (obsolete, refused)"
        if not HEADER_NAME.match(line):
            return "a header line is not NAME: VALUE"
    if len(lines[0].split(b" ")) != 3:
        return "the request line is not METHOD TARGET VERSION"
    return lines, data[end + len(HEAD_END):]


def _host_matches(lines: list[bytes], host: str, port: int) -> bool:
    """True if the request names ``host:port`` wherever it names a host: its one Host header and, in
    absolute form, its target (which a server must prefer to Host, RFC 9112 3.2.2)."""
    values = [line.split(b":", 1)[1].strip() for line in lines[1:] if line.split(b":", 1)[0].lower() == b"host"]
    target = lines[0].split(b" ")[1]
    if len(values) != 1 or not _names(values[0], host, port):
        return False
    if target.startswith(b"/") or target == b"*":
        return True
    parsed = urllib.parse.urlsplit(target.decode("ascii", "replace"))
    return parsed.scheme in ("http", "https") and _names(parsed.netloc.encode(), host, port)


def _names(authority: bytes, host: str, port: int) -> bool:
    """True if ``authority`` (``host[:port]``) is ``host`` and ``port``, or a web port when it names none."""
    if b"@" in authority:
        return False  # userinfo in an authority: another way to write a host, never needed here
    text = authority.decode("ascii", "replace")
    named, sep, port_text = text.rpartition(":") if not text.endswith("]") else (text, "", "")
    if not sep or not port_text.isdigit():
        named, port_text = text, ""
    normal, _ = normalize_host(named)
    return normal == host and (int(port_text) == port if port_text else port in (80, 443))


def _template_fits(binding: Binding, header: bytes, value: bytes) -> bool:
    """True if ``value`` of ``header`` is exactly the binding's template around its placeholder."""
    return (binding.header is not None and binding.header.encode() == header
            and binding.format not in ("basic-user", "basic-password") and binding.query_param is None
            and FOUND.sub(b"{}", value) == binding.format.encode())


def _shown(name: bytes) -> str:
    """A header's or parameter's name as an attempt's ``where`` shows it: printable ASCII, at most 64 characters."""
    return "".join(chr(c) if 0x21 <= c <= 0x7E else "?" for c in name[:64])


def _names_param(key: bytes, binding: Binding) -> bool:
    return binding.query_param == key.decode("ascii", "replace")


def _has_format(fmt: str, binding: Binding) -> bool:
    return binding.format == fmt


def _checked(name: str, value: bytes, binding: Binding) -> bytes:
    """``value`` if it can go where ``binding`` says; the error never shows it."""
    if any(bad in value for bad in UNSAFE_BYTES) or (binding.format == "basic-user" and b":" in value):
        raise CcwError("INVALID_ARGUMENT", f"secret {name}'s value has a CR, LF or NUL (or, for basic-user, a "
                       "':'), which cannot go in a request: set it again (ccw secret set)", {"name": name})
    return value


def _request_line(judge: _Judge, line: bytes, values: Callable[[str], bytes]) -> bytes:
    method, target, version = line.split(b" ")
    path, question, query = target.partition(b"?")
    judge.scan(b" ".join((method, path, version)), "the request path")
    if not question or PREFIX.encode() not in query:
        return line
    params = []
    for piece in query.split(b"&"):
        key, equals, value = piece.partition(b"=")
        where = f"query parameter {_shown(key)}"
        if key.lower().startswith(b"x-amz-") and PREFIX.encode() in value:
            judge.sigv4 = where  # a presigned URL: not swapped, and not an exfiltration either
            params.append(piece)
            continue
        judge.scan(key, where)
        name = judge.take(value, where, functools.partial(_names_param, key)) \
            if equals and PREFIX.encode() in value else None
        if name is not None:
            real = _checked(name, values(name), judge.capsule.bindings[name])
            value = urllib.parse.quote(real, safe="").encode()
        params.append(key + equals + value)
    return b" ".join((method, path + b"?" + b"&".join(params), version))


def _basic(judge: _Judge, value: bytes, values: Callable[[str], bytes]) -> bytes | None:
    """An ``Authorization: Basic`` value with its user or password put in; None if it holds no placeholder."""
    try:
        decoded = base64.b64decode(value[6:].strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    if PREFIX.encode() not in decoded:
        return None
    user, colon, password = decoded.partition(b":")
    parts = []
    for part, fmt in ((user, "basic-user"), (password, "basic-password")):
        name = judge.take(part, f"Authorization: Basic's {fmt[6:]}", functools.partial(_has_format, fmt)) \
            if PREFIX.encode() in part else None
        parts.append(part if name is None else _checked(name, values(name), judge.capsule.bindings[name]))
    return b"Basic " + base64.b64encode(parts[0] + colon + parts[1])


def _header(judge: _Judge, line: bytes, values: Callable[[str], bytes]) -> bytes:
    raw_name, _, raw_value = line.partition(b":")
    name, value = raw_name.lower(), raw_value.strip(b" \t")
    where = f"header {_shown(raw_name)}"
    if name == AUTHORIZATION.encode() and value[:16].upper() == b"AWS4-HMAC-SHA256" and PREFIX.encode() in value:
        judge.sigv4 = where
        return line
    if name == AUTHORIZATION.encode() and value[:6].lower() == b"basic ":
        replaced = _basic(judge, value, values)
        if replaced is not None:
            return raw_name + b": " + replaced
    if PREFIX.encode() not in value:
        return line
    runs = FOUND.findall(value)
    secret = judge.take(runs[0], where, lambda b: _template_fits(b, name, value)) if len(runs) == 1 else None
    if len(runs) != 1:
        judge.scan(value, where)
    if secret is None:
        return line
    real = _checked(secret, values(secret), judge.capsule.bindings[secret])
    return raw_name + b": " + judge.capsule.bindings[secret].format.encode().replace(b"{}", real)


def rewrite_request(data: bytes, host: str, port: int, capsule: CapsuleSecrets,
                    values: Callable[[str], bytes]) -> Rewritten:
    """The request head in ``data`` with each placeholder replaced by its value, where its binding allows.

    ``host:port`` is where the proxy is sending the request (``host`` as
    ``netrules.normalize_host`` leaves it); ``data`` is the head and whatever of the body
    came with it.  A placeholder anywhere else, or sent to a host its secret is not bound
    to, refuses the whole request (``head`` None) and is reported in ``attempts``.
    ``values(name)`` is called only for the secrets put in.
    """
    split = _split_head(data)
    if isinstance(split, str):
        return Rewritten(None, problem=split)
    lines, rest = split
    judge = _Judge(capsule, host, port, _host_matches(lines, host, port))
    out = [_request_line(judge, lines[0], values)]
    out.extend(_header(judge, line, values) for line in lines[1:])
    judge.scan(rest, "the body")
    if judge.attempts:
        return Rewritten(None, attempts=tuple(judge.attempts))
    if judge.sigv4 is not None:
        return Rewritten(None, unsupported=SIGV4.format(where=judge.sigv4))
    return Rewritten(b"\r\n".join(out) + HEAD_END, tuple(dict.fromkeys(judge.used)))


class ResponseMasker:
    """Replaces each real value echoed in a response stream by its placeholder, across read boundaries.

    Sans-IO: ``feed`` takes what came from upstream and returns what may go to the jail
    now; it holds back the last ``len(longest value) - 1`` bytes, which could be the start
    of a value the next read completes.  ``close`` returns the rest.  It finds a value only
    in the bytes the client will read as they are: a body in a content coding or in chunks
    is the proxy's to refuse or unframe first (egress/maskedbody.py).
    """

    def __init__(self, pairs: Mapping[bytes, bytes]) -> None:
        self._pairs = sorted(((v, p) for v, p in pairs.items() if v), key=lambda pair: -len(pair[0]))
        self._keep = max((len(v) for v, _ in self._pairs), default=1) - 1
        self._held = b""

    def _mask(self, data: bytes) -> bytes:
        for value, placeholder in self._pairs:
            data = data.replace(value, placeholder)
        return data

    def feed(self, data: bytes) -> bytes:
        """What of ``self._held + data`` can be passed on, masked.  The bytes held back are the
        upstream's own, never masked ones: a placeholder's last bytes held would pass in ``close``
        for a value's first (a placeholder ending as the value begins came out one byte wrong)."""
        raw = self._held + data
        cut = max(0, len(raw) - self._keep)
        moved = True
        while moved:  # a value that the cut would split goes out whole, masked
            moved = False
            for value, _ in self._pairs:
                start = raw.find(value, max(0, cut - len(value) + 1))  # the first that could straddle it
                if 0 <= start < cut:
                    cut, moved = start + len(value), True
        self._held = raw[cut:]
        return self._mask(raw[:cut])

    def close(self) -> bytes:
        """The bytes held back, masked: the stream has ended.  A stream cut inside an echoed
        value (a reset, the upstream's own cut) ends in the value's first bytes: a tail that is
        a value's beginning goes as its placeholder's beginning, so no part of a value reaches
        the jail.  The price: a body whose last bytes happen to be a value's first is changed
        there, only in an answer to a request a value went into."""
        rest, self._held = self._held, b""
        begun = [(size, placeholder) for value, placeholder in self._pairs  # the longest beginning, once
                 for size in range(min(len(value) - 1, len(rest)), 0, -1) if rest.endswith(value[:size])]
        if begun:
            size, placeholder = max(begun, key=lambda found: found[0])
            return self._mask(rest[:-size]) + placeholder[:size]
        return self._mask(rest)

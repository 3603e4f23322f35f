"""core/placeholders: a capsule's placeholders, the request rewrite the proxy will make, and response masking."""

from __future__ import annotations

import base64
import re
from collections.abc import Callable

import pytest

from mcp_server.core.placeholders import (
    MIN_RANDOM,
    PREFIX,
    CapsuleSecrets,
    ResponseMasker,
    make_placeholder,
    rewrite_request,
)
from mcp_server.core.secretbind import make_binding
from sandbox.errors import CcwError

TOKEN = b"ghp_REALVALUE0123456789abcdefghijklmnopq"  # 40 bytes
API_KEY = b"sk-REALKEY-9876543210-zyxwvutsrq"
PASSWORD = b"hunter2-REAL-PASSWORD-longer-than-28"
QUERY_KEY = b"qk/REAL+key=="
VALUES = {"GH_TOKEN": TOKEN, "API_KEY": API_KEY, "GIT_PASSWORD": PASSWORD, "INDEX_KEY": QUERY_KEY}


def _capsule() -> CapsuleSecrets:
    bindings = {
        "GH_TOKEN": make_binding("GH_TOKEN", ["api.github.example"]),
        "API_KEY": make_binding("API_KEY", ["models.example:8443"], header="X-Api-Key"),
        "GIT_PASSWORD": make_binding("GIT_PASSWORD", ["git.example"], fmt="basic-password"),
        "INDEX_KEY": make_binding("INDEX_KEY", ["pypi.example"], fmt="query:key"),
    }
    return CapsuleSecrets(bindings, {name: len(value) for name, value in VALUES.items()})


def _values(asked: list[str]) -> Callable[[str], bytes]:
    def value(name: str) -> bytes:
        asked.append(name)
        return VALUES[name]
    return value


def _head(*lines: str, body: bytes = b"") -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _no_value(data: bytes | None) -> None:
    for value in VALUES.values():
        assert data is None or value not in data


def test_placeholders_are_random_prefixed_and_as_long_as_the_value() -> None:
    first, second = _capsule(), _capsule()
    ph = first.placeholders["GH_TOKEN"]
    assert ph.text.startswith(PREFIX) and len(ph.text) == len(TOKEN) and ph.same_length
    assert re.fullmatch(PREFIX + "[A-Za-z0-9]+", ph.text)
    assert first.env()["GH_TOKEN"] != second.env()["GH_TOKEN"]  # unique to the capsule
    assert first.names[ph.text.encode()] == "GH_TOKEN"
    short = make_placeholder("PIN", 4)  # too short to hide 131 bits: longer, and says so
    assert len(short.text) == len(PREFIX) + MIN_RANDOM and not short.same_length


def test_a_bearer_header_to_its_host_gets_the_value() -> None:
    capsule, asked = _capsule(), list[str]()
    ph = capsule.env()["GH_TOKEN"]
    out = rewrite_request(_head("GET /user HTTP/1.1", "Host: api.github.example", f"authorization: Bearer {ph}",
                                "Accept: */*"), "api.github.example", 443, capsule, _values(asked))
    assert out.head is not None and out.attempts == () and out.used == ("GH_TOKEN",)
    assert b"authorization: Bearer " + TOKEN + b"\r\n" in out.head  # the header name's case does not matter
    assert ph.encode() not in out.head and asked == ["GH_TOKEN"]
    assert out.head.endswith(b"Accept: */*\r\n\r\n")
    assert TOKEN.decode() not in repr(out) + str(out)  # a log line of the answer would not show the value


def test_a_named_header_on_its_port_only() -> None:
    capsule = _capsule()
    ph = capsule.env()["API_KEY"]
    head = _head("POST /v1/chat HTTP/1.1", "Host: models.example:8443", f"X-API-KEY: {ph}")
    assert rewrite_request(head, "models.example", 8443, capsule, VALUES.__getitem__).used == ("API_KEY",)
    wrong_port = rewrite_request(_head("POST / HTTP/1.1", "Host: models.example", f"X-Api-Key: {ph}"),
                                 "models.example", 443, capsule, VALUES.__getitem__)
    assert wrong_port.head is None and wrong_port.attempts[0].secret == "API_KEY"
    assert "not bound" in wrong_port.attempts[0].where


@pytest.mark.parametrize("host", ["evil.example", "api.github.example.evil.example"])
def test_a_placeholder_to_another_host_is_an_attempt_and_nothing_is_asked(host: str) -> None:
    capsule, asked = _capsule(), list[str]()
    ph = capsule.env()["GH_TOKEN"]
    out = rewrite_request(_head("GET / HTTP/1.1", f"Host: {host}", f"Authorization: Bearer {ph}"),
                          host, 443, capsule, _values(asked))
    assert out.head is None and asked == []
    assert [a.secret for a in out.attempts] == ["GH_TOKEN"] and host in out.attempts[0].where


def test_a_host_header_naming_another_host_refuses_the_swap() -> None:
    # Domain fronting: TLS to the bound host, a Host header routing to someone else's site behind it.
    capsule = _capsule()
    ph = capsule.env()["GH_TOKEN"]
    for hosts in (["Host: evil.example"], [], ["Host: api.github.example", "Host: evil.example"]):
        out = rewrite_request(_head("GET / HTTP/1.1", *hosts, f"Authorization: Bearer {ph}"),
                              "api.github.example", 443, capsule, VALUES.__getitem__)
        assert out.head is None and "Host header" in out.attempts[0].where


@pytest.mark.parametrize("target", ["http://evil.example/user", "https://evil.example:443/user",
                                    "http://api.github.example@evil.example/user"])
def test_an_absolute_target_naming_another_host_refuses_the_swap(target: str) -> None:
    # A server prefers the target's authority to Host (RFC 9112 3.2.2): it must name the bound host too.
    capsule = _capsule()
    ph = capsule.env()["GH_TOKEN"]
    out = rewrite_request(_head(f"GET {target} HTTP/1.1", "Host: api.github.example", f"Authorization: Bearer {ph}"),
                          "api.github.example", 443, capsule, VALUES.__getitem__)
    assert out.head is None and "Host header" in out.attempts[0].where
    same = rewrite_request(_head("GET https://api.github.example/user HTTP/1.1", "Host: api.github.example",
                                 f"Authorization: Bearer {ph}"), "api.github.example", 443, capsule, VALUES.__getitem__)
    assert same.used == ("GH_TOKEN",)


@pytest.mark.parametrize("where", ["header", "other-secret-header", "body", "path", "cookie-template"])
def test_a_placeholder_anywhere_else_is_an_attempt(where: str) -> None:
    capsule = _capsule()
    ph = capsule.env()["GH_TOKEN"]
    lines = ["GET /user HTTP/1.1", "Host: api.github.example"]
    body = b""
    if where == "header":
        lines.append(f"X-Debug: {ph}")
    elif where == "other-secret-header":
        lines.append(f"X-Api-Key: {ph}")
    elif where == "body":
        lines[0] = "POST /user HTTP/1.1"
        body = f'{{"token": "{ph}"}}'.encode()
    elif where == "path":
        lines[0] = f"GET /user/{ph} HTTP/1.1"
    else:
        lines.append(f"Authorization: Bearer {ph} extra")  # not exactly the template
    out = rewrite_request(_head(*lines, body=body), "api.github.example", 443, capsule, VALUES.__getitem__)
    assert out.head is None and [a.secret for a in out.attempts] == ["GH_TOKEN"]


def test_a_placeholder_split_across_headers_is_never_completed() -> None:
    capsule, asked = _capsule(), list[str]()
    ph = capsule.env()["GH_TOKEN"]
    half = len(ph) // 2
    out = rewrite_request(_head("GET / HTTP/1.1", "Host: api.github.example", f"Authorization: Bearer {ph[:half]}",
                                f"Authorization: {ph[half:]}"), "api.github.example", 443, capsule, _values(asked))
    assert out.head is None and asked == []
    assert [(a.secret, a.where) for a in out.attempts] == [("GH_TOKEN", "header Authorization")]


@pytest.mark.parametrize("smuggled", [
    "X-A: x\rAuthorization: Bearer {ph}",  # bare CR: some servers split there
    "X-A: x\nAuthorization: Bearer {ph}",  # bare LF
    "X-A: x\0y",
    " Authorization: Bearer {ph}",  # obs-fold continuation
    "Authorization : Bearer {ph}",  # space before the colon
])
def test_header_splitting_is_refused_whole(smuggled: str) -> None:
    capsule, asked = _capsule(), list[str]()
    ph = capsule.env()["GH_TOKEN"]
    out = rewrite_request(_head("GET / HTTP/1.1", "Host: api.github.example", smuggled.format(ph=ph)),
                          "api.github.example", 443, capsule, _values(asked))
    assert out.head is None and out.problem and asked == []


def test_basic_auth_password_round_trip() -> None:
    capsule = _capsule()
    ph = capsule.env()["GIT_PASSWORD"]
    basic = base64.b64encode(f"agent:{ph}".encode()).decode()
    out = rewrite_request(_head("GET /repo.git/info/refs?service=git-upload-pack HTTP/1.1", "Host: git.example",
                                f"Authorization: Basic {basic}"), "git.example", 443, capsule, VALUES.__getitem__)
    assert out.head is not None and out.used == ("GIT_PASSWORD",)
    sent = re.search(rb"Authorization: Basic (\S+)\r\n", out.head)
    assert sent and base64.b64decode(sent.group(1)) == b"agent:" + PASSWORD
    swapped = rewrite_request(_head("GET / HTTP/1.1", "Host: git.example", "Authorization: Basic "
                                    + base64.b64encode(f"{ph}:x".encode()).decode()),
                              "git.example", 443, capsule, VALUES.__getitem__)
    assert swapped.head is None and "user" in swapped.attempts[0].where  # bound as the password, sent as the user


def test_basic_user_round_trip_and_a_bearer_placeholder_inside_basic() -> None:
    bindings = {"GIT_USER": make_binding("GIT_USER", ["git.example"], fmt="basic-user"),
                "GH_TOKEN": make_binding("GH_TOKEN", ["git.example"])}
    capsule = CapsuleSecrets(bindings, {"GIT_USER": 30, "GH_TOKEN": 40})
    values = {"GIT_USER": b"user-REAL", "GH_TOKEN": TOKEN}
    user, token = capsule.env()["GIT_USER"], capsule.env()["GH_TOKEN"]
    ok = rewrite_request(_head("GET / HTTP/1.1", "Host: git.example", "Authorization: basic "
                               + base64.b64encode(f"{user}:pw".encode()).decode()),
                         "git.example", 443, capsule, values.__getitem__)
    assert ok.head is not None and base64.b64encode(b"user-REAL:pw") in ok.head
    smuggle = rewrite_request(_head("GET / HTTP/1.1", "Host: git.example", "Authorization: Basic "
                                    + base64.b64encode(f"x:{token}".encode()).decode()),
                              "git.example", 443, capsule, values.__getitem__)
    assert smuggle.head is None and smuggle.attempts[0].secret == "GH_TOKEN"


def test_a_query_parameter_is_put_in_escaped_and_only_under_its_name() -> None:
    capsule = _capsule()
    ph = capsule.env()["INDEX_KEY"]
    out = rewrite_request(_head(f"GET /simple/pkg/?a=1&key={ph} HTTP/1.1", "Host: pypi.example"),
                          "pypi.example", 443, capsule, VALUES.__getitem__)
    assert out.head is not None and out.head.startswith(b"GET /simple/pkg/?a=1&key=qk%2FREAL%2Bkey%3D%3D HTTP/1.1")
    other = rewrite_request(_head(f"GET /simple/?token={ph} HTTP/1.1", "Host: pypi.example"),
                            "pypi.example", 443, capsule, VALUES.__getitem__)
    assert other.head is None and other.attempts[0].where == "query parameter token"
    shown = rewrite_request(_head(f"GET /?\x1b[31mkey={ph} HTTP/1.1", "Host: pypi.example"),
                            "pypi.example", 443, capsule, VALUES.__getitem__)
    assert shown.attempts[0].where == "query parameter ?[31mkey"  # no escape reaches a person's terminal


def test_an_unknown_prefixed_run_is_reported_without_a_name() -> None:
    capsule = _capsule()
    out = rewrite_request(_head("GET / HTTP/1.1", "Host: api.github.example", f"X-A: {PREFIX}notours"),
                          "api.github.example", 443, capsule, VALUES.__getitem__)
    assert out.head is None and out.attempts[0].secret is None
    plain = rewrite_request(_head("GET / HTTP/1.1", "Host: h.example", "X-A: b"), "h.example", 443, capsule,
                            VALUES.__getitem__)
    assert plain.head == _head("GET / HTTP/1.1", "Host: h.example", "X-A: b") and plain.used == ()


def test_a_value_that_cannot_go_in_a_header_is_an_error_without_the_value() -> None:
    capsule = _capsule()
    ph = capsule.env()["GH_TOKEN"]
    with pytest.raises(CcwError) as caught:
        rewrite_request(_head("GET / HTTP/1.1", "Host: api.github.example", f"Authorization: Bearer {ph}"),
                        "api.github.example", 443, capsule, lambda name: b"evil\r\nX-Injected: 1")
    assert "GH_TOKEN" in caught.value.message and b"evil" not in repr(caught.value).encode()
    assert rewrite_request(b"GET / HTTP/1.1\r\nHost: x", "x", 443, capsule, VALUES.__getitem__).problem


def test_response_masker_across_every_split() -> None:
    capsule = _capsule()
    gh, index = capsule.env()["GH_TOKEN"].encode(), capsule.env()["INDEX_KEY"].encode()
    body = b"echo: " + TOKEN + b" and escaped qk%2FREAL%2Bkey%3D%3D, raw " + QUERY_KEY + b" end"
    expected = b"echo: " + gh + b" and escaped " + index + b", raw " + index + b" end"
    for cut in range(len(body) + 1):
        masker = capsule.response_masker(VALUES)
        out = masker.feed(body[:cut]) + masker.feed(body[cut:]) + masker.close()
        assert out == expected
    byte_by_byte = capsule.response_masker(VALUES)
    streamed = b"".join(byte_by_byte.feed(body[i:i + 1]) for i in range(len(body))) + byte_by_byte.close()
    assert streamed == expected
    assert ResponseMasker({}).feed(b"abc") == b"abc"


def test_a_stream_cut_inside_an_echoed_value_gives_away_none_of_it() -> None:
    """A response that ends partway through a value (the upstream's connection cut mid-echo)
    ends in the placeholder's beginning instead, whatever the cut."""
    capsule = _capsule()
    gh = capsule.env()["GH_TOKEN"].encode()
    for size in range(1, len(TOKEN)):
        masker = capsule.response_masker(VALUES)
        out = masker.feed(b"echo: " + TOKEN[:size]) + masker.close()
        assert out == b"echo: " + gh[:size] and TOKEN[: max(size, 4)] not in out
    masker = capsule.response_masker(VALUES)
    assert masker.feed(b"no value here") + masker.close() == b"no value here"


def test_an_echoed_value_whose_placeholder_ends_as_the_value_begins_comes_back_whole() -> None:
    """The bytes held back for ``close`` are the upstream's own: a placeholder's last byte that
    is also the value's first was once taken, at the stream's end, for a value begun, and the
    jail got the placeholder one byte wrong (a CI run: ``...0t`` came back ``...0c``)."""
    value, placeholder = b"tokenvalue-0123456789", b"ccwph_abcdefghijklmnot"
    assert placeholder.endswith(value[:1])
    body = b"you sent Bearer " + value
    for cut in range(len(body) + 1):
        masker = ResponseMasker({value: placeholder})
        out = masker.feed(body[:cut]) + masker.feed(body[cut:]) + masker.close()
        assert out == b"you sent Bearer " + placeholder, cut
    masker = ResponseMasker({value: placeholder})
    assert masker.feed(body + b"!") + masker.close() == b"you sent Bearer " + placeholder + b"!"

"""Method/path rules (core/netrules.py's grammar, core/httprules.py's matcher): parsing to one
canonical text, the read-only preset, what a path must be to be judged, and each way of
writing a path that a server would read as another place refused."""

from __future__ import annotations

import pytest

from mcp_server.core import httprules, netrules
from mcp_server.core.httprules import BadPath, RequestRules, normal_path
from sandbox.errors import CcwError


@pytest.mark.parametrize(("given", "canonical"), [
    ("GET,HEAD https://pypi.example/simple/**", "GET,HEAD https://pypi.example/simple/**"),
    ("head,get HTTPS://PyPI.Example:443/simple/**", "GET,HEAD https://pypi.example/simple/**"),
    ("READ https://pypi.example", "GET,HEAD,OPTIONS https://pypi.example/**"),
    ("POST http://api.internal:8080/v1/**", "POST http://api.internal:8080/v1/**"),
    ("* http://10.1.2.3:80/x/*/y", "* http://10.1.2.3/x/*/y"),
    ("GET https://[fd00::1]:8443/", "GET https://[fd00::1]:8443/"),
    ("  PUT,PUT  http://h.example/a  ", "PUT http://h.example/a"),
])
def test_rule_parses_to_its_canonical_text(given: str, canonical: str) -> None:
    rule = netrules.parse_rule(given)
    assert rule.text == canonical and rule.is_http
    assert netrules.parse_rule(canonical) == rule  # the canonical text reads back to the same rule


def test_read_preset_and_ports() -> None:
    read = netrules.parse_rule("READ https://pypi.example/simple/**")
    assert read.methods == netrules.READ == ("GET", "HEAD", "OPTIONS")
    assert (read.host, read.port, read.scheme, read.kind) == ("pypi.example", 443, "https", "name")
    assert netrules.parse_rule("GET http://10.1.2.3:8080/").kind == "ip"


@pytest.mark.parametrize(("given", "said"), [
    ("GET https://*.example.com/", "no wildcard or CIDR"),
    ("GET ftp://x.example/", "http:// or https://"),
    ("GET https://x.example/a/../b", "dot"),
    ("GET https://x.example/a/./b", "dot"),
    ("GET https://x.example/%2e%2e/b", "no %"),
    ("GET https://x.example/a?b=1", "no %, ?"),
    ("GET https://x.example/a\\b", "no %, ?"),
    ("GET https://user@x.example/", "no user@"),
    ("G3T https://x.example/", "are not GET,POST"),
    ("GET https://x.example/ extra", "two words"),
    ("https://x.example/", "two words"),
    ("GET https://127.1/", "IPv4"),
])
def test_bad_rules_refused_naming_the_grammar(given: str, said: str) -> None:
    with pytest.raises(CcwError) as caught:
        netrules.parse_rule(given)
    assert caught.value.code == "INVALID_ARGUMENT" and said in caught.value.message
    assert repr(given.strip()) in caught.value.message


def test_rule_admits_its_host_and_port_only() -> None:
    spec = netrules.parse_network(["READ https://pypi.example/simple/**", "POST http://api.internal:8080/v1/**"])
    assert spec is not None
    assert netrules.decide(spec, "pypi.example", 443).allowed
    assert netrules.decide(spec, "API.internal.", 8080).rule == "POST http://api.internal:8080/v1/**"
    assert not netrules.decide(spec, "pypi.example", 80).allowed
    assert not netrules.decide(spec, "sub.pypi.example", 443).allowed
    assert not netrules.decide(spec, "api.internal", 80).allowed
    # Recorded per exec and replayed as any rule: the canonical text is in the spec's JSON and its id.
    again = netrules.parse_network(spec.to_json())
    assert again == spec and netrules.rules_id(again) == netrules.rules_id(spec)
    wider = netrules.changed(spec, allow=["GET http://api.internal:8080/v1/**"])
    assert netrules.rules_id(wider) != netrules.rules_id(spec)


@pytest.mark.parametrize(("target", "path"), [
    ("/simple/requests/", "/simple/requests/"),
    ("/simple/%72equests/?x=%2e%2e/..", "/simple/requests/"),  # unreserved decoded; the query is not judged
    ("/a%7eb/%41", "/a~b/A"),
    ("/a%20b/%c3%a9", "/a%20b/%C3%A9"),  # other escapes kept, upper case
    ("/a;v=1/b", "/a;v=1/b"),
    ("/a//b", "/a//b"),
])
def test_normal_path(target: str, path: str) -> None:
    assert normal_path(target) == path


@pytest.mark.parametrize("target", [
    "/simple/../admin", "/simple/./x", "/simple/%2e%2e/admin", "/simple/%2E./admin", "/simple/..;/admin",
    "/simple/..%2fadmin", "/simple/%2F..", "/simple\\..\\admin", "/simple/%5c..", "/simple/%252e%252e/x",
    "/simple/%00", "/simple/%zz", "/simple/%2", "simple/x", "*", "http://x/", "/a b", "/a\x7f", "/é", "/a#b",
])
def test_paths_a_server_could_read_otherwise_are_refused(target: str) -> None:
    with pytest.raises(BadPath):
        normal_path(target)


def _rules(*texts: str) -> RequestRules:
    return RequestRules(netrules.parse_rules(texts))


def test_check_by_method_path_and_scheme() -> None:
    rules = _rules("GET,HEAD https://pypi.example/simple/**", "READ http://api.internal:8080/**",
                   "POST http://api.internal:8080/v1/*/run", "pypi.example")
    assert rules.hosts() == {("pypi.example", 443), ("api.internal", 8080)}
    assert rules.check("pypi.example", 80, "http", "POST", "/") is None  # no method/path rule there
    ok = rules.check("pypi.example", 443, "https", b"GET", b"/simple/requests/?x=1")
    assert ok is not None and ok.allowed and ok.rule == "GET,HEAD https://pypi.example/simple/**"
    assert ok.line == "GET /simple/requests/"  # no query in the record
    run = rules.check("api.internal", 8080, "http", "POST", "/v1/job7/run")
    assert run is not None and run.allowed and run.rule == "POST http://api.internal:8080/v1/*/run"
    for method, target in [("POST", "/v1//run"), ("POST", "/v1/a/b/run"), ("DELETE", "/v1/x"), ("get", "/")]:
        refused = rules.check("api.internal", 8080, "http", method, target)
        assert refused is not None and not refused.allowed and refused.rule is None
        assert "GET,HEAD,OPTIONS http://api.internal:8080/**" in refused.reason  # the rules it missed, named
        assert refused.line == f"{method} {target}"
    # A host rule beside method/path rules does not widen them: the host is narrowed.
    post = rules.check("pypi.example", 443, "https", "POST", "/simple/x")
    assert post is not None and not post.allowed and "GET,HEAD https://pypi.example/simple/**" in post.reason
    # The scheme counts: an https rule does not judge a plain request to its port as allowed.
    plain = rules.check("pypi.example", 443, "http", "GET", "/simple/x")
    assert plain is not None and not plain.allowed
    bad = rules.check("pypi.example", 443, "https", "GET", "/simple/%2e%2e/admin")
    assert bad is not None and not bad.allowed and "dot segment" in bad.reason


def test_glob_pattern() -> None:
    assert httprules.pattern("/a/**").match("/a/") and httprules.pattern("/a/**").match("/a/b/c")
    assert not httprules.pattern("/a/**").match("/a")
    assert httprules.pattern("/a/**/z").match("/a/z") is None  # "/a/" + "" + "/z" would be /a//z
    assert httprules.pattern("/a/**/z").match("/a/b/c/z")
    assert httprules.pattern("/a/*.whl").match("/a/x.whl") and not httprules.pattern("/a/*.whl").match("/a/b/x.whl")
    assert not httprules.pattern("/a.b").match("/aXb")  # literal text is literal


def test_of_follows_the_spec() -> None:
    spec = netrules.parse_network(["READ http://h.example/**"])
    assert spec is not None
    assert httprules.of(spec).hosts() == {("h.example", 80)}
    changed = netrules.changed(spec, allow=["h.example"], remove=["READ http://h.example/**"])
    assert httprules.of(changed).hosts() == frozenset()

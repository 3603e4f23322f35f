"""Method/path rules end to end (issue 38 "Shown by"): a POST to a read-only host is refused with
the rule named and a GET on it passes; a rule added live (capsule_network) counts from the next
request; each exec's record keeps the request line; a replay runs each exec under the
method/path rules its witness recorded, and one allowed the host without them is refused.

The host is a server on the host's loopback (netfixtures.HttpLoopback), reached through the
capsule's proxy by exact-address rules: no fixed address, no shared namespace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sandbox.errors import CcwError
from tests.support.netfixtures import HttpLoopback

# Through the proxy (--noproxy '': the jail's NO_PROXY names its own loopback); each request
# prints its status and its body's first line.
REQUESTS = ("for spec in \"$@\"; do set -- $spec; code=$(curl -sS --noproxy '' -X $1 ${3:+-d $3} -o /tmp/body "
            "-w '%{http_code}' \"http://127.0.0.1:$PORT$2\"); echo \"$code $(head -n 1 /tmp/body)\"; done")


def _requests(port: int, *specs: str) -> list[str]:
    return ["sh", "-c", f"PORT={port}; " + REQUESTS, "sh", *specs]


def test_read_only_host_post_refused_naming_the_rule_get_passes_and_replays_keep_the_rules(
        tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario(t: Any, server: HttpLoopback) -> dict[str, Any]:
        read = f"READ http://127.0.0.1:{server.port}/**"
        cap = (await t.call("capsule_create", {"workspace": str(ws), "network": [read]}))["capsule_id"]
        one = await t.call("capsule_exec", {"capsule_id": cap, "cmd": _requests(
            server.port, "GET /simple/x/", "POST /simple/x/ body=secret-body", "HEAD /")})
        changed = await t.call("capsule_network", {"capsule_id": cap,
                                                   "allow": [f"post http://127.0.0.1:{server.port}/v1/**"]})
        two = await t.call("capsule_exec", {"capsule_id": cap, "cmd": _requests(
            server.port, "POST /v1/run a=1", "POST /simple/x/ a=1", "DELETE /v1/run")})
        witness = await t.call("capsule_witness", {"capsule_id": cap})
        replayed = await t.call("capsule_replay", {"witness_id": witness["witness_id"],
                                                   "network": changed["network"]["allow"]})
        try:
            await t.call("capsule_replay", {"witness_id": witness["witness_id"],
                                            "network": [f"127.0.0.1:{server.port}"]})
            refused: Any = None
        except CcwError as exc:
            refused = exc
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"one": one, "two": two, "changed": changed, "replayed": replayed, "refused": refused}

    with HttpLoopback() as server:
        out = tools.run(lambda t: scenario(t, server))
        accepted = server.accepted
    port = next(r["port"] for r in out["one"]["touched"]["network"])
    read = f"GET,HEAD,OPTIONS http://127.0.0.1:{port}/**"
    post = f"POST http://127.0.0.1:{port}/v1/**"
    lines = out["one"]["stdout"].splitlines()
    assert lines[0] == "200 ok" and lines[2].startswith("200"), out["one"]
    assert lines[1].startswith("403 ccw: no rule allows http POST /simple/x/") and read in lines[1], lines[1]
    assert [(r["allowed"], r["request"], r["rule"]) for r in out["one"]["touched"]["network"]] == [
        (True, "GET /simple/x/", read), (False, "POST /simple/x/", read), (True, "HEAD /", read)]
    assert read in out["one"]["touched"]["network"][1]["reason"]
    assert "secret-body" not in str(out["one"]["touched"])  # bodies are not recorded
    # Live: the POST rule is canonical in the capsule's rules, and counts from the next request.
    assert sorted(out["changed"]["network"]["allow"]) == sorted([post, read]), out["changed"]
    codes = [line.split(" ", 1)[0] for line in out["two"]["stdout"].splitlines()]
    assert codes == ["200", "403", "403"], out["two"]
    # A refused request's record keeps the rule that admitted its connection; its reason, the rules missed.
    assert [(r["rule"], r["allowed"]) for r in out["two"]["touched"]["network"]] == [
        (post, True), (read, False), (read, False)]
    assert accepted == 6  # three requests allowed, and the same three again in the replay: no refused one reached it
    # The witness recorded each exec's rules: a replay under both runs exec 1 under READ only,
    # so its POST is refused again and the outputs match; the host alone lacks the rules.
    replayed = out["replayed"]
    assert replayed["replay_ok"] and replayed["output_identical"], replayed["mismatches"]
    refused = out["refused"]
    assert refused is not None and refused.code == "PERMISSION_DENIED", refused
    assert read in refused.details["lacking"] and refused.details["exec"] == 1, refused.details

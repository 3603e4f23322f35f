"""Network for capsules end to end (issue 15 "Shown by"), through the real tools and helper.

Each test starts the servers of ``netfixtures`` in a network namespace of its own
(10.98.0.2, a veth to the host) and a capsule whose allowlist names some of them.  The
commands in the capsule reach out the way real tools do: curl and pip through the
``HTTP_PROXY``/``HTTPS_PROXY`` the jail gets; Python sockets for the attempts that must
fail (straight to the server's address, UDP, DNS, IPv6, the host's loopback).  Nothing
here sends a packet anywhere but loopback and the namespaces the tests (and the helper)
make: every address a capsule tries is the server's, the egress namespace's, or an
unassigned one that the egress namespace answers itself.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support import netfixtures as nf
from tests.support.cli_process import ccw
from tests.support.net_probes import PROBES

SERVER = nf.SERVER_ADDRESS
HTTP = f"{SERVER}:{nf.HTTP_PORT}"
HTTPS = f"{SERVER}:{nf.HTTPS_PORT}"
REDIRECT = f"{SERVER}:{nf.REDIRECT_PORT}"
FAST_S = 2.0  # "fail at once": every refused attempt ends well within this
PYTHON = "/usr/bin/python3"

@pytest.fixture
def servers(tmp_path: Path, root_required: None) -> Iterator[nf.Servers]:
    """The server namespace with a wheel in its index and files to fetch."""
    root = tmp_path / "srv"
    nf.build_wheel(root / "wheels")
    nf.big_file(root, "small.bin", 1000)
    nf.big_file(root, "eight.bin", 8 << 20)
    with nf.server_namespace(root, "http://denied.example/next") as running:
        yield running


@pytest.fixture
def workspace(tmp_path: Path, servers: nf.Servers) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "probes.py").write_text(PROBES)
    shutil.copy(servers.cert, ws / "server.pem")  # the jail has its own /tmp: the CA goes in the workspace
    return ws


def _places(ran: dict[str, Any]) -> set[tuple[str, int, str, bool]]:
    return {(r["host"], r["port"], r["protocol"], r["allowed"]) for r in ran["touched"]["network"] or ()}


def _curl(*args: str) -> list[str]:
    return ["curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{http_code} %{size_download}\n", *args]


def test_allowed_http_and_https_work_through_the_proxy_and_are_recorded(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = await t.call("capsule_create", {"workspace": str(workspace), "network": [HTTP, HTTPS]})
        plain = await t.call("capsule_exec", {"capsule_id": cap["capsule_id"], "cmd": _curl(f"http://{HTTP}/files/small.bin")})
        tls = await t.call("capsule_exec", {"capsule_id": cap["capsule_id"],
                                            "cmd": _curl("--cacert", "server.pem", f"https://{HTTPS}/files/small.bin")})
        env = await t.call("capsule_exec", {"capsule_id": cap["capsule_id"],
                                            "cmd": ["sh", "-c", "echo $HTTPS_PROXY $ALL_PROXY"]})
        socks = await t.call("capsule_exec", {"capsule_id": cap["capsule_id"], "cmd": _curl(
            "-x", "socks5h://10.99.0.1:1080", f"http://{HTTP}/files/small.bin")})
        return {"cap": cap, "plain": plain, "tls": tls, "env": env, "socks": socks}

    out = tools.run(scenario)
    assert out["cap"]["network"] == {"allow": [HTTP, HTTPS], "max_bytes": 1 << 30, "max_connections": 512}
    assert out["plain"]["exit_code"] == 0 and out["plain"]["stdout"] == "200 1000\n", out["plain"]
    assert out["tls"]["exit_code"] == 0 and out["tls"]["stdout"] == "200 1000\n", out["tls"]
    assert out["env"]["stdout"].split() == ["http://10.99.0.1:3128", "socks5h://10.99.0.1:1080"]
    plain = out["plain"]["touched"]["network"]
    assert [(r["host"], r["port"], r["protocol"], r["allowed"], r["rule"]) for r in plain] == [
        (SERVER, nf.HTTP_PORT, "http", True, HTTP)]
    assert plain[0]["bytes_in"] >= 1000 and plain[0]["bytes_out"] > 0
    tls = out["tls"]["touched"]["network"]
    assert ([(r["host"], r["port"], r["protocol"], r["allowed"]) for r in tls]
            == [(SERVER, nf.HTTPS_PORT, "https", True)])
    assert out["socks"]["stdout"] == "200 1000\n", out["socks"]  # other TCP goes through SOCKS5
    assert _places(out["socks"]) == {(SERVER, nf.HTTP_PORT, "socks5", True)}
    assert out["plain"]["network_notes"] == [] and "network" not in out["plain"]["touched_unavailable"]


def test_every_other_way_out_fails_at_once_and_is_recorded_as_denied(tools: Any, workspace: Path) -> None:
    with nf.loopback_server() as loop_port:
        async def scenario(t: Any) -> dict[str, Any]:
            cap = await t.call("capsule_create", {"workspace": str(workspace), "network": [HTTP]})
            return await t.call("capsule_exec", {"capsule_id": cap["capsule_id"],
                                                 "cmd": [PYTHON, "probes.py", SERVER, str(loop_port)]})

        ran = tools.run(scenario)
    results = {r["case"]: r for r in map(json.loads, ran["stdout"].splitlines())}
    assert set(results) == {"denied-host", "direct-tcp", "udp", "raw-dns", "ipv6", "host-loopback-direct",
                            "ipv6-link-local", "ipv4-link-local", "host-loopback-proxied"}, ran
    for case, result in results.items():
        assert not result["ok"], (case, result)
        assert result["elapsed"] < FAST_S, (case, result)
    assert "403" in results["denied-host"]["error"] and "403" in results["host-loopback-proxied"]["error"]
    for case in ("direct-tcp", "udp", "raw-dns", "ipv6", "host-loopback-direct", "ipv6-link-local", "ipv4-link-local"):
        assert "ConnectionRefusedError" in results[case]["error"], (case, results[case])
    places = _places(ran)
    assert {("denied.example", 80, "http", False), (SERVER, nf.HTTP_PORT, "tcp", False), (SERVER, 9999, "udp", False),
            (SERVER, 53, "udp", False), ("fd98::2", 80, "tcp", False), ("127.0.0.1", loop_port, "http", False),
            ("fe80::1", 80, "tcp", False), ("169.254.169.254", 80, "tcp", False), ("224.0.0.251", 5353, "udp", False),
            } <= places
    assert not any(allowed for *_, allowed in places)
    notes = "\n".join(ran["network_notes"])
    for fragment in ("denied http denied.example:80", f"denied tcp {SERVER}:8080", f"denied udp {SERVER}:53",
                     "direct connection outside ccw's proxy"):
        assert fragment in notes, notes


def test_pip_installs_a_wheel_from_the_local_index_into_the_workspace_venv(tools: Any, workspace: Path,
                                                                           servers: nf.Servers) -> None:
    install = [".venv/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check", "--index-url",
               servers.index, "--trusted-host", SERVER, "ccwtiny"]

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": [HTTP]}))["capsule_id"]
        venv = await t.call("capsule_exec",
                            {"capsule_id": cap, "cmd": [PYTHON, "-m", "venv", ".venv"], "timeout_ms": 120000})
        pip = await t.call("capsule_exec", {"capsule_id": cap, "cmd": install, "timeout_ms": 120000})
        used = await t.call("capsule_exec",
                            {"capsule_id": cap, "cmd": ["python", "-c", "import ccwtiny; print(ccwtiny.GREETING)"]})
        return {"venv": venv, "pip": pip, "used": used}

    out = tools.run(scenario)
    assert out["venv"]["exit_code"] == 0, out["venv"]["stderr"]
    assert out["venv"]["touched"]["network"] == []  # making a venv reaches nothing
    assert out["pip"]["exit_code"] == 0, out["pip"]["stderr"]
    assert out["used"]["stdout"] == "hello from ccwtiny\n"  # the workspace's .venv/bin is first on PATH
    fetched = [r for r in out["pip"]["touched"]["network"] if r["allowed"]]
    assert {(r["host"], r["port"], r["protocol"]) for r in fetched} == {(SERVER, nf.HTTP_PORT, "http")}
    assert sum(r["bytes_in"] for r in fetched) > 0
    assert not (workspace / ".venv").exists()  # the real tree is untouched until promotion


def test_a_redirect_to_a_disallowed_host_is_refused(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = await t.call("capsule_create", {"workspace": str(workspace), "network": [REDIRECT]})
        return await t.call("capsule_exec", {"capsule_id": cap["capsule_id"], "cmd": _curl("-L", f"http://{REDIRECT}/")})

    ran = tools.run(scenario)
    assert ran["exit_code"] != 0 and "403" in ran["stderr"], ran
    assert _places(ran) == {(SERVER, nf.REDIRECT_PORT, "http", True), ("denied.example", 80, "http", False)}
    assert any("denied http denied.example:80" in line for line in ran["network_notes"])


def test_the_byte_cap_and_the_connection_cap_hold(tools: Any, workspace: Path) -> None:
    fetch_four_times = ["sh", "-c", "for i in 1 2 3 4; do curl -sS -o /dev/null "
                                    f"-w '%{{http_code}}\\n' http://{HTTP}/files/small.bin; done"]

    async def scenario(t: Any) -> dict[str, Any]:
        cap = await t.call("capsule_create", {"workspace": str(workspace),
                                              "network": {"allow": [HTTP], "max_bytes": 1 << 20, "max_connections": 2}})
        big = await t.call("capsule_exec", {"capsule_id": cap["capsule_id"], "cmd": _curl(f"http://{HTTP}/files/eight.bin")})
        many = await t.call("capsule_exec", {"capsule_id": cap["capsule_id"], "cmd": fetch_four_times})
        return {"big": big, "many": many}

    out = tools.run(scenario)
    assert out["big"]["exit_code"] != 0, out["big"]  # the transfer was cut short
    (record,) = out["big"]["touched"]["network"]
    assert (record["cut"] == f"byte cap ({1 << 20} bytes)"
            and record["bytes_in"] + record["bytes_out"] <= (1 << 20) + (1 << 18))
    # The agent reads why the transfer stopped, beside curl's own complaint.
    assert out["big"]["network_notes"] == [f"ccw network: cut http {SERVER}:{nf.HTTP_PORT} after {1 << 20} bytes: "
                                           f"byte cap ({1 << 20} bytes)"]
    assert out["many"]["stdout"].split() == ["200", "200", "403", "403"], out["many"]
    # Refusals by the cap are recorded once per place and exec (the records stay bounded).
    refused = [r for r in out["many"]["touched"]["network"] if not r["allowed"]]
    assert ([(r["host"], r["port"], r["reason"]) for r in refused]
            == [(SERVER, nf.HTTP_PORT, "connection cap (2) reached")])


def test_forks_inherit_the_allowlist_and_witness_replay_compares_the_places_reached(
        tools: Any, workspace: Path, servers: nf.Servers) -> None:
    # The command fetches the URL the server names in target.txt: the world decides where it goes.
    target = servers.root / "files" / "target.txt"
    target.write_text(f"http://{HTTP}/files/small.bin\n")
    follow = ["sh", "-c", f"curl -sS --fail -o /dev/null \"$(curl -sS --fail http://{HTTP}/files/target.txt)\""]

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": [HTTP, REDIRECT]}))["capsule_id"]
        fork = await t.call("capsule_fork", {"capsule_id": cap})
        ran = await t.call("capsule_exec", {"capsule_id": fork["capsule_id"], "cmd": follow})
        made = await t.call("capsule_witness", {"capsule_id": fork["capsule_id"]})
        # The replayer grants the network (the witness's own is reported, never used).
        replayed = {"witness_id": made["witness_id"], "network": [HTTP, REDIRECT]}
        same = await t.call("capsule_replay", replayed)
        target.write_text(f"http://{REDIRECT}/elsewhere\n")
        moved = await t.call("capsule_replay", replayed)
        return {"fork": fork, "ran": ran, "same": same, "moved": moved}

    out = tools.run(scenario)
    assert out["fork"]["network"]["allow"] == [HTTP, REDIRECT]
    assert out["ran"]["exit_code"] == 0, out["ran"]
    assert out["same"]["replay_ok"] is True, out["same"]["mismatches"]
    assert out["same"]["network"]["recorded"]["allow"] == out["same"]["network"]["used"]["allow"] == [HTTP, REDIRECT]
    assert out["moved"]["replay_ok"] is False
    (mismatch,) = [m for m in out["moved"]["mismatches"] if m.get("field") == "network"]
    assert mismatch["actual_only"] == [[SERVER, nf.REDIRECT_PORT, "http", True]]


def test_policies_refuse_promotion_of_a_capsule_that_reached_outside_them(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": [HTTP]}))["capsule_id"]
        await t.call("capsule_exec",
                     {"capsule_id": cap, "cmd": ["sh", "-c", f"curl -sS http://{HTTP}/files/small.bin > got.bin"]})
        await t.call("policy_set", {"name": "only-pypi", "rules": {"allow_hosts": ["pypi.org:443"]}})
        await t.call("policy_set", {"name": "no-lab", "rules": {"deny_hosts": ["10.98.0.0/24"]}})
        # The required test runs in a fork of the capsule, which opens a session of its own.
        await t.call("policy_set", {"name": "lab", "rules": {"allow_hosts": [HTTP], "require_tests": [
            f"curl -sS --fail -o /dev/null http://{HTTP}/files/small.bin"]}})
        reports = {}
        for names in (["only-pypi"], ["no-lab"], ["strict"], ["lab"], ["baseline"]):
            done = await t.call("capsule_promote", {"capsule_id": cap, "policies": names, "dry_run": True})
            reports["+".join(names)] = done["policy_report"]
        return reports

    reports = tools.run(scenario)
    for name, rule in (("only-pypi", "allow_hosts"), ("no-lab", "deny_hosts"), ("strict", "allow_hosts")):
        report = reports[name]
        assert report["passed"] is False and report["network_ok"] is False, (name, report)
        assert [(v["exec"], v["host"], v["port"], v["rule"]) for v in report["network_violations"]] == [
            (1, SERVER, nf.HTTP_PORT, rule)], (name, report)
    assert reports["lab"]["network_ok"] is True and reports["lab"]["passed"] is True, reports["lab"]
    assert reports["lab"]["tests_ok"] is True
    assert reports["baseline"]["network_ok"] is True


def test_a_capsule_without_network_says_so(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = await t.call("capsule_create", {"workspace": str(workspace)})
        return {"cap": cap, "ran": await t.call("capsule_exec", {"capsule_id": cap["capsule_id"], "cmd": _curl(f"http://{HTTP}/")})}

    out = tools.run(scenario)
    assert out["cap"]["network"] == "none"
    assert out["ran"]["exit_code"] != 0 and out["ran"]["touched"]["network"] is None
    assert out["ran"]["touched_unavailable"]["network"].startswith("network is none")


def test_sessions_come_back_after_the_front_end_and_the_helper_restart(tools: Any, workspace: Path) -> None:
    fetch = _curl(f"http://{HTTP}/files/small.bin")

    async def first(t: Any) -> tuple[str, dict[str, Any]]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace), "network": [HTTP]}))["capsule_id"]
        return cap, await t.call("capsule_exec", {"capsule_id": cap, "cmd": fetch})

    cap, before = tools.run(first)

    async def second(t: Any) -> dict[str, Any]:
        # A new front end (and, embedded, a new helper): no session until the exec opens one.
        after_restart = await t.call("capsule_exec", {"capsule_id": cap, "cmd": fetch})
        # The helper dies under a live session: its exec says network_not_open, the
        # service opens a new session and runs the command once more.
        helper = await t.runtime.helper()
        os.kill(helper.process.process.pid, signal.SIGKILL)
        await trio.sleep(0.2)
        after_kill = await t.call("capsule_exec", {"capsule_id": cap, "cmd": fetch})
        return {"after_restart": after_restart, "after_kill": after_kill}

    out = tools.run(second)
    for ran in (before, out["after_restart"], out["after_kill"]):
        assert ran["exit_code"] == 0 and ran["stdout"] == "200 1000\n", ran
        assert _places(ran) == {(SERVER, nf.HTTP_PORT, "http", True)}


def test_the_cli_takes_an_allowlist_and_prints_denials(tmp_path: Path, workspace: Path) -> None:
    # Each ccw command is its own front end: the exec opens the session the create started.
    state = tmp_path / "state"
    try:
        cap = ccw(state, "capsule", "create", str(workspace), "--network", HTTP,
                  "--net-max-connections", "8").stdout.strip()
        fetched = ccw(state, "capsule", "exec", cap, "--", *_curl(f"http://{HTTP}/files/small.bin"))
        assert fetched.stdout == "200 1000\n"
        denied = ccw(state, "capsule", "exec", cap, "--", *_curl(f"http://{HTTPS}/"), check=False)
        assert denied.returncode != 0
        assert f"ccw network: denied http {HTTPS}: no rule allows {HTTPS}" in denied.stderr, denied.stderr
        listed = json.loads(ccw(state, "capsule", "exec", cap, "--json", "--", "true").stdout)
        assert listed["touched"]["network"] == []
        bad = ccw(state, "capsule", "create", str(workspace), "--network", "pypi.org:0", check=False)
        assert bad.returncode != 0 and "INVALID_ARGUMENT" in bad.stderr
    finally:
        ccw(state, "helper", "stop", check=False)

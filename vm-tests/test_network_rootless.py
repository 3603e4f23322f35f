"""Network for capsules as an unprivileged user: the rootless helper takes the same path.

A system user made for the test runs the front end in-process (a Runtime, the tool
handlers), whose embedded helper starts rootless (its own user namespace).  That helper
builds the capsule's jail and egress namespaces inside its user namespace (a veth
between two namespaces it owns needs no host privilege), so the same tests as
test_network_e2e.py hold: allowed HTTP and HTTPS through the proxy, every other way out
refused at once and recorded, pip from the local index into the workspace's venv, the
byte cap.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import netfixtures as nf
from tests.support.net_probes import PROBES
from tests.support.users import run_script_as

HERE = Path(__file__).resolve().parent

HTTP = f"{nf.SERVER_ADDRESS}:{nf.HTTP_PORT}"
HTTPS = f"{nf.SERVER_ADDRESS}:{nf.HTTPS_PORT}"

# Not raw, so that a backslash-newline joins a long line: the script never sees it.
SCRIPT = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import trio
from mcp_server.config import TOOLSETS, Config
from mcp_server.context import CallContext, Runtime
from mcp_server.state import State
from mcp_server.tools.registry import Registry

state, ws, http, https, index, server, loop_port = sys.argv[2:9]
config = Config.from_env({"CCW_STATE_DIR": state})
runtime = Runtime(config, State(state))
ctx = CallContext(runtime)
registry = Registry.load(TOOLSETS)

async def call(name, args):
    return await registry.lookup(name).handler(ctx, args)

async def main():
    out = {}
    try:
        cap = (await call("capsule_create", {"workspace": ws, "network": {"allow": [http, https], \
"max_bytes": 1 << 20}}))["capsule_id"]
        async def run(name, cmd, timeout_ms=120000):
            out[name] = await call("capsule_exec", {"capsule_id": cap, "cmd": cmd, "timeout_ms": timeout_ms})
        curl = ["curl", "-sS", "--fail", "-o", "/dev/null", "-w", "%{http_code} %{size_download}\\n"]
        await run("http", [*curl, f"http://{http}/files/small.bin"])
        await run("https", [*curl, "--cacert", "server.pem", f"https://{https}/files/small.bin"])
        await run("probes", ["/usr/bin/python3", "probes.py", server, loop_port])
        await run("venv", ["/usr/bin/python3", "-m", "venv", ".venv"])
        await run("pip", [".venv/bin/pip", "install", "--no-cache-dir", "--disable-pip-version-check",
                          "--index-url", index, "--trusted-host", server, "ccwtiny"])
        await run("used", ["python", "-c", "import ccwtiny; print(ccwtiny.GREETING)"])
        await run("big", [*curl, f"http://{http}/files/eight.bin"])
    finally:
        await runtime.aclose()
    return out

print(json.dumps(trio.run(main)))
"""


@pytest.fixture
def world(user_dir: tuple[int, int, Path],
          root_required: None) -> Iterator[tuple[int, int, Path, nf.Servers]]:
    uid, gid, home = user_dir
    root = home / "srv"
    nf.build_wheel(root / "wheels")
    nf.big_file(root, "small.bin", 1000)
    nf.big_file(root, "eight.bin", 8 << 20)
    with nf.server_namespace(root, "http://denied.example/") as servers:
        yield uid, gid, home, servers


def test_the_rootless_path_passes_the_same_network_tests(world: tuple[int, int, Path, nf.Servers]) -> None:
    uid, gid, home, servers = world
    ws, state = home / "ws", home / "state"
    ws.mkdir()
    state.mkdir()
    (ws / "probes.py").write_text(PROBES)
    shutil.copy(servers.cert, ws / "server.pem")
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(ws), str(state)], check=True)
    with nf.loopback_server() as loop_port:
        argv = [sys.executable, "-c", SCRIPT, str(HERE.parent), str(state), str(ws), HTTP, HTTPS, servers.index,
                nf.SERVER_ADDRESS, str(loop_port)]
        out = run_script_as(uid, gid, argv, home)
    assert out["http"]["stdout"] == "200 1000\n" and out["https"]["stdout"] == "200 1000\n", (out["http"], out["https"])
    assert [(r["host"], r["protocol"], r["allowed"]) for r in out["https"]["touched"]["network"]] == [
        (nf.SERVER_ADDRESS, "https", True)]
    results = [json.loads(line) for line in out["probes"]["stdout"].splitlines()]
    assert len(results) == 9 and all(not r["ok"] and r["elapsed"] < 2.0 for r in results), results
    places = {(r["host"], r["port"], r["protocol"], r["allowed"]) for r in out["probes"]["touched"]["network"]}
    assert {("denied.example", 80, "http", False), (nf.SERVER_ADDRESS, 8080, "tcp", False),
            (nf.SERVER_ADDRESS, 53, "udp", False), ("fd98::2", 80, "tcp", False),
            ("127.0.0.1", loop_port, "http", False), ("fe80::1", 80, "tcp", False),
            ("169.254.169.254", 80, "tcp", False), ("224.0.0.251", 5353, "udp", False)} <= places
    assert out["pip"]["exit_code"] == 0, out["pip"]["stderr"]
    assert out["used"]["stdout"] == "hello from ccwtiny\n"
    assert any(r["allowed"] and r["port"] == nf.HTTP_PORT for r in out["pip"]["touched"]["network"])
    assert out["big"]["exit_code"] != 0 and out["big"]["touched"]["network"][0]["cut"] == f"byte cap ({1 << 20} bytes)"

"""ccw as a user installs it: a wheel built from this checkout, in a fresh venv elsewhere.

The venv lives outside the checkout and every command runs with a clean environment
(no PYTHONPATH, cwd in a scratch workspace), so nothing can be read from the source
tree: package data must come from the wheel.  The wheel's dependencies come from the
package index through pip (its cache makes later runs quick); a host without the index
fails here under CCW_MUST_WORK=1 rather than testing a half-installed ccw.

Needs root: the capsule commands run a privileged helper.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import jsonschema
import pytest

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Installed:
    """A fresh venv with the built wheel installed, and a clean environment for its scripts."""

    wheel: Path
    bin: Path
    env: dict[str, str]

    def run(self, *argv: str, cwd: Path, stdin: str | None = None, timeout: float = 180,
            check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run one of the venv's scripts with the clean environment."""
        done = subprocess.run([str(self.bin / argv[0]), *argv[1:]], input=stdin, capture_output=True,
                              text=True, env=self.env, cwd=cwd, timeout=timeout)
        if check:
            assert done.returncode == 0, f"{argv}: {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done


def _pip(*argv: str, python: str = sys.executable) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, "-m", "pip", "--disable-pip-version-check", *argv],
                          capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """Build the wheel (pip wheel, build isolation), install it into a new venv outside ROOT."""
    if os.geteuid() != 0:  # module-scoped: the `require` fixture is function-scoped
        if os.environ.get("CCW_MUST_WORK") == "1":
            pytest.fail("CCW_MUST_WORK=1 but needs root")
        pytest.skip("needs root")
    base = tmp_path_factory.mktemp("installed")
    assert not base.resolve().is_relative_to(ROOT)
    # Built from a copy of the tree as it is (committed or not), without the checkout's
    # venv, caches or an old build/ (whose stale files a wheel would pick up).
    source = base / "source"
    shutil.copytree(ROOT, source, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".cache", "build", "*.egg-info", "__pycache__", ".hypothesis", ".mypy_cache",
        ".ccw-state"))
    built = _pip("wheel", "--no-deps", "-q", "-w", str(base / "dist"), str(source))
    assert built.returncode == 0, built.stderr
    (wheel,) = (base / "dist").glob("ccw-*.whl")
    venv = base / "venv"
    # The venv gets no pip of its own (ensurepip costs seconds of CPU): this pip installs
    # into it (--python), without compiling every dependency's bytecode, which Python
    # does itself on first import.  Together about a minute of this module's setup in CI.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    done = _pip("--python", str(venv / "bin" / "python"), "install", "-q", "--no-compile", str(wheel))
    if done.returncode != 0 and os.environ.get("CCW_MUST_WORK") != "1":
        pytest.skip(f"pip could not install the wheel's dependencies (no package index?): {done.stderr[-500:]}")
    assert done.returncode == 0, done.stderr
    home = base / "home"
    home.mkdir()
    env = {"PATH": f"{venv / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "CCW_STATE_DIR": str(base / "state"), "MCP_READY_FILE": str(base / "mcp.ready")}
    installed = Installed(wheel, venv / "bin", env)
    yield installed
    installed.run("ccw", "helper", "stop", cwd=base, check=False)


def test_wheel_carries_the_package_data(installed: Installed) -> None:
    names = set(zipfile.ZipFile(installed.wheel).namelist())
    presets = sorted(f"policies/network/{path.name}" for path in (ROOT / "policies" / "network").glob("*.json"))
    assert presets  # the network presets (mcp_server/fs/netpresets.py)
    for name in ("policies/policy.schema.json", "policies/baseline.json", "policies/strict.json", *presets,
                 "deploy/ccw-helper.service", "deploy/ccw-helper.socket", "deploy/ccw-mcp.service"):
        assert f"mcp_server/data/{name}" in names, name
        assert (ROOT / name).read_bytes() == zipfile.ZipFile(installed.wheel).read(f"mcp_server/data/{name}")
    for name in ("index.html", "app.js", "style.css"):  # the dashboard's page: nothing fetched elsewhere
        assert f"mcp_server/ui/static/{name}" in names, name
    assert not [n for n in names if n.startswith(("tests/", "vm-tests/", "bench/", "policies/"))]
    for program in ("sandbox/ccw-jail", "mcp_server/egress/ccw-forward"):  # setup.py's C programs, executable
        mode = zipfile.ZipFile(installed.wheel).getinfo(program).external_attr >> 16
        assert mode & 0o111 == 0o111, (program, oct(mode))


def test_installed_ccw_imports_nothing_from_the_checkout(installed: Installed, tmp_path: Path) -> None:
    where = installed.run("python", "-c", "import mcp_server, sandbox, mcp_server.data as d; "
                          "print(mcp_server.__file__, sandbox.__file__, d.data_dir('policies'))", cwd=tmp_path)
    site = installed.bin.parent / "lib"
    for path in where.stdout.split():
        assert Path(path).is_relative_to(site) and not Path(path).resolve().is_relative_to(ROOT), path


def test_installed_ccw_lists_the_network_presets_from_the_wheel(installed: Installed, tmp_path: Path) -> None:
    listing = json.loads(installed.run("ccw", "net", "presets", "--json", cwd=tmp_path).stdout)
    shipped = {path.stem for path in (ROOT / "policies" / "network").glob("*.json") if ".schema." not in path.name}
    assert {p["name"] for p in listing["presets"] if p["origin"] == "shipped"} == shipped
    site = installed.bin.parent / "lib"
    assert all(Path(p["path"]).is_relative_to(site) for p in listing["presets"]), listing["presets"]


def test_installed_ccw_runs_the_quick_start(installed: Installed, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("hello\n")
    doctor = installed.run("ccw", "doctor", "--json", cwd=workspace)
    assert json.loads(doctor.stdout)["can_run"] is True

    capsule_id = installed.run("ccw", "capsule", "create", ".", cwd=workspace).stdout.strip()
    assert capsule_id.startswith("cap_")
    ran = installed.run("ccw", "capsule", "exec", capsule_id, "--", "sh", "-c", "echo changed > a.txt; echo ran",
                        cwd=workspace)
    assert ran.stdout == "ran\n"
    diff = installed.run("ccw", "capsule", "diff", capsule_id, cwd=workspace).stdout
    assert "-hello\n+changed\n" in diff
    dry = installed.run("ccw", "capsule", "promote", capsule_id, "--policy", "strict", "--dry-run", "--json",
                        cwd=workspace, check=False)  # strict may refuse (it wants a replay): the report says
    assert json.loads(dry.stdout)["policy_report"]["policies"] == ["strict"]  # read from package data
    promoted = json.loads(installed.run("ccw", "capsule", "promote", capsule_id, "--json", cwd=workspace).stdout)
    assert promoted["promoted"] is True and promoted["applied"] == ["a.txt"]
    assert (workspace / "a.txt").read_text() == "changed\n"
    installed.run("ccw", "capsule", "destroy", capsule_id, cwd=workspace)


def _frame(id_: int | None, method: str, params: dict[str, object]) -> str:
    message: dict[str, object] = {"jsonrpc": "2.0", "method": method, "params": params}
    if id_ is not None:
        message["id"] = id_
    return json.dumps(message) + "\n"


def test_installed_ccw_mcp_serves_stdio(installed: Installed, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("hello\n")
    session = "".join([
        _frame(1, "initialize", {"protocolVersion": "2025-11-25", "capabilities": {},
                                 "clientInfo": {"name": "wheel-test", "version": "1"}}),
        _frame(None, "notifications/initialized", {}),
        _frame(2, "tools/list", {}),
        _frame(3, "tools/call", {"name": "capsule_create", "arguments": {"workspace": str(workspace)}}),
    ])
    done = installed.run("ccw-mcp", cwd=workspace, stdin=session)
    answers = {m["id"]: m for m in map(json.loads, done.stdout.splitlines())}
    assert answers[1]["result"]["serverInfo"]["name"] == "ccw"
    names = {tool["name"] for tool in answers[2]["result"]["tools"]}
    assert {"capsule_create", "policy_list", "read_text_file"} <= names
    created = answers[3]["result"]
    assert created.get("isError") is not True, created
    assert created["structuredContent"]["capsule_id"].startswith("cap_")
    listed = {tool["name"]: tool for tool in answers[2]["result"]["tools"]}
    jsonschema.Draft202012Validator(listed["capsule_create"]["outputSchema"]).validate(created["structuredContent"])
    assert "mcp:ready mode=stdio" in done.stderr and "mcp:shutdown mode=stdio" in done.stderr


def test_installed_entry_points_answer_version_and_help(installed: Installed, tmp_path: Path) -> None:
    for script in ("ccw", "ccw-mcp", "ccw-helper", "ccw-bot"):
        version = installed.run(script, "--version", cwd=tmp_path, stdin="", timeout=60)
        assert version.stdout == f"{script} 0.1.0\n", version
        shown = installed.run(script, "--help", cwd=tmp_path, stdin="", timeout=60)
        assert shown.stdout.startswith(f"usage: {script}") and "--version" in shown.stdout


def test_installed_ccw_forwards_a_services_port(installed: Installed, tmp_path: Path) -> None:
    # The port's program (ccw-forward) from site-packages, run by the installed front end.
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "index.html").write_text("served from the wheel\n")
    env = {**installed.env, "CCW_STATE_DIR": str(tmp_path / "state")}
    done = Installed(installed.wheel, installed.bin, env)
    cap = done.run("ccw", "capsule", "create", ".", cwd=workspace).stdout.strip()
    try:
        done.run("ccw", "capsule", "service", "start", cap, "web", "--ready-port", "8000", "--",
                 "python3", "-m", "http.server", "8000", "--bind", "127.0.0.1", cwd=workspace)
        url = json.loads(done.run("ccw", "capsule", "port", cap, "8000", "--json", cwd=workspace).stdout)["url"]
        with urllib.request.urlopen(url, timeout=30) as page:
            assert page.read() == b"served from the wheel\n"
        site = installed.bin.parent / "lib"
        programs = subprocess.run(["pgrep", "-a", "-f", "ccw-forward --listen"], capture_output=True, text=True).stdout
        assert any(line.split()[1].startswith(str(site)) for line in programs.splitlines()), programs
    finally:
        done.run("ccw", "capsule", "destroy", cap, cwd=workspace, check=False)
        done.run("ccw", "helper", "stop", cwd=workspace, check=False)

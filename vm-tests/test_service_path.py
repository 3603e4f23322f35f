"""The path a CI runner takes: the ``ccw`` CLI talking to a system helper via CCW_HELPER_SOCKET.

In the Vagrant VM (see the Vagrantfile) these tests run as an unprivileged user in group
``ccw``, against the socket-activated ``ccw-helper.socket`` under systemd: the caller
cannot mount, mark filesystems with fanotify or make cgroups itself, so every trace and
limit they see comes from the system helper, and every file its commands write belongs to
the caller. On a host without that service (``./dev test``), the tests start a privileged
helper themselves, on a group-restricted socket, and run the same CLI through it as root.

Every CLI call passes ``--no-autostart``: if the helper socket did not answer, the CLI
would otherwise start a helper of its own and the test would prove nothing about the
service.
"""

from __future__ import annotations

import grp
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.workspaces import make_workspace

ROOT = Path(__file__).resolve().parent.parent
CCW = [str(Path(sys.executable).parent / "ccw")]  # the installed script, as a CI runner calls it


@dataclass(frozen=True)
class Service:
    """A helper socket to test through, and the group its socket admits."""

    socket: str
    group: str
    systemd: bool  # the VM's ccw-helper.socket, not one this test started


@pytest.fixture
def service(require: Callable[[bool, str], None], launch_helper: Callable[..., Any]) -> Iterator[Service]:
    """CCW_HELPER_SOCKET's helper when set (the VM), else a privileged helper started here (root)."""
    configured = os.environ.get("CCW_HELPER_SOCKET")
    if configured:
        yield Service(configured, "ccw", systemd=True)
        return
    require(os.geteuid() == 0, "needs root to start a privileged helper (or CCW_HELPER_SOCKET set)")
    workdir = Path(tempfile.mkdtemp(prefix="ccw-service-"))
    socket_path, log_path = workdir / "helper.sock", workdir / "helper.log"
    process = launch_helper(socket_path, workdir / "state", log_path, "--privileged", "--socket-group", "root",
                            umask=0o077)  # as deploy/ccw-helper.service's UMask=0077
    try:
        yield Service(str(socket_path), "root", systemd=False)
    finally:
        process.terminate()
        assert process.wait(30) == 0, log_path.read_text()
        shutil.rmtree(workdir)


def ccw(service: Service, state: Path, *argv: str) -> Any:
    """``ccw ARGV --json`` through the service's socket, never starting a helper of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_"))}
    env.update(CCW_HELPER_SOCKET=service.socket, CCW_STATE_DIR=str(state))
    command, rest = argv[0], argv[1:]
    verb, rest = (rest[0], rest[1:]) if command == "capsule" else ("", rest)
    full = [*CCW, command, *([verb] if verb else []), "--json", "--no-autostart", *rest]
    done = subprocess.run(full, capture_output=True, text=True, env=env, timeout=180, cwd=ROOT)
    assert done.returncode == 0, f"{full}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A workspace owned by the caller, with one file a command reads."""
    return make_workspace(tmp_path / "ws", {"input.txt": "from the workspace\n"})


def test_socket_admits_only_its_group(service: Service) -> None:
    info = os.stat(service.socket)
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o660 and info.st_uid == 0
    assert info.st_gid == grp.getgrnam(service.group).gr_gid
    # The caller gets in by its group, not by being root, when it is not root.
    assert os.geteuid() == 0 or info.st_gid in os.getgroups()


def test_doctor_reports_the_system_helper_and_what_it_grants(service: Service, tmp_path: Path) -> None:
    report = ccw(service, tmp_path / "state", "doctor")
    checks = {check["name"]: check for check in report["checks"]}
    assert checks["helper_service"]["ok"] is True, checks["helper_service"]
    detail = checks["helper_service"]["detail"]
    assert f"{service.socket} answers (privileged mode" in detail
    for mechanism in ("fanotify", "cgroups", "seccomp", "capsule disks"):
        assert mechanism in detail, detail
    assert report["modes"]["service"]["ok"] is True and report["can_run"] is True
    if os.geteuid() != 0:
        assert report["mode"] == "service"  # what an unprivileged caller with the socket gets


def test_capsule_through_the_system_helper(service: Service, workspace: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    created = ccw(service, state, "capsule", "create", str(workspace))
    capsule = created["capsule_id"]
    try:
        ran = ccw(service, state, "capsule", "exec", capsule, "--",
                  "sh", "-c", "cat input.txt; echo made > output.txt; stat -c %u output.txt; id -u; stat -c %a ..")
        assert ran["exit_code"] == 0, ran
        # The workspace's parent is made in the jail (under its /tmp or $HOME): traversable,
        # whatever the helper's umask.
        assert ran["stdout"].splitlines() == ["from the workspace", str(os.getuid()), str(os.getuid()), "755"]
        # fanotify is the privileged helper's: an unprivileged caller's own helper has none.
        # The only set a "none" capsule cannot give is the network's (nothing gets out).
        assert list(ran["touched_unavailable"]) == ["network"], ran
        assert ran["disk"]["limit_mb"] > 0, ran  # a capsule disk: the helper may use loop devices
        assert "input.txt" in ran["touched"]["read"] and ran["touched"]["written"] == ["output.txt"], ran
        diff = ccw(service, state, "capsule", "diff", capsule)
        assert diff["summary"] == {"added": 1, "deleted": 0, "modified": 0}, diff
        assert "+++ b/output.txt" in diff["diff"]
        assert not (workspace / "output.txt").exists()  # the workspace is untouched until promotion
    finally:
        assert ccw(service, state, "capsule", "destroy", capsule)["destroyed"] is True


def test_exec_is_measured_by_the_helpers_cgroups(service: Service, workspace: Path, tmp_path: Path) -> None:
    state = tmp_path / "state"
    capsule = ccw(service, state, "capsule", "create", str(workspace))["capsule_id"]
    try:
        created = ccw(service, state, "capsule", "list")
        assert [c["capsule_id"] for c in created["capsules"]] == [capsule], created
        ran = ccw(service, state, "capsule", "exec", capsule, "--", "sh", "-c", "head -c 4000000 /dev/zero | wc -c")
        assert ran["exit_code"] == 0 and ran["stdout"] == "4000000\n", ran
        # Rootless, without a delegated cgroup subtree, these would be null with reasons.
        assert ran["usage_unavailable"] == {}, ran
        assert ran["usage"]["cpu_ms"] is not None and ran["usage"]["rss_max_kb"] > 0, ran
    finally:
        ccw(service, state, "capsule", "destroy", capsule)


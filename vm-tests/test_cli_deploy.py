"""Deployment files: systemd units verified by systemd-analyze, socket activation, Vagrantfile.

``systemd-analyze verify`` checks that each unit parses, every key is known and every
ExecStart= binary exists; the units name /usr/local/bin/ccw-*, where the Vagrantfile
links the installed scripts, so the test verifies copies pointing at this checkout's
scripts.  Any warning on its output fails the test, not only its exit status.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
SCRIPTS = Path(sys.executable).parent


def _units_for_here(tmp_path: Path) -> Path:
    out = tmp_path / "units"
    out.mkdir()
    for unit in DEPLOY.iterdir():
        text = unit.read_text().replace("/usr/local/bin/", f"{SCRIPTS}/")
        (out / unit.name).write_text(text)
    return out


def test_units_pass_systemd_analyze_verify(tmp_path: Path, require: Callable[[bool, str], None]) -> None:
    analyze = shutil.which("systemd-analyze")
    require(analyze is not None, "needs systemd-analyze (Debian package systemd)")
    assert analyze is not None
    require((SCRIPTS / "ccw-helper").exists(), "ccw is not installed in this venv (./dev setup)")
    units = _units_for_here(tmp_path)
    system = subprocess.run([analyze, "verify", str(units / "ccw-helper.socket"), str(units / "ccw-helper.service")],
                            capture_output=True, text=True, timeout=60)
    assert system.returncode == 0 and system.stdout + system.stderr == "", system.stdout + system.stderr
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    user = subprocess.run([analyze, "verify", "--user", str(units / "ccw-mcp.service")], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "XDG_RUNTIME_DIR": str(runtime)})
    assert user.returncode == 0 and user.stdout + user.stderr == "", user.stdout + user.stderr


def test_verify_catches_a_broken_unit(tmp_path: Path, require: Callable[[bool, str], None]) -> None:
    analyze = shutil.which("systemd-analyze")
    require(analyze is not None, "needs systemd-analyze (Debian package systemd)")
    assert analyze is not None
    units = _units_for_here(tmp_path)
    broken = (units / "ccw-helper.service").read_text().replace(f"{SCRIPTS}/ccw-helper", "/nonexistent/ccw-helper")
    (units / "ccw-helper.service").write_text(broken)
    done = subprocess.run([analyze, "verify", str(units / "ccw-helper.service")], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode != 0 and "/nonexistent/ccw-helper" in done.stderr


def test_units_say_what_the_brief_requires() -> None:
    socket_unit = (DEPLOY / "ccw-helper.socket").read_text()
    for line in ("ListenStream=/run/ccw/helper.sock", "SocketMode=0660", "SocketGroup=ccw", "Accept=no"):
        assert line in socket_unit.splitlines()
    service = (DEPLOY / "ccw-helper.service").read_text().splitlines()
    for line in ("StateDirectory=ccw", "NoNewPrivileges=yes", "Delegate=yes", "Requires=ccw-helper.socket"):
        assert line in service
    # ProtectHostname's seccomp filter would reach every jail: sethostname fails there.
    assert not any(line.startswith(("ProtectHome=", "PrivateTmp=", "RuntimeDirectory=", "ProtectHostname="))
                   for line in service)
    exec_start = next(line for line in service if line.startswith("ExecStart="))
    assert "--socket /run/ccw/helper.sock" in exec_start and "--state-dir /var/lib/ccw" in exec_start
    mcp = (DEPLOY / "ccw-mcp.service").read_text().splitlines()
    assert "Environment=CCW_HELPER_SOCKET=/run/ccw/helper.sock" in mcp


def test_helper_serves_a_socket_passed_by_systemd(tmp_path: Path, root_required: None,
                                                  require: Callable[[bool, str], None]) -> None:
    from sandbox.client import BlockingClient

    activate = shutil.which("systemd-socket-activate")
    require(activate is not None, "needs systemd-socket-activate (Debian package systemd)")
    assert activate is not None
    path = tmp_path / "helper.sock"
    process = subprocess.Popen(
        [activate, "-l", str(path), sys.executable, "-m", "sandbox", "--socket", str(path),
         "--state-dir", str(tmp_path / "state")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT,
    )
    try:
        deadline = time.monotonic() + 30
        while not path.exists():
            assert time.monotonic() < deadline and process.poll() is None, "no socket from systemd-socket-activate"
            time.sleep(0.05)
        with BlockingClient(str(path)) as client:
            assert client.hello()["mode"] == "privileged"  # the first connection starts the helper
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        log = process.stdout.read().decode()
        process.stdout.close()
    assert "serving on the socket passed by systemd" in log, log
    assert path.is_socket()  # systemd's socket file is left for the next activation
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            pass
        else:
            raise AssertionError("nothing should listen once the helper and its activator are gone")


def test_vagrantfile_validates(tmp_path: Path, require: Callable[[bool, str], None]) -> None:
    vagrant = shutil.which("vagrant")
    require(vagrant is not None, "needs vagrant (Debian package vagrant)")
    assert vagrant is not None
    done = subprocess.run([vagrant, "validate", "--ignore-provider"], cwd=ROOT, capture_output=True, text=True,
                          timeout=180, env={**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1",
                               "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot-vagrant")})  # no .vagrant/ in the tree
    assert done.returncode == 0, done.stdout + done.stderr
    assert "validated successfully" in done.stdout

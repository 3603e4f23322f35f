"""The Vagrantfile booted for real: ``vagrant up`` a Debian VM and run the service path in it.

Opt-in with ``CCW_VAGRANT=1`` (``.ci/run`` sets it where ``deploy/libvirt-host kvm`` says
KVM runs Debian's kernel): a boot takes minutes with KVM and most of an hour without.
The test builds (or finds) the local box, brings libvirt up (``deploy/libvirt-host up``),
runs ``vagrant up`` with the local box, whose provisioning installs ccw and the systemd
socket and runs ``vm-tests/test_service_path.py`` as the unprivileged user ``ccwci``,
then reads that suite's summary and ``ccw doctor`` from inside the VM. Whatever happens
it destroys the VM and checks that nothing is left: no libvirt domain, volume, network
or pool that was not there before, and no QEMU, dnsmasq or libvirt daemon it started.

The time of each phase goes to the test's output. Without KVM (``CCW_VAGRANT_DRIVER=qemu``,
chosen here when the KVM check fails) QEMU emulates the CPU (TCG).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VIRSH = ["virsh", "-q", "-c", "qemu:///system"]

pytestmark = pytest.mark.skipif(
    os.environ.get("CCW_VAGRANT") != "1",
    reason="opt-in: CCW_VAGRANT=1 boots the Vagrantfile in a VM (.ci/run sets it where KVM works)",
)


def _lines(argv: list[str]) -> set[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{argv}: {done.stderr}"
    return {line.strip() for line in done.stdout.splitlines() if line.strip()}


def libvirt_objects() -> dict[str, set[str]]:
    """Every domain, network, pool and volume libvirt knows, by kind."""
    pools = _lines([*VIRSH, "pool-list", "--all", "--name"])
    volumes: set[str] = set()
    for pool in pools:
        volumes |= {f"{pool}/{line.split()[0]}" for line in _lines([*VIRSH, "vol-list", pool])}
    return {
        "domains": _lines([*VIRSH, "list", "--all", "--name"]),
        "networks": _lines([*VIRSH, "net-list", "--all", "--name"]),
        "pools": pools,
        "volumes": volumes,
    }


def processes(*names: str) -> set[int]:
    """Pids of the processes whose executable is one of ``names``."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if Path(os.readlink(entry / "exe")).name in names:
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


VM_PROCESSES = ("qemu-system-x86_64", "dnsmasq", "libvirtd", "virtlogd")


# Lines of `vagrant up` that end one phase and start the next.
UP_MARKS = {
    "Creating image (snapshot of base box volume)": "box_to_libvirt",
    "Machine booted and ready": "boot_to_ssh",
    "Running provisioner: install": "rsync",
    "Running provisioner: tests": "install",
}


class Phases:
    """Wall time of each phase, for the test's output."""

    def __init__(self) -> None:
        self.times: dict[str, float] = {}

    def run(self, name: str, argv: list[str], log: Path, marks: dict[str, str] | None = None,
            **kwargs: object) -> int:
        """Run ``argv`` with its output in ``log``; its exit status. The time from one line
        named in ``marks`` to the next is recorded under that mark's phase, the rest under ``name``."""
        start = time.monotonic()
        with open(log, "ab") as out:
            out.write(f"\n$ {' '.join(argv)}\n".encode())
            with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, **kwargs) as process:
                for line in process.stdout:
                    out.write(line)
                    out.flush()
                    for marker, phase in (marks or {}).items():
                        if marker.encode() in line and phase not in self.times:
                            now = time.monotonic()
                            self.times[phase] = now - start
                            start = now
                status = process.wait()
        self.times[name] = time.monotonic() - start
        return int(status)

    def report(self) -> str:
        """One line: phase=seconds, in order."""
        return "  ".join(f"{name}={seconds:.0f}s" for name, seconds in self.times.items())


@pytest.fixture
def libvirt_host(tmp_path: Path, root_required: None,
                 require: Callable[[bool, str], None]) -> Iterator[dict[str, str]]:
    """libvirt up for the test, and afterwards only what it started stopped again."""
    env = {**os.environ, "CCW_LIBVIRT_STATE": str(tmp_path / "libvirt-host.state")}
    before_processes = processes(*VM_PROCESSES)
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text()  # libvirt's NAT turns it on
    done = subprocess.run([str(ROOT / "deploy/libvirt-host"), "up"], env=env, capture_output=True, text=True,
                          timeout=900)
    require(done.returncode == 0, f"deploy/libvirt-host up failed: {done.stderr}")
    yield env
    down = subprocess.run([str(ROOT / "deploy/libvirt-host"), "down"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert down.returncode == 0, down.stderr
    left = processes(*VM_PROCESSES) - before_processes
    assert not left, f"processes left behind: {left}"
    assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forwarding


@pytest.mark.timeout(5400)
def test_vagrant_up_runs_the_service_path_in_the_vm(libvirt_host: dict[str, str], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    phases = Phases()
    log = tmp_path / "vagrant.log"
    env = {**libvirt_host, "VAGRANT_CHECKPOINT_DISABLE": "1", "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot-vagrant"),
           "VAGRANT_HOME": str(ROOT / ".cache" / "vagrant.d"), "CCW_VAGRANT_BOX": "local"}
    if "CCW_VAGRANT_DRIVER" not in env:
        kvm = subprocess.run([str(ROOT / "deploy/libvirt-host"), "kvm"], capture_output=True, text=True, timeout=300)
        env["CCW_VAGRANT_DRIVER"] = "kvm" if kvm.returncode == 0 else "qemu"
    assert phases.run("image", [str(ROOT / "vm-image/build")], log, cwd=ROOT) == 0, log.read_text()[-4000:]
    before = libvirt_objects()
    vagrant = ["nice", "-n", "19", "ionice", "-c3", "vagrant"]
    summary = doctor = ""
    try:
        up = phases.run("tests", [*vagrant, "up", "--provider=libvirt"], log, UP_MARKS, cwd=ROOT, env=env)
        read = subprocess.run([*vagrant, "ssh", "-c", "sudo cat /var/tmp/ccw-vm-tests.log"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        summary = read.stdout
        ask = subprocess.run(
            [*vagrant, "ssh", "-c", "sudo -u ccwci env CCW_HELPER_SOCKET=/run/ccw/helper.sock HOME=/home/ccwci "
             "/opt/ccw/.venv/bin/ccw doctor --json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        doctor = ask.stdout
    finally:
        destroyed = phases.run("destroy", [*vagrant, "destroy", "-f"], log, cwd=ROOT, env=env)
        after = libvirt_objects()
        # The box's base image is uploaded into the pool by `vagrant up`: remove it too.
        for volume in sorted(after["volumes"] - before["volumes"]):
            pool, name = volume.split("/", 1)
            subprocess.run([*VIRSH, "vol-delete", "--pool", pool, name], capture_output=True, timeout=120)
        for network in sorted(after["networks"] - before["networks"]):
            subprocess.run([*VIRSH, "net-destroy", network], capture_output=True, timeout=60)
            subprocess.run([*VIRSH, "net-undefine", network], capture_output=True, timeout=60)
        left = libvirt_objects()
        with capsys.disabled():
            print(f"\nvagrant boot ({env['CCW_VAGRANT_DRIVER']}): {phases.report()}")
            print("\n".join(f"  {line}" for line in summary.splitlines()[-3:]))
    text = log.read_text()
    assert up == 0, text[-6000:]
    assert destroyed == 0, text[-3000:]
    assert left == before, {kind: left[kind] ^ before[kind] for kind in left}
    closing = summary.strip().splitlines()[-1] if summary.strip() else ""
    counts = dict((word, int(n)) for n, word in re.findall(r"(\d+) (passed|failed|errors?|skipped)", closing))
    assert counts.get("passed", 0) >= 4 and set(counts) == {"passed"}, summary
    report = json.loads(doctor)
    assert report["euid"] != 0 and report["mode"] == "service", report["modes"]
    service = next(check for check in report["checks"] if check["name"] == "helper_service")
    assert "answers (privileged mode; grants fanotify read tracing" in service["detail"], service

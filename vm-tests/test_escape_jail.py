"""Escape attempts: commands an agent could send to capsule_exec, each asserted to fail.

One module-scoped run sends every attempt through the real tool pipeline (capsule_exec
on an embedded, privileged helper; the caller is root, the strongest case) in a few
batched execs: each attempt runs in its own subshell between markers, so its exit
status and output are judged one by one, and each is its own test item below.  A
second, smaller batch runs as an unprivileged caller (uid nobody) for what only makes
sense there (setuid binaries).  Around both, the host is photographed: files, mounts,
kernel knobs, modules, hostname, processes, a loopback listener; it must not change.

What "fails" means per attempt: the command exits non-zero (or prints no ``ESCAPED``)
and nothing the test planted on the host (a secret file outside the workspace, a secret
in the front end's environment) appears in its output.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import stat
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sandbox import contain, seccomp, supervise
from tests.support import SUPPORT_DIR

NOBODY = 65534
TOKEN = uuid.uuid4().hex[:12]
SECRET = f"ccw-secret-{TOKEN}"  # name of the host files the jail must not read
SECRET_VALUE = f"ccw-hidden-{uuid.uuid4().hex}"  # their content, and the front end's secret env value
ESC = f"ccw-esc-{TOKEN}"  # name of every file an attempt tries to create on the host


@dataclass(frozen=True)
class Attempt:
    name: str
    script: str  # sh snippet, run in a subshell; may use {placeholders} from the context
    judge: str = "fails"  # fails | quiet (only the output matters) | host (only the host's files matter)


# Through capsule_exec, caller root.  {P} runs a probe: ``python3 probes.py NAME``.
ATTEMPTS = [
    # --- the host's filesystem through /proc, .., symlinks -----------------------------
    Attempt("proc1-root-read", "cat /proc/1/root{host_secret} /proc/1/root/root/{secret_name}"),
    Attempt("proc1-root-write", "echo x > /proc/1/root/{esc} && echo x > /proc/1/root/tmp/{esc}"),
    Attempt("proc-cwd-of-every-process",
            "for p in /proc/[0-9]*; do cat $p/cwd{host_secret} $p/root{host_secret} 2>/dev/null; done; false"),
    Attempt("proc-helper-pid", "cat /proc/{helper_pid}/environ || ls /proc/{helper_pid}/root{host_outside}"),
    Attempt("proc-frontend-pid", "cat /proc/{front_pid}/environ || cat /proc/{front_pid}/cwd{host_secret}"),
    Attempt("dotdot-to-host", "cat ../../../../../../../..{host_secret}"),
    # The workspace's host parent is under /tmp here, so ".." lands in the capsule's own /tmp:
    # judged by the host, where nothing may appear.
    Attempt("dotdot-write-beside-workspace", "echo x > ../{esc}; echo x > ../../{esc}", judge="host"),
    Attempt("planted-symlink-to-root", "ls link_root/ && cat link_root/{secret_name}"),
    Attempt("planted-symlink-to-secret", "cat link_secret"),
    Attempt("planted-symlink-write-out", "echo x > link_outside/{esc}"),
    Attempt("planted-symlink-to-etc-write", "echo x > link_etc/{esc}"),
    Attempt("etc-shadow", "cat /etc/shadow /etc/gshadow; cat link_etc/shadow", judge="quiet"),
    # The host replaced them by rename (as useradd does) after this jail's root was built.
    Attempt("etc-shadow-after-host-rename", "cat /etc/shadow /etc/shadow- /etc/gshadow /etc/gshadow-", judge="quiet"),
    Attempt("dev-mem-kmem-port", "head -c 16 /dev/mem || head -c 16 /dev/kmem || head -c 16 /dev/port"),
    Attempt("raw-block-devices", "ls /dev/sd* /dev/vd* /dev/nvme* /dev/xvd* /dev/loop* 2>&1 && head -c 1 /dev/sda"),
    Attempt("proc-kcore", "test $(head -c 64 /proc/kcore | wc -c) -gt 0"),
    Attempt("nsenter-pid1-mount-ns", "nsenter -t 1 -m -p cat {host_secret}"),
    Attempt("open-by-handle-shocker", "{P} open_by_handle_at"),
    # --- writing where the host would see it -------------------------------------------
    Attempt("write-usr", "touch /usr/{esc}"),
    Attempt("write-etc", "touch /etc/{esc} || : >> /etc/passwd"),
    Attempt("create-in-root", "touch /{esc}"),
    Attempt("proc-sys-core-pattern", "echo '|/bin/true' > /proc/sys/kernel/core_pattern"),
    Attempt("proc-sys-other", "echo 1 > /proc/sys/vm/drop_caches || echo 0 > /proc/sys/kernel/randomize_va_space"),
    Attempt("sysrq-trigger", "echo h > /proc/sysrq-trigger"),
    Attempt("sys-write", "cat {sys_knob} > /tmp/v && cat /tmp/v > {sys_knob}"),
    Attempt("binfmt-misc-register", "echo ':ccw:E::ccwx::/bin/sh:' > /proc/sys/fs/binfmt_misc/register"),
    Attempt("mknod-char", "mknod /tmp/mem c 1 1 || {P} mknod_char"),
    Attempt("mknod-block", "mknod ./sda b 8 0 || {P} mknod_block"),
    # --- rearranging mounts and namespaces ----------------------------------------------
    Attempt("mount-tmpfs", "mount -t tmpfs none /tmp"),
    Attempt("mount-bind-root", "mkdir -p /tmp/r && mount --bind / /tmp/r"),
    Attempt("umount-etc", "umount -l /etc || umount /proc/sys"),
    Attempt("remount-usr-rw", "mount -o remount,rw /usr"),
    Attempt("pivot-root", "mkdir -p /tmp/new/old && pivot_root /tmp/new /tmp/new/old"),
    Attempt("chroot-command", "chroot / true"),
    Attempt("chroot-fchdir-trick", "{P} chroot_escape"),
    Attempt("unshare-Urm", "unshare -Urm sh -c 'mount --bind / /tmp && echo ESCAPED'"),
    Attempt("unshare-user-syscall", "{P} unshare_user || {P} unshare_mount"),
    Attempt("clone-newuser", "{P} clone_newuser"),
    Attempt("setns-every-fd", "{P} setns_every_fd"),
    Attempt("fd-leak", "ls -l /proc/self/fd/ >&2; {P} fd_leak"),
    Attempt("init-fds-and-environ", "{P} init_fds || {P} init_environ"),
    # --- other processes ---------------------------------------------------------------
    Attempt("ptrace-init", "{P} ptrace_init"),
    Attempt("ptrace-sibling", "{P} ptrace_sibling"),
    Attempt("strace-attach", "command -v strace >/dev/null || exit 1; strace -p 1 -o /dev/null & s=$!; sleep 1; "
                             "if kill $s 2>/dev/null; then echo ESCAPED; fi; wait $s"),
    Attempt("process-vm-readv", "{P} process_vm_readv"),
    Attempt("kill-helper", "{P} kill {helper_pid}"),
    Attempt("kill-frontend", "{P} kill {front_pid}"),
    # --- the kernel ---------------------------------------------------------------------
    Attempt("modprobe", "modprobe dummy || insmod /nonexistent.ko"),
    Attempt("finit-module", "{P} finit_module || {P} init_module"),
    Attempt("kexec", "{P} kexec_load"),
    Attempt("reboot", "{P} reboot"),
    Attempt("keyctl", "{P} keyctl || {P} add_key"),
    Attempt("bpf", "{P} bpf"),
    Attempt("perf-event-open", "{P} perf_event_open"),
    Attempt("io-uring", "{P} io_uring"),
    Attempt("userfaultfd", "{P} userfaultfd"),
    Attempt("tiocsti", "{P} tiocsti"),
    Attempt("tioclinux", "{P} tioclinux"),
    Attempt("dmesg-syslog", "dmesg | head -1 | grep . && exit 0; {P} syslog"),
    Attempt("set-clock", "date -s \"$(date)\" || {P} settime"),
    Attempt("hostname", "hostname {esc} || {P} sethostname {esc}"),
    Attempt("swapon-swapoff", "{P} swapon || {P} swapoff"),
    Attempt("personality-aslr-off", "{P} personality"),
    Attempt("capabilities-and-nnp", "{P} capabilities"),
    Attempt("setuid-root-shell-as-root",
            "./suid-sh -p -c 'grep -Eq \"CapEff:.0000000000000000|CapEff:.000000000000001b\" /proc/self/status "
            "|| echo ESCAPED'; false"),
    # --- the network and the helper's sockets -------------------------------------------
    Attempt("helper-socket", "{P} unix_connect {helper_socket}"),
    Attempt("abstract-socket-on-host", "{P} abstract_connect {abstract}"),
    Attempt("host-loopback-listener", "{P} tcp_connect 127.0.0.1:{port}"),
    Attempt("tcp-outside", "{P} tcp_connect 192.0.2.1:80"),
    Attempt("udp-dns-outside", "{P} udp_dns"),
    Attempt("resolve-name", "getent hosts ccw-escape.invalid || {P} resolve"),
    Attempt("raw-socket", "{P} raw_socket"),
    Attempt("packet-socket", "{P} packet_socket"),
    Attempt("netlink-add-link", "ip link add ccw0 type dummy"),
    # --- the environment ----------------------------------------------------------------
    Attempt("env-secret", "env; cat /proc/self/environ", judge="quiet"),
]
# In a separate exec: it kills every process it can see, the batch's shell included.
KILL_ALL = Attempt("kill-minus-one", "kill -9 -1; sleep 2; echo survived")
# Through supervise.run as uid nobody.
NOBODY_ATTEMPTS = [
    Attempt("setuid-root-shell-as-nobody", "./suid-sh -p -c 'id -u' | grep -qx 0 && echo ESCAPED; false"),
    Attempt("su-root", "su -c 'echo ESCAPED' root < /dev/null"),
    Attempt("sudo", "command -v sudo >/dev/null || exit 1; sudo -n sh -c 'echo ESCAPED'"),
    Attempt("write-root-owned-workspace-file", "echo x >> root-owned.txt"),
    Attempt("ptrace-init-as-nobody", "{P} ptrace_init"),
    Attempt("capabilities-as-nobody", "{P} capabilities"),
]
ALL_NAMES = [a.name for a in [*ATTEMPTS, KILL_ALL, *NOBODY_ATTEMPTS]]


def _conftest(config: pytest.Config) -> Any:
    for plugin in config.pluginmanager.get_plugins():
        if hasattr(plugin, "ToolRunner") and hasattr(plugin, "require"):
            return plugin
    raise AssertionError("vm-tests/conftest.py is not loaded")


def _probes_file() -> str:
    numbers = {}
    for name in ("ptrace", "process_vm_readv", "open_by_handle_at", "clone", "unshare", "setns", "keyctl",
                 "add_key", "bpf", "perf_event_open", "io_uring_setup", "userfaultfd", "finit_module",
                 "init_module", "kexec_load", "reboot", "syslog", "clock_settime", "swapon", "swapoff"):
        numbers[name] = seccomp.syscall_number(name, os.uname().machine)
    return f"NR = {numbers!r}\n" + (SUPPORT_DIR / "escape_probes.py").read_text()


def _batch(attempts: list[Attempt], context: dict[str, str]) -> str:
    lines = ["P() { python3 probes.py \"$@\"; }"]
    for attempt in attempts:
        lines += [f"echo '@@begin {attempt.name}'", f"( {attempt.script.format(**context)} ) 2>&1",
                  f"rc=$?; echo; echo \"@@end {attempt.name} $rc\""]
    return "\n".join(lines) + "\n"


def _split(output: str) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    current: str | None = None
    body: list[str] = []
    for line in output.splitlines():
        if line.startswith("@@begin "):
            current, body = line[8:], []
        elif line.startswith("@@end ") and current is not None:
            name, status = line[6:].rsplit(" ", 1)
            found[name] = (int(status), "\n".join(body).strip())
            current = None
        elif current is not None:
            body.append(line)
    return found


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        digest.update(f"{path.relative_to(root)} {info.st_mode} {info.st_size}".encode())
        if stat.S_ISREG(info.st_mode):
            digest.update(path.read_bytes())
        elif stat.S_ISLNK(info.st_mode):
            digest.update(os.readlink(path).encode())
    return digest.hexdigest()


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError as exc:
        return f"<{exc.strerror}>"


def _host_photo(places: list[Path], watched: list[str], pids: list[int]) -> dict[str, Any]:
    """What the attempts must leave unchanged on the host."""
    with open("/proc/self/mountinfo") as handle:
        mount_points = sorted({line.split()[4] for line in handle} - {""})
    return {
        "planted": sorted(str(p) for place in places for p in place.glob(f"*{TOKEN}*") if SECRET not in p.name),
        "mounts": [m for m in mount_points if not m.startswith(("/tmp/", "/run/", "/var/lib/ccw"))],
        "oldroot": [m for m in mount_points if "oldroot" in m],
        "knobs": {path: _read(path) for path in watched},
        "hostname": socket.gethostname(),
        "modules": sorted(line.split()[0] for line in _read("/proc/modules").splitlines()),
        "alive": {pid: os.path.exists(f"/proc/{pid}") for pid in pids},
    }


class _Listener:
    """A host loopback TCP listener and an abstract unix socket that count connections."""

    def __init__(self) -> None:
        self.tcp = socket.create_server(("127.0.0.1", 0))
        self.abstract = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.abstract_name = f"ccw-escape-{TOKEN}"
        self.abstract.bind("\0" + self.abstract_name)
        self.abstract.listen()
        self.accepted = 0
        self._stop = False
        self._threads = [threading.Thread(target=self._serve, args=(s,), daemon=True)
                         for s in (self.tcp, self.abstract)]
        for thread in self._threads:
            thread.start()

    @property
    def port(self) -> int:
        return int(self.tcp.getsockname()[1])

    def _serve(self, server: socket.socket) -> None:
        server.settimeout(0.2)
        while not self._stop:
            try:
                conn, _ = server.accept()
            except (TimeoutError, OSError):
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        for thread in self._threads:
            thread.join(2)
        self.tcp.close()
        self.abstract.close()


@dataclass
class EscapeRun:
    outcomes: dict[str, tuple[int, str]]
    before: dict[str, Any]
    after: dict[str, Any]
    accepted: int
    helper_serves_after: bool
    context: dict[str, str]
    ws_parent: Path


def _workspace(tmp: Path, outside: Path, host_secret: Path) -> Path:
    ws = tmp / "ws"
    ws.mkdir()
    (ws / "probes.py").write_text(_probes_file())
    (ws / "link_root").symlink_to("/root")
    (ws / "link_etc").symlink_to("/etc")
    (ws / "link_secret").symlink_to(host_secret)
    (ws / "link_outside").symlink_to(outside)
    shell = shutil.which("dash") or "/bin/sh"
    shutil.copy(os.path.realpath(shell), ws / "suid-sh")
    os.chown(ws / "suid-sh", 0, 0)
    os.chmod(ws / "suid-sh", 0o4755)
    (ws / "root-owned.txt").write_text("root's\n")
    os.chmod(ws / "root-owned.txt", 0o644)
    return ws


@pytest.fixture(scope="module")
def escape_run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EscapeRun]:
    conftest = _conftest(request.config)
    conftest.require(os.geteuid() == 0, "needs root")
    conftest.require(seccomp.prepare() is not None, "no seccomp filter for this architecture")
    tmp = tmp_path_factory.mktemp("escape")
    os.chmod(tmp, 0o755)
    outside = tmp / "outside"
    outside.mkdir()
    host_secret = outside / f"{SECRET}.txt"
    host_secret.write_text(SECRET_VALUE + "\n")
    root_secret = Path("/root") / SECRET
    root_secret.write_text(SECRET_VALUE + "\n")
    ws = _workspace(tmp, outside, host_secret)
    sys_knob = next((p for p in ("/sys/kernel/mm/ksm/run", "/sys/kernel/mm/transparent_hugepage/enabled",
                                 "/sys/kernel/profiling") if os.path.exists(p)), "/sys/kernel/uevent_helper")
    watched = ["/proc/sys/kernel/core_pattern", "/proc/sys/kernel/randomize_va_space", "/proc/sys/kernel/hostname",
               "/proc/sys/kernel/domainname", sys_knob, "/etc/hostname"]  # not /etc/passwd: other suites add users
    listener = _Listener()
    os.environ["CCW_ESCAPE_SECRET"] = SECRET_VALUE  # the front end's (and so the embedded helper's) environment
    runner = conftest.ToolRunner(tmp / "state")
    places = [Path("/"), Path("/etc"), Path("/usr"), Path("/root"), Path("/tmp"), outside, tmp, ws]
    try:
        async def scenario(t: Any) -> EscapeRun:
            helper = await t.runtime.helper()
            helper_pid = helper.process.process.pid
            context = {
                "P": "P", "esc": ESC, "secret_name": SECRET, "host_secret": str(host_secret),
                "host_outside": str(outside), "helper_pid": str(helper_pid), "front_pid": str(os.getpid()),
                "helper_socket": helper.socket_path, "abstract": listener.abstract_name, "port": str(listener.port),
                "sys_knob": sys_knob,
            }
            before = _host_photo(places, watched, [1, helper_pid, os.getpid()])
            cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
            # This jail leaves the next one's root tree made ahead; then the host renames.
            await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["true"]})
            conftest.replace_secrets_by_rename()
            ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", _batch(ATTEMPTS, context)],
                                                "timeout_ms": 120_000})
            killed = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", _batch([KILL_ALL], context)]})
            outcomes = _split(ran["stdout"])
            kill_out = _split(killed["stdout"])
            outcomes[KILL_ALL.name] = kill_out.get(KILL_ALL.name, (-9, killed["stdout"] + killed["stderr"]))
            outcomes.update(_run_as_nobody(tmp, ws, context))
            serves = (await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["true"]}))["exit_code"] == 0
            await t.call("capsule_destroy", {"capsule_id": cap})
            after = _host_photo(places, watched, [1, helper_pid, os.getpid()])
            return EscapeRun(outcomes, before, after, listener.accepted, serves, context, ws.parent)

        yield runner.run(scenario)
    finally:
        os.environ.pop("CCW_ESCAPE_SECRET", None)
        listener.close()
        root_secret.unlink()
        for place in places:
            for planted in place.glob(f"*{ESC}*"):
                with contextlib.suppress(OSError):
                    planted.unlink()


def _run_as_nobody(tmp: Path, ws: Path, context: dict[str, str]) -> dict[str, tuple[int, str]]:
    """The setuid attempts, as an unprivileged caller (supervise.run over a copy of the workspace)."""
    merged = tmp / "nobody-ws"
    shutil.copytree(ws, merged, symlinks=True)
    os.chown(merged / "suid-sh", 0, 0)
    os.chmod(merged / "suid-sh", 0o4755)  # copytree's chmod ran before chown dropped the bit
    dirs = []
    for name in ("nobody-tmp", "nobody-home"):
        path = tmp / name
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
        dirs.append(path)
    os.chown(merged, NOBODY, NOBODY)
    workspace = f"/srv/ccw-escape-{TOKEN}"
    spec = contain.JailSpec(merged_dir=str(merged), workspace=workspace, tmp_dir=str(dirs[0]), home_dir=str(dirs[1]),
                         argv=["sh", "-c", _batch(NOBODY_ATTEMPTS, context)], cwd=workspace,
                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/home/agent"},
                         uid=NOBODY, gid=NOBODY, timeout_ms=60_000)
    result = supervise.run(spec)
    assert (merged / "root-owned.txt").read_text() == "root's\n"
    return _split(result.stdout.decode(errors="replace"))


JUDGES: dict[str, Callable[[int, str], bool]] = {
    "fails": lambda status, out: status != 0 and "ESCAPED" not in out,
    "quiet": lambda status, out: "ESCAPED" not in out,
}


@pytest.mark.parametrize("name", ALL_NAMES)
def test_escape_attempt_fails(escape_run: EscapeRun, name: str, record_property: Callable[[str, object], None],
                              request: pytest.FixtureRequest) -> None:
    record_property("escapes_tried", 1)
    assert name in escape_run.outcomes, (f"{name} did not report (the batch died early?) "
                                         f"{list(escape_run.outcomes)[-3:]}")
    status, out = escape_run.outcomes[name]
    attempt = next(a for a in [*ATTEMPTS, KILL_ALL, *NOBODY_ATTEMPTS] if a.name == name)
    assert SECRET_VALUE not in out, f"{name} saw a host secret:\n{out}"
    if name.startswith("etc-shadow"):
        # Each name is an empty mode-0000 file: cat is refused and prints nothing else.
        leaked = [line for path in _conftest(request.config).SECRET_FILES if os.path.exists(path)
                  for line in _read(path).splitlines() if line.strip() and line in out]
        assert leaked == [] and all(line.endswith("Permission denied") for line in out.splitlines()), out
    elif name == "env-secret":
        assert "CCW_ESCAPE_SECRET" not in out, out
    elif attempt.judge == "host":
        assert escape_run.after["planted"] == [] and not (escape_run.ws_parent / ESC).exists(), escape_run.after
    elif name == "kill-minus-one":
        assert escape_run.helper_serves_after and escape_run.after["alive"] == escape_run.before["alive"]
    else:
        assert JUDGES[attempt.judge](status, out), f"{name} exited {status}:\n{out}"


def test_host_is_unchanged(escape_run: EscapeRun) -> None:
    assert escape_run.before["planted"] == []
    for key, before in escape_run.before.items():
        if isinstance(before, dict):
            changed = {k: (v, escape_run.after[key].get(k)) for k, v in before.items()
                       if escape_run.after[key].get(k) != v}
            assert changed == {}, key
        else:
            assert escape_run.after[key] == before, key
    assert escape_run.accepted == 0, "a jail reached the host's loopback listener"
    assert escape_run.helper_serves_after


def test_state_dir_inside_the_workspace_is_out_of_sight(tools: Any, tmp_path: Path,
                                                        record_property: Callable[[str, object], None]) -> None:
    """./.ccw-state: the helper's socket, the capsules' dirs and the database are hidden."""
    ws = tmp_path / "repo"
    ws.mkdir()
    (ws / "README").write_text("hi\n")
    (ws / ".ccw-state").mkdir()
    runner = type(tools)(ws / ".ccw-state")
    attempts = {
        "state-helper-socket": "python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); "
                               "s.connect('.ccw-state/helper/helper.sock'); print('ESCAPED')\"",
        "state-capsule-dirs": "ls .ccw-state/helper/capsules/*/upper && echo ESCAPED",
        "state-database": "head -c 16 .ccw-state/ccw.sqlite3 | grep -q SQLite && echo ESCAPED",
    }

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        found = {}
        for name, script in attempts.items():
            found[name] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]})
        found["listing"] = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["ls", "-A", ".ccw-state"]})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return found

    found = runner.run(scenario)
    for name in attempts:
        record_property("escapes_tried", 1)
        assert found[name]["exit_code"] != 0 and "ESCAPED" not in found[name]["stdout"], (name, found[name])
    assert found["listing"]["stdout"] == ""
    assert json.dumps(found).count(SECRET_VALUE) == 0

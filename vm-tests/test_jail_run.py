"""The jail on the real kernel: identity, isolation, read-only host, output, timeouts, leaks.

Each test builds what a capsule would give the jail: a "merged" directory (a plain
directory standing in for the overlay's merged view), per-capsule /tmp and $HOME dirs,
and a workspace path at which the merged view appears inside the jail.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import struct
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import psutil
import pytest

from sandbox import contain, jail_end, mounts, namespaces, supervise
from sandbox.errors import CcwError

NOBODY = 65534
PYTHON = os.path.realpath(sys.executable)  # the base interpreter (bound into the jail)
TRANSIENT_IN_ETC = re.compile(r"netns|.*\.ccwtest|.*\.lock|.*\+|[a-z]+-?\.[0-9]+")


@dataclass
class Capsule:
    merged: Path
    tmp: Path
    home: Path
    workspace: str

    def spec(self, argv: list[str], **kwargs: object) -> contain.JailSpec:
        fields: dict[str, object] = {
            "merged_dir": str(self.merged),
            "workspace": self.workspace,
            "tmp_dir": str(self.tmp),
            "home_dir": str(self.home),
            "argv": argv,
            "cwd": self.workspace,
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/home/agent", "LANG": "C.UTF-8"},
            "uid": NOBODY,
            "gid": NOBODY,
            "timeout_ms": 30_000,
        }
        fields.update(kwargs)
        return contain.JailSpec(**fields)  # type: ignore[arg-type]


def our_mounts(tmp_path: Path) -> list[str]:
    """Mounts in the helper's namespace that a jail could have left (others' tests mount too)."""
    marks = (str(tmp_path), "/srv/ccw-ws-", mounts.OLD_ROOT)
    with open("/proc/self/mountinfo") as handle:
        return [line for line in handle if any(mark in line for mark in marks)]


@pytest.fixture
def capsule(root_required: None, tmp_path: Path) -> Iterator[Capsule]:
    """Capsule-like dirs writable by NOBODY; checks that no mount or process is left behind."""
    dirs = []
    for name in ("merged", "tmp", "home"):
        path = tmp_path / name
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
        dirs.append(path)
    (dirs[0] / "hello.txt").write_text("hello from the workspace\n")
    os.chown(dirs[0] / "hello.txt", NOBODY, NOBODY)
    yield Capsule(dirs[0], dirs[1], dirs[2], f"/srv/ccw-ws-{uuid.uuid4().hex[:8]}")
    assert jail_end.settle(30.0), "a jail's end (its init's exit, its cgroup's removal) never finished"
    assert our_mounts(tmp_path) == [], "a jail left a mount behind in the helper's namespace"
    assert psutil.Process().children(recursive=True) == [], "a jail left a process behind"


def run(capsule: Capsule, script: str, **kwargs: object) -> supervise.JailResult:
    return supervise.run(capsule.spec(["/bin/sh", "-c", script], **kwargs))


def test_runs_as_the_callers_uid_and_gid(capsule: Capsule) -> None:
    result = run(capsule, "id -u; id -g; id -G")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == [str(NOBODY)] * 3


def test_cannot_read_etc_shadow(capsule: Capsule) -> None:
    assert Path("/etc/shadow").stat().st_size > 0
    # Empty mode-0000 files by name (mounts.ETC_SECRETS), so not even a root caller's jail reads password
    # hashes: nobody is refused, root's CAP_DAC_OVERRIDE (sandbox/rootcaps.py) reads them empty.
    result = run(capsule, "cat /etc/shadow /etc/gshadow; echo rc=$?", uid=NOBODY, gid=NOBODY)
    assert result.stdout == b"rc=1\n", result.stderr
    assert result.stderr.decode().count("Permission denied") == 2, result.stderr
    result = run(capsule, "cat /etc/shadow /etc/gshadow; echo rc=$?; stat -c %s /etc/shadow", uid=0, gid=0)
    assert (result.stdout, result.stderr) == (b"rc=0\n0\n", b"")


def test_fresh_pid_namespace_hides_and_protects_host_pids(capsule: Capsule) -> None:
    host_pid = os.getpid()
    result = run(capsule, f"echo $PPID; ls /proc | grep -E '^[0-9]+$' | sort -n | tr '\\n' ' '; echo; "
                          f"kill -0 {host_pid} 2>/dev/null && echo KILLED || echo cannot-signal")
    assert result.exit_code == 0, result.stderr
    ppid, pids, verdict = result.stdout.decode().splitlines()
    assert ppid == "1"  # the command is the jail init's child
    assert max(int(p) for p in pids.split()) < 20  # only the jail's own few processes
    assert verdict == "cannot-signal"
    assert str(host_pid) not in pids.split()


def test_cannot_reach_a_listener_on_the_hosts_loopback(capsule: Capsule) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        code = ("import socket,sys\n"
                f"s=socket.socket(); s.settimeout(2)\n"
                f"try:\n s.connect(('127.0.0.1',{port})); print('connected')\n"
                "except OSError as e: print('refused', e.errno)\n")
        result = supervise.run(capsule.spec([PYTHON, "-c", code]))
        assert result.exit_code == 0, result.stderr
        assert result.stdout.startswith(b"refused")
        with pytest.raises(BlockingIOError):
            listener.accept()
    # lo itself is up in the jail's own network namespace
    result = run(capsule, "cat /sys/class/net/lo/operstate /sys/class/net/lo/flags; ls /sys/class/net")
    assert result.stdout.split()[1] in (b"0x9", b"0x49")  # IFF_UP | IFF_LOOPBACK (| IFF_RUNNING)
    assert result.stdout.split()[2:] == [b"lo"]


def _drain_spares() -> None:
    for pool in (supervise._SPARE_NETS, supervise._SPARE_ROOTS):
        while (spare := pool.take()) is not None:
            os.close(spare)


def test_every_jail_has_its_own_network_namespace_prepared_or_not(capsule: Capsule) -> None:
    # Jails take a network namespace the helper made while the previous jail was being
    # built, or unshare their own when none waits; either way: fresh, only lo, lo up.
    host_netns = os.stat("/proc/self/ns/net").st_ino
    seen = set()
    script = "stat -L -c %i /proc/self/ns/net; cat /sys/class/net/lo/flags; ls /sys/class/net"
    for drained in (True, False, False):
        if drained:
            _drain_spares()
        result = run(capsule, script)
        assert result.exit_code == 0, result.stderr
        inode, flags, *interfaces = result.stdout.decode().split()
        assert flags in ("0x9", "0x49") and interfaces == ["lo"]
        seen.add(int(inode))
    assert len(seen) == 3 and host_netns not in seen
    if namespaces.net_namespace_restorable():
        assert os.stat("/proc/self/ns/net").st_ino == host_netns  # this thread came back home
        spare = supervise._SPARE_NETS.take()
        assert spare is not None, "a run leaves a prepared namespace for the next one"
        os.close(spare)


def test_the_root_is_the_same_built_ahead_or_in_the_jail(capsule: Capsule) -> None:
    # The root tree (system dirs read-only, secrets masked, /dev) comes from the helper's
    # thread or, with none waiting, from the init itself: the jail must not tell.
    script = ("cat /proc/self/mountinfo | awk '{print $5, $6, $9}' | sort; ls -la /dev | awk '{print $1, $NF}'; "
              "touch /usr/x /etc/x /dev/x /x 2>&1 | wc -l; stat -c %s /etc/shadow; "
              "echo hi > /dev/shm/y && cat /dev/shm/y; ls /dev/pts")
    outputs = []
    for drained in (True, False, False):
        if drained:
            _drain_spares()
        result = run(capsule, script)
        assert result.exit_code == 0, result.stderr
        outputs.append(result.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    text = outputs[0].decode()
    assert "\n4\n0\nhi\nptmx\n" in text  # all four touches refused, /etc/shadow empty
    assert " /.oldroot " not in text and "/dev/null" in text
    if (tree := mounts.spare_root()) is not None:  # this kernel builds detached trees (6.15+)
        os.close(tree)
        spare = supervise._SPARE_ROOTS.take()
        assert spare is not None, "a run leaves a root tree for the next one"
        os.close(spare)


def test_hostname_is_ccw(capsule: Capsule) -> None:
    result = run(capsule, "cat /proc/sys/kernel/hostname")
    assert result.stdout == b"ccw\n"


def test_environment_is_exactly_the_spec(capsule: Capsule) -> None:
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/agent", "ONLY_THIS": "1 2 3"}
    result = supervise.run(capsule.spec(["/bin/cat", "/proc/self/environ"], env=env))
    assert result.exit_code == 0, result.stderr
    got = dict(item.split("=", 1) for item in result.stdout.decode().split("\0") if item)
    assert got == env


def test_output_cap_counts_and_flags_truncation(capsule: Capsule) -> None:
    result = run(capsule, "head -c 3000000 /dev/zero; echo -n err >&2", output_cap=1000)
    assert result.exit_code == 0
    assert result.stdout == b"\0" * 1000
    assert (result.stdout_bytes, result.stdout_truncated) == (3_000_000, True)
    assert (result.stderr, result.stderr_bytes, result.stderr_truncated) == (b"err", 3, False)


def test_stdin_is_delivered(capsule: Capsule) -> None:
    data = os.urandom(300_000)  # larger than a pipe buffer
    result = supervise.run(capsule.spec(["/bin/sh", "-c", "cat; echo done >&2"], stdin=data))
    assert result.stdout == data
    assert result.stderr == b"done\n"
    assert supervise.run(capsule.spec(["/bin/cat"])).stdout == b""  # no stdin: /dev/null


def test_timeout_kills_a_daemonised_grandchild(capsule: Capsule) -> None:
    token = f"{time.time_ns() % 1000}.{os.getpid()}"  # a unique sleep duration to find it by
    script = f"(setsid sh -c 'sleep {token}' > /dev/null 2>&1 &); sleep {token}"
    result = run(capsule, script, timeout_ms=700)
    assert result.timed_out
    assert (result.exit_code, result.signal) == (None, "SIGKILL")
    survivors = [p for p in psutil.process_iter(["cmdline"]) if token in " ".join(p.info["cmdline"] or [])]
    assert survivors == []


def test_daemons_die_when_the_command_exits(capsule: Capsule) -> None:
    token = f"{time.time_ns() % 1000}.{os.getpid() + 1}"
    result = run(capsule, f"(setsid sleep {token} > /dev/null 2>&1 &); echo started")
    assert (result.exit_code, result.timed_out, result.stdout) == (0, False, b"started\n")
    assert [p for p in psutil.process_iter(["cmdline"]) if token in " ".join(p.info["cmdline"] or [])] == []


def test_death_by_signal_is_reported(capsule: Capsule) -> None:
    result = run(capsule, "kill -SEGV $$")
    assert (result.exit_code, result.signal, result.timed_out) == (None, "SIGSEGV", False)
    result = run(capsule, "exit 3")
    assert (result.exit_code, result.signal) == (3, None)


def test_no_descriptor_above_2_leaks_into_the_jail(capsule: Capsule) -> None:
    leaky = os.open("/etc/hostname", os.O_RDONLY)
    os.set_inheritable(leaky, True)
    try:
        result = supervise.run(capsule.spec(["/bin/ls", "/proc/self/fd"]))
    finally:
        os.close(leaky)
    assert result.stdout.split() == [b"0", b"1", b"2", b"3"]  # 3 is ls's own directory handle


def test_missing_or_unrunnable_command(capsule: Capsule) -> None:
    result = supervise.run(capsule.spec(["no-such-command-ccw"]))
    assert result.exit_code == 127
    assert b"no-such-command-ccw" in result.stderr and b"not found" in result.stderr
    assert supervise.run(capsule.spec(["/no/such/file"])).exit_code == 127
    (capsule.merged / "script.sh").write_text("echo hi\n")  # mode 0644: not executable
    assert supervise.run(capsule.spec([f"{capsule.workspace}/script.sh"])).exit_code == 126


def test_a_script_whose_interpreter_the_jail_lacks_says_bad_interpreter(capsule: Capsule) -> None:
    # Found in a trial: a venv's pytest, made by a pyenv python under another user's home,
    # said "ccw: .venv/bin/pytest: No such file or directory" although the file was there.
    interpreter = "/home/someone/.pyenv/versions/3.11.9/bin/python3.11"
    bin_dir = capsule.merged / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "pytest").write_text(f"#!{interpreter}\nimport sys\n")
    (bin_dir / "pytest").chmod(0o755)
    result = supervise.run(capsule.spec([".venv/bin/pytest", "-q"]))
    assert result.exit_code == 126, result.stderr  # there, but cannot be run: bash's status too
    said = result.stderr.decode()
    assert said.startswith(f"ccw: .venv/bin/pytest: bad interpreter: {interpreter} (named by .venv/bin/pytest's "
                           "#! line): No such file or directory; "), said
    assert "expose its directory" in said and "recreate the venv" in said, said
    # Found along PATH, it is named by the path it was found at.
    found = supervise.run(capsule.spec(["pytest"], env={"PATH": f"{capsule.workspace}/.venv/bin:/usr/bin:/bin"}))
    assert found.exit_code == 126
    assert f"ccw: pytest: bad interpreter: {interpreter} (named by {capsule.workspace}/.venv/bin/pytest's" \
        in found.stderr.decode(), found.stderr
    # An interpreter that is there, and a dangling link, keep what they said.
    (bin_dir / "there").write_text("#!/bin/sh\necho ran\n")
    (bin_dir / "there").chmod(0o755)
    assert supervise.run(capsule.spec([".venv/bin/there"])).stdout == b"ran\n"
    (bin_dir / "python").symlink_to(interpreter)
    dangling = supervise.run(capsule.spec([".venv/bin/python"]))
    assert (dangling.exit_code, dangling.stderr) == (127, b"ccw: .venv/bin/python: No such file or directory\n")


def test_a_program_whose_elf_loader_the_jail_lacks_says_bad_interpreter(capsule: Capsule) -> None:
    # A program built against a loader the jail does not show (one under /nix/store, or
    # musl's) said "ccw: ./tool: No such file or directory" of a file that is plainly there.
    program = bytearray(Path("/bin/true").read_bytes())
    interpreter = _elf_interpreter(bytes(program))
    missing = "/nix/ccw" + "x" * (len(interpreter) - len("/nix/ccw") - len("/ld.so")) + "/ld.so"
    at = program.index(interpreter.encode() + b"\0")
    program[at:at + len(missing)] = missing.encode()
    (capsule.merged / "tool").write_bytes(bytes(program))
    (capsule.merged / "tool").chmod(0o755)
    result = supervise.run(capsule.spec(["./tool"]))
    assert result.exit_code == 126, result.stderr
    said = result.stderr.decode()
    assert said.startswith(f"ccw: ./tool: bad interpreter: {missing} (named by ./tool's ELF program header): "
                           "No such file or directory; "), said
    assert "expose its directory" in said and "whose loader the jail shows" in said, said
    # The same program with the loader the jail shows runs.
    (capsule.merged / "plain").write_bytes(Path("/bin/true").read_bytes())
    (capsule.merged / "plain").chmod(0o755)
    assert supervise.run(capsule.spec(["./plain"])).exit_code == 0


def _elf_interpreter(image: bytes) -> str:
    """The PT_INTERP path of a 64-bit little-endian ELF image (the test's own reading, not ccw-jail's)."""
    phoff, = struct.unpack_from("<Q", image, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", image, 0x36)
    for index in range(phnum):
        kind, _flags, offset, _vaddr, _paddr, size = struct.unpack_from("<IIQQQQ", image, phoff + index * phentsize)
        if kind == 3:  # PT_INTERP
            return image[offset:offset + size].rstrip(b"\0").decode()
    raise AssertionError("/bin/true names no program interpreter")


def test_missing_cwd_is_an_error_naming_the_step(capsule: Capsule) -> None:
    with pytest.raises(CcwError) as info:
        supervise.run(capsule.spec(["/bin/true"], cwd="/no/such/dir"))
    assert info.value.code == "NOT_FOUND"
    assert "chdir /no/such/dir" in info.value.message


def test_workspace_is_read_write_at_its_own_path(capsule: Capsule) -> None:
    result = run(capsule, f"pwd; cat hello.txt; echo new > {capsule.workspace}/made.txt")
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{capsule.workspace}\nhello from the workspace\n".encode()
    assert (capsule.merged / "made.txt").read_text() == "new\n"


def test_workspace_under_tmp_at_its_real_path(capsule: Capsule, tmp_path: Path) -> None:
    workspace = str(tmp_path / "project")  # a real path under /tmp, like most checkouts in tests
    result = run(capsule, "pwd; cat hello.txt; echo t > /tmp/t.txt", workspace=workspace, cwd=workspace)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{workspace}\nhello from the workspace\n".encode()
    assert (capsule.tmp / "t.txt").read_text() == "t\n"


def test_tmp_and_home_persist_across_runs(capsule: Capsule) -> None:
    first = run(capsule, "echo one > /tmp/a; echo two > $HOME/b")
    assert first.exit_code == 0, first.stderr
    second = run(capsule, "cat /tmp/a $HOME/b")
    assert second.stdout == b"one\ntwo\n"
    assert (capsule.tmp / "a").exists() and (capsule.home / "b").exists()


@pytest.mark.parametrize(("uid", "kept"), [(NOBODY, "0" * 16), (0, "000000000000001b")])
def test_no_capabilities_and_no_new_privs(capsule: Capsule, uid: int, kept: str) -> None:
    # Root keeps exactly CHOWN, DAC_OVERRIDE, FOWNER, FSETID (sandbox/rootcaps.py); nobody keeps none.
    result = run(capsule, "grep -E '^(Cap|NoNewPrivs)' /proc/self/status", uid=uid, gid=uid)
    fields = dict(line.split(":\t") for line in result.stdout.decode().splitlines())
    assert fields == {"CapInh": "0" * 16, "CapPrm": kept, "CapEff": kept,
                      "CapBnd": kept, "CapAmb": "0" * 16, "NoNewPrivs": "1"}


@pytest.fixture
def sentinel() -> Iterator[Path]:
    """A world-writable dir and file under /opt: only the read-only bind protects them."""
    require_opt = Path("/opt")
    path = require_opt / f"ccw-jail-sentinel-{uuid.uuid4().hex[:8]}"
    path.mkdir(mode=0o777)
    path.chmod(0o777)
    (path / "keep.txt").write_text("keep")
    (path / "keep.txt").chmod(0o666)
    yield path
    shutil.rmtree(path)


@pytest.mark.parametrize("uid", [NOBODY, 0])
def test_rm_rf_root_leaves_the_host_unchanged(capsule: Capsule, sentinel: Path, uid: int) -> None:
    etc_before = sorted(os.listdir("/etc"))
    result = run(capsule, "rm -rf --no-preserve-root / 2>/dev/null; "
                          f"echo x > {sentinel}/keep.txt || echo sentinel-protected; "
                          "touch /usr/ccw-x || echo usr-ro; touch /new || echo root-ro; "
                          "mkdir /dev/x || echo dev-ro; "
                          "echo ccw > /proc/sys/kernel/domainname || echo procsys-ro; "
                          "ls /tmp /home/agent | wc -l",
                 uid=uid, gid=uid, output_cap=1 << 16)
    lines = result.stdout.decode().split()
    for verdict in ("sentinel-protected", "usr-ro", "root-ro", "dev-ro", "procsys-ro"):
        assert verdict in lines, (verdict, result.stdout, result.stderr)
    assert (sentinel / "keep.txt").read_text() == "keep"
    # Nothing of /etc is gone (the jail's rm deletes).  Tests on the other worker add and remove
    # names of their own meanwhile, which may come and go: /etc/netns (an `ip netns exec`
    # test's), the copies conftest's replace_secrets_by_rename renames over /etc/shadow, and
    # useradd's and userdel's locks and temporary files (passwd.lock, passwd.1234, shadow+).
    transient = {name for name in etc_before if TRANSIENT_IN_ETC.fullmatch(name)}
    assert not set(etc_before) - transient - set(os.listdir("/etc"))
    assert Path("/usr/bin/true").exists() and Path(PYTHON).exists()


def test_clock_offset(capsule: Capsule, require: Callable[[bool, str], None]) -> None:
    require(namespaces.time_namespace_supported(), "no time namespace in this kernel")
    year = 365 * 86400
    with open("/proc/uptime") as handle:
        host_uptime = float(handle.read().split()[0])
    result = run(capsule, "cat /proc/uptime; date +%Y", clock_offset_sec=year)
    assert result.exit_code == 0, result.stderr
    uptime, _idle, shown_year = result.stdout.split()
    assert float(uptime) >= host_uptime + year
    if namespaces.faketime_library() is not None:
        assert int(shown_year) == time.gmtime(time.time() + year).tm_year


# Each bad spec with the code it gets and what the error names.  The helper's own choices
# (the workspace, the network) are checked by contain._check_spec: a workspace is the
# caller's mistake, a network other than none/egress the helper's (its op parsing admits no
# other), so INTERNAL.  argv and cwd were checked when the helper read the request
# (ExecRequest, spec.resolve_cwd) and are not checked again: here ccw-jail itself refuses a
# plan without argv, and fails the chdir of a relative cwd, each naming its step and errno.
INVALID_SPECS = [
    ({"argv": []}, "INVALID_ARGUMENT", {"step": "read the jail plan", "errno": "EINVAL"}, "lacks options"),
    ({"workspace": "relative"}, "INVALID_ARGUMENT", {}, "workspace 'relative' must be a normalised absolute path"),
    ({"workspace": "/proc/x"}, "INVALID_ARGUMENT", {}, "workspace '/proc/x' collides with a path the jail mounts"),
    ({"workspace": "/tmp"}, "INVALID_ARGUMENT", {}, "workspace '/tmp' collides with a path the jail mounts"),
    ({"cwd": "rel"}, "NOT_FOUND", {"step": "chdir rel", "errno": "ENOENT"}, "pass a cwd that exists"),
    ({"network": "host"}, "INTERNAL", {}, "network 'host' with net_fd None"),
]


@pytest.mark.parametrize(("bad", "code", "details", "says"), INVALID_SPECS,
                         ids=[repr(case[0]) for case in INVALID_SPECS])
def test_invalid_specs_are_refused(capsule: Capsule, bad: dict[str, object], code: str, details: dict[str, str],
                                   says: str) -> None:
    with pytest.raises(CcwError) as err:
        supervise.run(replace(capsule.spec(["/bin/true"]), **bad))  # type: ignore[arg-type]
    assert (err.value.code, err.value.details) == (code, details), err.value.to_dict()
    assert says in err.value.message, err.value.message


class RecordingCgroup:
    """Stands in for exec_cgroup.ExecCgroup: a pipe as its one cgroup file; records the rest."""

    def __init__(self, fail_enter: bool = False) -> None:
        self.fail_enter = fail_enter
        self.read_end: int | None = None
        self.watched = 0
        self.kills = 0
        self.teardowns = 0

    def entry_files(self) -> list[tuple[int, str]]:
        if self.fail_enter:  # the write fails (EBADF), as one into a removed cgroup would (ENODEV)
            return [(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC), "/sys/fs/cgroup/gone/tasks")]
        self.read_end, write_end = os.pipe2(os.O_CLOEXEC)
        return [(write_end, "/sys/fs/cgroup/recorded/tasks")]

    def written(self) -> bytes:
        assert self.read_end is not None
        try:
            return os.read(self.read_end, 64)
        finally:
            os.close(self.read_end)

    def watch(self) -> None:
        self.watched += 1

    def kill(self) -> None:
        self.kills += 1

    def teardown(self) -> None:
        self.teardowns += 1


def test_the_child_moves_itself_in_and_the_init_ends_the_jail_on_timeout(capsule: Capsule) -> None:
    cgroup = RecordingCgroup()
    started: list[int] = []
    result = supervise.run(capsule.spec(["/bin/sleep", "20"], timeout_ms=300), cgroup=cgroup,  # type: ignore[arg-type]
                      on_started=started.append)
    assert result.timed_out and result.signal == "SIGKILL"
    assert cgroup.written() == b"0" and cgroup.watched == 1  # "0": the writer itself (exec_cgroup.py)
    # Asked to, the init killed and reaped the jail itself, and reported what it used.
    assert cgroup.kills == 0 and result.init_report is not None
    assert len(started) == 1
    result.ending.release()


def test_an_init_that_cannot_be_asked_is_killed_with_its_cgroup(capsule: Capsule,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervise._Running, "end", lambda self: False)
    cgroup = RecordingCgroup()
    result = supervise.run(capsule.spec(["/bin/sleep", "20"], timeout_ms=300), cgroup=cgroup)  # type: ignore[arg-type]
    assert result.timed_out and result.signal == "SIGKILL"
    assert cgroup.kills >= 1 and result.init_report is None
    cgroup.written()
    result.ending.release()


def test_a_failed_move_into_the_cgroup_fails_the_run_without_leftovers(capsule: Capsule, tmp_path: Path) -> None:
    marker = tmp_path / "merged" / "ran"
    with pytest.raises(CcwError, match="write '0' to '/sys/fs/cgroup/gone/tasks' failed: EBADF") as caught:
        supervise.run(capsule.spec(["/bin/touch", f"{capsule.workspace}/ran"]),
                      cgroup=RecordingCgroup(fail_enter=True))  # type: ignore[arg-type]
    assert caught.value.details == {"errno": "EBADF", "path": "/sys/fs/cgroup/gone/tasks"}
    assert not marker.exists()  # nothing of the command ran


def test_a_real_exec_cgroup_holds_the_jail_and_roots_its_cgroup_namespace(capsule: Capsule) -> None:
    from sandbox import cgroups, exec_cgroup

    layout = cgroups.detect_layout()
    cgroup = exec_cgroup.ExecCgroup.prepare(layout, f"jailrun-{uuid.uuid4().hex[:8]}", exec_cgroup.Limits(pids_max=64))
    joined = dict(cgroup.dirs)
    try:
        result = supervise.run(capsule.spec(["/bin/cat", "/proc/self/cgroup"]), cgroup=cgroup)
    except BaseException:
        cgroup.teardown()
        raise
    usage = cgroup.collect(result.init_report)
    result.ending.release()
    assert result.ending.wait(30.0)
    assert cgroup.dirs == {} and not any(os.path.exists(path) for path in joined.values())
    assert joined and result.exit_code == 0
    # Moved in before it unshared its cgroup namespace: every joined hierarchy shows "/".
    seen = cgroups.parse_self_cgroup(result.stdout.decode())
    for hier in joined:
        key = "" if hier.version == 2 else next(k for k in seen if k and frozenset(k.split(",")) == hier.controllers)
        assert seen[key] == "/", (hier.mount_point, seen)
    unified = layout.unified
    if unified is not None and layout.for_resource("kill") is not unified:
        assert unified not in joined  # controller-less v2, freezer kills: never joined
    assert "pids_limited" in usage.unavailable or usage.pids_limited is False


def test_run_returns_on_the_inits_last_report_and_its_end_follows(capsule: Capsule) -> None:
    cgroup = RecordingCgroup()
    # A daemon holding stdout open: the init kills and reaps it before its last report.
    result = supervise.run(capsule.spec(["/bin/sh", "-c", "sleep 30 & echo done"]), cgroup=cgroup)  # type: ignore[arg-type]
    assert (result.exit_code, result.stdout) == (0, b"done\n")
    assert cgroup.written() == b"0"
    # The janitor reaps the init (no zombie is left) but keeps the cgroup until it is released.
    deadline = time.monotonic() + 30
    while psutil.Process().children(recursive=True) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert psutil.Process().children(recursive=True) == []
    assert not result.ending.done() and cgroup.teardowns == 0
    result.ending.release()
    result.ending.release()  # idempotent
    assert result.ending.wait(30.0) and cgroup.teardowns == 1


def test_concurrent_runs_from_helper_threads(capsule: Capsule) -> None:
    import threading

    outputs: dict[int, list[bytes]] = {}

    def worker(index: int) -> None:
        outputs[index] = [run(capsule, f"echo {index}-$$-$PPID").stdout for _ in range(3)]

    threads = [threading.Thread(target=worker, args=(index,)) for index in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outputs == {index: [f"{index}-2-1\n".encode()] * 3 for index in range(4)}
    # the threads went back to the helper's own pid namespace
    assert os.readlink("/proc/thread-self/ns/pid_for_children") == os.readlink("/proc/self/ns/pid")


@pytest.mark.parametrize("uid", [NOBODY, 0])
def test_the_init_is_out_of_the_commands_reach(capsule: Capsule, uid: int) -> None:
    # Same uid as the command, but non-dumpable: no /proc/1/fd (the report pipe), no ptrace.
    result = run(capsule, f"(echo forged > /proc/1/fd/{contain._FD_REPORT}) 2>/dev/null "
                          "&& echo fd-leak || echo fd-protected; "
                          "cat /proc/1/environ >/dev/null 2>&1 && echo env-leak || echo env-protected; "
                          "kill -9 1; echo still-here", uid=uid, gid=uid)
    assert result.stdout.split() == [b"fd-protected", b"env-protected", b"still-here"]
    assert result.exit_code == 0

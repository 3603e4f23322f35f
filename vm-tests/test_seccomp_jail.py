"""The seccomp filter on the real kernel: each denied call fails inside a jail, builds still work.

The probe calls each syscall through ctypes with arguments chosen so that, without the
filter, most calls would succeed or fail with another errno (EFAULT, EBADF, EINVAL,
ENOTTY); a control run of the same probe on the host as an unprivileged user (no
filter) shows that for those calls, so the EPERM seen in the jail is the filter's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import contain, seccomp, supervise

NOBODY = 65534
ARCH = os.uname().machine
SYSTEM_PYTHON = "/usr/bin/python3"

# name -> argument list; pointers are NULL (0), descriptors -1 where that gives EBADF.
CLONE_FS, CLONE_THREAD, SIGCHLD = 0x200, 0x10000, 17
PROBES: dict[str, list[int]] = {
    "mount": [0, 0, 0, 0, 0], "umount2": [0, 0], "pivot_root": [0, 0], "move_mount": [-1, 0, -1, 0, 0],
    "open_tree": [-1, 0, 0], "fsopen": [0, 0], "fsconfig": [-1, 0, 0, 0, 0], "fsmount": [-1, 0, 0],
    "fspick": [-1, 0, 0], "mount_setattr": [-1, 0, 0, 0, 0], "chroot": [0],
    "unshare": [0], "setns": [-1, 0],
    "ptrace": [16, 0x7FFFFFF0, 0, 0],  # PTRACE_ATTACH to no such pid: ESRCH
    "process_vm_readv": [0, 0, 0, 0, 0, 0],
    "process_vm_writev": [0, 0, 0, 0, 0, 0], "pidfd_getfd": [-1, 0, 0], "kexec_load": [0, 0, 0, 0],
    "kexec_file_load": [-1, -1, 0, 0, 0], "init_module": [0, 0, 0], "finit_module": [-1, 0, 0],
    "delete_module": [0, 0], "bpf": [0, 0, 0], "perf_event_open": [0, 0, -1, -1, 0],
    "keyctl": [0, -3, 0], "add_key": [0, 0, 0, 0, 0], "request_key": [0, 0, 0, 0],
    "io_uring_setup": [1, 0], "io_uring_enter": [-1, 0, 0, 0, 0, 0], "io_uring_register": [-1, 0, 0, 0],
    "userfaultfd": [0], "open_by_handle_at": [-1, 0, 0], "name_to_handle_at": [-100, 0, 0, 0, 0],
    "swapon": [0, 0], "swapoff": [0], "reboot": [0, 0, 0, 0], "acct": [0], "quotactl": [0, 0, 0, 0],
    "quotactl_fd": [-1, 0, 0, 0], "lookup_dcookie": [0, 0, 0], "syslog": [10, 0, 0],
    "settimeofday": [0, 0], "clock_settime": [0, 0], "vhangup": [], "iopl": [0], "ioperm": [0, 0, 0],
    "uselib": [0],
}
ARG_PROBES: dict[str, tuple[str, list[int]]] = {
    # label: (syscall, args).  Each combination is invalid without the filter (EINVAL).
    "clone(CLONE_NEWUSER|CLONE_FS)": ("clone", [0x10000000 | CLONE_FS | SIGCHLD, 0, 0, 0, 0]),
    "clone(CLONE_NEWNS|CLONE_FS)": ("clone", [0x00020000 | CLONE_FS | SIGCHLD, 0, 0, 0, 0]),
    "clone(CLONE_NEWPID|CLONE_THREAD)": ("clone", [0x20000000 | CLONE_THREAD | SIGCHLD, 0, 0, 0, 0]),
    "clone3": ("clone3", [0, 0]),
    "ioctl(TIOCSTI)": ("ioctl", [0, seccomp.TIOCSTI, 0]),
    "ioctl(TIOCLINUX)": ("ioctl", [0, seccomp.TIOCLINUX, 0]),
    "personality(ADDR_NO_RANDOMIZE)": ("personality", [0x0040000]),
    "mknodat(S_IFCHR)": ("mknodat", [-100, 0, 0o020600, 0x103]),
}
# Without the filter (host, unprivileged), these do not give EPERM.
UNAMBIGUOUS = ("unshare", "setns", "ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd",
               "keyctl", "io_uring_setup", "io_uring_enter", "io_uring_register", "perf_event_open",
               "name_to_handle_at", "clock_settime", "mount_setattr", "chroot",
               "clone(CLONE_NEWUSER|CLONE_FS)", "clone(CLONE_NEWNS|CLONE_FS)", "clone(CLONE_NEWPID|CLONE_THREAD)",
               "clone3", "ioctl(TIOCSTI)", "personality(ADDR_NO_RANDOMIZE)")

PROBE_SCRIPT = textwrap.dedent("""
    import ctypes, json, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    calls = json.loads(sys.argv[1])
    out = {}
    for label, (nr, args) in calls.items():
        if label.startswith("personality"):
            # Run it in a child so a success (no filter) cannot change this probe.
            pid = os.fork()
            if pid == 0:
                ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
                os._exit(0 if ret >= 0 else min(ctypes.get_errno(), 255))
            out[label] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            continue
        ctypes.set_errno(0)
        ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        out[label] = 0 if ret >= 0 else ctypes.get_errno()
    out["status"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("Seccomp:")]
    print(json.dumps(out))
""")


def _calls() -> dict[str, tuple[int, list[int]]]:
    calls: dict[str, tuple[int, list[int]]] = {}
    for name, args in PROBES.items():
        nr = seccomp.syscall_number(name, ARCH)
        if nr is not None:
            calls[name] = (nr, args)
    for label, (name, args) in ARG_PROBES.items():
        nr = seccomp.syscall_number(name, ARCH)
        if nr is not None:
            calls[label] = (nr, args)
    return calls


@pytest.fixture
def dirs(root_required: None, tmp_path: Path, require: Any) -> Iterator[dict[str, str]]:
    require(seccomp.prepare() is not None, f"no seccomp filter for {ARCH}")
    require(os.path.exists(SYSTEM_PYTHON), "needs /usr/bin/python3")
    made = {}
    for name in ("merged", "tmp", "home"):
        path = tmp_path / name
        path.mkdir()
        os.chown(path, NOBODY, NOBODY)
        made[name] = str(path)
    yield made


def _run(dirs: dict[str, str], argv: list[str], uid: int = NOBODY, **kwargs: Any) -> supervise.JailResult:
    spec = contain.JailSpec(
        merged_dir=dirs["merged"], workspace="/srv/ccw-seccomp", tmp_dir=dirs["tmp"], home_dir=dirs["home"],
        argv=argv, cwd="/srv/ccw-seccomp", env={"PATH": "/usr/bin:/bin", "HOME": "/home/agent", "LANG": "C.UTF-8"},
        uid=uid, gid=uid, timeout_ms=60_000, **kwargs,
    )
    return supervise.run(spec)


@pytest.mark.parametrize("uid", [NOBODY, 0], ids=["nobody", "root"])
def test_every_denied_call_fails_in_the_jail(dirs: dict[str, str], uid: int) -> None:
    calls = _calls()
    result = _run(dirs, [SYSTEM_PYTHON, "-c", PROBE_SCRIPT, json.dumps(calls)], uid=uid)
    assert result.exit_code == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen.pop("status") == ["2"]  # SECCOMP_MODE_FILTER
    expected = {label: (38 if label == "clone3" else 1) for label in calls}  # ENOSYS, EPERM
    assert seen == expected
    assert len(seen) >= 50


def test_without_the_filter_those_calls_do_not_give_eperm(dirs: dict[str, str]) -> None:
    """The control: the same probe on the host, as nobody, no filter."""
    calls = {label: call for label, call in _calls().items() if label in UNAMBIGUOUS}
    probe = subprocess.run([SYSTEM_PYTHON, "-c", PROBE_SCRIPT, json.dumps(calls)], capture_output=True, text=True,
                           user=NOBODY, group=NOBODY, extra_groups=[], check=False, stdin=subprocess.DEVNULL,
                           timeout=60)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert seen.pop("status") == ["0"]
    assert {label: errno for label, errno in seen.items() if errno == 1} == {}


def test_ordinary_work_still_runs(dirs: dict[str, str]) -> None:
    # A backslash-newline in this literal joins a long line: the shell never sees it.
    script = textwrap.dedent("""
        set -e
        python3 -c 'import threading, subprocess, multiprocessing, os
    t = threading.Thread(target=print, args=("thread ok",)); t.start(); t.join()
    print(subprocess.run(["echo", "spawn ok"], capture_output=True, text=True).stdout.strip())
    with multiprocessing.Pool(2) as pool: print("pool", sum(pool.map(abs, [-1, -2])))
    r, w = os.pipe(); os.mkfifo("/tmp/fifo"); print("fifo ok")'
        sh -c 'echo sh ok | tr a-z A-Z'
        stty size </dev/null 2>/dev/null || echo "ioctl on a non-tty: ENOTTY, not EPERM"
        cd /tmp && git init -q repo && cd repo && echo x > f && git add f
        git -c user.email=a@b -c user.name=a commit -qm one && git log --oneline | wc -l
        if command -v gcc >/dev/null; then
            printf '#include <stdio.h>\\n#include <pthread.h>\\nstatic void *f(void *a){return a;}\\n\
int main(void){pthread_t t;pthread_create(&t,0,f,0);pthread_join(t,0);puts("c ok");return 0;}\\n' > /tmp/m.c
            gcc -O1 -pthread -o /tmp/m /tmp/m.c && /tmp/m && echo compiled
        else
            echo "c ok"
        fi
    """)
    result = _run(dirs, ["/bin/sh", "-c", script])
    assert result.exit_code == 0, result.stderr.decode()
    lines = result.stdout.decode().split()
    for word in ("thread", "spawn", "pool", "fifo", "SH", "c"):
        assert word in lines, result.stdout
    assert b"1\n" in result.stdout  # one commit
    if shutil.which("gcc"):
        assert b"compiled" in result.stdout


def test_pytest_runs_in_a_capsule(tools: Any) -> None:
    """The project's own unit tests, run by its venv's pytest inside a capsule over the repo."""
    repo = str(Path(__file__).resolve().parent.parent)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": repo}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": [
            ".venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_seccomp_filter.py"]})
        status = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["grep", "Seccomp:", "/proc/self/status"]})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"ran": ran, "status": status}

    out = tools.run(scenario)
    assert out["ran"]["exit_code"] == 0, out["ran"]["stdout"] + out["ran"]["stderr"]
    assert " passed" in out["ran"]["stdout"]
    assert out["status"]["stdout"].split() == ["Seccomp:", "2"]


def test_isolation_reports_the_filter(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario(t: Any) -> dict[str, Any]:
        cap = await t.call("capsule_create", {"workspace": str(ws)})
        await t.call("capsule_destroy", {"capsule_id": cap["capsule_id"]})
        return dict(cap["isolation"])

    isolation = tools.run(scenario)
    reported = isolation["jail"]["seccomp"]
    assert reported["mode"] == "filter"
    assert set(seccomp.DENIED) <= set(reported["denied"]) and "ioctl(TIOCSTI,TIOCLINUX)" in reported["denied"]
    assert sys.platform == "linux"

"""ccw-jail's own contract (sandbox/jail/, sandbox/jail_launcher.py), on the real kernel.

A malformed plan is refused with an "E" report, never a crash; every report kind the
helper reads arrives (C, P, E, W, A, R); END_SIGNAL ends the jail with the usage still
reported; the seccomp filter holds for the command; no descriptor of the helper's
reaches the command; a launcher whose helper is gone before PR_SET_PDEATHSIG builds
nothing.  supervise.py drives the launcher in the other jail tests; here
it is also spawned by hand, with plans and descriptors made for each case.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace as dataclass_replace
from pathlib import Path

import pytest

from sandbox import contain, jail_end, jail_launcher, mounts, rusage, seccomp, supervise, unotify
from sandbox.errors import CcwError
from tests.support.descriptors import open_descriptors

NOBODY = 65534


@pytest.fixture
def spec(root_required: None, tmp_path: Path) -> Iterator[contain.JailSpec]:
    """A jail spec over capsule-like dirs writable by NOBODY."""
    for name in ("merged", "tmp", "home"):
        (tmp_path / name).mkdir()
        os.chown(tmp_path / name, NOBODY, NOBODY)
    yield contain.JailSpec(merged_dir=str(tmp_path / "merged"), workspace="/srv/ccw-launcher-ws",
                           tmp_dir=str(tmp_path / "tmp"), home_dir=str(tmp_path / "home"),
                           argv=["/bin/true"], cwd="/srv/ccw-launcher-ws",
                           env={"PATH": "/usr/bin:/bin", "HOME": "/home/agent"}, uid=NOBODY, gid=NOBODY,
                           timeout_ms=30_000)
    assert jail_end.settle(30.0)


def _with(spec: contain.JailSpec, **changes: object) -> contain.JailSpec:
    return contain.JailSpec(**{**spec.__dict__, **changes})  # type: ignore[arg-type]


def _reports(raw: bytes) -> dict[bytes, bytes]:
    return {kind: payload for kind, payload in reversed(supervise._parse_reports(raw))}


def _spawn(plan: bytes, report_w: int, err_w: int, extra: dict[int, int] | None = None) -> int:
    """Spawn the launcher on ``plan`` with stdio, the report pipe and ``extra`` descriptors
    (the caller keeps and closes those it passed); its pid."""
    plan_fd = os.memfd_create("test-plan", os.MFD_CLOEXEC)
    os.write(plan_fd, plan)
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    placed = {0: null, 1: null, 2: err_w, 3: report_w, jail_launcher.FD_PLAN: plan_fd, **(extra or {})}
    high = {target: os.dup(fd) for target, fd in placed.items()}  # above every target: see jail_launcher.spawn
    try:
        return os.posix_spawn(jail_launcher.PATH, [jail_launcher.PATH], {},
                              file_actions=[(os.POSIX_SPAWN_DUP2, fd, target) for target, fd in high.items()])
    finally:
        for fd in (*high.values(), plan_fd, null):
            os.close(fd)


def _spawn_raw(plan: bytes, extra: dict[int, int] | None = None) -> tuple[int, bytes, bytes]:
    """Spawn the launcher on ``plan`` with stdio, the report pipe and ``extra`` descriptors;
    its wait status, its reports and its stderr."""
    report_r, report_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        pid = _spawn(plan, report_w, err_w, extra)
    finally:
        os.close(report_w)
        os.close(err_w)
    with os.fdopen(report_r, "rb") as reports, os.fdopen(err_r, "rb") as err:
        raw, stderr = reports.read(), err.read()
    _, status = os.waitpid(pid, 0)
    return status, raw, stderr


def _plan(spec: contain.JailSpec) -> bytes:
    return jail_launcher.encode(contain.prepare(spec), jail_launcher.ROOT, 0)


@pytest.mark.parametrize("damage", ["magic", "cut short", "unknown record", "string without NUL",
                                    "no options", "bytes past the end", "empty"])
def test_a_malformed_plan_is_refused_with_an_e_report(spec: contain.JailSpec, damage: str) -> None:
    good = _plan(spec)
    bad = {
        "magic": b"CCWJAIL0" + good[8:],
        "cut short": good[:-5],
        "unknown record": good[:8] + b"Q" + struct.pack("=I", 1) + b"x" + good[8:],
        "string without NUL": good[:8] + b"h" + struct.pack("=I", 3) + b"ccw" + good[8:],
        "no options": good[:8] + good[8 + 5 + 36:],
        "bytes past the end": good + b"\0",
        "empty": b"",
    }[damage]
    status, raw, _ = _spawn_raw(bad)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 125, status  # refused, not crashed
    reports = _reports(raw)
    assert set(reports) == {b"E"}
    step, number, text = reports[b"E"].decode().split("\0")
    assert step == "read the jail plan" and int(number) == errno.EINVAL and text


def test_a_failed_step_reports_e_and_names_it(spec: contain.JailSpec) -> None:
    with pytest.raises(Exception) as caught:
        supervise.run(_with(spec, cwd="/no/such/dir"))
    assert "jail step 'chdir /no/such/dir'" in str(caught.value)
    assert "ENOENT" in str(caught.value)


def test_the_rootless_shape_reports_p_w_a_and_r(spec: contain.JailSpec) -> None:
    """Not pid 1 already: the launcher unshares the pid namespace, forks the init, reports its pid and status."""
    root = mounts.spare_root()
    assert root is not None, "this kernel builds no detached root tree (before 6.15?)"
    plan = jail_launcher.encode(contain.prepare(_with(spec, argv=["/bin/sh", "-c", "exit 7"])), jail_launcher.ROOT, 0)
    try:
        status, raw, _ = _spawn_raw(plan, {jail_launcher.FD_ROOT: root})
    finally:
        os.close(root)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    reports = _reports(raw)
    assert set(reports) == {b"P", b"W", b"A", b"R"}
    assert struct.unpack("!i", reports[b"P"])[0] > 1  # the init's pid as the helper sees it
    assert os.waitstatus_to_exitcode(struct.unpack("!i", reports[b"W"])[0]) == 7
    assert os.waitstatus_to_exitcode(struct.unpack("!i", reports[b"A"])[0]) == 0
    report = rusage.unpack(reports[b"R"])
    assert report is not None and 0 < report.inherited_kb < 20_000  # the launcher's small image, not the helper's


def test_a_cgroup_file_that_refuses_the_move_reports_c(spec: contain.JailSpec) -> None:
    root = mounts.spare_root()
    assert root is not None
    read_only = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)  # "0" cannot be written to it: EBADF
    plan = jail_launcher.encode(contain.prepare(spec), jail_launcher.ROOT, 1)
    try:
        status, raw, _ = _spawn_raw(plan, {jail_launcher.FD_ROOT: root, jail_launcher.FD_CGROUPS: read_only})
    finally:
        os.close(root)
        os.close(read_only)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 125
    reports = _reports(raw)
    assert set(reports) == {b"C"}
    assert struct.unpack("!ii", reports[b"C"]) == (0, errno.EBADF)


def test_end_signal_ends_the_jail_and_the_usage_is_still_reported(spec: contain.JailSpec) -> None:
    """The helper's timeout sends END_SIGNAL: the init kills and reaps everything, then reports."""
    script = "sleep 300 & sleep 300 & wait"
    result = supervise.run(_with(spec, argv=["/bin/sh", "-c", script], timeout_ms=1500))
    assert result.timed_out and result.signal == "SIGKILL"
    assert result.init_report is not None, "the init was killed instead of ending the jail itself"
    assert result.ending.wait(30.0)


def test_end_signal_sent_by_hand_reaches_the_init(spec: contain.JailSpec) -> None:
    started: list[int] = []

    def end_it(pid: int) -> None:
        started.append(pid)
        os.kill(pid, contain.END_SIGNAL)  # before or after the command starts: blocked until waited for

    result = supervise.run(_with(spec, argv=["/bin/sleep", "300"]), on_started=end_it)
    assert started and result.signal == "SIGKILL" and not result.timed_out
    assert result.init_report is not None


def test_the_seccomp_filter_still_denies(spec: contain.JailSpec) -> None:
    probe = ("import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
             "print(libc.syscall(272, 0x10000000), ctypes.get_errno()); "  # unshare(CLONE_NEWUSER)
             "print(open('/proc/self/status').read().split('Seccomp:')[1].split()[0])")
    result = supervise.run(_with(spec, argv=[os.path.realpath("/usr/bin/python3"), "-c", probe]))
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["-1", str(errno.EPERM), "2"]


# A run that can overlap another: one filter each way; the rename names the record, or, when the
# kernel refuses the notifying form (here: a program with no return, which it rejects), the
# plain filter still denies and the record says it had no listener.
_OVERLAP_PROBE = ("import ctypes, errno, os; libc = ctypes.CDLL(None, use_errno=True); "
                  "print(libc.syscall(272, 0x10000000), ctypes.get_errno()); "  # unshare(CLONE_NEWUSER)
                  "print(open('/proc/self/status').read().split('Seccomp_filters:')[1].split()[0]); "
                  "open('/tmp/a', 'w').close(); os.rename('/tmp/a', '/tmp/b'); print(os.path.exists('/tmp/b'))")


@pytest.mark.parametrize("kernel", ["takes", "refuses"])
def test_a_run_that_can_overlap_has_one_filter_and_the_plain_one_if_refused(
        spec: contain.JailSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kernel: str) -> None:
    if kernel == "refuses":
        broken = [seccomp.Insn(seccomp.BPF_LD | seccomp.BPF_W | seccomp.BPF_ABS, 0, 0, seccomp.OFFSET_NR)]
        raw = seccomp.encode(broken)
        buffer = ctypes.create_string_buffer(raw, len(raw))
        prepared = seccomp.Filter(buffer, seccomp._SockFprog(len(broken), ctypes.addressof(buffer)), len(broken))
        plain = seccomp.prepare
        monkeypatch.setattr(seccomp, "prepare", lambda notifying=False: prepared if notifying else plain())
    record = unotify.begin(str(tmp_path / "upper"), "/")
    try:
        result = supervise.run(_with(spec, argv=[os.path.realpath("/usr/bin/python3"), "-c", _OVERLAP_PROBE]),
                               record=record)
    finally:
        named = record.finish()
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["-1", str(errno.EPERM), "1", "True"]
    if kernel == "takes":
        assert named.complete and named.mine == {"tmp/a", "tmp/b"}  # its rename notified: both names
    else:
        assert not named.complete and record.unavailable == "the kernel refused the notifying seccomp filter"


def test_no_descriptor_of_the_helper_reaches_the_command(spec: contain.JailSpec) -> None:
    leaked = os.open(os.devnull, os.O_RDONLY)
    os.set_inheritable(leaked, True)  # even one the helper forgot to mark close-on-exec
    try:
        probe = "import os; print(' '.join(sorted(os.listdir('/proc/self/fd'), key=int)))"
        result = supervise.run(_with(spec, argv=[os.path.realpath("/usr/bin/python3"), "-c", probe]))
    finally:
        os.close(leaked)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.decode().split() == ["0", "1", "2", "3"]  # stdio, and listdir's own


def test_the_init_is_the_launcher_not_a_python_fork(spec: contain.JailSpec) -> None:
    result = supervise.run(_with(spec, argv=["/bin/sh", "-c", "tr '\\0' ' ' < /proc/1/cmdline; ls /proc/1/fd"]))
    assert result.stdout.decode().split()[0] == "ccw-jail"
    assert b"Permission denied" in result.stderr  # non-dumpable: its report pipe is out of reach


def test_a_helper_without_the_launcher_refuses_to_start(tmp_path: Path) -> None:
    code = ("import sys; from sandbox import jail_launcher, __main__ as m; "
            "jail_launcher.PATH = '/nonexistent/ccw-jail'; "
            f"sys.exit(m.main(['--socket', '{tmp_path}/s', '--state-dir', '{tmp_path}/state']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)})
    assert done.returncode == 1
    assert "/nonexistent/ccw-jail is missing" in done.stderr and "reinstall ccw" in done.stderr
    assert not (tmp_path / "s").exists()


def test_without_a_tree_built_ahead_the_launcher_builds_it_in_place(
        spec: contain.JailSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """What kernels before 6.15 get (no mounting onto a detached tree), forced here: the
    same root, built by ccw-jail from the plan's 'r' steps, /etc's secrets masked alike."""
    monkeypatch.setattr(supervise, "_SPARE_ROOTS", type(supervise._SPARE_ROOTS)(lambda: None))
    script = ("tr '\\0' ' ' < /proc/1/cmdline; echo; id -u; ls /; ls /dev; stat -c '%a %s' /etc/shadow; "
              "cat /etc/shadow; touch /newfile; grep -c . /etc/passwd; readlink /bin || true")
    result = supervise.run(_with(spec, argv=["/bin/sh", "-c", script]))
    assert result.exit_code == 0, result.stderr  # the last command's status
    lines = result.stdout.decode().split()
    assert lines[0] == "ccw-jail" and lines[1] == str(NOBODY)
    for name in ("usr", "etc", "dev", "proc", "sys", "tmp"):
        assert name in lines, name
    for name in ("null", "zero", "urandom", "pts", "shm", "ptmx", "fd"):
        assert name in lines, name
    assert "0 0" in result.stdout.decode()  # the mask's empty mode-0 file
    assert b"/etc/shadow: Permission denied" in result.stderr
    assert b"'/newfile': Read-only file system" in result.stderr


LAUNCH_VIEW = """
import os, sys
from sandbox import syscalls
proc = os.open("/proc/self", os.O_PATH | os.O_DIRECTORY)
syscalls.setns(int(sys.argv[1]), syscalls.CLONE_NEWNS)
with open(os.open("mountinfo", os.O_RDONLY, dir_fd=proc)) as table:
    print(len(table.read().splitlines()), sorted(os.listdir("/")), bool(os.statvfs("/").f_flag & os.ST_RDONLY))
"""


def test_the_launch_namespace_is_one_read_only_mount_holding_the_staging_dir(root_required: None) -> None:
    # What ccw-jail copies instead of the helper's table (mounts.py's essay): one mount,
    # however many capsules the helper has mounted.
    launch = mounts.launch_namespace()
    assert launch is not None
    assert mounts.launch_namespace() == launch  # made once
    seen = subprocess.run([sys.executable, "-c", LAUNCH_VIEW, str(launch)], pass_fds=(launch,), capture_output=True,
                          text=True, check=True, cwd=Path(__file__).resolve().parent.parent).stdout
    assert seen.split() == ["1", "['tmp']", "True"]


def test_a_jail_built_from_the_launch_namespace_shows_its_binds_and_no_host_path(
        spec: contain.JailSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "merged" / "in-workspace.txt").write_text("seen\n")
    (tmp_path / "tmp" / "in-tmp.txt").write_text("tmp\n")
    sent: list[tuple[int, list[str]]] = []
    encode = jail_launcher.encode

    def recorded(plan: contain.Plan, options: int, cgroups: int, notify_fd: int | None = None,
                 notify_key: bytes = b"") -> bytes:
        sent.append((options, [step.target for step in plan.mount_steps if step.from_fd]))
        return encode(plan, options, cgroups, notify_fd, notify_key)

    monkeypatch.setattr(jail_launcher, "encode", recorded)
    supervise.run(spec).ending.release()  # a root tree is made ahead for the next run
    script = ("cat in-workspace.txt /tmp/in-tmp.txt; cat /proc/self/mountinfo | wc -l; "
              f"test -e {tmp_path} && echo host-path-seen; test -e /.oldroot && echo old-root-seen; true")
    result = supervise.run(_with(spec, argv=["/bin/sh", "-c", script]))
    result.ending.release()
    options, from_descriptors = sent[-1]
    assert options & jail_launcher.LAUNCH and options & jail_launcher.ROOT
    assert {"/srv/ccw-launcher-ws", "/tmp", "/home/agent"} <= set(from_descriptors)
    lines = result.stdout.decode().split()
    assert lines[:2] == ["seen", "tmp"] and "host-path-seen" not in lines and "old-root-seen" not in lines
    assert int(lines[2]) < 40  # the jail's own mounts, not the helper's table


def test_a_source_descriptor_out_of_order_is_refused(spec: contain.JailSpec) -> None:
    root = mounts.spare_root()
    assert root is not None
    plan = contain.prepare(spec)
    steps, sources = mounts.detach_sources(plan.mount_steps, jail_launcher.FD_CGROUPS + 1)  # one too far
    raw = jail_launcher.encode(dataclass_replace(plan, mount_steps=steps), jail_launcher.ROOT, 0)
    try:
        status, reports_raw, _ = _spawn_raw(raw, {jail_launcher.FD_ROOT: root, **{
            jail_launcher.FD_CGROUPS + 1 + i: fd for i, fd in enumerate(sources)}})
    finally:
        for fd in (root, *sources):
            os.close(fd)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 125
    step, number, text = _reports(reports_raw)[b"E"].decode().split("\0")
    assert (step, int(number)) == ("read the jail plan", errno.EINVAL) and "out of order" in text


def test_a_root_step_source_out_of_order_is_refused(spec: contain.JailSpec, monkeypatch: pytest.MonkeyPatch) -> None:
    """Descriptor sources of the root tree's own steps ('r') are checked for order too, after the 'm' steps'."""
    passed = mounts.MountStep("bind", "/usr", str(jail_launcher.FD_CGROUPS + 3), from_fd=True)
    monkeypatch.setattr(mounts, "root_steps", lambda: [passed])
    status, raw, _ = _spawn_raw(jail_launcher.encode(contain.prepare(spec), 0, 0))  # no tree built ahead: 'r' records
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 125
    step, number, text = _reports(raw)[b"E"].decode().split("\0")
    assert (step, int(number)) == ("read the jail plan", errno.EINVAL) and "out of order" in text


def test_a_launcher_whose_helper_is_gone_builds_no_jail(spec: contain.JailSpec) -> None:
    """The report pipe's reader gone before PR_SET_PDEATHSIG was armed: the launcher ends, nothing runs."""
    root = mounts.spare_root()
    assert root is not None
    ran = os.path.join(spec.tmp_dir, "ran")
    plan = jail_launcher.encode(contain.prepare(_with(spec, argv=["/bin/sh", "-c", "echo > /tmp/ran"])),
                                jail_launcher.ROOT, 0)
    report_r, report_w = os.pipe()
    os.close(report_r)  # nobody reads the reports: the helper is gone
    try:
        pid = _spawn(plan, report_w, report_w, {jail_launcher.FD_ROOT: root})
    finally:
        os.close(report_w)
        os.close(root)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 125
    assert not os.path.exists(ran)


def test_a_bind_source_that_cannot_be_cloned_fails_as_its_step(spec: contain.JailSpec, tmp_path: Path) -> None:
    gone = str(tmp_path / "gone")  # the capsule's /tmp, removed after the plan was made
    steps = [dataclass_replace(step, source=mounts.OLD_ROOT + gone) if step.target == "/tmp" else step
             for step in contain.prepare(spec).mount_steps]
    with pytest.raises(CcwError) as caught:
        mounts.detach_sources(steps, jail_launcher.FD_CGROUPS)
    assert caught.value.details["step"] == f"bind /.oldroot{gone} -> /tmp"
    assert "ENOENT" in str(caught.value)


@pytest.mark.parametrize("uid", [NOBODY, 0])  # 0: a root caller's tree and binds, idmapped (sandbox/idmap.py)
def test_a_jail_that_cannot_start_leaves_no_descriptor(spec: contain.JailSpec, uid: int,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    spec = _with(spec, uid=uid, gid=uid)
    supervise.run(spec).ending.release()  # the launch namespace and a root tree made, as in a helper
    assert jail_end.settle(30.0)

    def refuse(steps: list[mounts.MountStep], first_fd: int,
               idmap: int | None) -> tuple[list[mounts.MountStep], list[int]]:
        raise CcwError("NOT_FOUND", "jail step 'bind ...' failed: ENOENT")

    monkeypatch.setattr(mounts, "detach_sources", refuse)
    pools = (supervise._SPARE_NETS, supervise._SPARE_ROOTS, supervise._MAPPED_ROOTS)

    def ours() -> dict[int, str]:
        """The open descriptors but the pools' spares (the start takes one, the refill makes another)."""
        for pool in pools:
            pool.refill()
        spares = {fd for pool in pools for fd in pool._ready}
        return {fd: target for fd, target in open_descriptors().items() if fd not in spares}

    before = ours()
    with pytest.raises(CcwError):
        supervise.run(spec)
    # The pipes, the plan, the clones: all closed.  Not the count before and after: a thread
    # an earlier test left on the worker (a fanotify group's closer) may close one meanwhile.
    assert {fd: target for fd, target in ours().items() if before.get(fd) != target} == {}


def test_a_user_namespace_that_cannot_be_unshared_is_told_with_its_errno(root_required: None) -> None:
    """``ccw-jail userns`` where no user namespace may be made (a namespace whose limit is 0): "E" and the errno."""
    script = f"echo 0 > /proc/sys/user/max_user_namespaces && exec {jail_launcher.PATH} userns < /dev/null"
    done = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script], capture_output=True, timeout=30)
    assert (done.returncode, done.stdout) == (125, f"E{errno.ENOSPC}".encode()), done.stderr

"""The jail's plan, parsers and result decoding: pure logic, no root, no namespaces."""

from __future__ import annotations

import errno
import os
import signal
import struct
from pathlib import Path

import pytest

from sandbox import contain, mounts, namespaces, spec, supervise, syscalls
from sandbox.errors import CcwError


def test_parse_id_map_and_mapping() -> None:
    text = "         0       1000          1\n      1000     100000      65536\n"
    ranges = namespaces.parse_id_map(text)
    assert ranges == [(0, 1000, 1), (1000, 100000, 65536)]
    assert namespaces.is_mapped(0, ranges) and namespaces.is_mapped(66535, ranges)
    assert not namespaces.is_mapped(1, ranges) and not namespaces.is_mapped(66536, ranges)
    assert namespaces.is_initial_user_namespace(namespaces.parse_id_map("0 0 4294967295\n"))
    assert not namespaces.is_initial_user_namespace(ranges)


def test_timens_offsets_clamp_negative_shifts() -> None:
    assert namespaces.timens_offsets(3600, 100.5, 200.5) == b"monotonic 3600 0\nboottime 3600 0\n"
    # -1000 s would make a 100 s-old clock negative: clamp so it stays at >= 1 s
    assert namespaces.timens_offsets(-1000, 100.5, 2000.0) == b"monotonic -99 0\nboottime -1000 0\n"


def test_prepare_without_offset_adds_no_time_namespace_nor_env() -> None:
    plan = namespaces.prepare(0, "ccw", {"PATH": "/bin"})
    assert plan.timens_offsets is None and plan.extra_env == {}
    assert plan.flags & namespaces.JAIL_FLAGS == namespaces.JAIL_FLAGS


def test_prepare_with_offset_uses_libfaketime_when_installed() -> None:
    plan = namespaces.prepare(86400, "ccw", {"LD_PRELOAD": "/x.so"})
    library = namespaces.faketime_library()
    if library is None:
        assert plan.extra_env == {}
    else:
        assert plan.extra_env == {"LD_PRELOAD": f"{library}:/x.so", "FAKETIME": "+86400",
                                  "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def test_mount_plan_order(tmp_path: Path) -> None:
    for name in ("merged", "tmp", "home"):
        (tmp_path / name).mkdir()
    workspace = str(tmp_path / "project")  # under /tmp: must be bound after /tmp itself
    steps = mounts.prepare(merged_dir=str(tmp_path / "merged"), workspace=workspace,
                           tmp_dir=str(tmp_path / "tmp"), home="/home/agent", home_dir=str(tmp_path / "home"))
    actions = [step.action for step in steps]
    assert actions[:2] == ["private", "root"]
    assert actions[-2:] == ["detach_old_root", "seal_root"]
    targets = [step.target for step in steps]
    assert targets.index("/tmp") < targets.index(workspace)
    assert targets.index(workspace) < targets.index("/proc") < targets.index("/sys")
    by_target = {step.target: step for step in steps}
    assert by_target[workspace].source == mounts.OLD_ROOT + os.path.realpath(tmp_path / "merged")
    assert not by_target[workspace].attrs & 1
    assert "/proc/sys" in by_target and by_target["/proc/sys"].attrs & 1
    for step in steps:
        assert step.describe()



def test_a_terminal_is_bound_as_the_console_before_the_old_root_goes(tmp_path: Path) -> None:
    for name in ("merged", "tmp", "home"):
        (tmp_path / name).mkdir()
    dirs = {"merged_dir": str(tmp_path / "merged"), "workspace": "/srv/p", "tmp_dir": str(tmp_path / "tmp"),
            "home": "/home/agent", "home_dir": str(tmp_path / "home")}
    assert not any(step.action == "console" for step in mounts.prepare(**dirs))
    steps = mounts.prepare(**dirs, terminal="/dev/pts/3")
    actions = [step.action for step in steps]
    console = steps[actions.index("console")]
    assert (console.target, console.source) == (mounts.CONSOLE, mounts.OLD_ROOT + "/dev/pts/3")
    assert actions.index("console") < actions.index("detach_old_root")
    # Read-only (no chmod by that name), but a device: never nodev.
    assert console.attrs & syscalls.MOUNT_ATTR_RDONLY and not console.attrs & syscalls.MOUNT_ATTR_NODEV

def test_root_tree_steps() -> None:
    # Built before the jail pivots: host paths as sources, parents before children.
    steps = mounts.root_steps()
    by_target = {step.target: step for step in steps}
    assert by_target["/usr"].source == "/usr" and by_target["/usr"].attrs & 1  # MOUNT_ATTR_RDONLY
    # The secrets are hidden by name inside the /etc overlay, not by a mount on each file.
    assert by_target["/etc"].action == "etc" and by_target["/etc"].attrs & 1
    assert not any(step.target in mounts.SECRET_FILES for step in steps)
    targets = [step.target for step in steps]
    assert targets.index("/dev") < targets.index("/dev/null") < targets.index("/dev/pts") < targets.index("/dev/shm")
    assert by_target["/dev/null"].source_is_file and not by_target["/dev/null"].attrs
    assert not any(step.source.startswith(mounts.OLD_ROOT) for step in steps)


def test_system_steps_recreate_symlinks(tmp_path: Path) -> None:
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "bin").symlink_to("usr/bin")
    steps = mounts.system_steps(str(tmp_path))
    assert mounts.MountStep("symlink", "/bin", data="usr/bin") in steps
    assert [s.target for s in steps if s.action == "bind"] == ["/usr"]


def test_host_mounts_inside_etc_are_bound_over_the_overlay_but_never_a_secret_nor_hosts(tmp_path: Path) -> None:
    (tmp_path / "etc").mkdir()
    line = "{n} 1 0:{n} / {point} rw,relatime - {fstype} src rw"
    mountinfo = "\n".join(line.format(n=n, point=point, fstype=fstype) for n, (point, fstype) in enumerate([
        ("/", "ext4"), ("/etc", "ext4"), ("/etc/hosts", "ext4"), ("/etc/resolv.conf", "tmpfs"),
        ("/etc/ssl", "tmpfs"), ("/etc/ssl/private", "tmpfs"), ("/etc/shadow", "ext4"), ("/etcetera", "tmpfs"),
        ("/etc/with\\040space", "tmpfs")]))
    steps = mounts.system_steps(str(tmp_path), mountinfo)
    # A container's /etc/hosts stays under the jail's own (its hostname is in no host's)
    assert [(s.action, s.target) for s in steps] == [("etc", "/etc")] + [
        ("bind_over", p) for p in ("/etc/resolv.conf", "/etc/ssl", "/etc/with space")]
    assert all(s.source == s.target and s.attrs & 1 for s in steps)
    assert steps[0].data == mounts.ETC_HOSTS and "127.0.1.1\tccw\n" in mounts.ETC_HOSTS


def test_stream_keeps_the_cap_and_counts_everything() -> None:
    stream = supervise._Stream(cap=5)
    for chunk in (b"abc", b"defgh", b"ij"):
        stream.feed(chunk)
    assert (bytes(stream.data), stream.total) == (b"abcde", 10)


_SETUP_FAILED_STATUS = 125 << 8


def _message(kind: bytes, payload: bytes) -> bytes:
    body = kind + payload
    return struct.pack("!H", len(body)) + body


def _running(status: int | None = None, timed_out: bool = False) -> supervise._Running:
    running = supervise._Running(pid=0, direct=True, cgroup=None)
    running.status, running.timed_out = status, timed_out
    return running


def test_result_decoding() -> None:
    out, err = supervise._Stream(10), supervise._Stream(10)
    exited = supervise._parse_reports(_message(b"W", struct.pack("!i", 3 << 8)))
    result = supervise._result(exited, _running(0), 5, out, err)
    assert (result.exit_code, result.signal, result.timed_out) == (3, None, False)
    killed = supervise._parse_reports(_message(b"W", struct.pack("!i", signal.SIGSEGV)))
    assert supervise._result(killed, _running(0), 5, out, err).signal == "SIGSEGV"
    timeout = supervise._result([], _running(signal.SIGKILL, timed_out=True), 5, out, err)
    assert (timeout.exit_code, timeout.signal, timeout.timed_out) == (None, "SIGKILL", True)
    oom = supervise._result([], _running(signal.SIGKILL), 5, out, err)
    assert oom.signal == "SIGKILL" and not oom.timed_out


def test_setup_failure_becomes_a_ccw_error_naming_the_step() -> None:
    raw = _message(b"P", struct.pack("!i", 42)) + _message(b"E", b"chdir /nope\x002\x00No such file or directory")
    assert supervise._init_pid(raw) == 42
    with pytest.raises(CcwError) as info:
        supervise._result(supervise._parse_reports(raw), _running(125 << 8), 5, supervise._Stream(1),
                          supervise._Stream(1))
    assert info.value.code == "NOT_FOUND"
    assert info.value.details["step"] == "chdir /nope"
    assert "cwd" in info.value.message


def test_a_failed_move_into_the_cgroup_is_the_error_a_helper_write_gave() -> None:
    # The child's "C" report: which of the files it wrote "0" to, and the errno.
    running = supervise._Running(pid=0, direct=True, cgroup=None,
                                 entry_paths=("/cg/memory/x/tasks", "/cg/pids/x/tasks"))
    running.status = _SETUP_FAILED_STATUS
    raw = _message(b"C", struct.pack("!ii", 1, errno.ENODEV))
    with pytest.raises(CcwError) as info:
        supervise._result(supervise._parse_reports(raw), running, 5, supervise._Stream(1), supervise._Stream(1))
    assert info.value.message.startswith("write '0' to '/cg/pids/x/tasks' failed: ENODEV")
    assert info.value.details == {"errno": "ENODEV", "path": "/cg/pids/x/tasks"}


def test_spec_checks(tmp_path: Path) -> None:
    for name in ("m", "t", "h"):
        (tmp_path / name).mkdir()
    good = contain.JailSpec(merged_dir=str(tmp_path / "m"), workspace="/srv/ws", tmp_dir=str(tmp_path / "t"),
                         home_dir=str(tmp_path / "h"), argv=["/bin/true"], cwd="/srv/ws",
                         env={"PATH": "/bin", "HOME": "/home/a"})
    contain._check_spec(good)
    # A "none" capsule's jail may join the capsule's own namespace; 0 is a service's "no time limit".
    contain._check_spec(contain.JailSpec(**{**good.__dict__, "net_fd": 3, "timeout_ms": 0}))  # type: ignore[arg-type]
    # What only the helper decides; the request's own arguments were checked as it was read
    # (tests/test_ops_typed.py: test_an_exec_request_is_checked_once_as_the_helper_reads_it).
    bad_cases: list[dict[str, object]] = [
        {"workspace": "/srv/ws/"}, {"workspace": "/"}, {"workspace": "/dev/x"}, {"workspace": "/home/a"},
        {"merged_dir": str(tmp_path / "missing")}, {"network": "host"}, {"network": "egress"},
        {"hostname": ""},
    ]
    for bad in bad_cases:
        spec = contain.JailSpec(**{**good.__dict__, **bad})  # type: ignore[arg-type]
        with pytest.raises(CcwError):
            contain._check_spec(spec)


ROOTLESS_MAPS = ([(0, 1000, 1)], [(0, 1001, 1)])  # a rootless helper's: its user is 0


@pytest.mark.parametrize(("setgroups", "maps", "ids", "expected"), [
    (False, ROOTLESS_MAPS, (0, 0), (1000, 1001)),  # rootless: the user's own ids outside
    (True, ROOTLESS_MAPS, (0, 0), None),  # setgroups allowed: a privileged helper, even in a container
    (False, ROOTLESS_MAPS, (5, 0), None),  # not the helper's own uid: not the one line it may map
    (False, ([(0, 0, 1)], [(0, 0, 1)]), (0, 0), None),  # the same ids outside: nothing to give back
])
def test_command_ids_are_the_users_own_only_for_a_rootless_helper(
        monkeypatch: pytest.MonkeyPatch, setgroups: bool, maps: object, ids: tuple[int, int],
        expected: tuple[int, int] | None) -> None:
    monkeypatch.setattr(namespaces, "setgroups_allowed", lambda: setgroups)
    monkeypatch.setattr(namespaces, "read_id_maps", lambda: maps)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(os, "getegid", lambda: 0)
    assert namespaces.command_ids(*ids) == expected
    assert namespaces.outside_id(0, ROOTLESS_MAPS[0]) == 1000 and namespaces.outside_id(7, ROOTLESS_MAPS[0]) == 7


@pytest.mark.parametrize("own_ids", [(1000, 1001), None])
def test_a_rootless_plan_carries_the_users_ids_and_switches_to_none(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, own_ids: tuple[int, int] | None) -> None:
    for name in ("m", "t", "h"):
        (tmp_path / name).mkdir()
    monkeypatch.setattr(namespaces, "command_ids", lambda uid, gid: own_ids)
    monkeypatch.setattr(namespaces, "read_id_maps", lambda: ROOTLESS_MAPS)
    plan = contain.prepare(contain.JailSpec(
        merged_dir=str(tmp_path / "m"), workspace="/srv/ws", tmp_dir=str(tmp_path / "t"), home_dir=str(tmp_path / "h"),
        argv=["/bin/true"], cwd="/srv/ws", env={"PATH": "/bin", "HOME": "/home/a"}))
    assert plan.own_user_namespace is (own_ids is not None)
    # The user's ids come with the command's own namespace; without it, uid 0 of the helper's, switched to.
    assert (plan.uid, plan.gid, plan.set_uid, plan.set_gid) == (*(own_ids or (0, 0)), own_ids is None, own_ids is None)
    assert plan.keep_caps == 0


def test_mechanisms_describe_what_is_in_force() -> None:
    info = contain.mechanisms()
    assert info["no_new_privs"] is True
    assert set(spec.JAIL_NAMESPACES) <= set(str(n).split(" ")[0] for n in info["namespaces"])  # type: ignore[attr-defined]
    assert "clock_offset" in info and "seccomp" in info


def test_capsule_binds_come_after_the_private_home_and_keep_their_mode(tmp_path: Path) -> None:
    for name in ("merged", "tmp", "home", "toolchain", "gitdir"):
        (tmp_path / name).mkdir()
    binds = (mounts.Bind(str(tmp_path / "toolchain"), "/home/agent/.pyenv/versions/3.12.1"),
             mounts.Bind(str(tmp_path / "gitdir"), "/srv/repo/.git", writable=True))
    steps = mounts.prepare(merged_dir=str(tmp_path / "merged"), workspace="/srv/wt", tmp_dir=str(tmp_path / "tmp"),
                           home="/home/agent", home_dir=str(tmp_path / "home"), binds=binds)
    targets = [step.target for step in steps]
    assert targets.index("/home/agent") < targets.index("/home/agent/.pyenv/versions/3.12.1")
    by_target = {step.target: step for step in steps}
    toolchain, gitdir = by_target["/home/agent/.pyenv/versions/3.12.1"], by_target["/srv/repo/.git"]
    assert toolchain.source == mounts.OLD_ROOT + os.path.realpath(tmp_path / "toolchain")
    assert toolchain.attrs & 1 and not gitdir.attrs & 1  # MOUNT_ATTR_RDONLY, and a writable one without it
    assert targets.index("/srv/repo/.git") < targets.index("/proc")

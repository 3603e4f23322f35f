"""sandbox/unotify.py without a jail: whose change is whose, the board's window, reading a
path from a process's memory and resolving it, and the notifying seccomp program."""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
from pathlib import Path

import pytest

from sandbox import seccomp, unotify


def test_a_change_is_the_runs_unless_only_another_named_it() -> None:
    named = unotify.Named(frozenset({"mine.txt", "moved"}), frozenset({"theirs.txt", "gone", "mine.txt"}), True)
    assert named.owns("mine.txt")  # both named it: both touched it
    assert named.owns("moved/inner/file")  # a directory it renamed: what is below came along
    assert not named.owns("theirs.txt")
    assert not named.owns("gone/a/b")
    assert named.owns("nobody.txt")  # a mkdir, a symlink: no one's notification names it
    incomplete = unotify.Named(frozenset(), frozenset({"theirs.txt"}), False, unknown=1)
    assert incomplete.owns("theirs.txt")  # a record with a gap keeps everything: never a loss


def test_a_run_sees_what_the_others_named_while_it_ran() -> None:
    upper = "/nonexistent/board-test/upper"
    service = unotify.begin(upper, "/work/ws")
    service.note(b"/work/ws/before.txt")  # before the exec began: not the exec's business
    exec_run = unotify.begin(upper, "/work/ws")
    service.note(b"/work/ws/during.txt")
    exec_run.note(b"/work/ws/own.txt")
    exec_run.note(b"/tmp/outside.txt")  # not in the workspace: not in the upper dir either
    exec_named = exec_run.finish()
    assert exec_named.mine == {"own.txt"} and exec_named.others == {"during.txt"}
    assert not exec_named.complete  # no listener came (none was asked for here)
    service.note(b"/work/ws")
    service.note(None)
    service_named = service.finish()
    assert service_named.mine == {"before.txt", "during.txt", "."} and service_named.others == {"own.txt"}
    assert service_named.unknown == 1
    assert upper not in unotify._boards  # both ended: the board goes


def test_paths_are_read_from_a_process_memory_across_pages() -> None:
    page = mmap.PAGESIZE
    area = mmap.mmap(-1, 2 * page)
    text = b"/across/the/page/boundary"
    start = page - 7
    area[start:start + len(text) + 1] = text + b"\0"
    first = ctypes.c_char.from_buffer(area)  # holds the mapping while its address is used
    buffer = ctypes.create_string_buffer(page)
    assert unotify.read_path(os.getpid(), ctypes.addressof(first) + start, buffer) == text
    with pytest.raises(unotify._Unreadable):  # a bad pointer: the kernel fails the call too
        unotify.read_path(os.getpid(), 8, buffer)


def test_relative_paths_resolve_through_the_process_cwd_and_dirfd(tmp_path: Path) -> None:
    pid = os.getpid()
    cwd = os.fsencode(os.getcwd())
    assert unotify.resolve(pid, None, b"a/./b") == cwd + b"/a/b"
    assert unotify.resolve(pid, unotify.AT_FDCWD & 0xFFFFFFFF, b"x") == cwd + b"/x"
    assert unotify.resolve(pid, 7, b"/abs//path/../file") == b"/abs/file"
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert unotify.resolve(pid, fd, b"name") == os.fsencode(tmp_path) + b"/name"
    finally:
        os.close(fd)


def _action(program: list[seccomp.Insn], nr: int, arch: int) -> int:
    """The program's action for one call (the instructions build_notify_program emits)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *([0] * 6))
    pc = 0
    while True:
        insn = program[pc]
        pc += 1
        if insn.code == seccomp.BPF_LD | seccomp.BPF_W | seccomp.BPF_ABS:
            (acc,) = struct.unpack_from("<I", data, insn.k)
        elif insn.code == seccomp.BPF_JMP | seccomp.BPF_JEQ | seccomp.BPF_K:
            pc += insn.jt if acc == insn.k else insn.jf
        else:
            assert insn.code == seccomp.BPF_RET | seccomp.BPF_K, insn
            return insn.k


@pytest.mark.parametrize("arch", ["x86_64", "aarch64"])
def test_the_notifying_program_hands_over_the_rename_family_only(arch: str) -> None:
    audit = {"x86_64": seccomp.AUDIT_ARCH_X86_64, "aarch64": seccomp.AUDIT_ARCH_AARCH64}[arch]
    program = seccomp.build_notify_program(arch)
    notified = {seccomp.syscall_number(name, arch) for name in seccomp.NOTIFIED} - {None}
    assert notified and len(notified) == (6 if arch == "x86_64" else 3)
    for nr in notified:
        assert nr is not None
        assert _action(program, nr, audit) == seccomp.SECCOMP_RET_USER_NOTIF
    mount, openat = seccomp.syscall_number("mount", arch), (257 if arch == "x86_64" else 56)
    for nr in (mount, openat, 0):
        assert nr is not None
        assert _action(program, nr, audit) == seccomp.SECCOMP_RET_ALLOW  # the jail's own filter decides
    assert _action(program, 82, 0x40000003) == seccomp.SECCOMP_RET_ALLOW  # a foreign arch: the other filter kills
    assert not set(seccomp.NOTIFIED) & set(seccomp.DENIED)

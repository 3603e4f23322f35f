"""The seccomp program, checked by running it in a small cBPF interpreter (no kernel needed).

The interpreter implements exactly the instructions seccomp.py emits and fails on any
other, so a program that reads past seccomp_data, jumps out of range or falls off its
end fails here before it reaches a kernel.
"""

from __future__ import annotations

import errno
import os
import re
import struct
from pathlib import Path

import pytest

from sandbox import seccomp, syscalls
from sandbox.seccomp import Insn

ALLOW = seccomp.SECCOMP_RET_ALLOW
EPERM = seccomp.SECCOMP_RET_ERRNO | errno.EPERM
ENOSYS = seccomp.SECCOMP_RET_ERRNO | errno.ENOSYS
KILL = seccomp.SECCOMP_RET_KILL_PROCESS
AUDIT = {"x86_64": seccomp.AUDIT_ARCH_X86_64, "aarch64": seccomp.AUDIT_ARCH_AARCH64}
ARCHES = ("x86_64", "aarch64")
BPF_MAXINSNS = 4096
# A few syscalls a build needs, by number (x86_64, aarch64).
ORDINARY = {"read": (0, 63), "write": (1, 64), "openat": (257, 56), "execve": (59, 221), "wait4": (61, 260),
            "mmap": (9, 222), "futex": (202, 98), "getpid": (39, 172), "seccomp": (317, 277), "kill": (62, 129)}


def seccomp_data(nr: int, arch: int, args: tuple[int, ...] = ()) -> bytes:
    padded = (list(args) + [0] * 6)[:6]
    return struct.pack("<iIQ6Q", nr, arch, 0x400000, *padded)


def run_filter(program: list[Insn], data: bytes, trace: list[int] | None = None) -> int:
    """Interpret ``program`` over one struct seccomp_data; returns the action.  ``trace``
    gets the number of instructions run before each load and before the return."""
    acc, pc, steps = 0, 0, 0
    while True:
        assert 0 <= pc < len(program), f"pc {pc} out of the program"
        steps += 1
        assert steps <= len(program), "a cBPF program only jumps forward"
        insn = program[pc]
        pc += 1
        if insn.code == seccomp.BPF_LD | seccomp.BPF_W | seccomp.BPF_ABS:
            assert insn.k % 4 == 0 and insn.k + 4 <= len(data), f"load outside seccomp_data: {insn.k}"
            if trace is not None:
                trace.append(steps - 1)
            (acc,) = struct.unpack_from("<I", data, insn.k)
        elif insn.code == seccomp.BPF_ALU | seccomp.BPF_AND | seccomp.BPF_K:
            acc &= insn.k
        elif insn.code & 0x07 == seccomp.BPF_JMP:
            op = insn.code & 0xF0
            taken = {seccomp.BPF_JEQ: acc == insn.k, seccomp.BPF_JGE: acc >= insn.k,
                     seccomp.BPF_JSET: bool(acc & insn.k)}[op]
            pc += insn.jt if taken else insn.jf
        elif insn.code == seccomp.BPF_RET | seccomp.BPF_K:
            if trace is not None:
                trace.append(steps - 1)
            return insn.k
        else:
            raise AssertionError(f"unexpected instruction {insn}")


def action(arch: str, name_or_nr: str | int, *args: int) -> int:
    nr = name_or_nr if isinstance(name_or_nr, int) else seccomp.syscall_number(name_or_nr, arch)
    assert nr is not None
    return run_filter(seccomp.build_program(arch), seccomp_data(nr, AUDIT[arch], args))


@pytest.mark.parametrize("arch", ARCHES)
def test_program_is_well_formed(arch: str) -> None:
    program = seccomp.build_program(arch)
    assert 0 < len(program) < BPF_MAXINSNS
    assert program[-1] == Insn(seccomp.BPF_RET | seccomp.BPF_K, 0, 0, ALLOW)
    for index, insn in enumerate(program):
        assert 0 <= insn.jt <= 255 and 0 <= insn.jf <= 255 and 0 <= insn.k <= 0xFFFFFFFF
        if insn.code & 0x07 == seccomp.BPF_JMP:
            assert index + 1 + max(insn.jt, insn.jf) < len(program), f"jump out of range at {index}"
    raw = seccomp.encode(program)
    assert len(raw) == 8 * len(program)
    assert struct.unpack_from("=HBBI", raw, 0) == (program[0].code, program[0].jt, program[0].jf, program[0].k)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_architecture_is_checked_first(arch: str) -> None:
    program = seccomp.build_program(arch)
    assert program[0] == Insn(seccomp.BPF_LD | seccomp.BPF_W | seccomp.BPF_ABS, 0, 0, seccomp.OFFSET_ARCH)
    audit_arch_i386, audit_arch_arm = 0x40000003, 0x40000028
    for foreign in (audit_arch_i386, audit_arch_arm, AUDIT["aarch64" if arch == "x86_64" else "x86_64"]):
        for nr in (0, 39, 56, 172):
            assert run_filter(program, seccomp_data(nr, foreign)) == KILL


@pytest.mark.parametrize("arch", ARCHES)
def test_every_listed_syscall_gets_eperm(arch: str) -> None:
    checked = 0
    for name in seccomp.DENIED:
        if seccomp.syscall_number(name, arch) is None:
            continue
        assert action(arch, name) == EPERM, name
        assert action(arch, name, 0xFFFFFFFF, 1, 2, 3) == EPERM, name
        checked += 1
    assert checked >= 40


@pytest.mark.parametrize("arch", ARCHES)
def test_ordinary_syscalls_pass(arch: str) -> None:
    column = ARCHES.index(arch)
    for name, numbers in ORDINARY.items():
        assert action(arch, numbers[column], 1, 2, 3) == ALLOW, name


@pytest.mark.parametrize("arch", ARCHES)
def test_every_number_the_filter_does_not_name_passes(arch: str) -> None:
    named = {seccomp.syscall_number(name, arch) for name in seccomp._TABLE} - set(
        seccomp.syscall_number(name, arch) for name in seccomp.NOTIFIED)
    for nr in range(1024):
        if nr not in named:
            assert action(arch, nr, 1, 2, 3) == ALLOW, nr


@pytest.mark.parametrize("arch", ARCHES)
def test_the_number_is_found_by_a_search_not_a_list(arch: str) -> None:
    """Every syscall reaches its action or its argument check within a few instructions
    of loading its number, whatever the number (the essay's binary search; the linear list
    took 60 for ioctl)."""
    program = seccomp.build_program(arch)
    longest = 0
    for nr in range(1024):
        trace: list[int] = []
        run_filter(program, seccomp_data(nr, AUDIT[arch], (1, 2, 3)), trace)
        assert trace[:2] == [0, 2]  # arch, then nr
        longest = max(longest, trace[2] - trace[1])  # to the argument check's load, or the return
    assert longest <= 12


def test_x32_abi_is_denied_on_x86_64() -> None:
    for nr in (0, 1, 59, 165, 512, 547):
        assert action("x86_64", seccomp.X32_SYSCALL_BIT | nr) == EPERM


@pytest.mark.parametrize("arch", ARCHES)
def test_clone_with_namespace_flags_is_denied_and_plain_fork_passes(arch: str) -> None:
    sigchld, clone_vm, clone_vfork, clone_thread = 17, 0x100, 0x4000, 0x10000
    assert action(arch, "clone", sigchld) == ALLOW  # fork()
    assert action(arch, "clone", clone_vm | clone_vfork | sigchld) == ALLOW  # posix_spawn
    assert action(arch, "clone", 0x3D0F00) == ALLOW  # pthread_create's flags
    assert action(arch, "clone", clone_thread | 0x80) == ALLOW  # 0x80 is an exit-signal bit for clone
    for flag in (syscalls.CLONE_NEWUSER, syscalls.CLONE_NEWNS, syscalls.CLONE_NEWPID, syscalls.CLONE_NEWNET,
                 syscalls.CLONE_NEWUTS, syscalls.CLONE_NEWIPC, syscalls.CLONE_NEWCGROUP):
        assert action(arch, "clone", flag | sigchld) == EPERM, hex(flag)
    # The kernel uses only the low 32 bits of clone's flags; high bits change nothing.
    assert action(arch, "clone", (0xFFFF << 32) | sigchld) == ALLOW
    assert action(arch, "clone3", 0, 88) == ENOSYS


@pytest.mark.parametrize("arch", ARCHES)
def test_ioctl_terminal_injection_is_denied_whatever_the_high_word(arch: str) -> None:
    tcgets, tiocgwinsz, fionread = 0x5401, 0x5413, 0x541B
    for request in (seccomp.TIOCSTI, seccomp.TIOCLINUX, (0xDEAD << 32) | seccomp.TIOCSTI):
        assert action(arch, "ioctl", 0, request) == EPERM, hex(request)
    for request in (tcgets, tiocgwinsz, fionread, (1 << 32) | tcgets):
        assert action(arch, "ioctl", 0, request) == ALLOW, hex(request)


@pytest.mark.parametrize("arch", ARCHES)
def test_personality_allows_only_the_default_values(arch: str) -> None:
    for persona in seccomp.ALLOWED_PERSONALITIES:
        assert action(arch, "personality", persona) == ALLOW
    addr_no_randomize, read_implies_exec = 0x0040000, 0x0400000
    for persona in (addr_no_randomize, read_implies_exec, 0x1):
        assert action(arch, "personality", persona) == EPERM


@pytest.mark.parametrize("arch", ARCHES)
def test_mknod_allows_fifos_files_and_sockets_not_devices(arch: str) -> None:
    import stat

    for name, mode_arg in (("mknod", 1), ("mknodat", 2)):
        if seccomp.syscall_number(name, arch) is None:
            continue
        for kind, expected in ((stat.S_IFCHR, EPERM), (stat.S_IFBLK, EPERM), (stat.S_IFIFO, ALLOW),
                               (stat.S_IFREG, ALLOW), (stat.S_IFSOCK, ALLOW), (0, ALLOW)):
            args = [0, 0, 0, 0]
            args[mode_arg] = kind | 0o644
            assert action(arch, name, *args) == expected, (name, oct(kind))


def _header_numbers(path: Path, prefix: str = "__NR") -> dict[str, int]:
    found: dict[str, int] = {}
    for match in re.finditer(rf"#define\s+{prefix}(?:3264)?_(\w+)\s+(\d+)\b", path.read_text()):
        found.setdefault(match.group(1), int(match.group(2)))
    return found


def test_the_numbers_match_the_kernel_headers() -> None:
    """The table against linux-libc-dev's headers (x86_64 table, and the generic one arm64 uses)."""
    x86 = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
    generic = Path("/usr/include/asm-generic/unistd.h")
    assert x86.exists() or generic.exists(), "install linux-libc-dev"
    for path, arch in ((x86, "x86_64"), (generic, "aarch64")):
        if not path.exists():
            continue
        numbers = _header_numbers(path)
        for name in seccomp._TABLE:
            assert seccomp.syscall_number(name, arch) == numbers.get(name), (arch, name)


def test_mechanisms_name_every_denial() -> None:
    info = seccomp.mechanisms()
    if os.uname().machine not in ARCHES:
        assert info["mode"] is None
        return
    assert info["mode"] == "filter"
    denied = info["denied"]
    assert isinstance(denied, list) and denied == sorted(denied)
    for name in ("mount", "unshare", "setns", "ptrace", "bpf", "keyctl", "io_uring_setup", "ioctl(TIOCSTI,TIOCLINUX)",
                 "clone(namespace flags)", "open_by_handle_at", "userfaultfd", "x32 ABI"):
        assert name in denied
    for name in seccomp.DENIED:
        assert name in seccomp.__doc__, f"{name} is not explained in the module docstring"


def test_unknown_architecture_is_refused() -> None:
    with pytest.raises(ValueError, match="riscv64"):
        seccomp.build_program("riscv64")


@pytest.mark.parametrize("arch", ARCHES)
def test_the_notifying_form_differs_only_in_notifying_the_rename_family(arch: str) -> None:
    """The one filter of a run that can overlap another (unotify.py) decides every call as the
    plain filter does, but hands the rename family to its listener: what the two filters it
    replaces decided together (the strictest action wins), with every argument, every arch."""
    plain, notifying = seccomp.build_program(arch), seccomp.build_program(arch, notifying=True)
    assert 0 < len(notifying) < BPF_MAXINSNS and notifying[-1] == plain[-1]
    notified = {seccomp.syscall_number(name, arch) for name in seccomp.NOTIFIED} - {None}
    assert len(notified) == (6 if arch == "x86_64" else 3)
    numbers = {n for n in (seccomp.syscall_number(name, arch) for name in seccomp._TABLE) if n is not None}
    numbers |= set(range(0, 480)) | {seccomp.X32_SYSCALL_BIT | 1, -1}
    args = ((), (0xFFFFFFFF, 1, 2, 3), (seccomp.CLONE_NAMESPACE_FLAGS, seccomp.TIOCSTI, seccomp.S_IFCHR))
    for audit in (AUDIT[arch], 0x40000003):
        for nr in numbers:
            for arg in args:
                data = seccomp_data(nr, audit, arg)
                expected = run_filter(plain, data)
                if audit == AUDIT[arch] and nr in notified:
                    assert expected == ALLOW, nr  # never denied: only the notifying form stops it
                    expected = seccomp.SECCOMP_RET_USER_NOTIF
                assert run_filter(notifying, data) == expected, (nr, hex(audit), arg)

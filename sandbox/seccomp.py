"""The jail's seccomp filter: a classic BPF program, assembled here, installed before exec.

Some facts about seccomp, as the jail uses it:

- A filter is a classic BPF program run on every syscall with a ``struct seccomp_data``
  (``nr`` at offset 0, ``arch`` at 4, the instruction pointer at 8, ``args[6]`` as u64
  from 16).  It is installed with ``prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog)``,
  which an unprivileged process may do only after ``no_new_privs``; it is inherited
  across fork and exec and can never be removed, only stacked with stricter ones.
- Syscall numbers depend on the ABI, so the program first checks ``arch``.  An x86_64
  process can still enter the kernel through the i386 ABI (``int 0x80``, another arch
  value: killed here) and the x32 ABI (same arch value, ``nr`` with bit 30 set: denied),
  the classic ways around a filter written for one table.
- The syscall number is found by a binary search, as libseccomp does: ``jge`` splits the
  sorted numbers the filter names down to runs of ``_LEAF`` tested with ``jeq``, so any
  syscall runs at most about ten instructions before its action or its argument check
  (the linear list it replaced ran 60 for ``ioctl``, which Python makes at every
  ``open()``: over no filter, an ioctl cost 175 ns more with that list and 90 ns with the
  tree, medians of seven runs of two million on this VM).  The jump
  offsets of cBPF are 8 bits, so a half is at most 255 instructions (``build_program``
  refuses more); the arguments-checking blocks each end in a return on every path, so
  the accumulator never has to be reloaded.
- Arguments are u64 but cBPF loads 32 bits; both architectures here are little-endian,
  so the low word of ``args[i]`` sits at ``16 + 8*i``.  The flags checked here are all
  32-bit for the kernel (clone uses ``lower_32_bits(flags)``, ioctl's ``cmd`` and
  personality's ``persona`` are ``unsigned int``), so the high word cannot smuggle a
  request past the check (the TIOCSTI bypass of filters that compared 64 bits).
- Since Linux 5.11 the kernel caches, per syscall, "this filter always allows it" and
  skips the program for those (the seccomp action cache, which understands ``jeq``,
  ``jge`` and ``jset`` on ``nr`` and ``arch``), so the program costs nothing on
  ``read``/``write``; syscalls with argument checks still run it, and so does every
  syscall on an older kernel.  What stays is the entry into seccomp on every syscall
  (65 ns here, with any filter at all): the price of having one.
- ``clone3`` passes its flags in memory that a filter cannot read, so it gets ENOSYS:
  glibc (posix_spawn, pthread_create) and Go then fall back to ``clone``, whose flags
  register is checked.
- The filter is installed in the jail's init after the capabilities are gone and
  ``no_new_privs`` is set, just before it spawns the command.  Denied calls return an
  errno (EPERM), never kill: a build that probes for a feature (``unshare`` in a test
  suite, ``perf`` in a benchmark) sees "not permitted" and carries on.

What is denied, and why (``DENIED``; the table is the source of ``mechanisms()``):

==========================  ===========================================================
syscall                     why no build or test needs it, and what it would open
==========================  ===========================================================
mount umount2 pivot_root    rearranging the jail's mount tree: the way out of a mount
move_mount open_tree        namespace (unmounting a mask, re-binding the old root);
fsopen fsconfig fsmount     the new mount API, same powers
fspick mount_setattr        clearing read-only/nosuid on the jail's mounts
chroot                      classic chroot-escape tricks with a held directory fd
unshare setns               new or foreign namespaces: a user namespace hands back
                            every capability (kernel attack surface: the source of
                            most container-escape CVEs); setns on a leaked ns fd
clone (namespace flags)     the same as unshare, through clone's flags
clone3                      flags in memory the filter cannot read: ENOSYS, see above
ptrace process_vm_readv     reading or steering another process (the init, a sibling
process_vm_writev           build): secrets and code injection
pidfd_getfd                 stealing another process's descriptor (ptrace-like)
kexec_load kexec_file_load  replacing the running kernel
init_module finit_module    loading or unloading kernel code
delete_module
bpf                         eBPF programs and maps: kernel attack surface, tracing
perf_event_open             profiling other processes and the kernel; side channels
keyctl add_key request_key  kernel keyrings are not namespaced: other users' and the
                            host's keys
io_uring_setup              a second syscall path that bypasses seccomp checks of the
io_uring_enter              calls it performs; many kernel CVEs
io_uring_register
userfaultfd                 stalls kernel copies at will: the classic exploit aid
open_by_handle_at           opening any inode of a filesystem by handle, ignoring
name_to_handle_at           the mount tree (the "shocker" Docker escape)
swapon swapoff reboot       host-global
acct quotactl quotactl_fd   host-global accounting and quota administration
lookup_dcookie              kernel profiling internals (oprofile)
syslog                      the kernel log: addresses, other tenants' messages
settimeofday clock_settime  the host's wall clock (CLOCK_REALTIME is not namespaced)
vhangup                     hanging up a terminal the jail shares
iopl ioperm uselib          (x86_64) raw I/O ports; a long-dead a.out loader
personality (non-default)   ADDR_NO_RANDOMIZE and READ_IMPLIES_EXEC weaken exploits'
                            obstacles; only the values Docker allows pass
ioctl TIOCSTI TIOCLINUX     typing into a terminal the jail shares with a human: the
                            next command runs outside the jail
mknod mknodat (devices)     char and block device nodes (FIFOs, sockets and regular
                            files pass)
x32 ABI (x86_64)            a second syscall table the list above does not name
==========================  ===========================================================

For runs of a capsule that can overlap (sandbox/unotify.py says why and how) the same
program comes in a notifying form: ``SECCOMP_RET_USER_NOTIF`` for the rename and unlink
family (``NOTIFIED``), never denied, and every other call decided as above.  It is one
filter, installed with ``seccomp(2)`` and ``SECCOMP_FILTER_FLAG_NEW_LISTENER``, which
``prctl`` cannot pass; a kernel that refuses that gets the plain program.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import platform
import struct
from dataclasses import dataclass

from sandbox import syscalls

# --- constants from linux/filter.h, linux/seccomp.h, linux/audit.h ---------------------

BPF_LD, BPF_ALU, BPF_JMP, BPF_RET = 0x00, 0x04, 0x05, 0x06
BPF_W, BPF_ABS, BPF_K = 0x00, 0x20, 0x00
BPF_AND = 0x50
BPF_JEQ, BPF_JGE, BPF_JSET = 0x10, 0x30, 0x40

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_RET_USER_NOTIF = 0x7FC00000
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

OFFSET_NR, OFFSET_ARCH = 0, 4


def arg_offset(index: int) -> int:
    """Offset of the low 32 bits of ``args[index]`` in struct seccomp_data (little-endian)."""
    return 16 + 8 * index


# clone's namespace flags (CLONE_NEWTIME, 0x80, is part of clone's exit signal; only
# unshare and clone3 take it, and both are denied outright).
CLONE_NAMESPACE_FLAGS = (
    syscalls.CLONE_NEWNS | syscalls.CLONE_NEWCGROUP | syscalls.CLONE_NEWUTS | syscalls.CLONE_NEWIPC
    | syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWPID | syscalls.CLONE_NEWNET
)
TIOCSTI, TIOCLINUX = 0x5412, 0x541C
S_IFMT, S_IFCHR, S_IFBLK = 0o170000, 0o020000, 0o060000
# personality(2) values that pass (Docker's list): PER_LINUX, PER_LINUX32, UNAME26 and
# its 32-bit form, and 0xffffffff, which only queries.
ALLOWED_PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)

# Syscall numbers per architecture (x86_64: arch/x86/entry/syscalls/syscall_64.tbl;
# aarch64: include/uapi/asm-generic/unistd.h).  None: the architecture has no such call.
_TABLE: dict[str, tuple[int | None, int | None]] = {
    # name: (x86_64, aarch64)
    "mount": (165, 40), "umount2": (166, 39), "pivot_root": (155, 41),
    "move_mount": (429, 429), "open_tree": (428, 428), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "mount_setattr": (442, 442), "chroot": (161, 51),
    "unshare": (272, 97), "setns": (308, 268),
    "ptrace": (101, 117), "process_vm_readv": (310, 270), "process_vm_writev": (311, 271),
    "pidfd_getfd": (438, 438),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294),
    "init_module": (175, 105), "finit_module": (313, 273), "delete_module": (176, 106),
    "bpf": (321, 280), "perf_event_open": (298, 241),
    "keyctl": (250, 219), "add_key": (248, 217), "request_key": (249, 218),
    "io_uring_setup": (425, 425), "io_uring_enter": (426, 426), "io_uring_register": (427, 427),
    "userfaultfd": (323, 282),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264),
    "swapon": (167, 224), "swapoff": (168, 225), "reboot": (169, 142),
    "acct": (163, 89), "quotactl": (179, 60), "quotactl_fd": (443, 443),
    "lookup_dcookie": (212, 18), "syslog": (103, 116),
    "settimeofday": (164, 170), "clock_settime": (227, 112), "vhangup": (153, 58),
    "iopl": (172, None), "ioperm": (173, None), "uselib": (134, None),
    # checked by argument, below
    "clone": (56, 220), "clone3": (435, 435), "ioctl": (16, 29), "personality": (135, 92),
    "mknod": (133, None), "mknodat": (259, 33),
    # notified where a capsule's runs overlap (build_program with notifying), never denied
    "rename": (82, None), "renameat": (264, 38), "renameat2": (316, 276),
    "unlink": (87, None), "unlinkat": (263, 35), "rmdir": (84, None),
}
NOTIFIED = ("rename", "renameat", "renameat2", "unlink", "unlinkat", "rmdir")
_ARG_CHECKED = ("clone", "clone3", "ioctl", "personality", "mknod", "mknodat")
DENIED = tuple(name for name in _TABLE if name not in _ARG_CHECKED and name not in NOTIFIED)
# What mechanisms() reports: the plain list plus the argument-checked denials.
DENIED_DESCRIBED = (*DENIED, "clone(namespace flags)", "clone3(ENOSYS)", "ioctl(TIOCSTI,TIOCLINUX)",
                    "personality(non-default)", "mknod(device nodes)", "mknodat(device nodes)", "x32 ABI")
_ARCHES = {"x86_64": (0, AUDIT_ARCH_X86_64), "aarch64": (1, AUDIT_ARCH_AARCH64)}


@dataclass(frozen=True)
class Insn:
    """One cBPF instruction (struct sock_filter)."""

    code: int
    jt: int
    jf: int
    k: int


def _stmt(code: int, k: int) -> Insn:
    return Insn(code, 0, 0, k & 0xFFFFFFFF)


def _jump(code: int, k: int, jt: int, jf: int) -> Insn:
    return Insn(code, jt, jf, k & 0xFFFFFFFF)


def _ret_errno(number: int) -> Insn:
    return _stmt(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (number & 0xFFFF))


_RET_ALLOW = _stmt(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
_RET_EPERM = _ret_errno(errno.EPERM)


def _load(offset: int) -> Insn:
    return _stmt(BPF_LD | BPF_W | BPF_ABS, offset)


def _if_nr(nr: int, block: list[Insn]) -> list[Insn]:
    """``if nr == N: block`` (the block must return on every path)."""
    return [_jump(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, len(block)), *block]


def _deny_values(arg: int, values: tuple[int, ...], mask: int | None = None) -> list[Insn]:
    """Return EPERM when the low word of ``args[arg]`` (masked) is one of ``values``, else allow."""
    block = [_load(arg_offset(arg))]
    if mask is not None:
        block.append(_stmt(BPF_ALU | BPF_AND | BPF_K, mask))
    for i, value in enumerate(values):
        block.append(_jump(BPF_JMP | BPF_JEQ | BPF_K, value, len(values) - i, 0))  # to the EPERM
    return [*block, _RET_ALLOW, _RET_EPERM]


def _allow_values(arg: int, values: tuple[int, ...]) -> list[Insn]:
    """Allow when the low word of ``args[arg]`` is one of ``values``, else EPERM."""
    block = [_load(arg_offset(arg))]
    for i, value in enumerate(values):
        block.append(_jump(BPF_JMP | BPF_JEQ | BPF_K, value, len(values) - i, 0))  # to the ALLOW
    return [*block, _RET_EPERM, _RET_ALLOW]


def build_program(arch: str, notifying: bool = False) -> list[Insn]:
    """The filter for ``arch`` ("x86_64" or "aarch64"), as a list of instructions.

    ``notifying``: the same filter, but ``NOTIFIED`` calls go to its listener
    (SECCOMP_RET_USER_NOTIF) instead of passing: the one program of a run that can overlap
    another (unotify.py).  One filter, not the plain one and a notifying one after it: the
    kernel runs every filter at every call, and most of a filter's cost in a jail is fixed,
    not its length (unotify.py's essay has the figures).  Its verdicts are those the two
    filters gave together, as the strictest action wins (a foreign arch killed, x32 and
    every denied call EPERM, the rename family notified, the rest allowed)."""
    if arch not in _ARCHES:
        raise ValueError(f"no seccomp filter for architecture {arch!r}")
    column, audit_arch = _ARCHES[arch]
    nr: dict[str, int] = {}
    for name, numbers in _TABLE.items():
        number = numbers[column]
        if number is not None:
            nr[name] = number
    program = [
        _load(OFFSET_ARCH),
        _jump(BPF_JMP | BPF_JEQ | BPF_K, audit_arch, 1, 0),
        _stmt(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        _load(OFFSET_NR),
    ]
    if arch == "x86_64":
        program += [_jump(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, 0, 1), _RET_EPERM]
    blocks = {nr[name]: [_RET_EPERM] for name in DENIED if name in nr}
    blocks[nr["clone3"]] = [_ret_errno(errno.ENOSYS)]
    blocks[nr["clone"]] = [
        _load(arg_offset(0)),
        _jump(BPF_JMP | BPF_JSET | BPF_K, CLONE_NAMESPACE_FLAGS, 0, 1),
        _RET_EPERM,
        _RET_ALLOW,
    ]
    blocks[nr["ioctl"]] = _deny_values(1, (TIOCSTI, TIOCLINUX))
    blocks[nr["personality"]] = _allow_values(0, ALLOWED_PERSONALITIES)
    if "mknod" in nr:
        blocks[nr["mknod"]] = _deny_values(1, (S_IFCHR, S_IFBLK), mask=S_IFMT)
    blocks[nr["mknodat"]] = _deny_values(2, (S_IFCHR, S_IFBLK), mask=S_IFMT)
    if notifying:
        blocks.update((nr[name], [_stmt(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF)]) for name in NOTIFIED if name in nr)
    named = [n for name, n in nr.items() if notifying or name not in NOTIFIED]
    if len(named) != len(blocks):
        raise ValueError(f"two syscalls of the filter share a number on {arch}")
    return [*program, *_dispatch(sorted(blocks.items()))]


_LEAF = 3  # numbers a leaf of the search tests one by one (each a jeq)


def _dispatch(entries: list[tuple[int, list[Insn]]]) -> list[Insn]:
    """``switch (nr)`` over ``entries`` (sorted by number; each block returns on every path),
    every other number allowed: a binary search with ``jge``, down to runs of ``_LEAF``."""
    if len(entries) <= _LEAF:
        leaf: list[Insn] = []
        for number, block in entries:
            leaf += _if_nr(number, block)
        return [*leaf, _RET_ALLOW]
    middle = len(entries) // 2
    below, above = _dispatch(entries[:middle]), _dispatch(entries[middle:])
    if len(below) > 255:
        raise ValueError(f"a half of the seccomp search is {len(below)} instructions, over cBPF's 255-step jump")
    return [_jump(BPF_JMP | BPF_JGE | BPF_K, entries[middle][0], len(below), 0), *below, *above]


def syscall_number(name: str, arch: str) -> int | None:
    """The syscall's number on ``arch`` per the filter's table (None: no such call there)."""
    return _TABLE[name][_ARCHES[arch][0]]


def encode(program: list[Insn]) -> bytes:
    """The program as an array of struct sock_filter (u16 code, u8 jt, u8 jf, u32 k)."""
    return b"".join(struct.pack("=HBBI", i.code, i.jt, i.jf, i.k) for i in program)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


@dataclass(frozen=True)
class Filter:
    """A filter ready to install: the encoded program in a buffer that outlives fork."""

    buffer: ctypes.Array[ctypes.c_char]
    fprog: _SockFprog
    length: int


@functools.lru_cache(maxsize=2)
def prepare(notifying: bool = False) -> Filter | None:
    """The filter for this machine's architecture, built once in the helper (None: unsupported arch).

    ``notifying``: the jail's filter with the rename family notified (``build_program``).
    """
    arch = platform.machine()
    if arch not in _ARCHES:
        return None
    program = build_program(arch, notifying)
    raw = encode(program)
    buffer = ctypes.create_string_buffer(raw, len(raw))
    fprog = _SockFprog(len(program), ctypes.addressof(buffer))
    return Filter(buffer, fprog, len(program))


_libc = ctypes.CDLL(None, use_errno=True)
_libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
_libc.prctl.restype = ctypes.c_int


def enter(prepared: Filter) -> None:
    """Install the filter on the calling thread (needs no_new_privs or CAP_SYS_ADMIN); ctypes only."""
    if _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(prepared.fprog), 0, 0) != 0:
        number = ctypes.get_errno()
        raise OSError(number, "prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER) failed; "
                              "the kernel needs CONFIG_SECCOMP_FILTER, and no_new_privs must be set first")


def mechanisms() -> dict[str, object]:
    """What ``contain.mechanisms()`` reports under "seccomp"."""
    prepared = prepare()
    if prepared is None:
        return {"mode": None, "reason": f"no filter for architecture {platform.machine()}", "denied": []}
    return {
        "mode": "filter",
        "arch": platform.machine(),
        "action": "EPERM (clone3: ENOSYS; foreign arch: kill)",
        "instructions": prepared.length,
        "denied": sorted(DENIED_DESCRIBED),
    }

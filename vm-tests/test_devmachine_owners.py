"""A root caller on a tree owned by another uid (issue 25 item 3): the capsule writes where the host's root would.

CI runs as root on a checkout of the runner's uid; ``tar`` as root keeps an sdist's
owners.  A root caller's jail keeps CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER and
CAP_FSETID (sandbox/rootcaps.py), so:

- the real project (more-itertools with its .venv, chowned to 1234:1234) takes a new
  file, a C extension's build, its own tests and their ``.pyc`` files in a capsule; its
  witness records the owners and replays true; deltamin finds the breaking edit
  instead of refusing with "the base without any change already fails";
- and what the four do not give stays refused (each test below names the capability
  that would make it fail): the system trees, the sealed root, the masked secrets,
  mounts, handles, device nodes, other users' identities, the init's /proc entries,
  the hostname, and set-id bits.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox import contain, supervise

OWNER = 1234
WORKSPACE = "/srv/ccw-owners"


@pytest.fixture
def jail_dirs(root_required: None, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A merged view owned by uid 1234 (mode 0755, a 0444 file in it), and the jail's /tmp and $HOME."""
    found = {}
    for name in ("merged", "tmp", "home"):
        (tmp_path / name).mkdir()
        found[name] = str(tmp_path / name)
    merged = tmp_path / "merged"
    (merged / "pkg").mkdir()
    (merged / "pkg" / "ro.txt").write_text("a\n")
    os.chmod(merged / "pkg" / "ro.txt", 0o444)
    for path in (merged, merged / "pkg", merged / "pkg" / "ro.txt"):
        os.chown(path, OWNER, OWNER)
    yield found


def jail(dirs: dict[str, str], script: str, uid: int = 0) -> supervise.JailResult:
    """Run ``sh -c script`` as ``uid`` in a jail over ``dirs``."""
    return supervise.run(contain.JailSpec(
        merged_dir=dirs["merged"], workspace=WORKSPACE, tmp_dir=dirs["tmp"], home_dir=dirs["home"],
        argv=["/bin/sh", "-c", script], cwd=WORKSPACE, env={"PATH": "/usr/bin:/bin", "HOME": "/root"},
        uid=uid, gid=uid, timeout_ms=30_000))


def lines(result: supervise.JailResult) -> list[str]:
    return result.stdout.decode().splitlines()


def test_root_keeps_exactly_the_four_and_nobody_none(jail_dirs: dict[str, str]) -> None:
    # Any broader set (CAP_DAC_READ_SEARCH, CAP_SYS_ADMIN, ...) changes these masks.
    script = "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status | cut -f2"
    assert lines(jail(jail_dirs, script)) == ["0" * 16, "000000000000001b", "000000000000001b",
                                              "000000000000001b", "0" * 16]
    assert lines(jail(jail_dirs, script, uid=65534)) == ["0" * 16] * 5


def test_root_writes_where_the_hosts_root_would(jail_dirs: dict[str, str]) -> None:
    result = jail(jail_dirs, "echo b > pkg/new.txt && echo c >> pkg/ro.txt && chown 5678:5678 pkg/new.txt "
                             "&& chmod 600 pkg/ro.txt && touch -d @0 pkg/ro.txt && stat -c '%u:%g %a' pkg/new.txt pkg/ro.txt")
    assert (result.exit_code, lines(result)) == (0, ["5678:5678 644", f"{OWNER}:{OWNER} 600"]), result.stderr
    assert Path(jail_dirs["merged"], "pkg", "ro.txt").read_text() == "a\nc\n"
    refused = jail(jail_dirs, "echo b > pkg/other.txt", uid=65534)
    assert refused.exit_code != 0 and b"Permission denied" in refused.stderr


def test_system_trees_and_the_sealed_root_stay_read_only(jail_dirs: dict[str, str]) -> None:
    # EROFS whatever the capabilities: no DAC capability passes a read-only mount.
    script = "; ".join(f"{cmd} 2>&1 | grep -q 'Read-only file system' && echo refused || echo WROTE"
                       for cmd in ("touch /usr/ccw-x", "chown 1:1 /usr/bin/env", "chmod 777 /etc/passwd",
                                   "mkdir /ccw-x", "touch /etc/ccw-x", "touch /sys/ccw-x",
                                   "sh -c 'echo ccw > /proc/sys/kernel/domainname'"))
    assert lines(jail(jail_dirs, script)) == ["refused"] * 7


def test_the_masked_secrets_read_empty(jail_dirs: dict[str, str]) -> None:
    assert Path("/etc/shadow").stat().st_size > 0
    result = jail(jail_dirs, "cat /etc/shadow /etc/gshadow | wc -c; stat -c '%a %s' /etc/shadow")
    assert lines(result) == ["0", "0 0"], result.stderr


def test_no_mount_handle_or_device_node(jail_dirs: dict[str, str]) -> None:
    # seccomp denies these too; CAP_SYS_ADMIN, CAP_DAC_READ_SEARCH and CAP_MKNOD are the second wall.
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "buf = ctypes.create_string_buffer(136); ctypes.c_uint.from_buffer(buf).value = 128\n"
        "mid = ctypes.c_int()\n"
        "for name, call in (('mount', lambda: libc.mount(b'none', b'/usr', None, 0x20 | 0x1000, None)),\n"
        "                   ('handle', lambda: libc.name_to_handle_at(-100, b'/usr', buf, ctypes.byref(mid), 0)),\n"
        "                   ('open_by_handle', lambda: libc.syscall(304, os.open('/usr', os.O_RDONLY), buf, 0)),\n"
        "                   ('mknod', lambda: libc.mknod(b'/tmp/null', 0o20666, os.makedev(1, 3)))):\n"
        "    print(name, 'refused' if call() != 0 else 'DONE')\n"
    )
    result = jail(jail_dirs, f"python3 -c \"{probe}\"; mount -o remount,rw /usr 2>/dev/null || echo remount refused")
    assert lines(result) == ["mount refused", "handle refused", "open_by_handle refused", "mknod refused",
                             "remount refused"], result.stderr


def test_no_other_identity_hostname_or_init_entries(jail_dirs: dict[str, str]) -> None:
    # CAP_SETUID/SETGID, CAP_SYS_ADMIN (sethostname in the jail's own uts namespace) and
    # CAP_SYS_PTRACE (the non-dumpable init's /proc/1/root, fd/N, exe, environ) would each pass one.
    # (Listing /proc/1/fd passes: the directory is root's; opening what it lists is a ptrace check.)
    probe = (
        "import os, socket\n"
        "for name, call in (('setuid', lambda: os.setuid(1234)), ('setgid', lambda: os.setgid(1234)),\n"
        "                   ('hostname', lambda: socket.sethostname('ccw-x')),\n"
        "                   ('init-root', lambda: os.listdir('/proc/1/root')),\n"
        "                   ('init-fd', lambda: os.open('/proc/1/fd/4', os.O_WRONLY)),\n"
        "                   ('init-exe', lambda: os.readlink('/proc/1/exe')),\n"
        "                   ('init-environ', lambda: open('/proc/1/environ').read())):\n"
        "    try:\n"
        "        call(); print(name, 'DONE')\n"
        "    except PermissionError:\n"
        "        print(name, 'refused')\n"
    )
    result = jail(jail_dirs, f"python3 -c \"{probe}\"")
    assert lines(result) == [f"{name} refused" for name in
                             ("setuid", "setgid", "hostname", "init-root", "init-fd", "init-exe", "init-environ")], result.stderr


def test_set_id_bits_made_in_the_capsule_are_inert(jail_dirs: dict[str, str]) -> None:
    # CAP_FOWNER lets root make a set-uid file of uid 1234 in its tree; no_new_privs keeps it inert.
    result = jail(jail_dirs, "cp /usr/bin/id pkg/id && chown 1234:1234 pkg/id && chmod 6755 pkg/id "
                             "&& stat -c %a pkg/id && pkg/id -u && pkg/id -g")
    assert (result.exit_code, lines(result)) == (0, ["6755", "0", "0"]), result.stderr

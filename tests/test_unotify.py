"""sandbox/unotify.py without a jail: whose change is whose, the board's window, the capsule's
socket, reading a path from a process's memory and resolving it (unotify_paths.py), and the
notifying seccomp program."""

from __future__ import annotations

import ctypes
import mmap
import os
import socket
from pathlib import Path

import pytest

from sandbox import seccomp, unotify, unotify_paths


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


def test_the_board_keeps_only_what_a_running_run_may_still_need() -> None:
    upper = "/nonexistent/board-prune/upper"
    first = unotify.begin(upper, "/ws")
    for _ in range(500):  # execs beside a service that rename nothing leave nothing behind
        unotify.begin(upper, "/ws").finish()
    board = unotify._boards[upper]
    assert board.records == [first] and board.ended == []
    mover = unotify.begin(upper, "/ws")
    mover.note(b"/ws/moved.txt")
    mover.note(b"/ws/again.txt")
    mover.note(b"/ws/moved.txt")  # named again: the newest
    assert mover.since(0) == ["moved.txt", "again.txt"]
    mover.finish()
    assert board.ended == [mover]  # the service began before it ended: its finish needs these
    second = unotify.begin(upper, "/ws")  # began after the mover ended: not its business
    assert first.finish().others == {"moved.txt", "again.txt"}
    assert board.ended == [] and board.records == [second]  # no running run overlapped the mover
    assert second.finish().others == frozenset()
    assert upper not in unotify._boards


def test_paths_are_read_from_a_process_memory_across_pages() -> None:
    page = mmap.PAGESIZE
    area = mmap.mmap(-1, 2 * page)
    text = b"/across/the/page/boundary"
    start = page - 7
    area[start:start + len(text) + 1] = text + b"\0"
    first = ctypes.c_char.from_buffer(area)  # holds the mapping while its address is used
    buffer = ctypes.create_string_buffer(page)
    assert unotify_paths.read_path(os.getpid(), ctypes.addressof(first) + start, buffer) == text
    with pytest.raises(unotify_paths.Unreadable):  # a bad pointer: the kernel fails the call too
        unotify_paths.read_path(os.getpid(), 8, buffer)


def test_relative_paths_resolve_through_the_process_cwd_and_dirfd(tmp_path: Path) -> None:
    pid = os.getpid()
    cwd = os.fsencode(os.getcwd())
    assert unotify_paths.resolve(pid, None, b"a/./b") == cwd + b"/a/b"
    assert unotify_paths.resolve(pid, unotify_paths.AT_FDCWD & 0xFFFFFFFF, b"x") == cwd + b"/x"
    assert unotify_paths.resolve(pid, 7, b"/abs//path/../file") == b"/abs/file"
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert unotify_paths.resolve(pid, fd, b"name") == os.fsencode(tmp_path) + b"/name"
    finally:
        os.close(fd)


# A child that does what ccw-jail's init does (steps.c hand_listener): no_new_privs, the
# notifying filter with a new listener, the listener sent over the socket given, named by its
# run's key; then it renames
# and deletes, each call held until the helper's reader answers it.
_CHILD = r"""
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
program = sys.stdin.buffer.read()
buffer = ctypes.create_string_buffer(program, len(program))
class Fprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
fprog = Fprog(len(program) // 8, ctypes.addressof(buffer))
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
listener = libc.syscall(int(sys.argv[1]), 1, 8, ctypes.byref(fprog))  # seccomp(SET_MODE_FILTER, NEW_LISTENER)
assert listener >= 0, ctypes.get_errno()
with socket.socket(fileno=int(sys.argv[3])) as sock:
    socket.send_fds(sock, [b"L" + bytes.fromhex(sys.argv[4])], [listener])
os.close(listener)
for i in range(int(sys.argv[2])):
    os.rename(f"old{i}", f"new{i}")
    os.unlink(f"gone{i}")
"""
_SECCOMP_NR = {"x86_64": 317, "aarch64": 277}


def _child_renames(record: unotify.Record, cwd: Path, count: int) -> None:
    import subprocess
    import sys

    program = seccomp.prepare(notifying=True)
    assert program is not None
    theirs, key = record.socket_for_jail()
    try:
        subprocess.run([sys.executable, "-S", "-c", _CHILD, str(_SECCOMP_NR[os.uname().machine]), str(count),
                        str(theirs), key.hex()],
                       input=program.buffer.raw, cwd=cwd, pass_fds=(theirs,), check=True, timeout=60)
    finally:
        os.close(theirs)


@pytest.mark.skipif(os.uname().machine not in _SECCOMP_NR, reason="no notifying filter for this architecture")
def test_the_reader_answers_each_notification_and_names_its_runs_paths(tmp_path: Path) -> None:
    upper = str(tmp_path / "upper")
    runs = []
    for n in range(3):  # one after another, and one alive throughout: the reader's epoll set turns over
        cwd = tmp_path / f"ws{n}"
        cwd.mkdir()
        for i in range(20):
            (cwd / f"old{i}").write_text("x")
            (cwd / f"gone{i}").write_text("x")
        runs.append((cwd, unotify.begin(upper, str(cwd))))
    for cwd, record in runs[1:]:
        _child_renames(record, cwd, 20)
    named = [record.finish() for _, record in reversed(runs)][::-1]
    expected = {f"{kind}{i}" for i in range(20) for kind in ("old", "new", "gone")}
    for (cwd, _), got in zip(runs[1:], named[1:], strict=True):
        assert got.complete and got.mine == expected, got
        assert not os.path.exists(cwd / "gone0") and (cwd / "new19").exists()  # each call went on as asked
    assert named[0].mine == frozenset() and not named[0].complete  # no listener ever came


def test_a_jail_whose_kernel_refused_the_filter_leaves_its_run_unattributed(tmp_path: Path) -> None:
    record = unotify.begin(str(tmp_path / "upper"), str(tmp_path))
    jail_end, key = record.socket_for_jail()
    os.write(jail_end, b"F" + key)  # what ccw-jail's init sends when seccomp() fails (steps.c install_listener)
    os.close(jail_end)
    named = record.finish()
    assert not named.complete and named.owns("anything")


def test_a_jail_that_never_hands_its_listener_over_renamed_nothing(tmp_path: Path) -> None:
    record = unotify.begin(str(tmp_path / "upper"), str(tmp_path))
    os.close(record.socket_for_jail()[0])  # the init exits holding it: no notification came
    named = record.finish()
    assert named.complete and not named.mine


def test_the_capsules_socket_gives_a_listener_to_the_run_its_key_names_and_to_no_other(tmp_path: Path) -> None:
    upper = str(tmp_path / "upper")
    first, second = unotify.begin(upper, str(tmp_path)), unotify.begin(upper, str(tmp_path))
    (first_end, first_key), (second_end, second_key) = first.socket_for_jail(), second.socket_for_jail()
    board = unotify._boards[upper]
    assert os.path.samestat(os.fstat(first_end), os.fstat(second_end))  # one socket per capsule
    assert first_key != second_key and len(first_key) == unotify.KEY_SIZE  # a key per run
    stray_r, stray_w = os.pipe()  # stands for a listener: what comes with no running run's key is closed
    for end in (first_end, second_end):
        with socket.socket(fileno=os.dup(end)) as sock:
            socket.send_fds(sock, [b"L" + bytes(unotify.KEY_SIZE)], [stray_w])
    os.close(stray_w)
    os.write(second_end, b"F" + second_key)  # the second's kernel refused the filter: the first is untouched
    for end in (first_end, second_end):
        os.close(end)
    second_named = second.finish()
    assert not second_named.complete and first.listener is None
    assert os.read(stray_r, 1) == b""  # every copy of the stray descriptor was closed
    os.close(stray_r)
    assert first.finish().complete and board.sock is None and upper not in unotify._boards

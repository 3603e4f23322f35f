"""sandbox/run_sockets.py on the real kernel: a run given a cgroup v2 of its own names the
sockets its processes make, by the id sock_diag reports; the cgroup goes with the run's."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable

from mcp_server.egress import peer
from sandbox import run_sockets
from sandbox.cgroups import detect_layout
from sandbox.exec_cgroup import ExecCgroup, Limits

Require = Callable[[bool, str], None]


def _connect_from_inside(cgroup: ExecCgroup, address: tuple[str, int]) -> tuple[int, tuple[str, int], int]:
    """A child that moves itself in through the run's entry files (as the jail's launcher
    does), then connects: its pid, its socket's own end, and the pipe whose closing ends it."""
    entries = cgroup.entry_files()
    ready_r, ready_w = os.pipe()
    hold_r, hold_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        try:
            os.close(hold_w)  # else the parent's close would not end its read
            os.close(ready_r)
            for fd, _path in entries:
                os.write(fd, b"0")
            with socket.create_connection(address) as sock:
                os.write(ready_w, sock.getsockname()[1].to_bytes(2, "big"))
                os.read(hold_r, 1)
        finally:
            os._exit(0)
    for fd, _path in entries:
        os.close(fd)
    os.close(ready_w)
    os.close(hold_r)
    port = int.from_bytes(os.read(ready_r, 2), "big")
    os.close(ready_r)
    return pid, ("127.0.0.1", port), hold_w


def test_a_run_with_its_own_cgroup_v2_names_its_sockets(require: Require, root_required: None) -> None:
    layout = detect_layout()
    require(layout.unified is not None, "no cgroup2 mount on this host")
    cgroup = ExecCgroup.prepare(layout, "runsockets", Limits())
    try:
        assert run_sockets.join_unified(cgroup) is None
        assert run_sockets.join_unified(cgroup) is None  # once is enough: the same directory
        assert layout.unified is not None
        v2 = cgroup.dirs[layout.unified]
        assert run_sockets.cgroup_id(cgroup) == os.stat(v2).st_ino
        with socket.create_server(("127.0.0.1", 0)) as listener, socket.socket(
                socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_NONBLOCK, peer.NETLINK_SOCK_DIAG) as diag:
            pid, theirs, hold = _connect_from_inside(cgroup, listener.getsockname())
            accepted, _ = listener.accept()
            with accepted:
                assert peer.socket_cgroup(diag, theirs, accepted.getsockname()) == run_sockets.cgroup_id(cgroup)
                # This process's own socket is not the run's.
                assert peer.socket_cgroup(diag, accepted.getsockname(), theirs) != run_sockets.cgroup_id(cgroup)
            os.close(hold)
            os.waitpid(pid, 0)
    finally:
        cgroup.teardown()
    assert not os.path.exists(v2)
    assert run_sockets.cgroup_id(cgroup) is None

"""An exec on a terminal at the wire: the pty slave travels beside the frame, never in it,
and only the request that asks for exactly one descriptor keeps it (the rest are closed);
the helper's check takes a read-write pty slave of the caller's own and nothing else."""

from __future__ import annotations

import os

import pytest

from sandbox.access import check_terminal
from sandbox.errors import CcwError
from sandbox.ops import ExecRequest, ListRequest, attach_descriptors, parse_request
from sandbox.spec import DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT_MS
from tests.support.descriptors import is_closed


def test_the_terminal_is_not_an_argument() -> None:
    request = ExecRequest("cap_1_ab", ("bash", "-i"), stdio="tty", tty_fd=9)
    assert request.to_args() == {"capsule_id": "cap_1_ab", "argv": ["bash", "-i"], "stdio": "tty",
                                 "timeout_ms": DEFAULT_TIMEOUT_MS, "output_cap": DEFAULT_OUTPUT_CAP}
    assert request.descriptors() == [9]
    read = parse_request("exec", request.to_args())
    assert isinstance(read, ExecRequest) and read.stdio == "tty" and read.tty_fd is None
    assert read.descriptors_wanted() == 1


def test_descriptors_go_only_where_they_are_asked_for() -> None:
    tty = parse_request("exec", {"capsule_id": "cap_1_ab", "argv": ["sh"], "stdio": "tty"})
    with pytest.raises(CcwError) as missing:
        attach_descriptors(tty, [])
    assert missing.value.code == "INVALID_ARGUMENT"
    a, b = os.pipe()
    with pytest.raises(CcwError) as extra:
        attach_descriptors(ListRequest(), [a])
    assert extra.value.code == "INVALID_ARGUMENT" and is_closed(a)
    c, d = os.pipe()
    with pytest.raises(CcwError):
        attach_descriptors(tty, [b, c])  # two for one: both closed
    assert is_closed(b) and is_closed(c)
    held = attach_descriptors(tty, [d])
    assert held.tty_fd == d and held.descriptors() == [d]
    os.close(d)


def test_only_a_read_write_pty_slave_of_the_callers_passes() -> None:
    master, slave = os.openpty()
    pipe_r, pipe_w = os.pipe()
    directory = os.open("/", os.O_RDONLY | os.O_DIRECTORY)
    path_only = os.open(os.ttyname(slave), os.O_PATH)
    read_only = os.open(os.ttyname(slave), os.O_RDONLY | os.O_NOCTTY)
    try:
        check_terminal(slave, os.geteuid())
        check_terminal(None, os.geteuid())  # an exec on pipes carries none
        for fd in (master, pipe_r, directory, path_only, read_only):
            with pytest.raises(CcwError) as refused:
                check_terminal(fd, os.geteuid())
            assert refused.value.code == "INVALID_ARGUMENT", fd
        with pytest.raises(CcwError, match="belongs to uid"):
            check_terminal(slave, os.geteuid() + 1)
    finally:
        for fd in (master, slave, pipe_r, pipe_w, directory, path_only, read_only):
            os.close(fd)

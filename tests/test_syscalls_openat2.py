"""openat2's EAGAIN under RESOLVE_BENEATH: the kernel asks for a retry when a rename or
mount raced the lookup (sandbox/syscalls.py); a file tool must not turn it into an error."""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sandbox import syscalls


class _RacingLibc:
    """The real libc, except that openat2 fails with EAGAIN the first ``races`` times."""

    def __init__(self, real: Any, races: int) -> None:
        self.real = real
        self.races = races
        self.calls = 0

    def syscall(self, number: int, *args: Any) -> int:
        if number == syscalls._nr("openat2"):
            self.calls += 1
            if self.calls <= self.races:
                ctypes.set_errno(errno.EAGAIN)
                return -1
        result: int = self.real.syscall(number, *args)
        return result


@pytest.fixture
def dirfd(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "inside").write_text("kept\n")
    fd = os.open(tmp_path, os.O_PATH | os.O_DIRECTORY)
    yield fd
    os.close(fd)


def test_a_raced_lookup_is_retried(dirfd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    racing = _RacingLibc(syscalls._libc, races=3)
    monkeypatch.setattr(syscalls, "_libc", racing)
    fd = syscalls.openat2(dirfd, "inside", os.O_RDONLY | os.O_CLOEXEC, 0, syscalls.RESOLVE_BENEATH)
    try:
        assert os.read(fd, 100) == b"kept\n"
    finally:
        os.close(fd)
    assert racing.calls == 4


def test_a_lookup_that_keeps_racing_fails_with_eagain(dirfd: int, monkeypatch: pytest.MonkeyPatch) -> None:
    racing = _RacingLibc(syscalls._libc, races=10_000)
    monkeypatch.setattr(syscalls, "_libc", racing)
    with pytest.raises(OSError) as caught:
        syscalls.openat2(dirfd, "inside", os.O_RDONLY | os.O_CLOEXEC, 0, syscalls.RESOLVE_BENEATH)
    assert caught.value.errno == errno.EAGAIN
    assert racing.calls == syscalls.OPENAT2_RACE_RETRIES

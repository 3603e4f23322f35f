"""ccw-helper's command line and mode choice (no root needed)."""

from __future__ import annotations

import pytest

from sandbox.__main__ import choose_mode, parse_args
from sandbox.errors import CcwError


def test_defaults_and_flags() -> None:
    args = parse_args(["--socket", "/s", "--state-dir", "/d"])
    assert (args.mode, args.ready_fd, args.socket_mode, args.die_with_parent) == ("auto", None, None, False)
    args = parse_args(["--socket", "/s", "--state-dir", "/d", "--rootless", "--ready-fd", "5",
                       "--socket-mode", "0660", "--die-with-parent"])
    assert (args.mode, args.ready_fd, args.socket_mode, args.die_with_parent) == ("rootless", 5, 0o660, True)


def test_modes_are_exclusive_and_required_options_checked() -> None:
    with pytest.raises(SystemExit):
        parse_args(["--socket", "/s", "--state-dir", "/d", "--rootless", "--privileged"])
    with pytest.raises(SystemExit):
        parse_args(["--socket", "/s"])


def test_choose_mode() -> None:
    assert choose_mode("auto", 0) == "privileged"
    assert choose_mode("auto", 1000) == "rootless"
    assert choose_mode("rootless", 0) == "rootless"
    assert choose_mode("privileged", 0) == "privileged"
    with pytest.raises(CcwError) as info:
        choose_mode("privileged", 1000)
    assert info.value.code == "PERMISSION_DENIED" and "--rootless" in info.value.message

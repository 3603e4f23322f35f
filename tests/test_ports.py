"""mcp_server/capsules/ports.py's ``Refusals``: which of a forwarded port's refusals become
events, so that another user's flood of connections cannot push the capsule's other
events out of the bounded log."""

from __future__ import annotations

from mcp_server.capsules.ports import Refusals


def test_the_first_refusal_of_a_uid_is_an_event_and_the_next_within_the_window_are_folded() -> None:
    quiet = Refusals(window=1.0)
    assert quiet.note(1001, 10.0) == 0
    assert [quiet.note(1001, 10.0 + i / 100) for i in range(1, 50)] == [None] * 49
    assert quiet.note(1002, 10.5) == 0  # another uid has its own window
    assert quiet.note(1001, 11.2) == 49  # the next event says how many it stands for
    assert quiet.note(1001, 11.3) is None
    assert quiet.note(None, 11.3) == 0  # nobody (a client gone before the lookup) counts as one peer


def test_the_uids_remembered_are_bounded() -> None:
    quiet = Refusals(window=60.0, most=3)
    for uid in range(10):
        assert quiet.note(uid, 0.0) == 0
    assert quiet.note(9, 1.0) is None  # the latest are remembered
    assert quiet.note(0, 1.0) == 0  # the oldest was forgotten: an event again

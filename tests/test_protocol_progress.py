"""Interim progress reports in the IPC protocol: decoded as such, checked like any frame."""

from __future__ import annotations

import pytest

from sandbox.errors import ProtocolError
from sandbox.ops import validate_args
from sandbox.protocol import (
    FrameDecoder,
    encode_frame,
    encode_progress,
    encode_reply,
)


def test_progress_then_reply_decode_in_order() -> None:
    decoder = FrameDecoder("reply")
    decoder.feed(encode_progress(7, {"elapsed_ms": 1000}) + encode_reply(7, {"exit_code": 0}))
    first, second = list(decoder.messages())
    assert first.id == 7 and first.progress == {"elapsed_ms": 1000} and first.result is None
    assert second.progress is None and second.result == {"exit_code": 0}


@pytest.mark.parametrize(
    "body",
    [
        {"id": None, "progress": {}},  # a report always answers a request
        {"id": 1, "progress": []},
        {"id": 1, "progress": {}, "extra": 1},
        {"id": 1, "progress": {}, "ok": True, "result": {}},  # neither one thing nor the other
    ],
)
def test_malformed_progress_is_a_protocol_error(body: dict[str, object]) -> None:
    decoder = FrameDecoder("reply")
    decoder.feed(encode_frame(body))
    with pytest.raises(ProtocolError):
        list(decoder.messages())


def test_exec_progress_interval_is_bounded() -> None:
    base = {"capsule_id": "cap_1_a", "argv": ["true"]}
    assert validate_args("exec", {**base, "progress_ms": 500})["progress_ms"] == 500
    for bad in (0, 99, 60_001, "1000", True):
        with pytest.raises(ProtocolError):
            validate_args("exec", {**base, "progress_ms": bad})

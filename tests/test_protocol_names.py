"""A frame holding a name that is not UTF-8 (sandbox/protocol.py ``encode_frame``): refused
naming that text, its bytes written ``\\xff``, with the way out, where it used to say only
"not encodable as canonical JSON"; other unencodable messages keep their words."""

from __future__ import annotations

import pytest

from sandbox.errors import ProtocolError
from sandbox.protocol import decode_body, encode_frame, encode_reply


def test_a_file_name_that_is_not_utf8_is_named_in_the_refusal() -> None:
    reply = {"changes": [{"path": "ok.txt"}, {"path": "dir/n\udcff\udcfe.txt"}]}  # os.fsdecode(b"n\xff\xfe.txt")
    with pytest.raises(ProtocolError) as refused:
        encode_reply(7, reply)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.details == {"text": "dir/n\\xff\\xfe.txt"}
    assert refused.value.message.startswith("message holds text that is not UTF-8: 'dir/n\\xff\\xfe.txt'; ")
    assert "rename the file or directory" in refused.value.message


def test_a_key_or_a_surrogate_that_stands_for_no_byte_is_named_too() -> None:
    with pytest.raises(ProtocolError) as key:
        encode_frame({"id": 1, "result": {"w\udcff": 1}})
    assert key.value.details == {"text": "w\\xff"}
    with pytest.raises(ProtocolError) as lone:
        encode_frame({"id": 1, "result": ["\ud800"]})
    assert lone.value.details == {"text": "\\ud800"}


def test_other_messages_keep_their_words_and_utf8_passes() -> None:
    with pytest.raises(ProtocolError, match="not encodable as canonical JSON"):
        encode_frame({"x": float("nan")})
    assert decode_body(encode_frame({"path": "wé/ü.txt"})[4:]) == {"path": "wé/ü.txt"}

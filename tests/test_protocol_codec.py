"""The IPC codec: framing, envelope checks, round trips, and fuzzing (only ProtocolError escapes)."""

from __future__ import annotations

import json
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox.errors import CcwError, ProtocolError
from sandbox.ops import encode_request
from sandbox.protocol import (
    HEADER,
    MAX_FRAME,
    FrameDecoder,
    Reply,
    Request,
    encode_error,
    encode_frame,
    encode_reply,
)


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def decode_all(data: bytes, kind: str = "raw", eof: bool = True) -> list[Any]:
    decoder = FrameDecoder(kind)
    decoder.feed(data)
    if eof:
        decoder.feed_eof()
    return list(decoder.messages())


def decode_bytewise(data: bytes, kind: str = "raw") -> list[Any]:
    decoder = FrameDecoder(kind)
    out: list[Any] = []
    for i in range(len(data)):
        decoder.feed(data[i : i + 1])
        out.extend(decoder.messages())
    decoder.feed_eof()
    out.extend(decoder.messages())
    return out


def test_request_round_trip_whole_and_bytewise() -> None:
    data = encode_request(7, "exec", {"capsule_id": "cap_1_ab", "argv": ["echo", "é"]}) + encode_request(
        8, "list", {}
    )
    expected = [
        Request(7, "exec", {"capsule_id": "cap_1_ab", "argv": ["echo", "é"]}),
        Request(8, "list", {}),
    ]
    assert decode_all(data, "request") == expected
    assert decode_bytewise(data, "request") == expected


def test_frames_are_canonical_json() -> None:
    data = encode_reply(3, {"b": 1, "a": "é"})
    (length,) = HEADER.unpack_from(data)
    assert data[4:] == '{"id":3,"ok":true,"result":{"a":"é","b":1}}'.encode()
    assert length == len(data) - 4


def test_error_reply_round_trip() -> None:
    err = CcwError("PERMISSION_DENIED", "not yours", {"capsule_id": "cap_1"})
    (reply,) = decode_all(encode_error(4, err), "reply")
    assert isinstance(reply, Reply) and not reply.ok and reply.id == 4
    assert reply.error is not None
    assert (reply.error.code, reply.error.message, reply.error.details) == (
        "PERMISSION_DENIED",
        "not yours",
        {"capsule_id": "cap_1"},
    )


def test_error_reply_with_null_id_and_unknown_code() -> None:
    body = json.dumps({"id": None, "ok": False, "error": {"code": "WEIRD", "message": "m"}})
    (reply,) = decode_all(frame(body.encode()), "reply")
    assert reply.id is None and reply.error.code == "INTERNAL"


def test_partial_frame_waits_for_more() -> None:
    data = encode_reply(1, {})
    decoder = FrameDecoder("reply")
    decoder.feed(data[:-1])
    assert decoder.next_message() is None
    decoder.feed(data[-1:])
    assert decoder.next_message() == Reply(1, True, result={})


def test_oversize_header_refused_before_body() -> None:
    decoder = FrameDecoder("raw")
    decoder.feed(struct.pack(">I", MAX_FRAME + 1))
    with pytest.raises(ProtocolError) as info:
        decoder.next_message()
    assert info.value.code == "TOO_LARGE"
    # Framing is lost for good: the decoder keeps refusing.
    with pytest.raises(ProtocolError):
        decoder.next_message()


def test_exactly_max_frame_is_accepted() -> None:
    filler = "x" * (MAX_FRAME - len('{"a":""}'))
    data = frame(json.dumps({"a": filler}, separators=(",", ":")).encode())
    assert len(data) == MAX_FRAME + 4
    (message,) = decode_all(data)
    assert len(message["a"]) == len(filler)


def test_encode_refuses_oversize() -> None:
    with pytest.raises(ProtocolError) as info:
        encode_frame({"a": "x" * MAX_FRAME})
    assert info.value.code == "TOO_LARGE"


def test_encode_error_survives_unencodable_details() -> None:
    err = CcwError("INTERNAL", "boom", {"bad": float("nan")})
    (reply,) = decode_all(encode_error(1, err), "reply")
    assert reply.error.message == "boom" and reply.error.details == {}


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\xff\xfe{}",
        b"not json",
        b"[1,2]",
        b'"text"',
        b"42",
        b'{"a":1,"a":2}',
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b'{"a":-Infinity}',
        b'{"a":1e999}',
        b'{"a":' + b"9" * 5000 + b"}",
        b'{"a":"\\ud800"}',
        b"{" * 100_000,
        b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b"{}garbage",
    ],
)
def test_malformed_bodies(body: bytes) -> None:
    with pytest.raises(ProtocolError):
        decode_all(frame(body))


def test_truncated_at_eof() -> None:
    data = encode_request(1, "list", {})
    for cut in range(1, len(data)):
        with pytest.raises(ProtocolError):
            decode_all(data[:cut])
    assert decode_all(b"") == []


@pytest.mark.parametrize(
    "message",
    [
        {"op": "list", "args": {}},
        {"id": 1, "args": {}},
        {"id": 1, "op": "list"},
        {"id": "1", "op": "list", "args": {}},
        {"id": True, "op": "list", "args": {}},
        {"id": -1, "op": "list", "args": {}},
        {"id": 2**53, "op": "list", "args": {}},
        {"id": 1.0, "op": "list", "args": {}},
        {"id": 1, "op": 3, "args": {}},
        {"id": 1, "op": "list", "args": []},
        {"id": 1, "op": "list", "args": {}, "extra": 1},
    ],
)
def test_bad_request_envelopes(message: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        decode_all(frame(json.dumps(message).encode()), "request")


@pytest.mark.parametrize(
    "message",
    [
        {"id": 1, "result": {}},
        {"id": 1, "ok": "yes", "result": {}},
        {"id": 1, "ok": True},
        {"id": 1, "ok": True, "result": []},
        {"id": 1, "ok": True, "result": {}, "error": {}},
        {"id": 1, "ok": False, "error": {"message": "m"}},
        {"id": 1, "ok": False, "error": {"code": 1, "message": "m"}},
        {"id": 1, "ok": False, "error": {"code": "X", "message": "m", "details": []}},
        {"id": 1, "ok": False, "error": {"code": "X", "message": "m", "more": 1}},
    ],
)
def test_bad_reply_envelopes(message: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError):
        decode_all(frame(json.dumps(message).encode()), "reply")


def test_feed_after_eof_is_protocol_error() -> None:
    decoder = FrameDecoder()
    decoder.feed_eof()
    with pytest.raises(ProtocolError):
        decoder.feed(b"x")


# --- fuzzing ------------------------------------------------------------------------------

VALID = [
    encode_request(1, "hello", {"version": 1}),
    encode_request(2, "create", {"workspace": "/w", "limits": {"memory_mb": 5}}),
    encode_request(3, "exec", {"capsule_id": "cap_9", "argv": ["sh", "-c", "x"], "env": {"A": "b"}}),
    encode_reply(4, {"capsules": [{"capsule_id": "cap_1", "parent": None}]}),
    encode_error(5, CcwError("NOT_FOUND", "no such capsule")),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=20,
)


def _only_protocol_errors(data: bytes, kind: str) -> None:
    for decode in (decode_all, decode_bytewise):
        try:
            decode(data, kind)
        except ProtocolError:
            pass


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300), st.sampled_from(["request", "reply", "raw"]))
def test_fuzz_random_bytes(data: bytes, kind: str) -> None:
    _only_protocol_errors(data, kind)


@settings(max_examples=300)
@given(st.binary(max_size=200), st.sampled_from(["request", "reply", "raw"]))
def test_fuzz_random_bodies_in_valid_frames(body: bytes, kind: str) -> None:
    _only_protocol_errors(frame(body), kind)


@settings(max_examples=300)
@given(
    st.sampled_from(VALID),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4),
    st.sampled_from(["request", "reply", "raw"]),
)
def test_fuzz_mutated_frames(data: bytes, mutations: list[tuple[int, int]], kind: str) -> None:
    mutated = bytearray(data)
    for position, value in mutations:
        mutated[position % len(mutated)] = value
    _only_protocol_errors(bytes(mutated), kind)


@settings(max_examples=200)
@given(st.sampled_from(VALID), st.integers(0, 10_000))
def test_fuzz_truncated_frames(data: bytes, cut: int) -> None:
    cut = cut % len(data)
    with pytest.raises(ProtocolError):
        decode_all(data[:cut] if cut else data[:1], "raw")


@settings(max_examples=200)
@given(st.dictionaries(st.text(), json_values, max_size=5), st.integers(0, 2**53 - 1))
def test_fuzz_reply_round_trip(result: dict[str, Any], request_id: int) -> None:
    data = encode_reply(request_id, result)
    expected = Reply(request_id, True, result=json.loads(json.dumps(result)))
    assert decode_all(data, "reply") == [expected]
    assert decode_bytewise(data, "reply") == [expected]


@settings(max_examples=100)
@given(st.lists(st.dictionaries(st.text(), json_values, max_size=3), max_size=4))
def test_fuzz_many_frames_in_one_stream(messages: list[dict[str, Any]]) -> None:
    data = b"".join(encode_frame(m) for m in messages)
    assert decode_all(data) == [json.loads(json.dumps(m)) for m in messages]

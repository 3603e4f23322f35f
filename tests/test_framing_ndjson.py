"""The sans-IO NDJSON framing: splitting, the 1 MiB guard, classification, answer order."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_server import framing
from mcp_server.framing import (
    MAX_FRAME,
    Invalid,
    Line,
    LineSplitter,
    Notification,
    Oversized,
    Request,
    Response,
    ResponseOrder,
    classify,
    scan_head,
)


def feed_all(splitter: LineSplitter, data: bytes, step: int) -> list[framing.Event]:
    events: list[framing.Event] = []
    for i in range(0, len(data), step):
        events.extend(splitter.feed(data[i : i + step]))
    return events


def test_lines_split_on_newline_and_ignore_blank_and_cr():
    events = LineSplitter().feed(b'{"a":1}\n\n  \r\n{"b":2}\r\n{"c"')
    assert events == [Line(b'{"a":1}'), Line(b'{"b":2}')]


def test_frame_of_exactly_max_is_accepted_and_one_more_byte_is_not():
    splitter = LineSplitter()
    exact = b"x" * MAX_FRAME
    assert splitter.feed(exact + b"\n") == [Line(exact)]
    events = splitter.feed(b"y" * (MAX_FRAME + 1) + b"\n")
    assert len(events) == 1 and isinstance(events[0], Oversized)
    assert events[0].size == MAX_FRAME + 1


def test_oversized_line_is_dropped_with_bounded_memory_and_next_line_survives():
    splitter = LineSplitter()
    big = b'{"jsonrpc":"2.0","id":42,"method":"ccw_info","params":{"echo":"' + b"z" * (3 * MAX_FRAME)
    events = feed_all(splitter, big, 65536)
    assert events == []
    assert splitter.buffered <= MAX_FRAME + 1
    events = splitter.feed(b'"}}\n{"jsonrpc":"2.0","id":43,"method":"ping"}\n')
    assert isinstance(events[0], Oversized)
    assert scan_head(events[0].head) == (42, "ccw_info")
    assert events[1] == Line(b'{"jsonrpc":"2.0","id":43,"method":"ping"}')


def test_scan_head_reads_top_level_keys_only():
    assert scan_head(b'{"params":{"id":9,"method":"x"},"id":"a","method":"m"') == ("a", "m")
    assert scan_head(b'{"jsonrpc":"2.0","method":"tools/call","id":7,') == (7, "tools/call")
    assert scan_head(b'{"params":{"deep":"' + b"q" * 100) == (None, None)
    assert scan_head(b"[1,2") == (None, None)
    assert scan_head(b'{"id":true,"method":5}') == (None, None)


def test_oversized_answer_shapes():
    seed = {"ok": False, "reason": "validation_failed", "errors": [{"path": "", "msg": "payload_too_large"}]}
    head = b'{"jsonrpc":"2.0","id":3,"method":"ccw_info","params":'
    direct = framing.oversized_answer(Oversized(head, MAX_FRAME + 5), is_direct_method=True)
    assert direct == {"jsonrpc": "2.0", "id": 3, "result": seed}
    mcp = framing.oversized_answer(Oversized(head, MAX_FRAME + 5), is_direct_method=False)
    assert mcp["id"] == 3 and mcp["error"]["code"] == -32600 and mcp["error"]["data"] == seed
    anonymous = framing.oversized_answer(Oversized(b"xx", MAX_FRAME + 5), is_direct_method=True)
    assert anonymous["id"] is None and anonymous["error"]["data"] == seed


def test_classify():
    assert isinstance(classify(b'{"jsonrpc":"2.0","id":1,"method":"ping"}'), Request)
    assert isinstance(classify(b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{}}'), Notification)
    assert isinstance(classify(b'{"jsonrpc":"2.0","id":1,"result":{}}'), Response)
    for bad, code in [
        (b"nope", -32700),
        (b"\xff\xfe", -32700),
        (b"[]", -32600),
        (b'{"id":1,"method":"ping"}', -32600),
        (b'{"jsonrpc":"2.0","id":true,"method":"ping"}', -32600),
        (b'{"jsonrpc":"2.0","id":{},"method":"ping"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":3}', -32600),
        (b"1" * 5000, -32700),
    ]:
        frame = classify(bad)
        assert isinstance(frame, Invalid), bad
        assert frame.answer["error"]["code"] == code, bad


def test_response_order_releases_in_request_order():
    order = ResponseOrder()
    order.reserve("a")
    order.reserve(2)
    c = order.reserve()  # an answer made locally (guard, parse error): filled by slot
    assert order.fill(c, b"C") == []
    assert order.fill_id(2, b"B") == []
    assert order.pending == 3
    assert order.fill_id("a", b"A") == [b"A", b"B", b"C"]
    assert order.pending == 0
    assert order.fill(c, b"again") == []  # a slot is answered once


def test_response_order_by_id_and_dropped_requests():
    order = ResponseOrder()
    order.reserve(1)
    order.reserve(2)
    order.reserve(3)
    assert order.fill_id(3, b"3") == []
    assert order.drop_id(1) == []  # cancelled: no answer, but 2 is still due
    assert order.fill_id(2, b"2") == [b"2", b"3"]
    assert order.pending == 0
    assert order.fill_id(99, b"stray") == [b"stray"]  # not an answer we wait for


def test_response_order_duplicate_ids_fill_oldest_first():
    order = ResponseOrder()
    order.reserve(5)
    order.reserve(5)
    assert order.fill_id(5, b"first") == [b"first"]
    assert order.fill_id(5, b"second") == [b"second"]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=4096), st.integers(min_value=1, max_value=64))
def test_fuzz_splitter_whole_and_bytewise_agree(data, step):
    small = 256  # a small limit so random data crosses it often
    whole = LineSplitter(max_frame=small).feed(data)
    pieces = feed_all(LineSplitter(max_frame=small), data, step)
    assert whole == pieces
    for event in whole:
        if isinstance(event, Line):
            assert b"\n" not in event.data and len(event.data) <= small
        else:
            assert event.size > small


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=2048))
def test_fuzz_classify_and_scan_never_raise(data):
    frame = classify(data)
    if isinstance(frame, Invalid):
        json.dumps(frame.answer)
    scan_head(data)
    framing.oversized_answer(Oversized(data, MAX_FRAME + 1), is_direct_method=True)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(), st.text(max_size=30)), st.text(min_size=1, max_size=30), json_values)
def test_fuzz_scan_head_recovers_id_of_any_request(id_, method, params):
    line = framing.encode({"jsonrpc": "2.0", "id": id_, "method": method, "params": params})
    assert scan_head(line) == (id_, method)
    frame = classify(line.rstrip(b"\n"))
    assert isinstance(frame, Request) and frame.id == id_ and frame.method == method


@settings(max_examples=200, deadline=None)
@given(st.permutations(list(range(8))), st.sets(st.integers(min_value=0, max_value=7)))
def test_fuzz_order_any_completion_order_yields_request_order(finish_order, dropped):
    order = ResponseOrder()
    for i in range(8):
        order.reserve(i)
    out: list[bytes] = []
    for i in finish_order:
        out += order.drop_id(i) if i in dropped else order.fill_id(i, str(i).encode())
    assert out == [str(i).encode() for i in range(8) if i not in dropped]
    assert order.pending == 0

"""Typed requests and replies (sandbox/ops.py, replies.py) and the sans-IO client core (sandbox/client.py)."""

from __future__ import annotations

import base64
import json
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from mcp_server.core.canonical import canonical_json
from sandbox.client import BlockingClient, ClientConnection
from sandbox.errors import CcwError, ProtocolError
from sandbox.ops import (
    OPS,
    REQUESTS,
    ChangesRequest,
    CreateRequest,
    ExecRequest,
    ForkRequest,
    encode_request,
    parse_request,
)
from sandbox.opsurface import SURFACE
from sandbox.protocol import PROTOCOL_VERSION, FrameDecoder, encode_error, encode_frame, encode_progress, encode_reply
from sandbox.replies import (
    CapsuleSummary,
    Change,
    ChangesReply,
    CreateReply,
    DestroyReply,
    DiskUse,
    ExecProgress,
    ExecReply,
    ForkReply,
    FreezeReply,
    GitdirChanges,
    HelloReply,
    ListReply,
    NetConnectReply,
    NetForwardReply,
    NetOpenReply,
    NotCarried,
    OpenRootReply,
    OpReply,
    RunReadsReply,
    SignalReply,
    Touched,
    Truncated,
    Usage,
)
from sandbox.spec import DEFAULT_OUTPUT_CAP, DEFAULT_TIMEOUT_MS, CapsuleSpec, Limits

EXEC_RESULT: dict[str, Any] = {
    "exit_code": 0, "signal": None, "timed_out": False, "oom_killed": False, "duration_ms": 3,
    "stdout_b64": base64.b64encode(b"out").decode(), "stderr_b64": "", "stdout_bytes": 3, "stderr_bytes": 0,
    "truncated": {"stdout": False, "stderr": False},
    "usage": {"cpu_ms": 1, "rss_max_kb": None, "rss_max_process_kb": 2, "io_read_kb": 0, "io_write_kb": 0},
    "usage_unavailable": {"rss_max_kb": "no memory cgroup"},
    "usage_sources": {}, "disk": None, "touched": {"read": [], "written": [], "listed": [], "executed": []},
    "touched_unavailable": {},
}


def test_every_op_has_one_typed_request() -> None:
    assert set(REQUESTS) == set(OPS)
    for op, cls in REQUESTS.items():
        assert cls.op == op and cls.reply is not None


def test_requests_round_trip_through_their_args() -> None:
    requests = [
        CreateRequest(CapsuleSpec("/w", given_base="/b", env_whitelist=("A",), limits=Limits(cpu_ms=5))),
        ExecRequest("cap_1", ("sh", "-c", "x"), cwd="/w", env={"A": "1"}, stdin=b"\x00in", timeout_ms=9,
                    limits=Limits(memory_mb=4), output_cap=0, progress_ms=100),
        ExecRequest("cap_1", ("true",)),
        ChangesRequest("cap_2"),
        ForkRequest("cap_1"),
        ForkRequest("cap_1", donors=("cap_3", "cap_2")),
    ]
    for request in requests:
        args = request.to_args()
        assert type(request).from_args(json.loads(json.dumps(args))) == request


def test_an_exec_request_holds_its_defaults_in_either_process() -> None:
    """The timeout and output cap take their defaults where the request is made, whichever
    side makes it: the front end's request sends them, the helper's read of one without
    them has the same values; what is None stays off the wire."""
    made = ExecRequest("cap_1", ("true",))
    assert made.to_args() == {"capsule_id": "cap_1", "argv": ["true"], "timeout_ms": DEFAULT_TIMEOUT_MS,
                              "output_cap": DEFAULT_OUTPUT_CAP}
    assert ExecRequest.from_args({"capsule_id": "cap_1", "argv": ["true"]}) == made
    typed = ExecRequest.from_args({"capsule_id": "cap_1", "argv": ["x"], "cwd": None, "stdin_b64": None})
    assert typed.cwd is None and typed.stdin is None and typed.argv == ("x",)
    tty = ExecRequest("cap_1", ("sh",), stdio="tty", tty_fd=7)
    assert "tty_fd" not in tty.to_args() and ExecRequest.from_args(tty.to_args()).with_descriptors([7]) == tty


def test_a_fork_request_without_donors_is_the_fork_of_before() -> None:
    """An older helper refuses an argument it does not know: a fork without donors sends none."""
    assert ForkRequest("cap_1").to_args() == {"capsule_id": "cap_1"}
    assert ForkRequest.from_args({"capsule_id": "cap_1"}) == ForkRequest("cap_1", donors=())
    assert ForkRequest("cap_1", ("cap_3", "cap_2")).to_args() == {"capsule_id": "cap_1", "donors": ["cap_3", "cap_2"]}


def test_a_fork_request_refuses_the_parent_among_its_donors() -> None:
    with pytest.raises(ProtocolError) as info:
        ForkRequest.from_args({"capsule_id": "cap_1", "donors": ["cap_2", "cap_1"]})
    assert info.value.code == "INVALID_ARGUMENT" and "donors" in info.value.message


def test_from_args_refuses_what_the_op_table_refuses() -> None:
    for cls, args in ((ExecRequest, {"capsule_id": "cap_1", "argv": []}), (ChangesRequest, {"capsule_id": "x"}),
                      (CreateRequest, {"workspace": "/w", "uid": 0})):
        with pytest.raises(ProtocolError):
            cls.from_args(args)


def test_replies_round_trip() -> None:
    reply = ExecReply.from_args(EXEC_RESULT)
    assert reply.stdout == b"out" and reply.to_args() == EXEC_RESULT
    listed = {"capsules": [{"capsule_id": "cap_1", "workspace": "/w", "parent": None, "created_at": "t",
                            "state": "ready"}]}
    assert ListReply.from_args(listed) == ListReply((CapsuleSummary("cap_1", "/w", None, "t", "ready"),))
    assert ListReply.from_args(listed).to_args() == listed
    hello = {"version": PROTOCOL_VERSION, "mode": "privileged", "mechanisms": {}, "ops": sorted(OPS),
             "surface": "0" * 16}
    assert HelloReply.from_args(hello).to_args() == hello
    progress = ExecProgress(5, 1, 0, b"a", b"")
    assert ExecProgress.from_args(progress.to_args()) == progress
    with pytest.raises(ProtocolError):
        ExecReply.from_args({k: v for k, v in EXEC_RESULT.items() if k != "usage"})


def test_reply_entries_are_checked_as_they_are_read() -> None:
    deleted = {"path": "gone", "kind": "deleted", "type": "file"}
    assert Change.from_args(deleted) == Change("gone", "deleted", "file")
    assert Change.from_args(deleted).to_args() == deleted  # absent fields stay absent
    for bad in ({"path": "a", "kind": "added"}, {**deleted, "blob": "x"}):
        with pytest.raises(ProtocolError):
            Change.from_args(bad)
    with pytest.raises(ProtocolError):
        ChangesReply.from_args({"changes": {}})
    for touched in ({"read": "a", "written": [], "listed": None, "executed": None},
                    {"read": None, "written": None, "listed": None, "executed": None},
                    {"read": None, "written": [1], "listed": None, "executed": None}):
        with pytest.raises(ProtocolError):
            Touched.from_args(touched)



def test_a_change_list_refuses_a_name_that_is_not_utf8_unless_asked_to_leave_it_out() -> None:
    bad, target = "n\udcff.txt", "t\udcfe"  # os.fsdecode(b"n\xff.txt"), of b"t\xfe"
    changes = (Change("b.txt", "added", "file", 420, 1), Change(bad, "added", "file", 420, 1),
               Change("l", "added", "symlink", target=target))
    gitdirs = (GitdirChanges("/repo/.git", (Change("HEAD", "modified", "file"), Change("g\udcfd", "added", "file"))),)
    with pytest.raises(CcwError) as refused:
        ChangesReply(changes, gitdirs)  # promote's list: the whole of it refused
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.details["not_utf8"] == ["g\\xfd", "n\\xff.txt", "t\\xfe"]
    left = ChangesReply.carried(changes, gitdirs)  # a diff's: the rest, those names counted apart
    assert left.changes == changes[:1] and left.gitdirs == (GitdirChanges("/repo/.git", gitdirs[0].changes[:1]),)
    assert left.not_utf8 == NotCarried(3, 3, ("g\\xfd", "n\\xff.txt", "t\\xfe"))
    assert ChangesReply.from_args(json.loads(json.dumps(left.to_args()))) == left
    assert ChangesReply.carried(changes[:1], None) == ChangesReply(changes[:1])  # none: nothing added to the wire
    assert ChangesRequest("cap_1", leave_not_utf8=True).to_args() == {"capsule_id": "cap_1", "leave_not_utf8": True}
    assert ChangesRequest.from_args({"capsule_id": "cap_1", "leave_not_utf8": True}).leave_not_utf8 is True
    with pytest.raises(CcwError):
        ChangesRequest.from_args({"capsule_id": "cap_1", "leave_not_utf8": "yes"})


ISOLATION: dict[str, Any] = {"filesystem": {"overlayfs": True, "disk_limit_mb": None}, "network": "none"}
REPLIES: list[OpReply] = [
    HelloReply(2, "rootless", {"jail": {"namespaces": ["mnt"]}}, tuple(sorted(OPS)), "0123456789abcdef"),
    CreateReply("cap_1", "/s/merged", "/w", "2026-01-01T00:00:00Z", "2026-01-01T00:00:05Z", ISOLATION),
    ForkReply("cap_2", "/s/m2", "/w", "t1", "t2", ISOLATION, parent="cap_1"),
    ExecProgress(5, 1, 0, b"a\x00", b""),
    ExecReply.from_args(EXEC_RESULT),
    ExecReply(None, "SIGKILL", True, True, 9, b"\xff" * 3, b"e", 3, 1, Truncated(stdout=True, stderr=False),
              Usage(None, 5, None, None, None), {"cpu_ms": "gone"}, {"rss_max_kb": "cgroup"},
              DiskUse(limit_mb=8, used_kb=8000, free_kb=100, full=True),
              Touched(None, ("a",), None, None), {"read": "overflow"}),
    ChangesReply((Change("a", "added", "file", mode=420, size=1), Change("l", "modified", "symlink", target="x"))),
    ChangesReply(()),
    OpenRootReply("cap_1"),
    NetOpenReply("10.99.0.1:3128", "10.99.0.1:1080", ("10.99.0.2", "fd63:6377::2"),
                 {"HTTP_PROXY": "http://10.99.0.1:3128", "no_proxy": "localhost"}, "egress: one line"),
    DestroyReply("cap_1", destroyed=True),
    SignalReply("web", sent=True),
    FreezeReply("cap_1", frozen=True, runs=("exec", "web")),
    NetConnectReply(8080),
    NetForwardReply(40000, True, 3),
    RunReadsReply("web", Touched(("app.py", "static/a.css"), ("web.log",), ("static",), ())),
    RunReadsReply("web", None, "the fanotify queue overflowed; the read set is incomplete"),
    ListReply((CapsuleSummary("cap_1", "/w", None, "t", "frozen"), CapsuleSummary("cap_2", "/w", "cap_1", "t", "busy"),
               CapsuleSummary("cap_3", "/w", None, "t", "paused", ("db", "web")))),
    ListReply(()),
]


def test_every_reply_class_round_trips_through_its_args() -> None:
    assert {type(reply) for reply in REPLIES} >= {cls.reply for cls in REQUESTS.values()} | {ExecProgress}
    for reply in REPLIES:
        result = json.loads(json.dumps(reply.to_args()))  # as a frame carries it
        assert type(reply).from_args(result) == reply
        assert type(reply).from_args(result).to_args() == result


def test_frames_are_canonical_json() -> None:
    args = {"workspace": "/w/é", "limits": {"memory_mb": 5}, "env_whitelist": ["Z", "A"]}
    frame = encode_request(3, "create", args)
    assert frame[4:] == canonical_json({"id": 3, "op": "create", "args": args})


def test_client_core_reads_progress_then_the_reply() -> None:
    core = ClientConnection()
    frame = core.send_request(1, "list", {})
    decoder = FrameDecoder("request")
    decoder.feed(frame)
    assert decoder.next_message().op == "list"
    assert not core.idle
    data = encode_progress(1, {"elapsed_ms": 5}) + encode_reply(1, {"capsules": []})
    for byte in data[:-1]:
        core.receive_data(bytes([byte]))
        if (event := core.next_event()) is not None:
            assert event.progress == {"elapsed_ms": 5}
    core.receive_data(data[-1:])
    reply = core.next_event()
    assert reply is not None and reply.result == {"capsules": []} and core.idle


def test_client_core_errors() -> None:
    core = ClientConnection()
    core.send_request(1, "list", {})
    with pytest.raises(ProtocolError):
        core.send_request(2, "list", {})  # one request in flight per connection
    core.receive_data(encode_error(1, CcwError("NOT_FOUND", "gone")))
    with pytest.raises(CcwError) as info:
        core.next_event()
    assert info.value.code == "NOT_FOUND" and core.idle  # an answered error leaves it usable
    core.send_request(2, "list", {})
    core.receive_data(encode_reply(9, {}))
    with pytest.raises(ProtocolError):
        core.next_event()
    eof = ClientConnection()
    eof.send_request(1, "list", {})
    eof.receive_data(b"")
    with pytest.raises(CcwError) as info:
        eof.next_event()
    assert info.value.code == "UNAVAILABLE" and "retry" in info.value.message
    with pytest.raises(ProtocolError):
        ClientConnection().send_request(1, "exec", {"capsule_id": "cap_1"})


def test_a_typed_request_is_checked_once_by_the_helper_as_it_reads_it() -> None:
    """HelperClient.call sends a typed request's arguments unchecked; the helper's read of
    the frame refuses a bad value with the error the front end used to raise itself."""
    bad = ExecRequest("cap_1", ("", "x"))
    frame = ClientConnection().send_request(1, bad.op, bad.to_args(), check=False)
    decoder = FrameDecoder("request")
    decoder.feed(frame)
    request = decoder.next_message()
    with pytest.raises(ProtocolError) as refused:
        parse_request(request.op, request.args)
    assert refused.value.code == "INVALID_ARGUMENT" and "'argv' must start with a program name" in refused.value.message
    with pytest.raises(ProtocolError) as before:  # the same words as the raw path's own check
        encode_request(1, bad.op, bad.to_args())
    assert before.value.message == refused.value.message


def test_an_exec_request_is_checked_once_as_the_helper_reads_it() -> None:
    """What the jail's own spec no longer re-checks (sandbox/contain.py: _check_spec) is
    refused here, at the helper's boundary, naming the field the request got wrong."""
    base = {"capsule_id": "cap_1", "argv": ["true"]}
    for bad, field in (({"argv": []}, "argv"), ({"argv": ["a\0b"]}, "argv"), ({"env": {"A=B": "1"}}, "env"),
                       ({"env": {"A": "x\0y"}}, "env.A"), ({"cwd": "rel"}, "cwd"), ({"timeout_ms": -1}, "timeout_ms"),
                       ({"output_cap": -1}, "output_cap")):
        with pytest.raises(ProtocolError) as refused:
            ExecRequest.from_args({**base, **bad})
        assert refused.value.code == "INVALID_ARGUMENT" and f"'{field}'" in refused.value.message, (bad, refused.value)


def test_blocking_client_says_hello(tmp_path: Path) -> None:
    path = str(tmp_path / "s")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            decoder = FrameDecoder("request")
            while (request := decoder.next_message()) is None:
                decoder.feed(conn.recv(4096))
            assert request.op == "hello"
            conn.sendall(encode_progress(request.id, {}) + encode_frame(
                {"id": request.id, "ok": True, "result": {"version": request.args["version"], "surface": SURFACE}}))

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with BlockingClient(path, 5.0) as client:
            assert client.hello() == {"version": PROTOCOL_VERSION, "surface": SURFACE}
    finally:
        thread.join()
        listener.close()
    with pytest.raises(OSError):
        BlockingClient(path, 1.0)

"""Fuzzing a real ccw-mcp through its transports (issue 9): NDJSON frames over the unix
socket and request bodies over Streamable HTTP.

One server per transport for the whole module.  Each hostile frame is followed by a probe
request (a direct ``ccw_info`` call with a fresh id); everything that comes back before
the probe's answer must be a JSON-RPC response (``result`` or ``error``, never a
traceback), the probe must be answered, and pipelined probes must come back in order.
The sans-IO splitter and classifier have their own fuzz tests in test_framing_ndjson.py.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any

import httpx2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.mcp_process import ServerProcess, server_env

MIB = 1 << 20
FUZZ = settings(max_examples=120, derandomize=True, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
_ids = count()


def probe() -> tuple[str, bytes]:
    """A fresh probe id and its frame."""
    pid = f"probe-{next(_ids)}"
    return pid, json.dumps({"jsonrpc": "2.0", "id": pid, "method": "ccw_info", "params": {"echo": pid}}).encode()


def hostile_frames() -> dict[str, bytes]:
    """Name -> one NDJSON frame (without its newline)."""
    big_digits = b"1" * 5000
    near = MIB - 200
    frames = {
        "deep_arrays": b"[" * 100_000 + b"]" * 100_000,
        "deep_objects": b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
        "deep_params": (b'{"jsonrpc":"2.0","id":1,"method":"ccw_info","params":{"echo":'
                        + b"[" * 50_000 + b"]" * 50_000 + b"}}"),
        "deep_unclosed": b"[" * 200_000,
        "huge_float_id": b'{"jsonrpc":"2.0","id":1e400,"method":"ccw_info"}',
        "huge_int_id": b'{"jsonrpc":"2.0","id":' + big_digits + b',"method":"ccw_info"}',
        "huge_int_param": b'{"jsonrpc":"2.0","id":2,"method":"ccw_info","params":{"delay_ms":' + big_digits + b"}}",
        "huge_float_param": b'{"jsonrpc":"2.0","id":3,"method":"ccw_info","params":{"delay_ms":1e400}}',
        "neg_huge": b'{"jsonrpc":"2.0","id":-1e400,"method":"tools/list"}',
        "nan": b'{"jsonrpc":"2.0","id":NaN,"method":"ccw_info"}',
        "infinity_param": b'{"jsonrpc":"2.0","id":4,"method":"ccw_info","params":{"delay_ms":Infinity}}',
        "duplicate_keys": b'{"jsonrpc":"2.0","id":5,"id":6,"method":"ccw_info","method":"nope"}',
        "duplicate_params": b'{"jsonrpc":"2.0","id":7,"method":"ccw_info","params":{"echo":"a"},"params":[1]}',
        "invalid_utf8": b'{"jsonrpc":"2.0","id":8,"method":"ccw_info","params":{"echo":"\xff\xfe\xc0\xaf"}}',
        "overlong_slash": b'{"jsonrpc":"2.0","id":9,"method":"\xc0\xafccw_info"}',
        "lone_surrogate_param": b'{"jsonrpc":"2.0","id":10,"method":"ccw_info","params":{"echo":"\\ud800"}}',
        "lone_surrogate_method": b'{"jsonrpc":"2.0","id":11,"method":"\\udc80ccw_info"}',
        "lone_surrogate_id": b'{"jsonrpc":"2.0","id":"\\ud800","method":"ccw_info"}',
        "surrogate_key": b'{"jsonrpc":"2.0","id":12,"method":"ccw_info","params":{"\\udfff":1}}',
        "near_limit_echo": b'{"jsonrpc":"2.0","id":13,"method":"ccw_info","params":{"echo":"'
        + b"x" * (near - 70) + b'"}}',
        "over_limit": b'{"jsonrpc":"2.0","id":14,"method":"ccw_info","params":{"echo":"' + b"y" * MIB + b'"}}',
        "over_limit_garbage": b"\x00" * (MIB + 10),
        "nul_bytes": b'{"jsonrpc":"2.0","id":15,\x00"method":"ccw_info"}',
        "bom": b'\xef\xbb\xbf{"jsonrpc":"2.0","id":16,"method":"ccw_info"}',
        "empty_batch": b"[]",
        "batch_of_junk": b'[1, "x", null, {"jsonrpc":"2.0"}, {"jsonrpc":"2.0","id":17,"method":"ccw_info"}]',
        "big_batch": b"[" + b",".join([b'{"jsonrpc":"2.0","id":18,"method":"ccw_info"}'] * 2000) + b"]",
        "tools_call_hostile": b'{"jsonrpc":"2.0","id":19,"method":"tools/call","params":{"name":"ccw_info","arguments":'
        + b'{"echo":"' + b"\\ud800" * 10 + b'"}}}',
        "tools_call_deep": b'{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"ccw_info","arguments":'
        + b"[" * 30_000 + b"]" * 30_000 + b"}}",
        "initialize_junk": (b'{"jsonrpc":"2.0","id":21,"method":"initialize",'
                            b'"params":{"protocolVersion":1e400,"capabilities":[]}}'),
        "cancel_unknown": b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":{"a":[1e400]}}}',
        "jsonrpc_1": b'{"jsonrpc":"1.0","id":22,"method":"ccw_info"}',
        "whitespace_only": b"   \t  ",
        "carriage_returns": b"\r\r\r",
    }
    for jtype, literal in {"null": b"null", "true": b"true", "int": b"1", "float": b"1.5", "str": b'"s"',
                           "array": b"[1]", "object": b'{"a":1}', "bigint": big_digits}.items():
        frames[f"id_{jtype}"] = b'{"jsonrpc":"2.0","id":' + literal + b',"method":"ccw_info"}'
        frames[f"method_{jtype}"] = b'{"jsonrpc":"2.0","id":23,"method":' + literal + b"}"
        frames[f"params_{jtype}"] = b'{"jsonrpc":"2.0","id":24,"method":"ccw_info","params":' + literal + b"}"
        frames[f"bare_{jtype}"] = literal
    return frames


def _no_constant(name: str) -> Any:
    raise AssertionError(f"the server wrote {name}, which is not JSON")


def strict_json(raw: bytes) -> Any:
    """Parse as JSON proper: UTF-8, no NaN/Infinity."""
    return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)


def check_message(message: Any) -> None:
    """A JSON-RPC response object: result xor error, an error with an int code and a message."""
    assert isinstance(message, dict) and message.get("jsonrpc") == "2.0", message
    assert ("result" in message) != ("error" in message), message
    if "error" in message:
        error = message["error"]
        assert isinstance(error["code"], int) and isinstance(error["message"], str), message
        assert "Traceback" not in error["message"], message


class Line:
    """An NDJSON connection to the server's unix socket, reconnecting if the server hangs up."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock: socket.socket | None = None
        self.buffer = b""
        self.reconnects = 0

    def _connect(self) -> socket.socket:
        if self.sock is None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(30)
            self.sock.connect(self.path)
            self.buffer = b""
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def send(self, data: bytes) -> None:
        try:
            self._connect().sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            self.close()
            self.reconnects += 1

    def read_until(self, probe_ids: list[str]) -> list[Any]:
        """Read messages until every probe id has been answered; return all messages."""
        sock = self._connect()
        seen: list[Any] = []
        waiting = list(probe_ids)
        while waiting:
            while b"\n" not in self.buffer:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise ConnectionError(f"server hung up; waiting for {waiting}")
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\n", 1)
            message = strict_json(raw)  # the server writes JSON, nothing else
            check_message(message)
            seen.append(message)
            if message.get("id") in waiting:
                assert message["id"] == waiting[0], f"out of order: {message['id']} before {waiting[0]}"
                assert message["result"]["echo"] == waiting.pop(0)
        return seen

    def exchange(self, frame: bytes) -> list[Any]:
        """Send a frame, then a probe; return what came back.  Reconnect once if dropped."""
        pid, probe_frame = probe()
        self.send(frame + b"\n" + probe_frame + b"\n")
        try:
            return self.read_until([pid])
        except (ConnectionError, OSError):
            self.close()
            self.reconnects += 1
            pid, probe_frame = probe()
            self.send(probe_frame + b"\n")
            return self.read_until([pid])


@pytest.fixture(scope="module")
def socket_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("fuzz-socket")
    server = ServerProcess(server_env(tmp, MCP_ENDPOINT="socket"))
    server.wait_ready()
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def line(socket_server: ServerProcess) -> Iterator[Line]:
    conn = Line(socket_server.path)
    yield conn
    conn.close()


@pytest.mark.parametrize("name", sorted(hostile_frames()))
def test_hostile_frame_gets_structured_answers_and_the_server_keeps_serving(line: Line, name: str) -> None:
    line.exchange(hostile_frames()[name])
    assert line.reconnects == 0, f"{name}: the server dropped the connection"


def test_pipelined_hostile_frames_keep_probe_order(line: Line) -> None:
    frames = hostile_frames()
    ids: list[str] = []
    payload = b""
    for name in sorted(frames):
        if name.startswith(("over_limit", "deep", "big_batch", "near_limit")):
            continue
        pid, probe_frame = probe()
        ids.append(pid)
        payload += frames[name] + b"\n" + probe_frame + b"\n"
    line.send(payload)
    line.read_until(ids)


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(line: Line, data: bytes) -> None:
    line.exchange(data.replace(b"\n", b" "))


json_scalar = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12)
json_any = st.recursive(json_scalar, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=6)
methods = st.one_of(json_any, st.sampled_from(["ccw_info", "tools/call", "tools/list", "initialize", "ping",
                                               "resources/read", "capsule/create", "validate", "get_schema", ""]))


@FUZZ
@given(st.fixed_dictionaries({}, optional={"jsonrpc": st.one_of(st.just("2.0"), json_any), "id": json_any,
                                           "method": methods, "params": json_any, "result": json_any}))
def test_random_requests(line: Line, request: dict[str, Any]) -> None:
    line.exchange(json.dumps(request).encode())
    assert line.reconnects == 0


# --- HTTP ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("fuzz-http")
    server = ServerProcess(server_env(tmp, MCP_ENDPOINT="http"))
    server.wait_ready()
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def http_url(http_server: ServerProcess) -> str:
    return http_server.path


def post(http: httpx2.Client, url: str, body: bytes) -> None:
    """POST a body; the answer is a 2xx/4xx with a JSON-RPC body (or none), and a probe works."""
    response = http.post(url, content=body, headers={"content-type": "application/json",
                                                     "accept": "application/json, text/event-stream"})
    assert response.status_code < 500, (response.status_code, response.text[:300])
    if response.content and response.headers.get("content-type", "").startswith("application/json"):
        message = strict_json(response.content)
        for item in message if isinstance(message, list) else [message]:
            check_message(item)
    pid, frame = probe()
    answer = http.post(url, content=frame, headers={"content-type": "application/json"})
    assert answer.status_code == 200 and answer.json()["result"]["echo"] == pid


@pytest.fixture(scope="module")
def http(http_server: ServerProcess) -> Iterator[httpx2.Client]:
    with httpx2.Client(timeout=30, headers=http_server.bearer()) as client:
        yield client


def test_http_hostile_bodies(http: httpx2.Client, http_url: str) -> None:
    for name, body in sorted(hostile_frames().items()):
        try:
            post(http, http_url, body)
        except AssertionError as exc:
            raise AssertionError(f"{name}: {exc}") from exc


@FUZZ
@given(st.binary(max_size=300))
def test_http_random_bodies(http: httpx2.Client, http_url: str, body: bytes) -> None:
    post(http, http_url, body)


@settings(max_examples=60, derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(st.fixed_dictionaries({}, optional={"jsonrpc": st.just("2.0"), "id": json_any, "method": methods,
                                           "params": json_any}))
def test_http_random_requests(http: httpx2.Client, http_url: str, request: dict[str, Any]) -> None:
    post(http, http_url, json.dumps(request).encode())


def test_fuzz_count() -> None:
    assert len(hostile_frames()) >= 60
    assert Path(__file__).name == "test_fuzz_frames.py"

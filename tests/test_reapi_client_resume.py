"""A broken Execute stream is resumed with WaitExecution, not run twice (fake Execution service)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from mcp_server.reapi import client as client_module
from mcp_server.reapi.client import ReapiClient
from mcp_server.reapi.protos import operations_pb2, re_pb2
from sandbox.errors import CcwError


class _Broken(grpc.RpcError, grpc.Call):
    """What a gRPC stream raises when it breaks."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "stream broke"

    def initial_metadata(self) -> Any:
        return ()

    def trailing_metadata(self) -> Any:
        return ()

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float | None:
        return None

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


def _operation(name: str, stage: Any, exit_code: int | None = None) -> operations_pb2.Operation:
    operation = operations_pb2.Operation(name=name, done=exit_code is not None)
    operation.metadata.Pack(re_pb2.ExecuteOperationMetadata(stage=stage))
    if exit_code is not None:
        operation.response.Pack(re_pb2.ExecuteResponse(result=re_pb2.ActionResult(exit_code=exit_code)))
    return operation


class _Execution:
    """Execute and WaitExecution, each answering from a script of streams (a list of items or an error)."""

    def __init__(self, executes: list[list[Any]], waits: list[list[Any]]) -> None:
        self.executes, self.waits = executes, waits
        self.calls: list[str] = []

    @staticmethod
    def _stream(script: list[Any]) -> Iterator[operations_pb2.Operation]:
        for item in script:
            if isinstance(item, BaseException):
                raise item
            yield item

    def Execute(self, request: re_pb2.ExecuteRequest, timeout: float | None = None) -> Iterator[Any]:
        self.calls.append("Execute")
        return self._stream(self.executes.pop(0))

    def WaitExecution(self, request: re_pb2.WaitExecutionRequest, timeout: float | None = None) -> Iterator[Any]:
        self.calls.append(f"WaitExecution {request.name}")
        return self._stream(self.waits.pop(0))


@pytest.fixture
def client(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReapiClient]:
    monkeypatch.setattr(client_module, "RESUME_PAUSE_S", 0.0)
    reapi = ReapiClient("grpc://127.0.0.1:9")  # never dialled: the stub is replaced
    yield reapi
    reapi.close()


QUEUED, EXECUTING, COMPLETED = (re_pb2.ExecutionStage.QUEUED, re_pb2.ExecutionStage.EXECUTING,
                                 re_pb2.ExecutionStage.COMPLETED)


def test_a_broken_stream_is_resumed_on_the_operation(client: ReapiClient) -> None:
    fake = _Execution([[_operation("op-1", QUEUED), _Broken(grpc.StatusCode.UNAVAILABLE)]],
                      [[_operation("op-1", EXECUTING)], [_operation("op-1", COMPLETED, 3)]])
    client._exec = fake  # type: ignore[assignment]
    executed = client.execute(re_pb2.Digest(hash="a" * 64, size_bytes=1), timeout_s=30)
    # the stream broke, then ended early once: two resumes, never a second Execute
    assert fake.calls == ["Execute", "WaitExecution op-1", "WaitExecution op-1"]
    assert executed.result.exit_code == 3 and executed.resumed == 2 and executed.operation == "op-1"
    assert executed.stages == [QUEUED, EXECUTING, COMPLETED]


def test_an_operation_the_server_forgot_is_executed_again(client: ReapiClient) -> None:
    fake = _Execution([[_operation("op-1", QUEUED), _Broken(grpc.StatusCode.UNAVAILABLE)],
                       [_operation("op-2", COMPLETED, 0)]],
                      [[_Broken(grpc.StatusCode.NOT_FOUND)]])
    client._exec = fake  # type: ignore[assignment]
    executed = client.execute(re_pb2.Digest(hash="a" * 64, size_bytes=1))
    assert fake.calls == ["Execute", "WaitExecution op-1", "Execute"]
    assert executed.operation == "op-2" and executed.result.exit_code == 0


def test_cancelled_and_refused_streams_are_not_resumed(client: ReapiClient) -> None:
    for code, ours in ((grpc.StatusCode.CANCELLED, "INTERNAL"), (grpc.StatusCode.INVALID_ARGUMENT, "INVALID_ARGUMENT")):
        fake = _Execution([[_operation("op-1", QUEUED), _Broken(code)]], [])
        client._exec = fake  # type: ignore[assignment]
        with pytest.raises(CcwError) as raised:
            client.execute(re_pb2.Digest(hash="a" * 64, size_bytes=1))
        assert raised.value.code == ours and fake.calls == ["Execute"]


def test_a_stream_that_keeps_breaking_gives_up_with_the_operation_named(client: ReapiClient) -> None:
    broken = [_operation("op-1", QUEUED), _Broken(grpc.StatusCode.UNAVAILABLE)]
    fake = _Execution([list(broken)], [list(broken) for _ in range(client_module.RESUMES)])
    client._exec = fake  # type: ignore[assignment]
    with pytest.raises(CcwError) as raised:
        client.execute(re_pb2.Digest(hash="a" * 64, size_bytes=1))
    assert raised.value.code == "UNAVAILABLE" and len(fake.calls) == client_module.RESUMES + 1

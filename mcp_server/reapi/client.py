"""A REAPI v2 client: CAS (find missing, batch and ByteStream upload, read), action cache, Execute.

Blocking gRPC calls, one channel; ``TrioReapi`` runs them in trio's worker threads.

Some facts about REAPI servers, as this client meets them:

- A batch call (``BatchUpdateBlobs``, ``BatchReadBlobs``) must stay under the server's
  ``max_batch_total_size_bytes`` (capabilities; 0 means no limit of its own) *and*
  under gRPC's 4 MiB default message size; the per-blob overhead (digest, status) is
  small but not nothing, so batches keep headroom.  A blob that alone is over the
  budget goes through ByteStream, in chunks, at
  ``{instance}/uploads/{uuid}/blobs/{hash}/{size}``; reads at ``{instance}/blobs/{hash}/{size}``.
- The empty blob (size 0, which is also the empty Directory's) is always present:
  FindMissingBlobs never reports it and reading it needs no call.
- A batch answers per blob: the call succeeds while single blobs fail, so every
  response status is checked.
- ``Execute`` streams ``Operation`` updates (stage CACHE_CHECK, QUEUED, EXECUTING)
  until ``done``; the result is an ``ExecuteResponse`` packed in ``response`` and its own
  ``status`` (DEADLINE_EXCEEDED when the action's timeout hit) is separate from the
  ActionResult's exit code.  A cache hit comes back done at once with
  ``cached_result``.  Without a worker, an uncached Execute stays QUEUED.
- The stream is not the operation: it can break (a proxy's idle timeout, a server
  restart) while the job queues or runs.  ``WaitExecution`` with the operation's name
  picks it up again without running it twice; a server that restarted with its
  operations in memory answers NOT_FOUND, and the action is executed again.
- The action cache answers NOT_FOUND for a miss, which is an answer, not an error.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import trio

from mcp_server.reapi.merkle import DigestKey, InputTree, key
from mcp_server.reapi.protos import (
    bytestream_pb2,
    bytestream_pb2_grpc,
    operations_pb2,
    operations_pb2_grpc,
    re_grpc,
    re_pb2,
)
from sandbox.errors import CcwError

GRPC_MESSAGE_LIMIT = 4 * 1024 * 1024  # gRPC's default maximum received message
BATCH_HEADROOM = 64 * 1024  # room for per-blob digests and statuses in one batch
BYTESTREAM_CHUNK = 1024 * 1024
FIND_MISSING_CHUNK = 10_000  # digests per FindMissingBlobs call
RESUMES = 3  # broken Execute streams resumed (WaitExecution) before giving up
RESUME_PAUSE_S = 0.2  # times the attempt, between them

_CODES = {
    grpc.StatusCode.NOT_FOUND: "NOT_FOUND",
    grpc.StatusCode.INVALID_ARGUMENT: "INVALID_ARGUMENT",
    grpc.StatusCode.FAILED_PRECONDITION: "INVALID_ARGUMENT",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "TOO_LARGE",
    grpc.StatusCode.PERMISSION_DENIED: "PERMISSION_DENIED",
    grpc.StatusCode.UNAUTHENTICATED: "PERMISSION_DENIED",
    grpc.StatusCode.DEADLINE_EXCEEDED: "TIMEOUT",
    grpc.StatusCode.UNAVAILABLE: "UNAVAILABLE",
    grpc.StatusCode.UNIMPLEMENTED: "UNSUPPORTED",
}


@contextlib.contextmanager
def rpc_errors(what: str) -> Iterator[None]:
    """Turn a gRPC failure of ``what`` into a CcwError that keeps the status."""
    try:
        yield
    except grpc.RpcError as error:
        status = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
        detail = error.details() if isinstance(error, grpc.Call) else str(error)
        raise CcwError(_CODES.get(status, "INTERNAL"), f"REAPI {what} failed: {status.name}: {detail}",
                       {"grpc_status": status.name}) from None  # fmt: skip


def parse_url(url: str) -> tuple[str, bool, str]:
    """``grpc://host:port[/instance]`` (or grpcs://, or bare host:port) → (target, tls, instance)."""
    if "://" not in url:
        return url, False, ""
    parts = urlsplit(url)
    if parts.scheme not in ("grpc", "grpcs") or not parts.netloc:
        raise CcwError("INVALID_ARGUMENT", f"REAPI URL {url!r}: want grpc://host:port[/instance]")
    return parts.netloc, parts.scheme == "grpcs", parts.path.strip("/")


def _pieces(source: bytes | Path, size: int) -> Iterator[bytes]:
    """``source``'s bytes in pieces of ``size`` (a file is read as it goes)."""
    if isinstance(source, bytes):
        for start in range(0, len(source), size):
            yield source[start : start + size]
        return
    with open(source, "rb") as reader:
        while data := reader.read(size):
            yield data


def _status_failed(status: object) -> bool:
    return getattr(status, "code", 0) != 0


@dataclass
class UploadReport:
    """What an upload sent: blob count and bytes, and how many went by ByteStream."""

    blobs: int = 0
    bytes: int = 0
    bytestream: int = 0
    missing_before: list[DigestKey] = field(default_factory=list)


@dataclass
class Executed:
    """An Execute's answer: the ExecuteResponse, the operation's name, the stages seen, streams resumed."""

    response: re_pb2.ExecuteResponse
    operation: str
    stages: list[int]
    resumed: int = 0

    @property
    def result(self) -> re_pb2.ActionResult:
        """The ActionResult (exit code, outputs, stdout/stderr digests)."""
        return self.response.result


def _note_stage(operation: operations_pb2.Operation, stages: list[int]) -> None:
    """Append the operation's stage to ``stages`` when it moved on."""
    metadata = re_pb2.ExecuteOperationMetadata()
    if operation.metadata.Unpack(metadata) and (not stages or stages[-1] != metadata.stage):
        stages.append(metadata.stage)


class ReapiClient:
    """One channel to a REAPI server and instance; every call blocks."""

    def __init__(self, url: str, *, channel: grpc.Channel | None = None) -> None:
        target, tls, self.instance = parse_url(url)
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        if channel is None:
            channel = (grpc.secure_channel(target, grpc.ssl_channel_credentials(), options) if tls
                       else grpc.insecure_channel(target, options))  # fmt: skip
        self.channel = channel
        self._cas = re_grpc.ContentAddressableStorageStub(channel)
        self._ac = re_grpc.ActionCacheStub(channel)
        self._exec = re_grpc.ExecutionStub(channel)
        self._caps = re_grpc.CapabilitiesStub(channel)
        self._bytestream = bytestream_pb2_grpc.ByteStreamStub(channel)
        self._operations = operations_pb2_grpc.OperationsStub(channel)
        self._capabilities: re_pb2.ServerCapabilities | None = None

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def __enter__(self) -> ReapiClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def capabilities(self) -> re_pb2.ServerCapabilities:
        """The server's capabilities (asked once)."""
        if self._capabilities is None:
            with rpc_errors("GetCapabilities"):
                self._capabilities = self._caps.GetCapabilities(
                    re_pb2.GetCapabilitiesRequest(instance_name=self.instance))
        return self._capabilities

    def batch_budget(self) -> int:
        """Bytes of blob data one batch call may carry."""
        limit = self.capabilities().cache_capabilities.max_batch_total_size_bytes
        return min(limit or GRPC_MESSAGE_LIMIT, GRPC_MESSAGE_LIMIT) - BATCH_HEADROOM

    # --- CAS ----------------------------------------------------------------------

    def find_missing(self, digests: Iterable[re_pb2.Digest]) -> list[re_pb2.Digest]:
        """The digests among ``digests`` that the CAS does not hold."""
        unique = list({key(d): d for d in digests}.values())
        missing: list[re_pb2.Digest] = []
        for start in range(0, len(unique), FIND_MISSING_CHUNK):
            request = re_pb2.FindMissingBlobsRequest(
                instance_name=self.instance, blob_digests=unique[start : start + FIND_MISSING_CHUNK])
            with rpc_errors("FindMissingBlobs"):
                missing.extend(self._cas.FindMissingBlobs(request).missing_blob_digests)
        return missing

    def upload(self, blobs: Mapping[DigestKey, bytes | Path]) -> UploadReport:
        """Upload ``blobs`` (all of them): small ones in batches, large ones by ByteStream."""
        report = UploadReport()
        budget = self.batch_budget()
        batch: list[re_pb2.BatchUpdateBlobsRequest.Request] = []
        batch_bytes = 0
        for (hash_, size), source in blobs.items():
            digest = re_pb2.Digest(hash=hash_, size_bytes=size)
            report.blobs += 1
            report.bytes += size
            if size > budget:
                self._bytestream_write(digest, source)
                report.bytestream += 1
                continue
            if batch and batch_bytes + size > budget:
                self._batch_update(batch)
                batch, batch_bytes = [], 0
            data = source if isinstance(source, bytes) else source.read_bytes()
            batch.append(re_pb2.BatchUpdateBlobsRequest.Request(digest=digest, data=data))
            batch_bytes += size
        if batch:
            self._batch_update(batch)
        return report

    def upload_tree(self, tree: InputTree, extra: Mapping[DigestKey, bytes] | None = None) -> UploadReport:
        """Upload what the CAS misses of ``tree`` (and ``extra`` blobs, e.g. an Action's)."""
        blobs: dict[DigestKey, bytes | Path] = {**tree.blobs, **(extra or {})}
        digests = [re_pb2.Digest(hash=h, size_bytes=s) for (h, s) in blobs]
        missing = [key(d) for d in self.find_missing(digests)]
        report = self.upload({k: blobs[k] for k in missing})
        report.missing_before = missing
        return report

    def _batch_update(self, requests: list[re_pb2.BatchUpdateBlobsRequest.Request]) -> None:
        with rpc_errors("BatchUpdateBlobs"):
            reply = self._cas.BatchUpdateBlobs(
                re_pb2.BatchUpdateBlobsRequest(instance_name=self.instance, requests=requests))
        failed = [r for r in reply.responses if _status_failed(r.status)]
        if failed:
            first = failed[0]
            raise CcwError("UNAVAILABLE", f"BatchUpdateBlobs refused {len(failed)} blob(s), first "
                                          f"{first.digest.hash}/{first.digest.size_bytes}: "
                                          f"{first.status.message}")  # fmt: skip

    def _resource(self, *parts: str) -> str:
        return "/".join(p for p in (self.instance, *parts) if p)

    def _bytestream_write(self, digest: re_pb2.Digest, source: bytes | Path) -> None:
        name = self._resource("uploads", str(uuid.uuid4()), "blobs", digest.hash, str(digest.size_bytes))

        def requests() -> Iterator[bytestream_pb2.WriteRequest]:
            offset = 0
            for data in _pieces(source, BYTESTREAM_CHUNK):
                last = offset + len(data) >= digest.size_bytes
                yield bytestream_pb2.WriteRequest(resource_name=name if offset == 0 else "",
                                                  write_offset=offset, data=data, finish_write=last)  # fmt: skip
                offset += len(data)

        with rpc_errors("ByteStream.Write"):
            reply = self._bytestream.Write(requests())
        if reply.committed_size not in (digest.size_bytes, -1):
            raise CcwError("UNAVAILABLE", f"ByteStream.Write of {name} committed {reply.committed_size} "
                                          f"of {digest.size_bytes} bytes")  # fmt: skip

    def read_blob(self, digest: re_pb2.Digest) -> bytes:
        """A blob's bytes: by BatchReadBlobs when small, by ByteStream when large."""
        if digest.size_bytes == 0:
            return b""
        if digest.size_bytes > self.batch_budget():
            name = self._resource("blobs", digest.hash, str(digest.size_bytes))
            with rpc_errors("ByteStream.Read"):
                data = b"".join(r.data for r in self._bytestream.Read(
                    bytestream_pb2.ReadRequest(resource_name=name)))  # fmt: skip
        else:
            with rpc_errors("BatchReadBlobs"):
                reply = self._cas.BatchReadBlobs(
                    re_pb2.BatchReadBlobsRequest(instance_name=self.instance, digests=[digest]))
            (answer,) = reply.responses
            if _status_failed(answer.status):
                raise CcwError("NOT_FOUND", f"CAS has no blob {digest.hash}/{digest.size_bytes}: "
                                            f"{answer.status.message}")  # fmt: skip
            data = answer.data
        if len(data) != digest.size_bytes:
            raise CcwError("INTERNAL", f"blob {digest.hash} came back with {len(data)} bytes, "
                                       f"not {digest.size_bytes}")  # fmt: skip
        return data

    def read_blobs(self, digests: Iterable[re_pb2.Digest]) -> Iterator[tuple[re_pb2.Digest, bytes]]:
        """Each blob's bytes, many small ones per BatchReadBlobs (within the batch budget), large ones alone."""
        budget = self.batch_budget()
        batch: list[re_pb2.Digest] = []
        size = 0
        for digest in {key(d): d for d in digests}.values():
            if digest.size_bytes == 0 or digest.size_bytes > budget:
                yield digest, self.read_blob(digest)
                continue
            if batch and size + digest.size_bytes > budget:
                yield from self._batch_read(batch)
                batch, size = [], 0
            batch.append(digest)
            size += digest.size_bytes
        if batch:
            yield from self._batch_read(batch)

    def _batch_read(self, digests: list[re_pb2.Digest]) -> Iterator[tuple[re_pb2.Digest, bytes]]:
        with rpc_errors("BatchReadBlobs"):
            reply = self._cas.BatchReadBlobs(re_pb2.BatchReadBlobsRequest(instance_name=self.instance, digests=digests))
        for answer in reply.responses:
            if _status_failed(answer.status) or len(answer.data) != answer.digest.size_bytes:
                raise CcwError("NOT_FOUND", f"CAS has no blob {answer.digest.hash}/{answer.digest.size_bytes}: "
                                            f"{answer.status.message}")  # fmt: skip
            yield answer.digest, answer.data

    def get_tree(self, root: re_pb2.Digest) -> Iterator[re_pb2.Directory]:
        """Every Directory under ``root`` (root included), page by page from GetTree."""
        token = ""
        while True:
            request = re_pb2.GetTreeRequest(instance_name=self.instance, root_digest=root, page_token=token)
            with rpc_errors("GetTree"):
                for page in self._cas.GetTree(request):
                    yield from page.directories
                    token = page.next_page_token
            if not token:
                return

    # --- action cache and execution ------------------------------------------------

    def get_action_result(self, action_digest: re_pb2.Digest) -> re_pb2.ActionResult | None:
        """The cached ActionResult for ``action_digest``, or None on a miss."""
        request = re_pb2.GetActionResultRequest(instance_name=self.instance, action_digest=action_digest,
                                                inline_stdout=True, inline_stderr=True)  # fmt: skip
        try:
            with rpc_errors("GetActionResult"):
                return self._ac.GetActionResult(request)
        except CcwError as error:
            if error.code == "NOT_FOUND":  # a miss is an answer
                return None
            raise

    def update_action_result(self, action_digest: re_pb2.Digest, result: re_pb2.ActionResult) -> None:
        """Store ``result`` for ``action_digest`` (servers may refuse: allow-updates)."""
        with rpc_errors("UpdateActionResult"):
            self._ac.UpdateActionResult(re_pb2.UpdateActionResultRequest(
                instance_name=self.instance, action_digest=action_digest, action_result=result))

    def execute(self, action_digest: re_pb2.Digest, *, skip_cache_lookup: bool = False,
                timeout_s: float | None = None,
                on_update: Callable[[operations_pb2.Operation], None] | None = None,
                on_call: Callable[[grpc.Call], None] | None = None) -> Executed:  # fmt: skip
        """Run the action (or take it from the cache) and wait until its operation is done.

        ``on_call`` receives each stream, so another thread can cancel it; ``timeout_s``
        bounds the whole wait (TIMEOUT), queueing included.  A stream that breaks
        (UNAVAILABLE, or ends before the operation is done) is resumed with
        ``WaitExecution`` on the operation's name, up to ``RESUMES`` times; an operation
        the server no longer knows (NOT_FOUND: it restarted) is executed again.
        """
        request = re_pb2.ExecuteRequest(instance_name=self.instance, action_digest=action_digest,
                                        skip_cache_lookup=skip_cache_lookup)  # fmt: skip
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        stages: list[int] = []
        name = ""
        for attempt in range(RESUMES + 1):
            left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
            what = "WaitExecution" if name else "Execute"
            try:
                with rpc_errors(what):
                    stream = (self._exec.WaitExecution(re_pb2.WaitExecutionRequest(name=name), timeout=left) if name
                              else self._exec.Execute(request, timeout=left))  # fmt: skip
                    if on_call is not None:
                        on_call(stream)
                    for operation in stream:
                        name = operation.name or name
                        _note_stage(operation, stages)
                        if on_update is not None:
                            on_update(operation)
                        if operation.done:
                            return Executed(self._finished(operation), name, stages, attempt)
            except CcwError as error:
                if error.code == "NOT_FOUND" and what == "WaitExecution":
                    name = ""  # the server forgot it (a restart): ask again; the cache may answer
                elif error.code != "UNAVAILABLE" or attempt == RESUMES:
                    raise
            time.sleep(RESUME_PAUSE_S * (attempt + 1))
        raise CcwError("UNAVAILABLE", f"Execute stream for {name or 'the action'} broke {RESUMES + 1} times "
                       "before it was done", {"operation": name})

    def wait_execution(self, name: str, timeout_s: float | None = None) -> Executed:
        """Wait for an operation started earlier (by this client or another) to be done."""
        stages: list[int] = []
        with rpc_errors("WaitExecution"):
            for operation in self._exec.WaitExecution(re_pb2.WaitExecutionRequest(name=name), timeout=timeout_s):
                _note_stage(operation, stages)
                if operation.done:
                    return Executed(self._finished(operation), operation.name or name, stages)
        raise CcwError("UNAVAILABLE", f"WaitExecution stream for {name} ended before it was done")

    @staticmethod
    def _finished(operation: operations_pb2.Operation) -> re_pb2.ExecuteResponse:
        if operation.HasField("error"):
            raise CcwError("UNAVAILABLE", f"operation {operation.name} failed: {operation.error.message}",
                           {"rpc_code": operation.error.code})  # fmt: skip
        response = re_pb2.ExecuteResponse()
        if not operation.response.Unpack(response):
            raise CcwError("INTERNAL", f"operation {operation.name} answered {operation.response.type_url}")
        return response

    def cancel_operation(self, name: str) -> None:
        """Ask the server to cancel a queued or running operation."""
        with rpc_errors("CancelOperation"):
            self._operations.CancelOperation(operations_pb2.CancelOperationRequest(name=name))

    def outputs(self, result: re_pb2.ActionResult) -> tuple[bytes, bytes]:
        """The run's stdout and stderr: inlined when the server inlined them, else from the CAS."""
        stdout = result.stdout_raw or self.read_blob(result.stdout_digest)
        stderr = result.stderr_raw or self.read_blob(result.stderr_digest)
        return stdout, stderr


def digests_of(keys: Sequence[DigestKey]) -> list[re_pb2.Digest]:
    """Digest messages for ``(hash, size)`` keys."""
    return [re_pb2.Digest(hash=h, size_bytes=s) for (h, s) in keys]


class TrioReapi:
    """``ReapiClient`` for trio code: each call runs in a worker thread.

    gRPC's blocking calls release the GIL, so the trio loop runs on; a cancelled
    ``execute`` cancels its gRPC stream, which ends the thread's wait.
    """

    def __init__(self, client: ReapiClient) -> None:
        self.client = client

    async def upload_tree(self, tree: InputTree, extra: Mapping[DigestKey, bytes] | None = None) -> UploadReport:
        """``ReapiClient.upload_tree`` in a thread."""
        return await trio.to_thread.run_sync(self.client.upload_tree, tree, extra)

    async def find_missing(self, digests: Sequence[re_pb2.Digest]) -> list[re_pb2.Digest]:
        """``ReapiClient.find_missing`` in a thread."""
        return await trio.to_thread.run_sync(self.client.find_missing, digests)

    async def read_blob(self, digest: re_pb2.Digest) -> bytes:
        """``ReapiClient.read_blob`` in a thread."""
        return await trio.to_thread.run_sync(self.client.read_blob, digest)

    async def get_action_result(self, action_digest: re_pb2.Digest) -> re_pb2.ActionResult | None:
        """``ReapiClient.get_action_result`` in a thread."""
        return await trio.to_thread.run_sync(self.client.get_action_result, action_digest)

    async def execute(self, action_digest: re_pb2.Digest, *, skip_cache_lookup: bool = False,
                      timeout_s: float | None = None) -> Executed:  # fmt: skip
        """``ReapiClient.execute`` in a thread; cancelling the caller cancels the stream."""
        calls: list[grpc.Call] = []

        def run() -> Executed:
            return self.client.execute(action_digest, skip_cache_lookup=skip_cache_lookup,
                                       timeout_s=timeout_s, on_call=calls.append)  # fmt: skip

        try:
            return await trio.to_thread.run_sync(run, abandon_on_cancel=True)
        except trio.Cancelled:
            for call in calls:
                call.cancel()
            raise

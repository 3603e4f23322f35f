"""The MCP Tasks extension (``io.modelcontextprotocol/tasks``, SEP-2663) over ccw's runs.

A long ``capsule_exec``, ``capsule_deltamin`` or ``capsule_replay`` already becomes a run
(mcp_server/capsules/run.py) that answers ``status: running`` with a ``run_id``
once its ``wait_ms`` is spent.  A client that declares the extension on its request gets
that answer as a ``CreateTaskResult`` instead (``resultType: "task"``) and polls it with
``tasks/get``, which gives the tool's own ``CallToolResult`` once the run has ended.

- **Only to a declaring client, only in the 2026-07-28 era.**  The extension is declared
  in the request's own capabilities (``params._meta["io.modelcontextprotocol/
  clientCapabilities"].extensions``), which exist only in the per-request envelope of the
  2026 era; the 2025-11-25 schema has neither ``extensions`` nor ``resultType``, and its
  own experimental tasks are what SEP-2663 removed.  A 2025-era client, or one that does
  not declare it, never gets a task: it gets ``status: running`` and ``capsule_run``.
- **The task id is the run id.**  A task is the run it was made from, so it keeps the
  run's place in the capsule's turn, ends with the server (runs are per process), and is
  kept as long as a finished run is.  ``capsule_run`` reaches it by the same id, and
  ``tasks/cancel`` is ``capsule_run`` with ``cancel``: the jail is ended and the turn
  passed on before the ack.  An id that was never answered as a task is no task.
- **Whose task.**  A task is its run's, and a run belongs to the bearer token that
  started it (background.py): another token's ``tasks/*`` (or ``capsule_run``) finds no
  such task.  Over HTTP the ``tasks/*`` methods need the ``exec`` scope, as
  ``capsule_run`` does (``CcwServer.scope_for``).  A task made by a tool that the asking
  connection is not served (``served``: its tool list's names, mcp_server/frontdoor.py)
  is no task to it either.
- **The result is the call's.**  A completed task's ``result`` is what ``tools/call`` of
  the tool that made it would have answered (structured content, text block, ``isError``
  for a ccw error); a failure that ``tools/call`` would have answered as a JSON-RPC error
  makes the task ``failed`` with that error.  ccw never asks the client for input, so
  ``tasks/update`` only acknowledges a known task.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection
from datetime import UTC, datetime
from typing import Any

import mcp_types as types
import trio
from mcp.shared.exceptions import MCPError
from pydantic import Field

from mcp_server.capsules.run import KEEP_S, Run, Runs
from sandbox.errors import CcwError

EXTENSION = "io.modelcontextprotocol/tasks"
METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
MODERN_ERA = "2026-07-28"  # the protocol version whose per-request capabilities can declare it
POLL_INTERVAL_MS = 2000  # execs worth a task last seconds to hours
_SUMMARY_KEYS = frozenset(("status", "run_id", "elapsed_ms", "progress", "next"))  # RUN_STATUS's properties

# A tools/call result for a finished run: (the tool's name, how to get its answer) -> wire dict.
Answer = Callable[[str, Callable[[], Awaitable[dict[str, Any]]]], Awaitable[dict[str, Any]]]


class TaskParams(types.RequestParams):
    """``tasks/get`` and ``tasks/cancel`` params: the task's id."""

    task_id: str = Field(alias="taskId")


class UpdateTaskParams(TaskParams):
    """``tasks/update`` params: answers to input requests (ccw never makes any)."""

    input_responses: dict[str, Any] = Field(alias="inputResponses", default_factory=dict)


def token_name(ctx: Any) -> str | None:
    """The name of the bearer token a request came with (HTTP: transports/http.py puts it in
    the ASGI scope as the SDK's authenticated user); None over stdio and the unix socket."""
    scope = getattr(getattr(ctx, "request", None), "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    name = getattr(getattr(user, "access_token", None), "client_id", None)
    return name if isinstance(name, str) else None


def token_scopes(ctx: Any) -> frozenset[str] | None:
    """The scopes of the bearer token a request came with (as ``token_name``); None without one."""
    scope = getattr(getattr(ctx, "request", None), "scope", None)
    user = scope.get("user") if isinstance(scope, dict) else None
    scopes = getattr(getattr(user, "access_token", None), "scopes", None)
    return frozenset(scopes) if isinstance(scopes, list) else None


def declared(ctx: Any) -> bool:
    """True when this request may be answered with a task: a 2026-era request whose own
    capabilities list the extension (in that era the connection is the request's envelope)."""
    if getattr(ctx, "protocol_version", None) != MODERN_ERA:
        return False
    capabilities = getattr(ctx.session, "client_capabilities", None)
    extensions = getattr(capabilities, "extensions", None)
    return isinstance(extensions, dict) and EXTENSION in extensions


class Tasks:
    """The runs that were answered as tasks, by id (= run id), with the tool that made each."""

    def __init__(self, runs: Runs) -> None:
        self._runs = runs
        self._tools: dict[str, str] = {}

    def adopt(self, tool: str, result: Any, owner: str | None) -> dict[str, Any] | None:
        """The CreateTaskResult for a call (by ``owner``) whose answer was a live run's "running"
        summary; else None."""
        if not isinstance(result, dict) or set(result) != _SUMMARY_KEYS or result["status"] != "running":
            return None
        try:
            run = self._runs.get(str(result["run_id"]), owner)
        except CcwError:
            return None
        self._tools[run.run_id] = tool
        return {"resultType": "task", **self._task(run, "working")}

    def find(self, task_id: str, owner: str | None, served: Collection[str] | None = None) -> tuple[Run, str]:
        """``owner``'s task: its run and the tool that made it; INVALID_PARAMS (-32602) if there
        is no such task, or it is another token's, or a tool not in ``served`` (None: any)
        made it (each said the same way)."""
        tool = self._tools.get(task_id)
        if tool is not None and (served is None or tool in served):
            try:
                return self._runs.get(task_id, owner), tool
            except CcwError:
                if task_id not in self._runs:
                    del self._tools[task_id]  # the run expired: so did its task
        raise MCPError(code=types.INVALID_PARAMS, message=(
            f"no task {task_id!r}: tasks are the runs of this server process, kept {int(KEEP_S)} s after they "
            "end and lost when it restarts; call the tool again"), data={"taskId": task_id})

    async def get(self, task_id: str, owner: str | None, answer: Answer,
                  served: Collection[str] | None = None) -> dict[str, Any]:
        """``tasks/get``: the task, with the tool's result (completed), its error (failed), or neither."""
        run, tool = self.find(task_id, owner, served)
        if not run.done.is_set():
            return self._task(run, "working")
        if run.cancelled:
            return self._task(run, "cancelled")

        async def outcome() -> dict[str, Any]:
            return run.outcome()

        try:
            result = await answer(tool, outcome)
        except MCPError as exc:
            return {**self._task(run, "failed"), "error": exc.error.model_dump(mode="json", exclude_none=True)}
        return {**self._task(run, "completed"), "result": result}

    async def cancel(self, task_id: str, owner: str | None, served: Collection[str] | None = None) -> dict[str, Any]:
        """``tasks/cancel``: end the run (its jail, its turn) before the ack; an ended task stays as it was."""
        run, _ = self.find(task_id, owner, served)
        await self._runs.cancel(run)
        return {}

    def update(self, task_id: str, owner: str | None, served: Collection[str] | None = None) -> dict[str, Any]:
        """``tasks/update``: ccw's tasks never wait for input, so answers to none are ignored."""
        self.find(task_id, owner, served)
        return {}

    def _task(self, run: Run, status: str) -> dict[str, Any]:
        updated = run.ended if run.ended is not None else run.started
        # A finished run is kept KEEP_S after its end; a working one as long as it works.
        ttl = None if run.ended is None else int((run.ended - run.started + KEEP_S) * 1000)
        task: dict[str, Any] = {"taskId": run.run_id, "status": status, "createdAt": self._iso(run.started),
                                "lastUpdatedAt": self._iso(updated), "ttlMs": ttl,
                                "pollIntervalMs": POLL_INTERVAL_MS}
        if run.last_report is not None and status == "working":
            task["statusMessage"] = run.last_report
        return task

    @staticmethod
    def _iso(trio_time: float) -> str:
        # Runs keep trio's clock (its origin is arbitrary); tasks tell wall-clock times.
        moment = datetime.fromtimestamp(time.time() - trio.current_time() + trio_time, tz=UTC)
        return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

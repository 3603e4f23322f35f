"""ccw's MCP server: the SDK's low-level ``Server`` built from the tool registry.

``CcwServer`` is transport-free.  Transports hand it either a stream pair
(``serve_streams``: the SDK serves both protocol eras on it, the client's first request
decides which) or a single direct-method request (``run_direct``).

Each connection is served a ``ToolList`` (tools/surface.py): the tools of its
``CCW_TOOLSETS``, which is this server's own, or that of the attached ``ccw-mcp`` that
opened the connection (mcp_server/frontdoor.py).  The process can serve every family
(``servable``); a connection is shown, and may call, only its list.  The transport passes
the list to ``serve_streams`` and to the direct-method entry points; the SDK hands it to
every handler as ``ctx.lifespan_context``, the state the connection's serving loop was
started with (over HTTP the SDK enters ``Server.lifespan`` instead: this server's list).

How a tool call is served, the same for ``tools/call`` and for direct methods:

1. Look the name up in the connection's tool list (its own name, an alias, or a
   deprecated alias, which logs a warning to stderr).  Unknown there, though another
   connection may call it → JSON-RPC error -32602.
2. Validate the arguments against the tool's input schema (Draft 2020-12), listing the
   violations as ``{path, msg}`` sorted (seed 001 §5 order, RFC 6901 paths).  To a
   session that negotiated 2025-11-25 or later they are a tool error (step 3's): code
   INVALID_ARGUMENT, the list as ``details.errors``, the schema's name
   (``tool.NAME.input``) as ``details.schema``; that revision has a model see them and
   correct its call (SEP-1303).  To an older session, and from a direct method, a
   JSON-RPC error -32602 with the list as ``data.errors``.
3. Run the handler.  A ``CcwError`` becomes a tool error: ``isError: true`` and
   ``structuredContent: {"error": {code, message, details}}`` (over MCP), or a JSON-RPC
   error -32000 with ``data: {"error": …}`` (direct methods, which have no result
   envelope to flag an error in).
4. With ``CCW_DEBUG=1`` the result is checked against the output schema; a violation is
   a server bug, answered as JSON-RPC -32603 and logged.
5. The structured result is sent as ``structuredContent`` and, for clients that read
   only content blocks, as the same JSON in one text block; except for tools whose
   result is one document (``ToolSpec.text``: reading a file's lines), whose text block
   is the other fields as one JSON line and then the document as text, which a model
   reads as the file is (seed 002's tagged lines) rather than as one escaped string.
6. A call answered as a live run's ``status: running`` (capsules/run.py) is
   answered instead as an MCP task (``resultType: "task"``) when the request declared
   the Tasks extension; ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` serve it
   (mcp_server/tasks.py).  A tool error, bad arguments' included, is never a task.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
import traceback
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any

import mcp_types as types
from jsonschema.protocols import Validator as SchemaValidator
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.runner import serve_dual_era_loop
from mcp.shared.exceptions import MCPError
from mcp_types import methods as spec_methods
from mcp_types.version import is_version_at_least

from mcp_server import __version__, completion, framing, mcp_logging
from mcp_server.caller import lending, lent
from mcp_server.capsules.turns import Ticket, arrived_ticket
from mcp_server.config import TOOLSETS, Config
from mcp_server.context import CallContext, Runtime
from mcp_server.core.schemapattern import Validator
from mcp_server.framing import INTERNAL_ERROR, INVALID_PARAMS
from mcp_server.journal import Journal
from mcp_server.logs import LOGGER
from mcp_server.state import State, storage_error
from mcp_server.tasks import EXTENSION, TaskParams, Tasks, UpdateTaskParams, declared, token_name, token_scopes
from mcp_server.tasks import MODERN_ERA as TASKS_ERA
from mcp_server.tools.registry import Registry, ResourceSpec, ToolSpec
from mcp_server.tools.surface import ToolList
from sandbox.errors import CcwError

TOOL_ERROR = -32000  # a direct method's tool failure; data = {"error": {code, message, details}}
RESOURCE_NOT_FOUND = -32002  # MCP's code for an unknown resource URI
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
TOOL_ERROR_ARGUMENTS_SINCE = "2025-11-25"  # the first revision whose bad tool arguments are a tool error


class CcwServer:
    """The registry served over MCP; one per process, shared by every connection, each
    shown its own tool list."""

    def __init__(self, config: Config, state: State, registry: Registry | None = None) -> None:
        self.config = config
        self.state = state
        # Every tool this process can serve (``registry``: a test's own); a connection is
        # served the part its CCW_TOOLSETS chooses.
        self.servable = registry if registry is not None else Registry.load(TOOLSETS)
        self.runtime = Runtime(config, state, self.servable.run_outcome)
        self.check_output = config.debug
        # By the spec itself, not its name: a profile may serve a narrowed spec of the same name
        # (ToolSpec.narrowed) beside another connection's whole one.  Each entry holds its spec,
        # so the id is not reused while the entry lives.
        self._validators: dict[int, tuple[ToolSpec, SchemaValidator, SchemaValidator]] = {}
        self._tool_lists: dict[tuple[str, ...], ToolList] = {}
        self.tools = self.tool_list(config.toolsets)  # this server's own: its stdio, socket and HTTP clients'
        self.sdk: Server[ToolList] = Server(
            "ccw",
            version=__version__,
            title="ccw: counterfactual capsule workspaces",
            instructions="Try changes and run commands in copy-on-write capsules; promote them when policies pass.",
            get_tool_input_schema=self._input_schema_of,
            on_list_tools=self._on_list_tools,
            on_list_resources=self._on_list_resources,
            on_list_resource_templates=self._on_list_resource_templates,
            on_read_resource=self._on_read_resource,
            lifespan=self._own_tools,
        )
        # Registered directly: the constructor keyword for it warns that roots are
        # deprecated in the 2026 era, but 2025-era clients still send it.
        self.sdk.add_notification_handler(
            "notifications/roots/list_changed", types.NotificationParams, self._on_roots_changed
        )
        # tools/call answers a CallToolResult or, to a client that declared tasks, a CreateTaskResult.
        self.sdk.add_request_handler("tools/call", types.CallToolRequestParams, self._on_call_tool)
        self.tasks = Tasks(self.runtime.runs)  # the MCP Tasks extension over the runs (mcp_server/tasks.py)
        self.sdk.extensions[EXTENSION] = {}
        self.sdk.add_request_handler("tasks/get", TaskParams, self._on_task_get)
        self.sdk.add_request_handler("tasks/update", UpdateTaskParams, self._on_task_update)
        self.sdk.add_request_handler("tasks/cancel", TaskParams, self._on_task_cancel)
        # Logging and completion (mcp_logging.py, completion.py); setLevel registered directly, as
        # roots are: the constructor's keyword warns that logging leaves the 2026 era.
        self.sdk.add_request_handler("logging/setLevel", types.SetLevelRequestParams, mcp_logging.on_set_level)
        self.sdk.add_request_handler("completion/complete", types.CompleteRequestParams, self._on_complete)
        self.sdk.middleware.append(mcp_logging.serving)  # which connection a record was logged for
        mcp_logging.install()
        self.init_options = self.sdk.create_initialization_options()

    # --- entry points for transports ---------------------------------------------

    def tool_list(self, toolsets: Collection[str]) -> ToolList:
        """The tools served to a connection whose CCW_TOOLSETS is ``toolsets`` (made once
        per selection, with its tools' validators)."""
        key = tuple(sorted(set(toolsets)))
        tools = self._tool_lists.get(key)
        if tools is None:
            tools = self._tool_lists[key] = ToolList(self.config, key, self.servable)
            for spec in tools.registry.tools:
                self._checkers(spec)
        return tools

    async def serve_streams(self, read_stream: Any, write_stream: Any, tools: ToolList | None = None) -> None:
        """Serve one MCP connection (either era) over SDK message streams until read EOF,
        with ``tools`` (default: this server's own)."""
        await serve_dual_era_loop(self.sdk, read_stream, write_stream, init_options=self.init_options,
                                  lifespan_state=tools if tools is not None else self.tools)

    @contextlib.asynccontextmanager
    async def _own_tools(self, sdk: Server[ToolList]) -> AsyncIterator[ToolList]:
        """The SDK's lifespan, entered by what serves our ``sdk`` by itself (HTTP, in-memory
        clients): its handlers' ``ctx.lifespan_context`` is this server's own tool list."""
        yield self.tools

    def startup(self) -> None:
        """Work due before the first request: finish or undo interrupted promotions (no
        workspace stays half-promoted after a crash), journal the runs a killed front end left
        unjournaled, and read the schema files (seed 001: files are read at start only)."""
        from mcp_server.fs.promote import Promoter

        for outcome in Promoter(self.state.root).recover():
            LOGGER.info(f"mcp:recovered promotion {outcome['txid']}: {outcome['action']} "
                        f"workspace={outcome.get('workspace', '-')}")
        for capsule_id, seq in Journal(self.state).recover_running():
            LOGGER.info(f"mcp:recovered run {seq} of {capsule_id}: journaled cut short (its front end died as it ran)")
        if "witness" in self.config.toolsets:
            from mcp_server.capsules.witness import remove_stale_temps

            for name in remove_stale_temps(self.state):
                LOGGER.info(f"mcp:recovered witness temp file {name}: removed (its writer died mid-write)")
        if "schema" in self.config.toolsets:
            from mcp_server.tools import schema

            schema.warm(self.config, LOGGER.warning)

    def arrive(self, method: str, params: Any, tools: ToolList | None = None) -> Ticket | None:
        """Take the capsule's turn for a call (``tools/call`` or a direct method of ``tools``,
        default ours) the moment a transport reads it, if its tool takes one
        (``ToolSpec.turn``): every transport calls this, hands the ticket to the call and
        gives it back once the request is answered (mcp_server/capsules/turns.py)."""
        registry = (tools if tools is not None else self.tools).registry
        name: Any = method
        if method == "tools/call" and isinstance(params, Mapping):
            name, params = params.get("name"), params.get("arguments")
        elif not self.is_direct_method(method, tools):
            return None
        spec = registry.lookup(name) if isinstance(name, str) else None
        return self.runtime.capsule_queue.arrive(spec.turn if spec is not None else None, params, self._parents_of)

    def _parents_of(self, capsule_id: str) -> list[str]:
        """The capsules whose layers a live capsule of this state dir lies on, which it freezes: its
        parent and, for a merged one, the inputs a merge may have stacked (``Journal.merged_from``)."""
        journal = Journal(self.state)
        record = journal.capsule(capsule_id)
        if record is None or record.destroyed_at is not None:
            return []
        return list(dict.fromkeys([*([record.parent] if record.parent else []), *journal.merged_from(capsule_id)]))

    def is_direct_method(self, method: str, tools: ToolList | None = None) -> bool:
        """True when ``method`` names a tool (or alias) of ``tools`` (default ours) rather
        than an MCP method."""
        if method in spec_methods.SPEC_CLIENT_METHODS or method.startswith("notifications/"):
            return False
        return (tools if tools is not None else self.tools).registry.lookup(method) is not None

    def scope_for(self, method: str, params: Any) -> str | None:
        """The bearer scope a request needs (None: any valid token will do); HTTP's clients
        are served this server's own tools."""
        registry = self.tools.registry
        if method in TASK_METHODS:
            return "exec"  # a task is a run: capsule_run's scope
        if method == "completion/complete":
            return "read"  # what it asks: the list tools and list://, each of scope read
        if method == "tools/call" and isinstance(params, Mapping):
            spec = registry.lookup(str(params.get("name", "")))
            return spec.scope_for(params.get("arguments")) if spec is not None else None
        if method == "resources/read" and isinstance(params, Mapping):
            resource = _match_resource(registry, str(params.get("uri", "")))
            return resource.scope if resource is not None else None
        spec = registry.lookup(method) if self.is_direct_method(method) else None
        return spec.scope_for(params) if spec is not None else None

    async def run_direct(self, request_id: Any, method: str, params: Any, owner: str | None = None,
                         ticket: Ticket | None = None, tools: ToolList | None = None) -> dict[str, Any]:
        """Serve a direct-method request of ``tools`` (default ours; from the bearer token
        named ``owner``, over HTTP; with the place ``arrive`` took when it was read); returns
        the JSON-RPC response message."""
        tools = tools if tools is not None else self.tools
        spec = self._lookup(method, tools)
        if params is None:
            params = {}
        if not isinstance(params, dict):
            return _error(request_id, INVALID_PARAMS, f"{method}: params must be an object of tool arguments")
        args = {k: v for k, v in params.items() if k != "_meta"}
        try:
            call = CallContext(self.runtime, owner=owner, caller=lent(params.get("_meta")), ticket=ticket,
                               config=tools.config)
            result = await self.call_tool(spec, args, call)
        except MCPError as exc:
            return _error(request_id, exc.error.code, exc.error.message, exc.error.data)
        except CcwError as exc:
            return _error(request_id, TOOL_ERROR, exc.message, {"error": exc.to_dict()})
        except Exception as exc:
            LOGGER.error(f"mcp:bug {spec.name} raised {exc!r}\n{traceback.format_exc()}")
            return _error(request_id, INTERNAL_ERROR, f"{spec.name} failed unexpectedly: {exc}; see the server log")
        return {"jsonrpc": "2.0", "id": request_id, "result": result}

    # --- the tool pipeline ------------------------------------------------------

    def _lookup(self, name: str, tools: ToolList) -> ToolSpec:
        spec = tools.registry.lookup(name)
        if spec is None:
            known = ", ".join(sorted(s.name for s in tools.registry.tools))
            raise MCPError(code=INVALID_PARAMS, message=f"unknown tool {name!r}; tools/list shows the tools: {known}")
        if tools.registry.is_deprecated_alias(name):
            LOGGER.warning(f"mcp:deprecated {name!r} is a deprecated alias of {spec.name!r}; "
                           f"call {spec.name!r} instead")
        return spec

    def _checkers(self, spec: ToolSpec) -> tuple[SchemaValidator, SchemaValidator]:
        """The input and output validators of ``spec``.

        The schemas are not checked against the metaschema here: they are constants of the
        code, and checking the 110 of every tool took 1-2 s of each server's start (more
        under load); tests/test_tool_surface.py checks every spec of every selection once.
        """
        entry = self._validators.get(id(spec))
        if entry is None:
            entry = self._validators[id(spec)] = (
                spec, Validator(spec.input_schema), Validator(spec.output_schema))
        return entry[1], entry[2]

    def argument_errors(self, spec: ToolSpec, args: Any) -> list[dict[str, str]]:
        """Input-schema violations as sorted ``{path, msg}`` (RFC 6901 paths)."""
        validator = self._checkers(spec)[0]
        errors = [{"path": _pointer(e.absolute_path), "msg": e.message} for e in validator.iter_errors(args)]
        return sorted(errors, key=lambda e: (e["path"], e["msg"]))

    async def call_tool(self, spec: ToolSpec, args: dict[str, Any], ctx: CallContext,
                        violation_is_tool_error: bool = False) -> dict[str, Any]:
        """Validate, run and (in debug) check one call; raises MCPError or CcwError.  Arguments
        that violate the input schema raise a CcwError INVALID_ARGUMENT if
        ``violation_is_tool_error``, else an MCPError -32602."""
        errors = self.argument_errors(spec, args)
        if errors:
            summary = "; ".join(f"{e['path'] or '/'}: {e['msg']}" for e in errors[:5])
            message = f"{spec.name}: arguments do not match the input schema: {summary}"
            if violation_is_tool_error:  # the schema's name is the one get_schema knows it by
                raise CcwError("INVALID_ARGUMENT", f"{message}; change those arguments as {spec.name}'s "
                               "inputSchema in tools/list says and call it again",
                               {"errors": errors, "schema": f"tool.{spec.name}.input"})
            raise MCPError(code=INVALID_PARAMS, message=message, data={"errors": errors})
        return await self.checked(spec, lambda: spec.handler(ctx, args))

    async def checked(self, spec: ToolSpec, produce: Any) -> dict[str, Any]:
        """``produce()`` (the tool's result): a state-dir failure as a CcwError, and in debug
        the result checked against the output schema (a violation is a server bug)."""
        try:
            result: dict[str, Any] = await produce()
        except (OSError, sqlite3.Error) as exc:
            failure = storage_error(exc, self.config.state_dir)
            if failure is None:
                raise
            LOGGER.error(f"mcp:state {spec.name}: {failure.message}")
            raise failure from exc
        if self.check_output:
            problems = list(self._checkers(spec)[1].iter_errors(result))
            if problems:
                detail = "; ".join(f"{_pointer(p.absolute_path) or '/'}: {p.message}" for p in problems[:5])
                LOGGER.error(f"mcp:bug {spec.name} result violates its output schema: {detail}")
                raise MCPError(code=INTERNAL_ERROR, message=f"{spec.name}: result violates its output schema: {detail}")
        return result

    # --- SDK handlers -----------------------------------------------------------

    def _input_schema_of(self, name: str) -> Mapping[str, Any] | None:
        # Asked only by the SDK's HTTP transport (Mcp-Param headers): HTTP serves our own tools.
        spec = self.tools.registry.lookup(name)
        return spec.input_schema if spec is not None else None

    async def _on_list_tools(
        self, ctx: ServerRequestContext[ToolList], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        # An HTTP token is shown only what it may call: a tool it would be refused misleads its model.
        granted, tools = token_scopes(ctx), ctx.lifespan_context
        return types.ListToolsResult(tools=tools.listed() if granted is None else tools.listed_to(granted))

    async def _on_call_tool(
        self, ctx: ServerRequestContext[ToolList], params: types.CallToolRequestParams
    ) -> types.CallToolResult | dict[str, Any]:
        tools = ctx.lifespan_context
        spec = self._lookup(params.name, tools)
        args = dict(params.arguments or {})
        owner = token_name(ctx)

        async def produce() -> dict[str, Any]:
            with lending(params.meta, spec.name) as caller:  # its terminal, if any, closed when the call ends
                call = CallContext(self.runtime, ctx.session, owner, caller, arrived_ticket(ctx.request), tools.config,
                                   ctx.request_id)
                return await self.call_tool(spec, args, call, _violation_is_tool_error(ctx.protocol_version))

        answer = await self.tool_answer(spec, produce)
        if declared(ctx) and not answer.is_error:  # never a task to a client that did not declare it here
            task = self.tasks.adopt(spec.name, answer.structured_content, owner)
            if task is not None:
                return task
        return answer

    async def tool_answer(self, spec: ToolSpec, produce: Any) -> types.CallToolResult:
        """The CallToolResult of ``produce()`` (the tool's structured result): a CcwError is a
        tool error (``isError``); any other failure a JSON-RPC error (MCPError raised)."""
        try:
            result = await produce()
        except CcwError as exc:
            failure: dict[str, Any] = {"error": exc.to_dict()}
            return types.CallToolResult(
                content=[types.TextContent(text=_json_text(failure))], structured_content=failure, is_error=True
            )
        except MCPError:
            raise
        except Exception as exc:
            LOGGER.error(f"mcp:bug {spec.name} raised {exc!r}\n{traceback.format_exc()}")
            raise MCPError(code=INTERNAL_ERROR,
                           message=f"{spec.name} failed unexpectedly: {exc}; see the server log") from exc
        text = spec.text(result) if spec.text is not None else _json_text(result)
        return types.CallToolResult(content=[types.TextContent(text=text)], structured_content=result)

    # --- the Tasks extension (mcp_server/tasks.py) --------------------------------

    async def _task_result(self, tool: str, outcome: Any) -> dict[str, Any]:
        """A finished task's ``result``: what tools/call of ``tool`` would have answered on the wire."""
        # The tool that made the task, which tasks.find found among the asking connection's.
        spec = self.servable.lookup(tool)
        if spec is None:
            raise MCPError(code=INTERNAL_ERROR, message=f"a task of {tool!r}, which this process does not serve")
        answer = await self.tool_answer(spec, lambda: self.checked(spec, outcome))
        dumped = answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        return spec_methods.serialize_server_result("tools/call", TASKS_ERA, dumped)

    # A task made by a tool outside the connection's list is no task to it, as a server
    # serving only that list would have none: the ``served`` of each tasks.* call.

    async def _on_task_get(self, ctx: ServerRequestContext[ToolList], params: TaskParams) -> dict[str, Any]:
        _tasks_era(ctx)
        return await self.tasks.get(params.task_id, token_name(ctx), self._task_result, ctx.lifespan_context.names)

    async def _on_task_update(self, ctx: ServerRequestContext[ToolList], params: UpdateTaskParams) -> dict[str, Any]:
        _tasks_era(ctx)
        return self.tasks.update(params.task_id, token_name(ctx), ctx.lifespan_context.names)

    async def _on_task_cancel(self, ctx: ServerRequestContext[ToolList], params: TaskParams) -> dict[str, Any]:
        _tasks_era(ctx)
        return await self.tasks.cancel(params.task_id, token_name(ctx), ctx.lifespan_context.names)

    async def _on_list_resources(
        self, ctx: ServerRequestContext[ToolList], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        # Only templates without variables name one concrete resource; an HTTP token is shown
        # those it may read, as its tools/list shows the tools it may call.
        resources = [
            types.Resource(uri=r.uri_template, name=r.name, description=r.description, mime_type=r.mime_type)
            for r in ctx.lifespan_context.resources_to(token_scopes(ctx))
            if "{" not in r.uri_template
        ]
        return types.ListResourcesResult(resources=resources)

    async def _on_list_resource_templates(
        self, ctx: ServerRequestContext[ToolList], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        templates = [
            types.ResourceTemplate(
                uri_template=r.uri_template, name=r.name, description=r.description, mime_type=r.mime_type
            )
            for r in ctx.lifespan_context.resources_to(token_scopes(ctx))
        ]
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def _on_read_resource(
        self, ctx: ServerRequestContext[ToolList], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        tools = ctx.lifespan_context
        resource = _match_resource(tools.registry, uri)
        if resource is None:
            raise MCPError(code=RESOURCE_NOT_FOUND,
                           message=f"no resource matches {uri!r}; see resources/templates/list")
        try:
            call = CallContext(self.runtime, ctx.session, caller=lent(params.meta), config=tools.config)
            mime_type, text = await resource.handler(call, uri)
        except CcwError as exc:
            code = RESOURCE_NOT_FOUND if exc.code == "NOT_FOUND" else INVALID_PARAMS
            raise MCPError(code=code, message=exc.message, data={"error": exc.to_dict()}) from exc
        return types.ReadResourceResult(contents=[types.TextResourceContents(uri=uri, mime_type=mime_type, text=text)])

    async def _on_complete(
        self, ctx: ServerRequestContext[ToolList], params: types.CompleteRequestParams
    ) -> types.CompleteResult:
        tools = ctx.lifespan_context
        call = CallContext(self.runtime, ctx.session, token_name(ctx), lent(params.meta), config=tools.config)
        return await completion.complete(self, tools, call, params)

    async def _on_roots_changed(self, ctx: ServerRequestContext[Any], params: types.NotificationParams) -> None:
        self.runtime.forget_roots(getattr(ctx.session, "_connection", None))


def _tasks_era(ctx: ServerRequestContext[Any]) -> None:
    """The tasks/* methods exist where the extension can be declared: the 2026-07-28 era."""
    if ctx.protocol_version != TASKS_ERA:
        raise MCPError(code=types.METHOD_NOT_FOUND, message=(
            "Method not found: MCP tasks (io.modelcontextprotocol/tasks) are served to 2026-07-28 clients "
            "that declare them; here a long call answers status running, and capsule_run fetches it"))


def _violation_is_tool_error(protocol_version: str) -> bool:
    """Whether a session of ``protocol_version`` is answered bad tools/call arguments as a
    tool error: from 2025-11-25, whose SEP-1303 moved them out of the protocol errors."""
    return is_version_at_least(protocol_version, TOOL_ERROR_ARGUMENTS_SINCE)


def _json_text(value: Any) -> str:
    """The structured result as compact JSON with sorted keys, for the text block."""
    return framing.dumps(value, sort_keys=True).decode("utf-8")


def _error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def _pointer(path: Any) -> str:
    """RFC 6901 pointer for a jsonschema error path."""
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def _match_resource(registry: Registry, uri: str) -> ResourceSpec | None:
    """The resource of ``registry`` whose template matches ``uri``, if any."""
    for resource in registry.resources:
        if _template_regex(resource.uri_template).fullmatch(uri):
            return resource
    return None


@functools.cache
def _template_regex(template: str) -> re.Pattern[str]:
    """A regex for an RFC 6570 level-2 template: ``{var}`` one segment, ``{+var}`` anything."""
    pattern = ""
    pos = 0
    for match in re.finditer(r"\{(\+?)([A-Za-z0-9_]+)\}", template):
        pattern += re.escape(template[pos : match.start()])
        pattern += f"(?P<{match.group(2)}>.*)" if match.group(1) else f"(?P<{match.group(2)}>[^/]*)"
        pos = match.end()
    pattern += re.escape(template[pos:])
    return re.compile(pattern)

"""Service tools: long-lived processes in a capsule, their logs, and pausing a capsule.

Adapters over the front end's services (``ctx.capsules.services``, capsules/services.py)
and the helper's freezer.  ``capsule_service_start`` takes the capsule's turn and answers
once the service is ready, so the next call on the capsule (an exec running the tests)
runs against a ready service; the others take no turn: a log or a stop must not wait
behind a long test run (a stop still waits for a start of its service sent before it and
the calls between, a log read for those starts alone, a port's forward for the opens and
closes of that port sent before it: capsules/turns.py ``follow``).  Pause
and resume act at once on whatever the capsule runs (an exec's time limit keeps counting
while it is frozen).
"""

from __future__ import annotations

from typing import Any

from mcp_server.capsules.fragments import CAPSULE_ID, RUN_LIMITS
from mcp_server.capsules.service_spec import (
    LINE_MAX,
    READY_TIMEOUT_MAX_MS,
    RESTARTS,
    Ready,
    ServiceSpec,
)
from mcp_server.capsules.services import Services
from mcp_server.capsules.turns import TakesTurn
from mcp_server.tools.registry import ToolContext, ToolSpec, text_with_header
from sandbox import checks
from sandbox.checks import MAX_ARGV, MAX_PORT, SERVICE_NAME_RE
from sandbox.errors import CcwError
from sandbox.ops import FreezeRequest, ListRequest
from sandbox.spec import Limits, resolve_cwd

SERVICE_START = TakesTurn("service start", command_arg="cmd", subject_arg="name")
SERVICE_STOP = TakesTurn("service stop", subject_arg="name", follows=SERVICE_START.label)
SERVICE_LOGS = TakesTurn("service logs", subject_arg="name", follows=SERVICE_START.label)
PORT = TakesTurn("port", subject_arg="port", follows="port", follows_any=SERVICE_START.label)
_NAME = {"type": "string", "pattern": f"^{SERVICE_NAME_RE.pattern}$"}
_SERVICE = {"type": "object", "description": "name, state (starting|running|ready|paused|exited|failed|lost|"
            "stopped), since, argv, restart, restarts; exit_code, signal, reason, seq (its last run's row)"}
_ALWAYS_ENV = frozenset({"PATH", "HOME", "LANG"})


def _services(ctx: ToolContext) -> Services:
    services = ctx.capsules.services
    if services is None:
        raise CcwError("INTERNAL", "this server keeps no services")
    return services


def _spec(ctx: ToolContext, args: dict[str, Any]) -> ServiceSpec:
    argv = tuple(checks.argv("cmd", args["cmd"]))  # under the name the caller sent, before any lookup
    env = args.get("env")
    if env:  # the helper's own check would fail the started service, not this call
        checks.env("env", env)
    record = ctx.capsules.live_record(args["capsule_id"])
    unknown = sorted(set(env or ()) - set(record.spec.env_whitelist) - _ALWAYS_ENV)
    if unknown:
        raise CcwError("INVALID_ARGUMENT", f"env variables {unknown} are not in the capsule's env_whitelist "
                       f"{sorted(record.spec.env_whitelist)}; create the capsule with them whitelisted",
                       {"argument": "env", "names": unknown})
    cwd = resolve_cwd(args.get("cwd"), record.workspace)  # outside the workspace: refused before any wait
    return ServiceSpec(record.capsule_id, args["name"], argv, cwd, env,
                       Ready.from_json(args["ready"]) if args.get("ready") else None,
                       Limits(**args["limits"]) if args.get("limits") else None, args.get("restart", "no"))


async def capsule_service_start(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Start a service in the capsule, in its turn; answer when it is ready, or why it is not."""
    spec = _spec(ctx, args)
    capsules = ctx.capsules
    async with capsules.turn(spec.capsule_id, SERVICE_START):
        capsules.live_record(spec.capsule_id)  # a destroy queued before this call may have run
        return {"capsule_id": spec.capsule_id, **await _services(ctx).start(capsules, spec)}


async def capsule_service_list(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    record = ctx.capsules.live_record(args["capsule_id"])
    services = _services(ctx)
    await services.recover(ctx.capsules)
    frozen = await services.capsule_state(record.capsule_id)
    return {"capsule_id": record.capsule_id, "services": services.summaries(record.capsule_id, frozen),
            "ports": await services.ports.summaries(record.capsule_id)}


async def capsule_service_logs(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    await ctx.follow(through=False)  # a start of this service sent before it makes the log first
    record = ctx.capsules.live_record(args["capsule_id"])
    services = _services(ctx)
    await services.recover(ctx.capsules)
    state, part = services.logs(record.capsule_id, args["name"], args.get("since"), args.get("tail"))
    return {"capsule_id": record.capsule_id, "name": args["name"], "state": state, **part.to_json()}


async def capsule_service_stop(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    await ctx.follow()  # a start of this service sent before it, queued behind a run, comes first
    record = ctx.capsules.live_record(args["capsule_id"])
    services = _services(ctx)
    await services.recover(ctx.capsules)
    summary = await services.stop(record.capsule_id, args["name"], args.get("grace_ms", 5000))
    return {"capsule_id": record.capsule_id, **summary}


async def _freeze(ctx: ToolContext, args: dict[str, Any], frozen: bool) -> dict[str, Any]:
    record = ctx.capsules.live_record(args["capsule_id"])
    reply = await ctx.capsules.call(FreezeRequest(record.capsule_id, frozen))
    out = {"capsule_id": record.capsule_id, "paused": reply.frozen, "runs": list(reply.runs)}
    if reply.frozen and not frozen:  # a resume that could not thaw: say what holds it
        listed = (await ctx.capsules.call(ListRequest())).capsules
        held = next((list(one.held_by or ()) for one in listed if one.capsule_id == record.capsule_id), None)
        if held:
            out |= {"held_by": held, "note": f"it stays frozen while {', '.join(held)} stand(s) on its layer (forks, "
                                             "merges of it); it thaws when they are destroyed"}
    return out


async def capsule_pause(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Freeze every process of the capsule (cgroup freezer); it takes no new run until resumed."""
    return await _freeze(ctx, args, True)


async def capsule_resume(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    return await _freeze(ctx, args, False)


async def capsule_port(ctx: ToolContext, args: dict[str, Any]) -> dict[str, Any]:
    """Forward a port of the capsule to the host's loopback (or close the forward)."""
    # the same port's opens and closes sent before it, one at a time, and the service starts sent before it
    await ctx.follow(through=False)
    record = ctx.capsules.live_record(args["capsule_id"])
    ports = _services(ctx).ports
    if args.get("close"):
        return await ports.close(record.capsule_id, args["port"])
    return await ports.open(record.capsule_id, args["port"], args.get("host_port", 0))


def _input(required: list[str], **properties: Any) -> dict[str, Any]:
    return {"type": "object", "required": ["capsule_id", *required], "additionalProperties": False,
            "properties": {"capsule_id": CAPSULE_ID, **properties}}


_PORT = {"type": "integer", "minimum": 1, "maximum": MAX_PORT}
_OUT = {"type": "object", "required": ["capsule_id"], "properties": {"capsule_id": CAPSULE_ID}}
_READY = {
    "type": "object", "additionalProperties": False,
    "properties": {"port": _PORT, "path": {"type": "string"},
                   "line": {"type": "string", "maxLength": LINE_MAX},
                   "timeout_ms": {"type": "integer", "minimum": 1, "maximum": READY_TIMEOUT_MAX_MS}},
    "description": "One of: port (accepts on the capsule's loopback), path (made in the jail), line "
                   "(text a line of its output contains); timeout_ms default 30000.",
}
_PAUSED_OUT: dict[str, Any] = {"capsule_id": CAPSULE_ID, "paused": {"type": "boolean"},
                               "runs": {"type": "array", "items": {"type": "string"}}}
_PAUSED = {"type": "object", "required": ["capsule_id", "paused", "runs"], "additionalProperties": False,
           "properties": _PAUSED_OUT}
_RESUMED = {**_PAUSED, "properties": {**_PAUSED_OUT, "held_by": {"type": "array", "items": CAPSULE_ID},
                                      "note": {"type": "string"}}}

TOOLS = [
    ToolSpec(
        name="capsule_service_start",
        family="capsule",
        title="Start service",
        description=("Start a long-lived process (a dev server, a database) in the capsule, beside its execs, on "
                     "its loopback: answers when `ready` holds, or why not (status, last output lines)."),
        input_schema=_input(
            ["name", "cmd"], name=_NAME, cmd={"type": "array", "minItems": 1, "maxItems": MAX_ARGV,
                                              "items": {"type": "string"}},
            cwd={"type": "string"}, env={"type": "object", "additionalProperties": {"type": "string"}},
            ready=_READY, limits=RUN_LIMITS, restart={"enum": list(RESTARTS)}),
        output_schema={**_OUT, "required": ["capsule_id", "name", "state", "ready"], "properties": {
            "capsule_id": CAPSULE_ID, "name": {"type": "string"}, "state": {"type": "string"},
            "ready": {"type": "boolean"}, "why": {"type": "string"}, "log_tail": {"type": "string"}}},
        handler=capsule_service_start,
        turn=SERVICE_START,
        scope="exec",
    ),
    ToolSpec(
        name="capsule_service_list",
        family="capsule",
        title="List services",
        description=("The capsule's services and their states (an ended one stays listed until stopped), "
                     "and its forwarded ports."),
        input_schema=_input([]),
        output_schema={**_OUT, "required": ["capsule_id", "services", "ports"], "properties": {
            "capsule_id": CAPSULE_ID, "services": {"type": "array", "items": _SERVICE},
            "ports": {"type": "array", "items": {"type": "object"}}}},
        handler=capsule_service_list,
        read_only=True,
        idempotent=True,
    ),
    ToolSpec(
        name="capsule_service_logs",
        family="capsule",
        title="Service logs",
        description=("A service's output (stdout and stderr as they came): after `since` (a cursor from an "
                     "earlier answer), or its last `tail` lines. Bounded; `lost`: bytes no longer kept."),
        input_schema=_input(["name"], name=_NAME, since={"type": "integer", "minimum": 0},
                            tail={"type": "integer", "minimum": 0, "maximum": 100_000}),
        output_schema={**_OUT, "required": ["capsule_id", "name", "state", "text", "start", "cursor", "lost"],
                       "properties": {"capsule_id": CAPSULE_ID, "name": {"type": "string"},
                                      "state": {"type": "string"}, "text": {"type": "string"},
                                      **{k: {"type": "integer"} for k in ("start", "cursor", "lost")}}},
        handler=capsule_service_logs,
        text=text_with_header("text"),
        turn=SERVICE_LOGS,
        read_only=True,
    ),
    ToolSpec(
        name="capsule_service_stop",
        family="capsule",
        title="Stop service",
        description="SIGTERM, then SIGKILL after grace_ms (default 5000); the service leaves the list.",
        input_schema=_input(["name"], name=_NAME, grace_ms={"type": "integer", "minimum": 0, "maximum": 600_000}),
        output_schema={**_OUT, "required": ["capsule_id", "name", "state"]},
        handler=capsule_service_stop,
        turn=SERVICE_STOP,
        scope="exec",
    ),
    ToolSpec(
        name="capsule_port",
        family="capsule",
        title="Forward port",
        description=("Open the capsule's PORT on the host's loopback for a person (its `url`): HTTP, WebSocket and "
                     "TCP pass; only your uid's connections are let in. Lasts until closed or destroy."),
        input_schema=_input(["port"], port=_PORT, host_port={**_PORT, "description": "Default: any free port."},
                            close={"type": "boolean"}),
        output_schema={**_OUT, "required": ["capsule_id", "port", "host_port", "url", "open"], "properties": {
            "capsule_id": CAPSULE_ID, **{k: {"type": "integer"} for k in ("port", "host_port", "refused", "accepted")},
            "url": {"type": "string"}, "open": {"type": "boolean"}}},
        handler=capsule_port,
        turn=PORT,
        scope="exec",
    ),
    ToolSpec(
        name="capsule_pause",
        family="capsule",
        title="Pause capsule",
        description="Freeze every process of the capsule (its services keep their state); no new run until resumed.",
        input_schema=_input([]),
        output_schema=_PAUSED,
        handler=capsule_pause,
        scope="exec",
        idempotent=True,
    ),
    ToolSpec(
        name="capsule_resume",
        family="capsule",
        title="Resume capsule",
        description="Thaw a paused capsule's processes.",
        input_schema=_input([]),
        output_schema=_RESUMED,
        handler=capsule_resume,
        scope="exec",
        idempotent=True,
    ),
]

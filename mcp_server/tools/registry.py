"""The tool registry: what every tool declares, independent of any transport or SDK.

A tool family is a module in ``mcp_server/tools/`` that exposes ``TOOLS: list[ToolSpec]``
(and, if it serves resources, ``RESOURCES: list[ResourceSpec]``).  The server turns these
into MCP tools; direct methods (seed 001 style) call ``handler`` the same way.

A handler is ``async def handler(ctx: ToolContext, args: dict) -> dict``.  It receives
arguments already validated against ``input_schema`` and returns the structured result,
which must conform to ``output_schema`` (tests check every result).  A failure is raised
as ``CcwError``: the server turns it into ``isError: true`` with
``structuredContent: {"error": {code, message, details}}``.  Seed 001's tools instead
return their own ``{ok, reason, errors}`` shapes as ordinary results.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mcp_server.auth import SCOPES
from mcp_server.capsules.turns import TakesTurn, Ticket

if TYPE_CHECKING:  # types only: a handler module need not load the capsule service to be listed
    from mcp_server.capsules.run import OwnedRuns, Run
    from mcp_server.capsules.service import CapsuleService
    from mcp_server.config import Config
    from mcp_server.state import State
    from sandbox.client import HelperClient
    from sandbox.replies import ExecProgress


class ToolContext(Protocol):
    """What a handler may use; the server provides one per call."""

    @property
    def config(self) -> Config:
        """The server's configuration; its ``toolsets`` are the families this call's
        connection is served (an attached ccw-mcp's own, not the serving process's)."""

    @property
    def state(self) -> State:
        """The state dir: SQLite database and blob store paths."""

    async def helper(self) -> HelperClient:
        """The helper IPC client, connected (or started, in the embedded default) on first use."""

    @property
    def capsules(self) -> CapsuleService:
        """The capsule service (create, exec, fork, diff, list, destroy; journal; turns) for this call."""

    async def roots(self) -> list[str] | None:
        """Absolute root directories the client declared (MCP roots), or None if it declared none."""

    @property
    def workspace(self) -> str:
        """The workspace root when the client declares no roots (the CCW_WORKSPACE of the
        ``ccw-mcp`` the client started, even when attached to another front end)."""

    @property
    def caller_env(self) -> Mapping[str, str]:
        """The caller's environment (PATH and HOME for toolchain discovery, the values of a
        capsule's whitelisted variables): the one a client of our own uid lent with the call
        (mcp_server/caller.py), else this process's own."""

    @property
    def caller_lent(self) -> bool:
        """Whether ``caller_env`` is one a client lent (the ccw command, an attached ccw-mcp)."""

    @property
    def terminal(self) -> int | None:
        """The pty slave ``ccw capsule shell`` passed with this call, else None; the server
        closes it when the call ends."""

    @property
    def wants_output(self) -> bool:
        """Whether the caller asked for an exec's output as it comes (mcp_server/caller.py CALLER_OUTPUT)."""

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: ExecProgress | None = None) -> None:
        """Report progress if the caller sent a progress token; otherwise do nothing.  ``output``:
        a streaming exec's report, sent on to a caller that asked for its output."""

    def capsule_turn(self, capsule_id: str, label: str) -> AbstractAsyncContextManager[Ticket]:
        """Wait for the capsule's turn in arrival order and hold it for the block (execs, fork,
        destroy: one at a time per capsule); a queued call reports so through ``progress``."""

    async def follow(self, through: bool = True) -> None:
        """Wait for the calls this one follows (its spec's ``turn.follows``, on the same subject)
        that arrived before it, and (``through``) the calls between: a service's stop for its start."""

    @property
    def runs(self) -> OwnedRuns:
        """The process's background runs: calls that answer "running" and are fetched by id."""

    def for_run(self, run: Run) -> ToolContext:
        """This call's context for the body of its background ``run`` (progress goes to the run)."""

    def log(self, message: str) -> None:
        """Write a diagnostic line to the server's log (stderr, never stdout)."""


Handler = Callable[[ToolContext, dict[str, Any]], Awaitable[dict[str, Any]]]
# A finished call's events (mcp_server/events.py), [(kind, data)], from its result or from
# the error that refused it (each None when the call had none).
Outcome = Callable[[Mapping[str, Any] | None, BaseException | None], list[tuple[str, dict[str, Any]]]]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its names, schemas, annotations, HTTP scope and handler."""

    name: str  # snake_case, advertised in tools/list
    family: str  # CCW_TOOLSETS key (mcp_server.config.TOOLSETS)
    description: str
    input_schema: dict[str, Any]  # Draft 2020-12, additionalProperties: false
    output_schema: dict[str, Any]  # the structured result really conforms to it
    handler: Handler
    scope: str = "read"  # HTTP bearer scope needed: read | write | exec | promote | admin
    aliases: tuple[str, ...] = ()  # seed spellings, accepted on tools/call and as direct methods
    deprecated_aliases: tuple[str, ...] = ()  # accepted, but each use logs a warning to stderr
    read_only: bool = False
    destructive: bool = False
    idempotent: bool = False
    title: str = ""
    # The text block of a result, for clients (and models) that read only content blocks.
    # None: the structured result as JSON.  Tools whose result is mostly one document
    # (a file's lines) render it as text instead (see text_with_header).
    text: Callable[[dict[str, Any]], str] | None = None
    # Whether and how a call takes a capsule's turn (capsules/turns.py): the transport
    # takes its place in the capsule's line when it reads the request; None: no turn.
    turn: TakesTurn | None = None
    # A scope that depends on the call's arguments (capsule_network: an agent proposes with
    # exec, a person changes rules with admin); None: ``scope`` for every call.
    scope_of: Callable[[Mapping[str, Any]], str] | None = None
    other_scopes: tuple[str, ...] = ()  # what scope_of may answer besides ``scope`` (see ``scopes``)
    # The spec a profile (config.PROFILES) serves when it names this tool without its family:
    # fewer arguments, so a connection limited to the profile cannot make the others' calls
    # (capsule_network: the agent profile proposes rules, never changes them).  None: as is.
    narrowed: Callable[[ToolSpec], ToolSpec] | None = None
    # What a person watching the event stream learns when a call ends (events.record_outcome
    # appends it); None: nothing beyond what its work journals.  A call answered through a
    # run (capsules/run.py) is told when the run ends (Registry.run_outcome); one answered
    # at once, by its handler, which alone knows which of its failures are refusals.
    outcome: Outcome | None = None

    def scope_for(self, arguments: Any) -> str:
        """The scope a call with ``arguments`` needs (``scope`` unless ``scope_of`` says)."""
        if self.scope_of is None or not isinstance(arguments, Mapping):
            return self.scope
        return self.scope_of(arguments)

    @property
    def scopes(self) -> tuple[str, ...]:
        """Every scope some call of it needs: over HTTP, a token granting none of them is not
        shown the tool (server.py ``_on_list_tools``)."""
        return (self.scope, *self.other_scopes)

    def __post_init__(self) -> None:
        for scope in self.scopes:
            if scope not in SCOPES:
                raise ValueError(f"{self.name}: scope {scope!r} not in {SCOPES}")
        if self.input_schema.get("type") != "object":
            raise ValueError(f"{self.name}: input schema must be an object schema")
        if self.input_schema.get("additionalProperties", True) is not False:
            raise ValueError(f"{self.name}: input schema must set additionalProperties: false")

    @property
    def annotations(self) -> dict[str, Any]:
        """MCP tool annotations."""
        return {
            "title": self.title or self.name,
            "readOnlyHint": self.read_only,
            "destructiveHint": self.destructive,
            "idempotentHint": self.idempotent,
            "openWorldHint": False,
        }


ResourceHandler = Callable[[ToolContext, str], Awaitable[tuple[str, str]]]


@dataclass(frozen=True)
class ResourceSpec:
    """A resource template such as ``list://{+path}``; the handler returns (mime type, text)."""

    uri_template: str
    name: str
    description: str
    family: str
    handler: ResourceHandler
    scope: str = "read"
    mime_type: str = "application/json"


# Families, in the order tools/list shows them.  A module that does not exist yet is
# skipped, so families can land one at a time.  A module whose tools clients have always
# seen among another module's names the tool they follow as its ``LISTED_AFTER``
# (tools/exec.py: capsule_exec after capsule_create), so a move leaves tools/list as it was.
FAMILY_MODULES = (
    "mcp_server.tools.capsule",
    "mcp_server.tools.exec",
    "mcp_server.tools.run",
    "mcp_server.tools.network",
    "mcp_server.tools.services",
    "mcp_server.tools.promote",
    "mcp_server.tools.deltamin",
    "mcp_server.tools.race",
    "mcp_server.tools.merge",
    "mcp_server.tools.commutativity",
    "mcp_server.tools.policy",
    "mcp_server.tools.witness",
    "mcp_server.tools.replay",
    "mcp_server.tools.snapshot",
    "mcp_server.tools.workspace",
    "mcp_server.tools.hashline",
    "mcp_server.tools.rootspace",
    "mcp_server.tools.schema",
    "mcp_server.tools.server_info",
)


@dataclass
class Registry:
    """Every tool and resource, looked up by name or alias."""

    tools: list[ToolSpec] = field(default_factory=list)
    resources: list[ResourceSpec] = field(default_factory=list)
    _by_name: dict[str, ToolSpec] = field(default_factory=dict)

    def add(self, spec: ToolSpec, after: str | None = None) -> None:
        """Register a tool, listed last or right after the tool named ``after`` (registered
        already); a name or alias used twice is a programming error."""
        for key in (spec.name, *spec.aliases, *spec.deprecated_aliases):
            if key in self._by_name:
                raise ValueError(f"tool name {key!r} registered twice")
        place = len(self.tools)
        if after is not None:
            before = self._by_name.get(after)
            if before is None:
                raise ValueError(f"{spec.name}: listed after {after!r}, which is not registered before it")
            place = self.tools.index(before) + 1
        for key in (spec.name, *spec.aliases, *spec.deprecated_aliases):
            self._by_name[key] = spec
        self.tools.insert(place, spec)

    def lookup(self, name: str) -> ToolSpec | None:
        """The tool called ``name`` (its own name or an alias), or None."""
        return self._by_name.get(name)

    def run_outcome(self, run: Run) -> list[tuple[str, dict[str, Any]]]:
        """The events of an ended run (a Runtime's ``run_outcome``): its tool's ``ToolSpec.outcome``
        of the run's result or error; none for a tool this registry does not hold."""
        spec = self.lookup(run.tool)
        return spec.outcome(run.result, run.error) if spec is not None and spec.outcome is not None else []

    def is_deprecated_alias(self, name: str) -> bool:
        """True when ``name`` is a deprecated alias of some tool."""
        spec = self._by_name.get(name)
        return spec is not None and name in spec.deprecated_aliases

    @classmethod
    def load(cls, toolsets: Collection[str], modules: Sequence[str] = FAMILY_MODULES) -> Registry:
        """Collect the tools of the selected families and profiles (config.PROFILES) from their modules."""
        every = cls()
        for module_name in modules:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as exc:
                if exc.name == module_name:
                    continue
                raise
            after = getattr(module, "LISTED_AFTER", None)
            for spec in getattr(module, "TOOLS", []):
                every.add(spec, after)
                if after is not None:  # the module's next tool follows this one
                    after = spec.name
            every.resources.extend(getattr(module, "RESOURCES", []))
        return every.select(toolsets)

    def select(self, toolsets: Collection[str]) -> Registry:
        """The tools and resources of this registry that the families and profiles
        (config.PROFILES) named in ``toolsets`` choose, in this registry's order; a name
        that is neither chooses nothing."""
        from mcp_server.config import PROFILES

        chosen = Registry()
        wanted = set(toolsets)
        single = {name for profile in wanted & set(PROFILES) for name in PROFILES[profile]}
        for spec in self.tools:
            if spec.family in wanted:
                chosen.add(spec)
            elif spec.name in single:
                chosen.add(spec.narrowed(spec) if spec.narrowed is not None else spec)
        chosen.resources = [resource for resource in self.resources if resource.family in wanted]
        return chosen


def text_with_header(field: str) -> Callable[[dict[str, Any]], str]:
    """A text block: the result without ``field`` as one line of JSON, then ``field`` as is.

    A 10,000-line file as a JSON string costs a model (and the wire) an escaped quote or
    newline per line; as text it reads the way seed 002 prints tagged lines, and a
    program still finds every other field on the first line.
    """

    def render(result: dict[str, Any]) -> str:
        header = {key: value for key, value in result.items() if key != field}
        return (json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False) + "\n"
                + str(result.get(field, "")))

    return render

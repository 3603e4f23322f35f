"""The helper's closed set of operations: the op table, and one typed request per op.

``OPS`` is bubblewrap's PrivSepOp: the helper serves these operations and nothing else,
and each says why serving it is safe.  Every op that names a capsule is authorised
against the capsule's owner uid, which the helper takes from SO_PEERCRED, never from
the request.

Arguments are checked against the table (``validate_args``) at the boundary: the
helper checks every request when it decodes it (``<Op>Request.from_args``), whoever
sent it, in case something manages to send hacked requests.  A typed request goes out
unchecked (``HelperClient.call``), so each value is checked once, there; a request
written as a raw ``args`` object is checked before it is sent too
(``encode_request``).  Past that point code holds typed requests; what the privileged
side must re-check on the host (paths, ownership) it re-checks in one place of its own.

Each request class has ``to_args()`` / ``from_args()`` for the wire's ``args`` object,
and names the class of its op's reply (sandbox/replies.py).  A field left None in a
request is left out of its arguments, so the helper's default holds.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Generic, TypeVar

from sandbox import checks, spec
from sandbox.checks import MAX_OUTPUT_CAP, MAX_PORT, MAX_STDIN, MAX_TIMEOUT_MS, Check
from sandbox.errors import CcwError, ProtocolError
from sandbox.protocol import PROTOCOL_VERSION, check_id, encode_frame
from sandbox.replies import (
    ChangesReply,
    CreateReply,
    DestroyReply,
    ExecReply,
    ForkReply,
    FreezeReply,
    HelloReply,
    ListReply,
    NetConnectReply,
    NetForwardReply,
    NetOpenReply,
    OpenRootReply,
    OpReply,
    ReplyT,
    RunReadsReply,
    SignalReply,
)
from sandbox.spec import CapsuleSpec, Limits


@dataclass(frozen=True)
class OpSpec:
    """One operation of the closed set: its arguments and why serving it is safe."""

    name: str
    required: dict[str, Check]
    optional: dict[str, Check] = field(default_factory=dict)
    safety: str = ""


def _op(name: str, safety: str, required: dict[str, Check], optional: dict[str, Check] | None = None) -> OpSpec:
    return OpSpec(name, required, optional or {}, " ".join(safety.split()))


_CAPSULE: dict[str, Check] = {"capsule_id": checks.capsule_id}

# The signals a caller may send a service: the ones a service manager sends, none that stops
# a process in a way its init could not follow (SIGSTOP: freeze is for that).
SERVICE_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGKILL")
# net_connect's spares in one reply (one SCM_RIGHTS message: the kernel allows 253; client.ANCILLARY_SPACE follows)
MAX_SPARES = 128


OPS: dict[str, OpSpec] = {
    op.name: op
    for op in (
        _op(
            "hello",
            """Reads nothing but constants: the protocol version, the helper's mode and the
            mechanisms in force.  No state is touched.""",
            {"version": checks.int_in(0, 1 << 31)},
        ),
        _op(
            "create",
            """Mounts an overlay whose lower layer is a directory the caller can already
            write (checked against the peer's uid/gid), so the capsule grants no access the
            caller lacks; upper/work dirs live under the helper's state dir with names the
            helper chooses.  No directory that is, holds or lies in a system directory, a
            home itself or a key store (nor, for root, another user's home) is taken, under
            any path it is mounted at, so a root caller's capsule shows no host secret.
            Paths are absolute, bounded and NUL-free; network is a closed enum; limits are
            bounded integers that only restrict.""",
            spec.SPEC_REQUIRED,
            spec.SPEC_OPTIONAL,
        ),
        _op(
            "exec",
            """Runs argv in a fresh jail (mount, pid, net, uts, ipc, cgroup namespaces) as the
            caller's own uid/gid with no capabilities and no_new_privs, so the command can do
            nothing the caller could not do outside, and less.  Only the caller's own
            capsules.  Sizes of argv, env, stdin, output and time are bounded.  With
            ``stdio: "tty"`` the request carries one descriptor, which must be a pty slave
            the caller owns, open read-write (access.check_terminal): a character device
            gives the jail no path into any file system (a directory or O_PATH descriptor
            would be a way out of its mount namespace), only the terminal the caller
            already holds.  With ``stdio: "stdin"`` the one descriptor must be the read end
            of a pipe (access.check_stdin): the jail reads what the caller writes, and a
            pipe names no file.  A ``service`` runs beside the capsule's other runs, in the
            capsule's one network namespace, until it ends or its caller's connection
            closes; it is no more than an exec that the caller may keep open, signal
            (``signal``) and freeze (``freeze``).""",
            {"capsule_id": checks.capsule_id, "argv": checks.argv},
            {
                "cwd": checks.nullable(checks.abs_path),
                "env": checks.env,
                "stdin_b64": checks.nullable(checks.base64_text(MAX_STDIN)),
                "timeout_ms": checks.int_in(0, MAX_TIMEOUT_MS),
                "limits": checks.limits,
                "output_cap": checks.int_in(0, MAX_OUTPUT_CAP),
                "progress_ms": checks.int_in(100, 60_000),
                "stdio": checks.one_of("pipes", "tty", "stdin"),
                "stream": checks.boolean,
                "service": checks.service_name,
            },
        ),
        _op("changes", """Reads the upper dir of the caller's own capsule: names, types, modes, sizes,
            symlink targets (read with readlink, never followed).  No file content.""",
            _CAPSULE, {"leave_not_utf8": checks.boolean, "unlisted": checks.boolean, "mtimes": checks.boolean}),
        _op(
            "fork",
            """Creates a capsule stacked on one the caller owns; the child sees exactly what
            the parent sees and belongs to the same caller.  ``donors``, more of the caller's
            own capsules over the same base, add their own layers, frozen as the parent's.""",
            _CAPSULE, {"donors": checks.capsule_ids},
        ),
        _op(
            "open_root",
            """Passes an O_PATH directory descriptor of the merged view of the caller's own
            capsule.  O_PATH grants no read or write by itself; every open through it is
            checked by the kernel against the caller's own credentials, and the front end
            resolves beneath it (openat2 RESOLVE_BENEATH).""",
            _CAPSULE,
        ),
        _op(
            "net_open",
            """Passes three sockets of the caller's own "egress" capsule: two TCP listeners and
            a packet socket in a network namespace the helper made for that capsule alone,
            where nothing else exists (no host interface, no route out).  Accepting on them
            reaches only the capsule's own jail; the packet socket sees only the jail's
            traffic.  They grant the front end nothing it could not do in the host's own
            namespace, and the jail nothing but a path to them.  With ``runs``, a fourth: a
            sock_diag socket in the jail's namespace, and the cgroup v2 id of each of the
            capsule's services: which of the caller's own runs made each socket there.""",
            _CAPSULE, {"runs": checks.boolean},
        ),
        _op(
            "signal",
            """Sends one of a short list of signals to a running service of the caller's own
            capsule, through the service's init, which passes it to the command it spawned:
            nothing outside that service's pid namespace can be reached.""",
            {"capsule_id": checks.capsule_id, "service": checks.service_name,
             "signal": checks.one_of(*SERVICE_SIGNALS)},
        ),
        _op(
            "freeze",
            """Freezes (or thaws) every process the caller's own capsule runs, through the
            cgroup freezer of each of its runs' cgroups, which the helper made; while frozen
            the capsule takes no new run.  It stops processes the caller could stop itself.""",
            {"capsule_id": checks.capsule_id, "frozen": checks.boolean},
        ),
        _op(
            "net_connect",
            """Passes one TCP socket connected to 127.0.0.1:port inside the caller's own
            capsule's network namespace, which holds only the capsule's own jails: the caller
            reaches what its capsule serves, and nothing of the host it could not reach
            already.  ``spares``: that many unconnected sockets there instead (IPv6 with
            ``v6``), which reach only that.""",
            {"capsule_id": checks.capsule_id, "port": checks.int_in(1, MAX_PORT)},
            {"spares": checks.int_in(1, MAX_SPARES), "v6": checks.boolean},
        ),
        _op(
            "net_forward",
            """Leads the caller's own connections to a host loopback port it holds (proved by
            the listening socket the request carries) into the caller's own capsule, by NAT
            (kernel_ports.py): rules match the caller's uid alone, so no other user's traffic
            goes anywhere new; the capsule's link to the host takes nothing it did not ask for.
            ``close`` removes them; ``count`` reads how many connections they led.""",
            {"capsule_id": checks.capsule_id, "port": checks.int_in(1, MAX_PORT),
             "host_port": checks.int_in(1, MAX_PORT), "action": checks.one_of("open", "close", "count")},
        ),
        _op(
            "run_reads",
            """Names what a running service of the caller's own capsule has opened, listed,
            executed and written so far, as its reply will when it ends: paths in that
            capsule's own view, which the caller can open itself (``open_root``).  Its
            recording goes on; nothing is changed.""",
            {"capsule_id": checks.capsule_id, "service": checks.service_name},
        ),
        _op(
            "destroy",
            """Unmounts and deletes the caller's own capsule, whose files live only under the
            helper's state dir; the workspace (the lower layer) is never written.""",
            _CAPSULE,
        ),
        _op(
            "list",
            """Lists the caller's own capsules (ids, workspaces, parents, times); other
            callers' capsules are not shown.""",
            {},
        ),
    )
}


def validate_args(op: str, args: Any) -> dict[str, Any]:
    """Check ``args`` against ``op``'s schema: types, required/optional, bounds, no unknown keys."""
    op_spec = OPS.get(op) if isinstance(op, str) else None
    if op_spec is None:
        raise ProtocolError(f"unknown op {op!r:.80}; the helper serves {sorted(OPS)}", {"op": str(op)[:80]})
    if not isinstance(args, dict):
        raise ProtocolError(f"{op}: args must be an object")
    return checks.check_fields(args, op_spec.required, op_spec.optional, f"{op} args")


def encode_request(request_id: int, op: str, args: dict[str, Any]) -> bytes:
    """A request frame; the arguments are validated here as well as in the helper."""
    check_id(request_id, nullable=False)
    validate_args(op, args)
    return encode_frame({"id": request_id, "op": op, "args": args})


# --- typed requests -----------------------------------------------------------------------

RequestT = TypeVar("RequestT", bound="OpRequest[Any]")


class OpRequest(Generic[ReplyT]):
    """A request of one op; ``to_args`` is its wire ``args``, ``from_args`` reads and checks them.

    The type parameter is the op's reply class, which ``reply`` names (a class variable
    cannot be typed by it): a client's ``call`` returns that type.
    """

    op: ClassVar[str]
    reply: ClassVar[type[OpReply]]
    carried: ClassVar[str | None] = None  # the field of a descriptor that travels with the frame, not an argument

    def to_args(self) -> dict[str, Any]:
        """The wire arguments: fields left None (or an empty tuple) are left out."""
        given = ((one.name, getattr(self, one.name)) for one in fields(self) if one.name != self.carried)  # type: ignore[arg-type]
        return {name: list(v) if isinstance(v, tuple) else v for name, v in given if v not in (None, ())}

    @classmethod
    def from_args(cls: type[RequestT], args: Any) -> RequestT:
        """Check ``args`` against the op table, then build the typed request."""
        return cls._build(validate_args(cls.op, args))

    @classmethod
    def _build(cls: type[RequestT], args: dict[str, Any]) -> RequestT:
        return cls(**args)

    def descriptors_wanted(self) -> int:
        """How many descriptors travel with this request (SCM_RIGHTS); most carry none."""
        return 0

    def descriptors(self) -> list[int]:
        """The descriptors to send with this request (the sender keeps its own)."""
        fd = None if self.carried is None else getattr(self, self.carried)
        return [] if fd is None else [fd]

    def with_descriptors(self: RequestT, fds: list[int]) -> RequestT:
        """This request holding the ``descriptors_wanted()`` descriptors that came with it."""
        return replace(self, **{self.carried: fds[0]}) if fds and self.carried else self  # type: ignore[type-var]


@dataclass(frozen=True)
class CapsuleRequest(OpRequest[ReplyT]):
    """A request that names one capsule and nothing else."""

    capsule_id: str


@dataclass(frozen=True)
class HelloRequest(OpRequest[HelloReply]):
    """The handshake: the front end's protocol version."""

    op = "hello"
    reply = HelloReply
    version: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class CreateRequest(OpRequest[CreateReply]):
    """Make a capsule from a spec."""

    op = "create"
    reply = CreateReply
    spec: CapsuleSpec

    def to_args(self) -> dict[str, Any]:
        return self.spec.to_json()

    @classmethod
    def from_args(cls, args: Any) -> CreateRequest:
        # The spec's own check is the create op's (OPS["create"] is built from it).
        return cls(CapsuleSpec.from_json(args))


@dataclass(frozen=True)
class ExecRequest(OpRequest[ExecReply]):
    """Run a command in a capsule: the one form of an exec request in either process.

    The front end builds it from a tool's arguments (mcp_server/capsules/exec.py), the
    wire carries ``to_args()``, and the helper reads it back with ``from_args`` and runs
    it (sandbox/execution.py).  The timeout and output cap take their defaults here, so
    whoever builds a request holds the values the jail will use; the environment's
    defaults (PATH, HOME, LANG) and what a cwd may be depend on the capsule, and the
    helper applies them (``spec.exec_env``, ``spec.resolve_cwd``).
    """

    op = "exec"
    reply = ExecReply
    capsule_id: str
    argv: tuple[str, ...]
    cwd: str | None = None  # absolute, inside the workspace; None: the workspace
    env: Mapping[str, str] | None = None  # over spec.exec_env's defaults; each name in the capsule's whitelist
    stdin: bytes | None = None
    timeout_ms: int = spec.DEFAULT_TIMEOUT_MS
    limits: Limits | None = None
    output_cap: int = spec.DEFAULT_OUTPUT_CAP
    progress_ms: int | None = None  # None: no progress reports
    stdio: str | None = None  # "tty": stdin, stdout and stderr are ``tty_fd``; "stdin": stdin is
    # ``tty_fd`` (a pipe's read end, the caller writes the other); None/"pipes": captured
    tty_fd: int | None = None  # not an argument: the descriptor travels with the frame (SCM_RIGHTS)

    carried = "tty_fd"
    stream: bool = False  # each progress report carries every byte since the last (supervise.py)
    service: str | None = None  # a service's name: it runs beside the capsule's other runs

    def to_args(self) -> dict[str, Any]:
        out: dict[str, Any] = {"capsule_id": self.capsule_id, "argv": list(self.argv),
                               "timeout_ms": self.timeout_ms, "output_cap": self.output_cap}
        more = {"cwd": self.cwd, "env": None if self.env is None else dict(self.env),
                "stdin_b64": None if self.stdin is None else base64.b64encode(self.stdin).decode(),
                "limits": None if self.limits is None else self.limits.to_json(), "progress_ms": self.progress_ms,
                "stdio": self.stdio, "stream": True if self.stream else None, "service": self.service}
        out.update((name, value) for name, value in more.items() if value is not None)
        return out

    @classmethod
    def _build(cls, args: dict[str, Any]) -> ExecRequest:
        # Every other argument is the field of its name, whose default is the helper's.
        stdin_b64, plain = args.get("stdin_b64"), {k: v for k, v in args.items() if k not in ("stdin_b64", "limits")}
        request = cls(**{**plain, "argv": tuple(args["argv"])},
                      stdin=None if stdin_b64 is None else base64.b64decode(stdin_b64, validate=True),
                      limits=None if "limits" not in args else Limits(**args["limits"]))
        if request.timeout_ms == 0 and request.service is None:
            raise checks.fail("timeout_ms", "may be 0 (no limit) only for a service")
        return request

    def descriptors_wanted(self) -> int:
        return 1 if self.stdio in ("tty", "stdin") else 0


@dataclass(frozen=True)
class ChangesRequest(CapsuleRequest[ChangesReply]):
    """The capsule's changes against its base (``leave_not_utf8``: a change naming something not UTF-8
    left out and counted, not the list refused, ``ChangesReply.carried``; ``unlisted``: its paths too)."""

    op = "changes"
    reply = ChangesReply
    leave_not_utf8: bool | None = None
    unlisted: bool | None = None
    mtimes: bool | None = None  # files' mtimes too (``Change.mtime_ns``)


@dataclass(frozen=True)
class ForkRequest(CapsuleRequest[ForkReply]):
    """A child capsule seeing its parent's view, the ``donors``' own layers stacked above it (top first)."""

    op = "fork"
    reply = ForkReply
    donors: tuple[str, ...] = ()

    @classmethod
    def _build(cls, args: dict[str, Any]) -> ForkRequest:
        if args["capsule_id"] in args.get("donors", ()):
            raise checks.fail("donors", "must not name the capsule forked: its layers are the child's already")
        return cls(args["capsule_id"], tuple(args.get("donors", ())))


@dataclass(frozen=True)
class OpenRootRequest(CapsuleRequest[OpenRootReply]):
    """An O_PATH descriptor of the capsule's merged view (passed with the reply)."""

    op = "open_root"
    reply = OpenRootReply


@dataclass(frozen=True)
class NetOpenRequest(CapsuleRequest[NetOpenReply]):
    """The egress kit of an "egress" capsule: [http listener, socks listener, sniffer] passed with the reply
    (``runs``: and a sock_diag socket in the jail's namespace, sandbox/run_sockets.py)."""

    op = "net_open"
    reply = NetOpenReply
    runs: bool | None = None


@dataclass(frozen=True)
class SignalRequest(OpRequest[SignalReply]):
    """Send a signal to a running service."""

    op = "signal"
    reply = SignalReply
    capsule_id: str
    service: str
    signal: str


@dataclass(frozen=True)
class FreezeRequest(OpRequest[FreezeReply]):
    """Freeze or thaw every process of a capsule."""

    op = "freeze"
    reply = FreezeReply
    capsule_id: str
    frozen: bool


@dataclass(frozen=True)
class NetConnectRequest(OpRequest[NetConnectReply]):
    """A TCP socket connected to a port inside the capsule's network namespace, passed with the reply."""

    op = "net_connect"
    reply = NetConnectReply
    capsule_id: str
    port: int
    spares: int | None = None  # that many unconnected sockets instead (capsule_nets.Nets.passed)
    v6: bool | None = None  # of IPv6, not IPv4


@dataclass(frozen=True)
class NetForwardRequest(OpRequest[NetForwardReply]):
    """A forwarded port's kernel path: ``open`` carries the port's listening socket."""

    op = "net_forward"
    reply = NetForwardReply
    capsule_id: str
    port: int
    host_port: int
    action: str
    listener: int | None = None  # ``open``'s: travels with the frame
    carried = "listener"

    def descriptors_wanted(self) -> int:
        return 1 if self.action == "open" else 0


@dataclass(frozen=True)
class RunReadsRequest(OpRequest[RunReadsReply]):
    """What a running service has touched so far (its recording going on)."""

    op = "run_reads"
    reply = RunReadsReply
    capsule_id: str
    service: str


@dataclass(frozen=True)
class DestroyRequest(CapsuleRequest[DestroyReply]):
    """Unmount and delete the capsule."""

    op = "destroy"
    reply = DestroyReply


@dataclass(frozen=True)
class ListRequest(OpRequest[ListReply]):
    """The caller's own capsules."""

    op = "list"
    reply = ListReply


REQUESTS: dict[str, type[OpRequest[Any]]] = {
    cls.op: cls
    for cls in (HelloRequest, CreateRequest, ExecRequest, ChangesRequest, ForkRequest, OpenRootRequest,
                NetOpenRequest, SignalRequest, FreezeRequest, NetConnectRequest, NetForwardRequest, RunReadsRequest,
                DestroyRequest, ListRequest)
}
assert set(REQUESTS) == set(OPS), "typed requests and the op table differ"


def attach_descriptors(request: RequestT, fds: list[int]) -> RequestT:
    """``request`` holding the descriptors that came with its frame; all are closed and the
    request refused unless it asks for exactly that many (a descriptor nobody asked for is
    never kept, nor handed to a jail)."""
    wanted = request.descriptors_wanted()
    if len(fds) != wanted:
        for fd in fds:
            os.close(fd)
        raise CcwError("INVALID_ARGUMENT", f"{request.op} with these arguments carries {wanted} descriptor(s) "
                       f"(SCM_RIGHTS, with the frame's first byte), not {len(fds)}; send the pty slave "
                       "with an exec whose stdio is \"tty\", and nothing with any other request",
                       {"expected": wanted, "received": len(fds)})
    return request.with_descriptors(fds)


def parse_request(op: str, args: Any) -> OpRequest[Any]:
    """The typed request for ``op`` with ``args``, checked (an unknown op is refused too)."""
    cls = REQUESTS.get(op) if isinstance(op, str) else None
    if cls is None:
        validate_args(op, args)  # raises: the op is unknown
    assert cls is not None
    return cls.from_args(args)

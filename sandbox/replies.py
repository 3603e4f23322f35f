"""The helper's typed replies: one class per op's ``result`` object, and the entries in them.

Each class has ``to_args()`` (the wire ``result`` object, the same dict the helper
always sent) and ``from_args()`` (reads one, refusing a missing or unknown key).  The
requests that expect them, and the op table, are in sandbox/ops.py.  The helper builds
these values where it learns them (execution.py, overlay.py, manager.py, server.py);
the front end reads their attributes, and keeps ``to_args()`` where a journal or a
tool result stores the wire form.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, fields
from typing import Any, ClassVar, TypeVar

from sandbox import checks, rawnames
from sandbox.errors import ProtocolError
from sandbox.protocol import MAX_FRAME, check_keys

ReplyT = TypeVar("ReplyT", bound="OpReply")


class OpReply:
    """A reply's ``result`` object, or one entry in it; its keys are the fields' names, a
    bytes field named in ``base64_fields`` travels as base64 text under ``<name>_b64``, and
    a field named in ``optional_fields`` is left out when None."""

    base64_fields: ClassVar[tuple[str, ...]] = ()
    optional_fields: ClassVar[tuple[str, ...]] = ()

    def to_args(self) -> dict[str, Any]:
        """The wire ``result`` object."""
        out = {}
        for name, coded, optional in _wire_fields(type(self)):
            value = getattr(self, name)
            if coded:
                out[f"{name}_b64"] = base64.b64encode(value).decode()
            elif value is not None or not optional:
                out[name] = value if type(value) in _SCALARS else _plain(value)
        return out

    @classmethod
    def from_args(cls: type[ReplyT], result: Any) -> ReplyT:
        """Read a ``result`` object; a missing or unknown key is a ProtocolError."""
        if not isinstance(result, dict):
            raise ProtocolError(f"{cls.__name__} must be an object")
        required, allowed = _wire_keys(cls)
        if not required <= result.keys() <= allowed:  # two comparisons in C (1,000 entries a change list)
            check_keys(result, required, allowed, cls.__name__)  # which keys, in its words
        if not cls.base64_fields:  # no key to rename: ``_build`` reads the object, never changes it
            return cls._build(result)
        plain = dict(result)
        for name in cls.base64_fields:
            text = checks.base64_text(MAX_FRAME)(f"{name}_b64", plain.pop(f"{name}_b64"))  # no more than a frame
            plain[name] = base64.b64decode(text, validate=True)
        return cls._build(plain)

    @classmethod
    def _build(cls: type[ReplyT], result: dict[str, Any]) -> ReplyT:
        return cls(**result)


# A class's wire keys (required, allowed), worked out once: per entry, a third of a change list's parse.
_WIRE_KEYS: dict[type, tuple[set[str], set[str]]] = {}  # never changed once made


def _wire_keys(cls: type[OpReply]) -> tuple[set[str], set[str]]:
    """The keys a ``cls`` object must have, and those it may have."""
    known = _WIRE_KEYS.get(cls)
    if known is None:
        keys = {f"{one.name}_b64" if one.name in cls.base64_fields else one.name
                for one in fields(cls)}  # type: ignore[arg-type]
        known = _WIRE_KEYS[cls] = (keys - set(cls.optional_fields), keys)
    return known


# Each class's fields as ``to_args`` walks them (name, base64, optional), worked out once (half an encoding).
_WIRE_FIELDS: dict[type, tuple[tuple[str, bool, bool], ...]] = {}  # never changed once made
_SCALARS = frozenset({str, int, bool, float, type(None)})  # what ``_plain`` gives back as it is


def _wire_fields(cls: type[OpReply]) -> tuple[tuple[str, bool, bool], ...]:
    known = _WIRE_FIELDS.get(cls)
    if known is None:
        known = _WIRE_FIELDS[cls] = tuple((one.name, one.name in cls.base64_fields, one.name in cls.optional_fields)
                                          for one in fields(cls))  # type: ignore[arg-type]
    return known


def _plain(value: Any) -> Any:
    if isinstance(value, OpReply):
        return value.to_args()
    if isinstance(value, tuple | list):
        return [_plain(item) for item in value]
    return value


def _entries(cls: type[ReplyT], items: Any, what: str) -> tuple[ReplyT, ...]:
    """A list of wire objects read as a tuple of ``cls``."""
    if not isinstance(items, list):
        raise ProtocolError(f"{what} must be a list")
    return tuple(cls.from_args(item) for item in items)


def _paths(items: Any, what: str) -> tuple[str, ...] | None:
    """A wire list of paths (or null) as a tuple."""
    if items is None:
        return None
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise ProtocolError(f"{what} must be a list of paths or null")
    return tuple(items)


@dataclass(frozen=True)
class Change(OpReply):
    """One entry of a capsule's diff against its base (sandbox/overlay.py finds them)."""

    path: str  # repo-relative, POSIX
    kind: str  # added | modified | deleted | type_changed | mode_changed | opaque
    type: str  # file | dir | symlink | other (the new type; the old one for deleted)
    mode: int | None = None  # permission bits (S_IMODE) of the new entry
    size: int | None = None  # regular files only
    target: str | None = None  # symlinks only, as readlink says, never followed
    mtime_ns: int | None = None  # an added or modified file's, when asked (ChangesRequest ``mtimes``)

    optional_fields = ("mode", "size", "target", "mtime_ns")


@dataclass(frozen=True)
class Truncated(OpReply):
    """Whether each captured output stopped at the output cap (the byte counts go on)."""

    stdout: bool
    stderr: bool


@dataclass(frozen=True)
class Usage(OpReply):
    """What an exec used.  A None figure was not measured (never 0): the exec reply's
    ``usage_unavailable`` says why, and ``usage_sources`` names each figure's mechanism
    (sandbox/exec_cgroup.py, rusage.py)."""

    cpu_ms: int | None
    rss_max_kb: int | None  # the jail's peak total (a memory cgroup's peak charge)
    rss_max_process_kb: int | None  # the largest single process's peak (rusage), never a total
    io_read_kb: int | None
    io_write_kb: int | None


@dataclass(frozen=True)
class DiskUse(OpReply):
    """A capsule disk after an exec: its size, use, and whether it counts as full (execution.py)."""

    limit_mb: int
    used_kb: int
    free_kb: int
    full: bool


@dataclass(frozen=True)
class NotCarried(OpReply):
    """The touched names that are not UTF-8 (sandbox/rawnames.py): how many in all and how many
    of them written (in a change list, all), and the first ``rawnames.SHOWN`` in display form
    (``\\xNN`` per such byte)."""

    count: int
    written: int
    names: tuple[str, ...]

    @classmethod
    def _build(cls, result: dict[str, Any]) -> NotCarried:
        names = _paths(result["names"], "touched.not_utf8.names")
        counts = (result["count"], result["written"])
        if names is None or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in counts):
            raise ProtocolError("touched.not_utf8 must hold counts and a list of names")
        return cls(result["count"], result["written"], names)


@dataclass(frozen=True)
class Touched(OpReply):
    """The files an exec touched, relative to the workspace, each set sorted by path bytes.

    ``read`` is None when it could not be recorded (the exec reply's
    ``touched_unavailable`` says why); ``listed`` (directories opened) and ``executed``
    are None exactly when ``read`` is.  ``written`` is always known: the upper dir shows it.
    The sets hold only UTF-8 names; ``not_utf8`` (absent when there are none) counts and
    shows the others (``carried`` splits them off).
    """

    read: tuple[str, ...] | None
    written: tuple[str, ...]
    listed: tuple[str, ...] | None
    executed: tuple[str, ...] | None
    not_utf8: NotCarried | None = None

    optional_fields = ("not_utf8",)

    @classmethod
    def carried(cls, read: tuple[str, ...] | None, written: tuple[str, ...], listed: tuple[str, ...] | None,
                executed: tuple[str, ...] | None) -> Touched:
        """The sets as the wire carries them: each name that is not UTF-8 taken out of its set,
        and counted and shown in ``not_utf8`` instead."""
        sets = (read, written, listed, executed)
        if all(rawnames.all_carried(one) for one in sets if one):
            return cls(read, written, listed, executed)
        kept = [None if one is None else tuple(name for name in one if rawnames.carried(name)) for one in sets]
        count, shown = rawnames.listed({name for one in sets for name in one or ()})
        left_out = NotCarried(count, len(written) - len(kept[1] or ()), shown)
        return cls(kept[0], kept[1] or (), kept[2], kept[3], left_out)

    @classmethod
    def _build(cls, result: dict[str, Any]) -> Touched:
        written = _paths(result["written"], "touched.written")
        if written is None:
            raise ProtocolError("touched.written must be a list of paths")
        left_out = result.get("not_utf8")
        return cls(_paths(result["read"], "touched.read"), written, _paths(result["listed"], "touched.listed"),
                   _paths(result["executed"], "touched.executed"),
                   None if left_out is None else NotCarried.from_args(left_out))


@dataclass(frozen=True)
class HelloReply(OpReply):
    """The helper's protocol version, mode, the mechanisms in force, its ops and their digest
    (sandbox/opsurface.py)."""

    version: int
    mode: str
    mechanisms: dict[str, Any]
    ops: tuple[str, ...]
    surface: str

    @classmethod
    def _build(cls, result: dict[str, Any]) -> HelloReply:
        return cls(result["version"], result["mode"], result["mechanisms"], tuple(result["ops"]), result["surface"])


@dataclass(frozen=True)
class CreateReply(OpReply):
    """A capsule just made: where it is mounted, the clock it shows, its isolation."""

    capsule_id: str
    mount: str
    workspace: str
    created_at: str
    clock: str
    isolation: dict[str, Any]


@dataclass(frozen=True)
class ForkReply(CreateReply):
    """A fork just made; ``parent`` is the capsule it was forked from."""

    parent: str


@dataclass(frozen=True)
class ExecProgress(OpReply):
    """An interim report of a running exec: time so far, bytes so far, the latest output,
    and the files written since the last report, as fanotify saw them close (None: not
    traced; at most ``LIVE_WRITTEN`` paths a report).  For a request with ``stream``, the
    tails are every byte since the last report instead (at most ``supervise.STREAM_MAX``
    each; the byte counts tell what was dropped), and a last report, once the output ends,
    carries what came after the one before it: nothing printed is left to the reply alone.
    That one says ``last``: it comes after the command ended, so it is no sign of life
    (a service's path check counts only the reports of a run that still runs)."""

    elapsed_ms: int
    stdout_bytes: int
    stderr_bytes: int
    stdout_tail: bytes
    stderr_tail: bytes
    written: tuple[str, ...] | None = None
    last: bool | None = None

    base64_fields = ("stdout_tail", "stderr_tail")
    optional_fields = ("written", "last")

    @classmethod
    def _build(cls, result: dict[str, Any]) -> ExecProgress:
        return cls(**{**result, "written": _paths(result.get("written"), "written")})


@dataclass(frozen=True)
class ExecReply(OpReply):
    """How a command ended, its output, its resource use and the files it touched.

    ``disk`` is None for a capsule without a disk of its own; ``usage_unavailable`` and
    ``touched_unavailable`` say why a figure or set is None.
    """

    exit_code: int | None
    signal: str | None  # the signal's name (SIGKILL), when one ended the command
    timed_out: bool
    oom_killed: bool
    duration_ms: int
    stdout: bytes
    stderr: bytes
    stdout_bytes: int
    stderr_bytes: int
    truncated: Truncated
    usage: Usage
    usage_unavailable: dict[str, str]
    usage_sources: dict[str, str]
    disk: DiskUse | None
    touched: Touched
    touched_unavailable: dict[str, str]

    base64_fields = ("stdout", "stderr")

    @classmethod
    def _build(cls, result: dict[str, Any]) -> ExecReply:
        disk = None if result["disk"] is None else DiskUse.from_args(result["disk"])
        return cls(**{**result, "truncated": Truncated.from_args(result["truncated"]),
                      "usage": Usage.from_args(result["usage"]), "disk": disk,
                      "touched": Touched.from_args(result["touched"])})


@dataclass(frozen=True)
class GitdirChanges(OpReply):
    """A git dir outside the workspace that the capsule shows copy-on-write (sandbox/gitdirs.py),
    and its changes against the host's, paths relative to it."""

    path: str
    changes: tuple[Change, ...]

    @classmethod
    def _build(cls, result: dict[str, Any]) -> GitdirChanges:
        return cls(checks.text("path", result["path"], checks.MAX_PATH),
                   _entries(Change, result["changes"], "GitdirChanges 'changes'"))


@dataclass(frozen=True)
class ChangesReply(OpReply):
    """The capsule's changes, sorted by path; ``gitdirs``: those of its git dirs (None: it shows none);
    ``not_utf8``: the names left out as not UTF-8, when asked to leave them out (``carried``);
    ``unlisted``: when asked, what its uppers hold that no change names (upperscan.collect_changes)."""

    changes: tuple[Change, ...]
    gitdirs: tuple[GitdirChanges, ...] | None = None
    not_utf8: NotCarried | None = None
    unlisted: tuple[str, ...] | None = None

    optional_fields = ("gitdirs", "not_utf8", "unlisted")

    def __post_init__(self) -> None:
        # Promote, witness and merge would miss a change they cannot carry, and a promotion would
        # leave its file behind: refused whole (sandbox/rawnames.py).  A diff asks ``carried``.
        rawnames.refuse([*_names(self.changes, self.gitdirs), *(self.unlisted or ())], "changes")

    @classmethod
    def carried(cls, changes: tuple[Change, ...], gitdirs: tuple[GitdirChanges, ...] | None) -> ChangesReply:
        """The list as a diff shows it: each change naming something that is not UTF-8 (its path
        or its symlink's target) left out, and those names counted and shown in ``not_utf8``."""
        names = _names(changes, gitdirs)
        if rawnames.all_carried(names):
            return cls(changes, gitdirs)

        def kept(listed: tuple[Change, ...]) -> tuple[Change, ...]:
            return tuple(one for one in listed if rawnames.all_carried((one.path, one.target or "")))

        count, shown = rawnames.listed(names)
        return cls(kept(changes), None if gitdirs is None else tuple(
            GitdirChanges(gitdir.path, kept(gitdir.changes)) for gitdir in gitdirs), NotCarried(count, count, shown))

    @classmethod
    def _build(cls, result: dict[str, Any]) -> ChangesReply:
        gitdirs, left_out = result.get("gitdirs"), result.get("not_utf8")
        unlisted = result.get("unlisted")
        return cls(_entries(Change, result["changes"], "ChangesReply 'changes'"),
                   None if gitdirs is None else _entries(GitdirChanges, gitdirs, "ChangesReply 'gitdirs'"),
                   None if left_out is None else NotCarried.from_args(left_out),
                   _paths(unlisted, "ChangesReply 'unlisted'"))


def _names(changes: tuple[Change, ...], gitdirs: tuple[GitdirChanges, ...] | None) -> list[str]:
    """Every name a change list holds: its paths and symlink targets, its git dirs' too."""
    listed = [*changes, *(change for gitdir in gitdirs or () for change in gitdir.changes)]
    return [name for change in listed for name in (change.path, change.target or "")]


@dataclass(frozen=True)
class OpenRootReply(OpReply):
    """Sent with the descriptor (SCM_RIGHTS)."""

    capsule_id: str


@dataclass(frozen=True)
class NetOpenReply(OpReply):
    """Sent with an egress capsule's three descriptors (SCM_RIGHTS): [http listener, socks
    listener, sniffer], each non-blocking and close-on-exec (sandbox/egress.py)."""

    http_proxy: str  # "10.99.0.1:3128", as the jail reaches the HTTP listener
    socks_proxy: str  # "10.99.0.1:1080", as the jail reaches the SOCKS5 listener
    jail_addresses: tuple[str, ...]  # the jail's own addresses (v4, v6): the source of its attempts
    env: dict[str, str]  # the proxy variables each exec's jail gets unless the caller sets them
    mechanism: str  # one line for the isolation report
    # Asked with ``runs``: each running service's cgroup v2 id (None: it has none), which
    # the sock_diag socket sent fourth reports for each socket its processes made.
    services: dict[str, int | None] | None = None

    optional_fields = ("services",)

    @classmethod
    def _build(cls, result: dict[str, Any]) -> NetOpenReply:
        addresses, env = result["jail_addresses"], result["env"]
        if not isinstance(addresses, list) or not all(isinstance(one, str) for one in addresses):
            raise ProtocolError("NetOpenReply 'jail_addresses' must be a list of strings")
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ProtocolError("NetOpenReply 'env' must be an object of strings")
        for name in ("http_proxy", "socks_proxy", "mechanism"):
            if not isinstance(result[name], str):
                raise ProtocolError(f"NetOpenReply {name!r} must be a string")
        ids = result.get("services")
        if ids is not None and not (isinstance(ids, dict) and all(
                isinstance(k, str) and (v is None or (isinstance(v, int) and not isinstance(v, bool)))
                for k, v in ids.items())):
            raise ProtocolError("NetOpenReply 'services' must be an object of integers or nulls")
        return cls(result["http_proxy"], result["socks_proxy"], tuple(addresses), dict(env), result["mechanism"], ids)


@dataclass(frozen=True)
class SignalReply(OpReply):
    """The signal went to the service's init, which passes it on to the command."""

    service: str
    sent: bool  # False: the service had already ended


@dataclass(frozen=True)
class RunReadsReply(OpReply):
    """What a running service has touched so far, its recording going on: ``touched`` as an
    exec reply's (``written`` as fanotify saw it closed, not the upper dir's), or None with
    ``unavailable`` saying why (not traced, the queue overflowed, or too many paths for one frame)."""

    service: str
    touched: Touched | None
    unavailable: str | None = None

    optional_fields = ("unavailable",)

    @classmethod
    def _build(cls, result: dict[str, Any]) -> RunReadsReply:
        touched = result["touched"]
        return cls(result["service"], None if touched is None else Touched.from_args(touched),
                   result.get("unavailable"))


@dataclass(frozen=True)
class FreezeReply(OpReply):
    """Which runs of the capsule are now frozen (or thawed): "exec" or a service's name."""

    capsule_id: str
    frozen: bool
    runs: tuple[str, ...]

    @classmethod
    def _build(cls, result: dict[str, Any]) -> FreezeReply:
        return cls(result["capsule_id"], result["frozen"], _paths(result["runs"], "FreezeReply 'runs'") or ())


@dataclass(frozen=True)
class NetConnectReply(OpReply):
    """Sent with one connected, non-blocking, close-on-exec TCP socket (SCM_RIGHTS); asked
    with ``spares``, with that many unconnected ones instead."""

    port: int
    spares: int | None = None

    optional_fields = ("spares",)


@dataclass(frozen=True)
class NetForwardReply(OpReply):
    """A forwarded port's kernel path: whether its rules are in place, and the connections they led."""

    host_port: int
    open: bool
    connections: int


@dataclass(frozen=True)
class DestroyReply(OpReply):
    """The capsule is gone."""

    capsule_id: str
    destroyed: bool


@dataclass(frozen=True)
class CapsuleSummary(OpReply):
    """One capsule in a list: state is paused, busy, frozen, ready or unmounted; ``services`` its running
    services; ``held_by`` what keeps it frozen: its forks, and merged capsules stacked on its layer."""

    capsule_id: str
    workspace: str
    parent: str | None
    created_at: str
    state: str
    services: tuple[str, ...] | None = None
    held_by: tuple[str, ...] | None = None

    optional_fields = ("services", "held_by")

    @classmethod
    def _build(cls, result: dict[str, Any]) -> CapsuleSummary:
        return cls(**{**result, **{key: _paths(result.get(key), key) for key in cls.optional_fields}})


@dataclass(frozen=True)
class ListReply(OpReply):
    """The caller's own capsules, sorted by id (= creation)."""

    capsules: tuple[CapsuleSummary, ...]

    @classmethod
    def _build(cls, result: dict[str, Any]) -> ListReply:
        return cls(_entries(CapsuleSummary, result["capsules"], "ListReply 'capsules'"))

"""The capsule spec and the vocabulary both processes share: one grammar, one set of bounds.

A capsule is made from a ``CapsuleSpec``: the workspace it shows, the lower dir it shows
there (the workspace itself, or a materialised snapshot), the clock offset, which
environment variables a command may set, its limits and its network.  The front end
builds one from a tool call, sends it in a ``create`` request (``sandbox/ops.py``), the
helper stores it in the capsule's meta.json and the journal keeps it; each of them
reads and writes it through ``to_json`` / ``from_json`` here, never field by field.

The argument checks below are the protocol's: ``sandbox/ops.py`` builds its closed op
table from them, so a spec read from a request and one read from a file obey the same
bounds.  Each failure is a ``ProtocolError`` (INVALID_ARGUMENT) naming the field.

Capsule ids: the helper generates ``cap_<13-digit ms>_<8 hex>``; everyone validates
with the one wider grammar ``CAPSULE_ID_RE``, so an id is never refused for a detail
of how it was made.

Where a capsule may be made (``check_capsule_dir``) is a rule both processes apply: the
front end to answer early and clearly, the helper again on what the path really is.
Its argument is at the rule.
"""

from __future__ import annotations

import base64
import binascii
import functools
import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from sandbox.errors import CcwError, ProtocolError
from sandbox.homes import Home, login_homes  # noqa: F401  (the rule below takes them; callers import them from here)
from sandbox.protocol import check_keys, is_int

CAPSULE_ID_RE = re.compile(r"cap_[0-9A-Za-z_]{1,64}")
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")

# What a command gets unless its exec request says otherwise (the request's defaults,
# sandbox/ops.py: ExecRequest; the environment's, the helper's: exec_env below).
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
DEFAULT_HOME = "/home/ccw"  # where the jail shows the capsule's own $HOME
DEFAULT_LANG = "C.UTF-8"
DEFAULT_TIMEOUT_MS = 300_000
DEFAULT_OUTPUT_CAP = 1 << 20  # bytes per stream
DEFAULT_PROGRESS_MS = 1000  # the front end's journaled exec asks this; a request naming none gets no reports
# The namespaces every jail gets (a time namespace too, when a clock offset is asked for).
JAIL_NAMESPACES = ("mount", "pid", "net", "uts", "ipc", "cgroup")

# Bounds on arguments.  They are generous for real use and small enough that no single
# request can make the helper allocate without limit.
MAX_PATH = 4096  # PATH_MAX
MAX_ARGV = 4096  # entries
MAX_ARG_BYTES = 2 * 1024 * 1024  # all argv + env strings together, like ARG_MAX
MAX_ENV = 1024  # entries
MAX_STDIN = 4 * 1024 * 1024  # decoded bytes
MAX_OUTPUT_CAP = 2 * 1024 * 1024  # per stream; two base64 streams still fit one frame
MAX_TIMEOUT_MS = 24 * 3600 * 1000
MAX_CLOCK_OFFSET_SEC = 100 * 366 * 86400
MAX_BINDS = 64  # directories a capsule shows besides its workspace (exposed toolchains, git dirs)
# "none": an empty network namespace, lo only; "egress": the capsule's own namespaces whose
# only way out is the front end's proxies (sandbox/egress.py).  The allowlist is the front end's.
NETWORKS = ("none", "egress")
DISK_MB_MIN = 32  # a capsule disk smaller than this is mostly ext4's own metadata
DISK_MB_MAX = 1 << 24  # 16 TiB: ext4's limit with 4 KiB blocks


# --- argument checks (the protocol's; sandbox/ops.py builds its op table from them) -------

Check = Callable[[str, Any], Any]


def fail(name: str, why: str) -> ProtocolError:
    """The error for argument ``name``: INVALID_ARGUMENT, with the name in the details."""
    return ProtocolError(f"argument {name!r} {why}", {"argument": name})


def int_in(lo: int, hi: int) -> Check:
    """A check for an integer in [lo, hi]."""

    def check(name: str, value: Any) -> Any:
        if not is_int(value) or not lo <= value <= hi:
            raise fail(name, f"must be an integer in [{lo}, {hi}]")
        return value

    return check


def text(name: str, value: Any, limit: int) -> str:
    """A string without NUL of at most ``limit`` UTF-8 bytes."""
    if not isinstance(value, str):
        raise fail(name, "must be a string")
    if "\x00" in value:
        raise fail(name, "must not contain NUL")
    if len(value.encode("utf-8", "surrogatepass")) > limit:
        raise fail(name, f"is longer than {limit} bytes")
    return value


def abs_path(name: str, value: Any) -> Any:
    """An absolute path of at most MAX_PATH bytes, without NUL."""
    text(name, value, MAX_PATH)
    if not value.startswith("/"):
        raise fail(name, "must be an absolute path")
    return value


def nullable(check: Check) -> Check:
    """``check``, or None."""

    def nullable_check(name: str, value: Any) -> Any:
        return None if value is None else check(name, value)

    return nullable_check


def one_of(*choices: str) -> Check:
    """A check for one of a closed set of strings."""

    def check(name: str, value: Any) -> Any:
        if value not in choices:
            raise fail(name, f"must be one of {list(choices)}")
        return value

    return check


def capsule_id(name: str, value: Any) -> Any:
    """A capsule id (``CAPSULE_ID_RE``)."""
    if not isinstance(value, str) or not CAPSULE_ID_RE.fullmatch(value):
        raise fail(name, "must be a capsule id such as 'cap_0001700000000000_1a2b'")
    return value


def check_capsule_id(value: Any) -> str:
    """``value`` if it is a capsule id, else INVALID_ARGUMENT."""
    return str(capsule_id("capsule_id", value))


def abs_paths(name: str, value: Any) -> Any:
    """A list of at most MAX_BINDS absolute paths (directories the jail shows besides the workspace)."""
    if not isinstance(value, list) or len(value) > MAX_BINDS:
        raise fail(name, f"must be a list of at most {MAX_BINDS} absolute paths")
    for index, item in enumerate(value):
        abs_path(f"{name}[{index}]", item)
    return value


def env_names(name: str, value: Any) -> Any:
    """A list of at most MAX_ENV environment variable names."""
    if not isinstance(value, list) or len(value) > MAX_ENV:
        raise fail(name, f"must be a list of at most {MAX_ENV} variable names")
    for item in value:
        if not isinstance(item, str) or not ENV_NAME_RE.fullmatch(item):
            raise fail(name, f"holds {item!r:.80}, not an environment variable name")
    return value


def env(name: str, value: Any) -> Any:
    """An object of at most MAX_ENV variables, MAX_ARG_BYTES in all."""
    if not isinstance(value, dict) or len(value) > MAX_ENV:
        raise fail(name, f"must be an object of at most {MAX_ENV} variables")
    total = 0
    for key, item in value.items():
        if not ENV_NAME_RE.fullmatch(key):
            raise fail(name, f"holds {key!r:.80}, not an environment variable name")
        total += len(key) + len(text(f"{name}.{key}", item, MAX_ARG_BYTES)) + 2
    if total > MAX_ARG_BYTES:
        raise fail(name, f"is larger than {MAX_ARG_BYTES} bytes")
    return value


def argv(name: str, value: Any) -> Any:
    """A list of 1 to MAX_ARGV strings, MAX_ARG_BYTES in all, starting with a program name."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_ARGV:
        raise fail(name, f"must be a list of 1 to {MAX_ARGV} strings")
    total = sum(len(text(name, item, MAX_ARG_BYTES)) + 1 for item in value)
    if total > MAX_ARG_BYTES:
        raise fail(name, f"is larger than {MAX_ARG_BYTES} bytes")
    if value[0] == "":
        raise fail(name, "must start with a program name")
    return value


def base64_text(limit: int) -> Check:
    """A check for base64 text of at most ``limit`` decoded bytes."""

    def check(name: str, value: Any) -> Any:
        if not isinstance(value, str) or len(value) > (limit + 2) // 3 * 4:
            raise fail(name, f"must be base64 text of at most {limit} decoded bytes")
        try:
            base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError):
            raise fail(name, "is not valid base64") from None
        return value

    return check


_LIMIT_FIELDS: dict[str, Check] = {
    "memory_mb": int_in(1, 1 << 20),
    "pids_max": int_in(1, 1 << 22),
    "cpu_ms": int_in(1, MAX_TIMEOUT_MS),
    "disk_mb": int_in(DISK_MB_MIN, DISK_MB_MAX),
}


def limits(name: str, value: Any) -> Any:
    """A limits object: any of memory_mb, pids_max, cpu_ms, disk_mb, each bounded."""
    if not isinstance(value, dict):
        raise fail(name, "must be an object")
    check_keys(value, set(), set(_LIMIT_FIELDS), f"argument {name!r}")
    for key, item in value.items():
        _LIMIT_FIELDS[key](f"{name}.{key}", item)
    return value


# The fields of a create request, i.e. of a spec's JSON (sandbox/ops.py's "create").
SPEC_REQUIRED: dict[str, Check] = {"workspace": abs_path}
SPEC_OPTIONAL: dict[str, Check] = {
    "base": nullable(abs_path),
    "clock_offset_sec": int_in(-MAX_CLOCK_OFFSET_SEC, MAX_CLOCK_OFFSET_SEC),
    "env_whitelist": env_names,
    "limits": limits,
    "network": one_of(*NETWORKS),
    "expose": abs_paths,
    "gitdirs": abs_paths,
}


def check_fields(value: Any, required: dict[str, Check], optional: dict[str, Check], what: str) -> dict[str, Any]:
    """Check an object against its required and optional fields; unknown keys are refused."""
    if not isinstance(value, dict):
        raise ProtocolError(f"{what} must be an object")
    check_keys(value, set(required), set(required) | set(optional), what)
    for key, item in value.items():
        (required.get(key) or optional[key])(key, item)
    return value


# --- the spec ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """Resource limits; None leaves a limit unset (the helper's default, or none).

    ``disk_mb`` is the size of the capsule's own disk when creating it (ignored per
    exec: the disk is the capsule's, fixed when it was made).
    """

    memory_mb: int | None = None
    pids_max: int | None = None
    cpu_ms: int | None = None
    disk_mb: int | None = None

    def to_json(self) -> dict[str, int]:
        """The wire form: only the limits that are set."""
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, value: Any, name: str = "limits") -> Limits:
        """Read and check a limits object (ProtocolError naming the field)."""
        limits(name, value)
        return cls(**value)


@dataclass(frozen=True)
class CapsuleSpec:
    """What a capsule is made of; the same on the wire, in meta.json and in the journal.

    The size of the capsule's own disk is ``limits.disk_mb`` (None: the helper's
    default), one place for it rather than a field of its own.
    """

    workspace: str  # where the jail shows the capsule's view (absolute)
    base: str | None = None  # the lower dir when not the workspace itself (a snapshot)
    clock_offset_sec: int = 0
    env_whitelist: tuple[str, ...] = ()  # sorted, unique
    limits: Limits = Limits()
    network: str = "none"
    # Host directories the jail shows read-only (toolchains under $HOME and the like),
    # sorted; the helper checks each again (check_expose_dir) before binding it.
    expose: tuple[str, ...] = ()
    # Git dirs outside the workspace that its .git file names (a worktree's common dir,
    # a submodule's gitdir), sorted; each is shown through the capsule's own overlay.
    gitdirs: tuple[str, ...] = ()

    @property
    def lower(self) -> str:
        """The directory the capsule's view starts from: the base, else the workspace."""
        return self.base if self.base is not None else self.workspace

    def to_json(self) -> dict[str, Any]:
        """The JSON object (a create request's arguments); ``base`` only when there is one."""
        out: dict[str, Any] = {
            "workspace": self.workspace,
            "clock_offset_sec": self.clock_offset_sec,
            "env_whitelist": list(self.env_whitelist),
            "limits": self.limits.to_json(),
            "network": self.network,
        }
        if self.base is not None:
            out["base"] = self.base
        # Only when set, so a spec without them reads as it always did (meta.json, journal).
        if self.expose:
            out["expose"] = list(self.expose)
        if self.gitdirs:
            out["gitdirs"] = list(self.gitdirs)
        return out

    @classmethod
    def from_json(cls, value: Any) -> CapsuleSpec:
        """Read and check a spec's JSON; absent optional fields take their defaults."""
        check_fields(value, SPEC_REQUIRED, SPEC_OPTIONAL, "capsule spec")
        return cls(
            workspace=value["workspace"],
            base=value.get("base"),
            clock_offset_sec=value.get("clock_offset_sec", 0),
            env_whitelist=tuple(sorted(set(value.get("env_whitelist", ())))),
            limits=Limits.from_json(value.get("limits", {})),
            network=value.get("network", "none"),
            expose=tuple(sorted(set(value.get("expose", ())))),
            gitdirs=tuple(sorted(set(value.get("gitdirs", ())))),
        )


# --- an exec's environment and cwd ---------------------------------------------------------


def exec_env(workspace: str, given: dict[str, str]) -> dict[str, str]:
    """A command's whole environment: ``given`` over PATH, HOME and LANG defaults.

    PATH starts with the workspace's ``.venv/bin``, as ``uv run`` and ``poetry run`` put
    the project's environment first (``pytest`` in a capsule is the project's pytest),
    whether or not it exists, so a run's environment does not depend on the host.  The
    helper applies it to every exec (execution.py); a REAPI Command carries it whole.
    """
    return {"PATH": f"{posixpath.join(workspace, '.venv', 'bin')}:{DEFAULT_PATH}", "HOME": DEFAULT_HOME,
            "LANG": DEFAULT_LANG, **given}




def resolve_cwd(cwd: str | None, workspace: str) -> str:
    """A command's working directory: the workspace, or a path inside it.

    None or "" is the workspace; a relative path is taken from the workspace; an
    absolute one must lie inside it.  Anything that leaves the workspace is refused.
    """
    if not cwd:
        return workspace
    text("cwd", cwd, MAX_PATH)
    joined = os.path.normpath(os.path.join(workspace, cwd))
    if joined != workspace and not joined.startswith(workspace.rstrip("/") + "/"):
        raise ProtocolError(
            f"cwd {cwd!r} is outside the workspace {workspace}; give a path relative to it", {"cwd": cwd}
        )
    return joined


# --- where a capsule may be made ------------------------------------------------------
#
# A capsule over a system directory would show the host's secrets: the jail hides
# /etc/shadow by name in *its own* /etc, but a workspace that is /etc is bound over that,
# and the front end reads a capsule's files through open_root with its own rights (root,
# for the service), where no jail mask applies.  Masking secrets inside the capsule's
# view instead would mean knowing every secret's name in every directory a workspace
# might hold, in a tree the agent writes to, for the jail and for every front-end read
# alike.  No project is a system directory, so the rule refuses at the door instead,
# in both processes (the helper on the path as resolved and on every other path the
# same directory is mounted at), and the message says what to make a capsule of.
#
# Refused, for every caller: a directory that is, contains or lies inside one of
# SYSTEM_TREES (so / and /var too); one of SHARED_DIRS itself (each holds many owners'
# files: a project is a directory inside it); a login user's home itself or anything
# containing one (~ holds ~/.ssh; /home holds every home); and anything inside or
# holding one of HOME_SECRETS of a home (~/.ssh, ~/.config/gcloud), the caller's own
# included.  A project *inside* a home stays allowed, another user's too, for root as
# for anyone: a CI job runs as root on a checkout in its runner's home, and a capsule
# over ~alice/proj shows that project and nothing beside it (the jail binds only the
# workspace, so ../.ssh is not there; the front end reads with RESOLVE_BENEATH), while
# what a home keeps secret sits at its top (its key stores, refused above).  A non-root
# caller's jail runs as that caller, whom the kernel keeps out of what it may not read.
# So a project under /root for root, under ~ for anyone, under /srv, /opt, /tmp,
# /var/tmp, /var/lib or /work stays allowed.
#
# With a base, the workspace is only where the jail shows the view (and where promotion
# writes): nothing is read from the host there, so only the system part applies, and a
# replay still works where the recorded workspace lies in a home that is another user's
# on this host.  Login users are root and uids UID_MIN..UID_MAX of /etc/login.defs; a
# service account's "home" (/var/www, /nonexistent, /) is not a home here.

SYSTEM_TREES: dict[str, str] = {
    "/etc": "the host's configuration and secrets (password hashes, ssh host keys)",
    "/boot": "the kernels and their boot secrets",
    "/proc": "the kernel's view of every process",
    "/sys": "the kernel's devices and settings",
    "/dev": "the host's devices",
    "/run": "the host's runtime state (service sockets, other users' sessions)",
    "/usr": "the system's programs",
    "/bin": "the system's programs",
    "/sbin": "the system's programs",
    "/lib": "the system's libraries",
    "/lib32": "the system's libraries",
    "/lib64": "the system's libraries",
    "/libx32": "the system's libraries",
    "/var/backups": "backups of system files (shadow.bak)",
    "/var/log": "the system's logs",
    "/var/mail": "every user's mail",
    "/var/spool": "every user's queued jobs and crontabs",
}
SHARED_DIRS = ("/home", "/tmp", "/var/tmp", "/var/lib", "/var/cache", "/opt", "/srv", "/mnt", "/media")
HOME_SECRETS = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".password-store", ".pki",
                ".config/gcloud", ".config/gh", ".local/share/keyrings")
_INSTEAD = "make a capsule of a project directory instead (one inside your home, /srv or /tmp)"


def inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies below it (both absolute and normalised)."""
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def _refusal(path: str, caller_uid: int, homes: tuple[Home, ...], shown_only: bool) -> str | None:
    """Why ``path`` (absolute, normalised) may not be a capsule directory; None if it may."""
    for tree, what in SYSTEM_TREES.items():
        if inside(path, tree):
            return f"lies in {tree}, {what}"
        if inside(tree, path):
            return f"contains {tree}, {what}"
    if path in SHARED_DIRS:
        return "holds many owners' files; a capsule shows everything under its directory"
    if shown_only:
        return None
    for home in homes:
        whose = "your home" if home.uid == caller_uid else f"the home of {home.user}"
        if inside(home.path, path):
            return f"{'is' if home.path == path else 'contains'} {whose} ({home.path}), which holds keys and credentials"
        if not inside(path, home.path):
            continue  # a store lies in its home: a path neither in nor above the home is in or above none
        for secret in HOME_SECRETS:
            store = f"{home.path}/{secret}"
            if inside(path, store) or inside(store, path):
                where = "lies in" if inside(path, store) else "contains"
                return f"{where} {store}, where {home.user}'s keys and credentials are kept"
    return None


# Exposing a toolchain shows a directory read-only in the jail beside the workspace
# (issue 25): ~/.pyenv/versions/3.12.1, ~/.nvm/versions/node/v20.1.0.  The rule is the
# capsule directories' one (no system tree, no home itself or what holds one, nothing
# in or holding a key store) plus the stores that matter only when shown read-only:
# files of credentials at a home's top (held by the home, refused already, named here
# so the message says what they are), registries' tokens inside a tool's own dir (so
# ~/.cargo is refused while ~/.cargo/bin is not), and browser and mail profiles.
EXPOSE_SECRETS = (".netrc", ".git-credentials", ".pypirc", ".npmrc", ".yarnrc", ".vault-token",
                  ".cargo/credentials", ".cargo/credentials.toml", ".config/hub", ".config/op",
                  ".terraform.d", ".mozilla", ".thunderbird", ".config/google-chrome",
                  ".config/chromium", ".config/BraveSoftware", ".config/microsoft-edge",
                  ".local/share/password-store")


def check_expose_dir(name: str, path: str, caller_uid: int, homes: tuple[Home, ...]) -> None:
    """Refuse (PERMISSION_DENIED) a directory to expose that would show secrets.

    ``path`` is absolute and resolved.  Refused: whatever ``check_capsule_dir`` refuses,
    and a directory that is, contains or lies in one of EXPOSE_SECRETS of a home; asking
    for it explicitly changes nothing.
    """
    path = os.path.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    why = _expose_refusal(path, caller_uid, homes)
    if why is not None:
        raise CcwError("PERMISSION_DENIED", f"{name} {path!r} {why}; expose a toolchain's own "
                       "directory instead (~/.pyenv/versions/3.12.1, ~/.nvm/versions/node/v20.1.0)",
                       {"argument": name, "path": path})


@functools.lru_cache(maxsize=1024)
def _expose_refusal(path: str, caller_uid: int, homes: tuple[Home, ...]) -> str | None:
    """Why ``path`` (absolute, normalised) may not be exposed; None if it may.

    A function of its strings alone (no filesystem access), so kept: the helper asks
    again for every exposed directory at every exec, and the front end at every create.
    """
    why = _refusal(path, caller_uid, homes, shown_only=False)
    for home in homes:
        if why is not None or not (inside(path, home.path) or inside(home.path, path)):
            continue  # a store lies in its home: a path neither in nor above it is in or above none
        for secret in EXPOSE_SECRETS:
            store = f"{home.path}/{secret}"
            if why is None and (inside(path, store) or inside(store, path)):
                where = "lies in" if inside(path, store) else "contains"
                why = f"{where} {store}, where {home.user}'s credentials or profiles are kept"
    return why


def check_capsule_dir(name: str, path: str, caller_uid: int, homes: tuple[Home, ...], *,
                      shown_only: bool = False, given: str | None = None) -> None:
    """Refuse (PERMISSION_DENIED) a capsule directory that would show the host's secrets.

    ``path`` is absolute and resolved (symlinks followed); ``given`` is what the caller
    named, when it differs (another path of the same directory).  ``caller_uid`` is the
    caller's uid on the host, ``homes`` come from ``login_homes``; ``shown_only``: a
    workspace that is only where a base is shown.  The rule and its reasons are above.
    """
    path = os.path.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    why = _refusal(path, caller_uid, homes, shown_only)
    if why is not None:
        seen = f"{given!r} (the directory {path})" if given and given != path else repr(path)
        raise CcwError("PERMISSION_DENIED", f"{name} {seen} {why}; {_INSTEAD}",
                       {"argument": name, "path": path})

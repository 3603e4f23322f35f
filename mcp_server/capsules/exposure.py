"""Find the toolchains a workspace runs with outside it (issue 25): the reads for core/expose.

At capsule_create the front end knows the workspace and the caller's PATH; this module
reads what they point at, bounded (pyvenv.cfg up to 64 KiB, the first 256 bytes of at
most MAX_SCRIPTS scripts per bin directory), resolves symlinks, and hands the paths to
``core.expose`` for their toolchain roots.  The workspace is the agent's: a planted
pyvenv.cfg or ``#!`` line may name anything, so every directory found is held to
``sandbox.hostdirs.check_expose_dir`` and dropped when refused (an explicit ``expose``
entry that is refused is an error instead: the caller asked for it).  The helper checks
each path again before it binds it (sandbox/exposed.py), at create and at every exec.

- ``plan``: what capsule_create puts in ``CapsuleSpec.expose``; the caller's PATH and HOME
  are the front end's own environment (stdio and the CLI run as the caller), and a $HOME
  that /etc/passwd does not name is guarded like a login home (``with_home``).
- ``hints``: an exec that exits 126/127 on a program the jail hides names what to expose (or
  how to reach one it shows off its PATH), judged by the caller's PATH, not the jail's.
- ``replayable``: a witness is untrusted; a replay shows only the directories its
  ``capsule.expose`` names that this replayer's checks allow and that exist here.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Mapping

from mcp_server.core.expose import (
    MAX_SHEBANG,
    Need,
    cover,
    expose_hint,
    layout_root,
    link_hint,
    missing_paths,
    off_path_hint,
    shebang_interpreter,
    toolchain_root,
    venv_home,
)
from sandbox.errors import CcwError
from sandbox.homes import Home, login_homes
from sandbox.hostdirs import check_expose_dir, inside

VENV_DIRS = (".venv", "venv")
SCRIPT_DIRS = (".venv/bin", "venv/bin", "node_modules/.bin")
MAX_SCRIPTS = 64
MAX_CFG = 64 * 1024


def _read_head(path: str, limit: int) -> bytes:
    """The first ``limit`` bytes of a regular file (never a FIFO or device), else b""."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        if not os.path.isfile(f"/proc/self/fd/{fd}"):
            return b""
        return os.read(fd, limit)
    except OSError:
        return b""
    finally:
        os.close(fd)


def _resolved(path: str) -> str:
    """``os.path.realpath``, by the kernel when the path exists: one open and one readlink
    instead of an lstat per component (discovery resolves a dozen paths per create)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        resolved = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        resolved = ""
    finally:
        os.close(fd)
    return resolved if resolved.startswith("/") and not resolved.endswith(" (deleted)") else os.path.realpath(path)


def _venv_needs(workspace: str, home: str | None) -> list[Need]:
    """The interpreter prefix of each venv in the workspace (pyvenv.cfg home, bin/python)."""
    found = []
    for venv in VENV_DIRS:
        cfg = _read_head(os.path.join(workspace, venv, "pyvenv.cfg"), MAX_CFG)
        bin_dir = venv_home(cfg.decode("utf-8", "replace"))
        if bin_dir is not None:
            found.append((bin_dir, f"pyvenv.cfg home of {venv}"))
        python = os.path.join(workspace, venv, "bin", "python")
        if os.path.lexists(python):
            found.append((python, f"interpreter of {venv}/bin/python"))
    return _roots(found, home)


def _roots(paths: list[tuple[str, str]], home: str | None) -> list[Need]:
    """The toolchain root of each (path, reason), symlinks resolved; system trees left out.

    A path through a link to a toolchain root (uv's ``cpython-3.12-linux-x86_64-gnu`` ->
    ``cpython-3.12.8-linux-x86_64-gnu``, which its venvs name so that patch upgrades carry
    over) also needs the link's path: the jail shows the toolchain there too.
    """
    needs = []
    roots: dict[str, tuple[str | None, str | None]] = {}  # a venv's scripts name one interpreter many times
    for path, reason in paths:
        if path not in roots:
            root = toolchain_root(_resolved(path), home)
            named = None if root is None else toolchain_root(os.path.normpath(path), home)
            linked = named is not None and named != root and _resolved(named) == root
            roots[path] = (root, named if linked else None)
        root, named = roots[path]
        if root is None:
            continue
        needs.append(Need(root, reason))
        if named is not None:
            needs.append(Need(named, f"{reason} (a link to {root})"))
    return needs


@functools.lru_cache(maxsize=64)
def _shebangs(bin_dir: str, stamp: tuple[int, int, int]) -> tuple[tuple[str, str], ...]:
    """(script name, interpreter) for the first MAX_SCRIPTS scripts of ``bin_dir``.

    Kept while the directory's inode and mtime stay (``stamp``): installing, removing or
    replacing a script (pip and npm write a new file and rename it) changes the mtime,
    so an agent creating many capsules over one workspace reads its scripts once.
    """
    try:
        names = sorted(os.listdir(bin_dir))[:MAX_SCRIPTS]
    except OSError:
        return ()
    found = []
    for name in names:
        interpreter = shebang_interpreter(_read_head(os.path.join(bin_dir, name), MAX_SHEBANG))
        if interpreter is not None:
            found.append((name, interpreter))
    return tuple(found)


def _script_needs(workspace: str, home: str | None) -> list[Need]:
    """The interpreters ``#!`` lines name in the workspace's bin directories (bounded)."""
    found = []
    for scripts in SCRIPT_DIRS:
        bin_dir = os.path.join(workspace, scripts)
        try:
            st = os.stat(bin_dir)
        except OSError:
            continue
        for name, interpreter in _shebangs(bin_dir, (st.st_dev, st.st_ino, st.st_mtime_ns)):
            found.append((interpreter, f"shebang of {scripts}/{name}"))
    return _roots(found, home)


def _pyenv_root(entry: str) -> str | None:
    """The pyenv root a PATH entry lies in (``bin``, ``shims``, a plugin's ``shims``): the nearest
    directory above it holding ``libexec/pyenv`` and ``versions``; None if there is none."""
    here = os.path.dirname(entry)
    while here not in ("/", ""):
        if os.path.isfile(os.path.join(here, "libexec", "pyenv")) and os.path.isdir(os.path.join(here, "versions")):
            return here
        here = os.path.dirname(here)
    return None


def _pyenv_versions(root: str, workspace: str, env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(version dir, why) for the versions pyenv selects, as it would: PYENV_VERSION, else the
    workspace's ``.python-version``, else the root's global ``version`` file; a prefix
    ("3.12") is its latest installed version, "system" none."""
    def read(path: str) -> str:
        return _read_head(path, MAX_CFG).decode("utf-8", "replace")

    sources = (("PYENV_VERSION", env.get("PYENV_VERSION") or ""),
               (".python-version", read(os.path.join(workspace, ".python-version"))),
               (f"{root}/version", read(os.path.join(root, "version"))))
    said = [(where, text.replace(":", " ").split()) for where, text in sources]
    where, names = next(((where, names) for where, names in said if names), ("", []))
    try:
        installed = os.listdir(os.path.join(root, "versions"))
    except OSError:
        return []
    found = []
    for name in names:
        matches = [name] if name in installed else sorted(
            (v for v in installed if v.startswith(f"{name}.")), key=_version_key)[-1:]
        found += [(os.path.join(root, "versions", v, "bin", "python"), f"pyenv version {v} ({where})")
                  for v in matches]
    return found


def _version_key(version: str) -> list[tuple[int, str]]:
    """A version name's sort key: numbers as numbers ("3.12.10" after "3.12.9")."""
    return [(int(part), "") if part.isdigit() else (-1, part) for part in version.split(".")]


def _path_needs(path_env: str, home: str | None, workspace: str, env: Mapping[str, str]) -> list[Need]:
    """The caller's PATH entries outside the system trees, as their toolchain roots, but ccw's own.

    An entry in a pyenv root (its ``bin`` or ``shims``) needs what its shims run, not the whole
    root (its every version, plugins, caches): ``bin``, ``shims`` and ``libexec``, and the
    versions it selects (``_pyenv_versions``).  The directory this front end runs from
    (``sys.prefix``: ccw's own venv, whose ``bin`` the caller's PATH holds to run ccw) is ccw's,
    not the project's toolchain: it is shown only when asked for.
    """
    own = _resolved(sys.prefix)
    entries = [entry for entry in path_env.split(":") if entry.startswith("/") and os.path.isdir(entry)
               and not inside(_resolved(entry), own)]
    needs, plain = [], []
    for entry in entries:
        root = _pyenv_root(entry)
        if root is None:
            plain.append((entry, f"PATH entry {entry}"))
            continue
        needs += [Need(path, f"pyenv's {os.path.basename(path)} (PATH entry {entry})")
                  for path in (os.path.join(root, part) for part in ("bin", "shims", "libexec"))
                  if os.path.isdir(path)]
        needs.append(Need(entry, f"PATH entry {entry}"))
        needs += _roots(_pyenv_versions(root, workspace, env), home)
    return needs + _roots(plain, home)


def discover(workspace: str, path_env: str, home: str | None, caller_uid: int,
             homes: tuple[Home, ...], env: Mapping[str, str] | None = None) -> list[Need]:
    """The directories outside ``workspace`` its toolchains need, each with its reason (``env``:
    the caller's environment, for PYENV_VERSION).

    Sorted, none inside another, none a secret (refused ones are left out).
    """
    workspace = _resolved(workspace)
    home = _resolved(home) if home else None
    found = (_venv_needs(workspace, home) + _script_needs(workspace, home)
             + _path_needs(path_env, home, workspace, env or {}))
    verdicts: dict[str, bool] = {}  # each directory checked once, however many reasons name it
    kept = []
    for need in found:
        if need.path not in verdicts:
            try:
                check_expose_dir("expose", need.path, caller_uid, homes)
                check_expose_dir("expose", _resolved(need.path), caller_uid, homes)
                verdicts[need.path] = os.path.isdir(need.path)
            except CcwError:
                verdicts[need.path] = False
        if verdicts[need.path]:
            kept.append(need)
    return cover(kept, workspace)


def asked(paths: list[str], caller_uid: int, homes: tuple[Home, ...]) -> list[Need]:
    """The caller's explicit ``expose`` entries, resolved and checked (refusals raise)."""
    needs = []
    for path in paths:
        if not path.startswith("/"):
            raise CcwError("INVALID_ARGUMENT", f"expose {path!r} is not absolute; name the directory "
                           "from / (~/.pyenv/versions/3.12.1 as /home/you/.pyenv/versions/3.12.1)",
                           {"argument": "expose", "path": path})
        real = os.path.realpath(path)
        check_expose_dir("expose", real, caller_uid, homes)
        if not os.path.isdir(real):
            raise CcwError("NOT_FOUND", f"expose {path!r} is not a directory; name one that exists",
                           {"argument": "expose", "path": path})
        needs.append(Need(real, "asked"))
    return needs


def with_home(homes: tuple[Home, ...], home: str | None, caller_uid: int) -> tuple[Home, ...]:
    """``homes`` and the caller's $HOME, when it is not a login home (HOME=/data/me): its key
    stores are the caller's as much as those of the home /etc/passwd names."""
    real = _resolved(home) if home and home.startswith("/") else "/"
    if real == "/" or any(known.path == real for known in homes):
        return homes
    return (*homes, Home("$HOME", caller_uid, real))


def plan(workspace: str, expose: list[str], auto: bool, env: Mapping[str, str],
         caller_uid: int, homes: tuple[Home, ...]) -> list[Need]:
    """What a new capsule shows: the caller's ``expose`` (checked; refusals raise) and, when
    ``auto``, what ``discover`` finds from the caller's environment ``env`` (PATH, HOME)."""
    homes = with_home(homes, env.get("HOME"), caller_uid)
    needs = asked(expose, caller_uid, homes)
    if auto:
        needs += discover(workspace, env.get("PATH", ""), env.get("HOME"), caller_uid, homes, env)
    return cover(needs, _resolved(workspace))


def _search_path(jail_path: str, caller_path: str, cwd: str, workspace: str) -> str:
    """Where a hint looks for a program named bare: the jail's PATH (what the command ran with),
    the ``node_modules/.bin`` directories npm and npx put first (from ``cwd`` up to the
    workspace), then the caller's PATH, where what the jail hides is found."""
    scripts, here = [], cwd
    while inside(here, workspace):
        scripts.append(os.path.join(here, "node_modules", ".bin"))
        if here == workspace:
            break
        here = os.path.dirname(here)
    return ":".join([jail_path, *scripts, caller_path])


def _link_out(located: str, workspace: str) -> tuple[str, str] | None:
    """The workspace directory link ``located`` (normalised, in the workspace) leads out of the
    workspace through, and its resolved target; None if there is none (a program that is
    itself a link to a toolchain is the toolchain's case, not this)."""
    here = workspace
    for part in os.path.relpath(located, workspace).split("/")[:-1]:
        here = os.path.join(here, part)
        if os.path.islink(here):
            target = _resolved(here)
            if not inside(target, workspace):
                return here, target
    return None


def _exposable(path: str, caller_uid: int, homes: tuple[Home, ...]) -> bool:
    try:
        check_expose_dir("expose", path, caller_uid, homes)
    except CcwError:
        return False
    return True


def exec_hints(exit_code: int | None, stderr: str, workspace: str, cwd: str, jail_path: str, caller_path: str,
               home: str | None, caller_uid: int, homes: tuple[Home, ...], shown: tuple[str, ...] = ()) -> list[str]:
    """Notes for an exec that could not run a program the jail hides (exit 126/127).

    A program named bare is looked for as the jail would, then on the caller's PATH
    (``_search_path``): the jail's PATH finds only what it shows.  Each note names what
    stderr says is missing and where it is on the host: through a workspace link whose
    target the jail does not show (``link_hint``), in a toolchain ``shown`` (the capsule's
    expose) whose directory is not on the jail's PATH (``off_path_hint``), or in a toolchain
    to expose (``expose_hint``).  None for what is missing on the host too, lies in the
    workspace or the system trees, or would be refused as a secret.
    """
    workspace = os.path.realpath(workspace)
    home = os.path.realpath(home) if home else None
    shown_real = [os.path.realpath(path) for path in shown]
    search = _search_path(jail_path, caller_path, cwd, workspace)
    hints = []
    for missing in missing_paths(exit_code, stderr):
        located = os.path.join(cwd, missing) if "/" in missing else shutil.which(missing, path=search)
        if located is None:
            continue
        located = os.path.normpath(located)
        target = os.path.realpath(located)
        if not os.path.exists(target) or inside(target, workspace):
            continue
        link = _link_out(located, workspace) if inside(located, workspace) else None
        if link is not None:
            if toolchain_root(link[1], home) is not None and _exposable(link[1], caller_uid, homes):
                hints.append(link_hint(missing, os.path.relpath(link[0], workspace), link[1]))
            continue
        root = toolchain_root(target, home)
        if root is None or not _exposable(root, caller_uid, homes):
            continue
        off_path = "/" not in missing and os.path.dirname(located) not in jail_path.split(":")
        if any(inside(target, path) for path in (*shown, *shown_real)):
            if off_path:
                hints.append(off_path_hint(missing, located))
            continue
        hints.append(expose_hint(missing, target, root, located if off_path else None))
    return hints


def hints(workspace: str, cwd: str, jail_path: str, env: Mapping[str, str], shown: tuple[str, ...],
          exit_code: int | None, stderr: bytes) -> list[str]:
    """``exec_hints`` for an exec of this front end's caller, whose environment is ``env`` (the
    one it lent, else ours: PATH and HOME), judged by its uid and the host's homes."""
    home = env.get("HOME")
    homes = with_home(login_homes(), home, os.getuid())
    return exec_hints(exit_code, stderr.decode("utf-8", "replace"), workspace, cwd, jail_path, env.get("PATH", ""),
                      home, os.getuid(), homes, shown)


FOREIGN_EXPOSE = ("a witness not made in this state dir has a directory shown only where a toolchain manager "
                  "keeps one (~/.pyenv/versions/V, ~/.nvm/versions/node/V, uv's pythons, /nix/store/…), and this "
                  "is none: replay a witness made here, or one whose toolchain lives in such a place")


def replayable(recorded: list[str], caller_uid: int, homes: tuple[Home, ...],
               foreign: bool = True) -> tuple[list[str], list[dict[str, str]]]:
    """The directories a witness's capsule exposed that this replayer may show: (used, dropped).

    The witness is untrusted: each is held to ``check_expose_dir`` against the replayer
    (a witness naming ~/.ssh gets nothing), and one missing here is dropped, not fatal;
    ``dropped`` says why for each (the replay's report lists them).  A ``foreign`` one (not
    this state dir's own; a trusted key's too) has only toolchains at their managers' known
    places (``layout_root``): any other readable directory it named, ~/other-project or
    /srv/app, its commands would read, and their output is in the report the replayer shares.
    """
    used, dropped = [], []
    places = [home.path for home in homes]
    for path in recorded:
        real = os.path.realpath(path)
        try:
            check_expose_dir("expose", os.path.normpath(path), caller_uid, homes)
            check_expose_dir("expose", real, caller_uid, homes)
        except CcwError as exc:
            dropped.append({"path": path, "reason": exc.message})
            continue
        if foreign and not all(layout_root(one, places) == one for one in (os.path.normpath(path), real)):
            dropped.append({"path": path, "reason": FOREIGN_EXPOSE})
            continue
        if not os.path.isdir(real):
            dropped.append({"path": path, "reason": "not a directory on this machine"})
            continue
        used.append(os.path.normpath(path))  # where the jail shows it (a link's path, too)
    return sorted(set(used)), dropped

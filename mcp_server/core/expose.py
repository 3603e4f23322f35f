"""What a workspace needs from outside it: the toolchain directories a jail must show.

Pure logic (no I/O): ``mcp_server.capsules.exposure`` reads the files (a venv's
pyvenv.cfg, the first bytes of scripts, the caller's PATH) and resolves symlinks; this
module turns what it read into directories, each with the reason it is needed.

Choices made here:
- A toolchain is exposed as its own root, the smallest directory that holds it whole:
  ``~/.pyenv/versions/3.12.1``, not ``~/.pyenv`` (a pyenv ``bin`` or ``shims`` on PATH
  adds only what its shims run and the versions it selects: capsules/exposure.py
  ``_path_needs``) and never ``$HOME``.  Known layouts (pyenv, uv, nvm, rustup, conda,
  asdf, nix, snap) name their roots; anything else is the prefix above a ``bin``
  directory (``/a/b/bin/python3`` needs ``/a/b``: its lib sits beside its bin), and
  never a home itself (``~/bin`` is exposed as it is).
- What the jail already shows is not asked for: the system trees (``/usr``, ``/bin``,
  ``/lib``, ``/opt``...) and the workspace itself.
- The result is sorted and has no directory inside another listed one (the outer one
  already shows it), so the same inputs always give the same list.
- A ``#!/usr/bin/env node`` line names no directory: the command is found on PATH,
  whose entries are exposed in their own right.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from sandbox.hostdirs import inside
from sandbox.usage_words import BAD_INTERPRETER, NAMED_BY

# Directories the jail binds already (sandbox/mounts.py SYSTEM_DIRS) or makes its own;
# what lies in them needs no exposing.
SHOWN_TREES = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt",
               "/proc", "/sys", "/dev", "/run")
# Toolchain layouts under a home: (path below the home, how many components after it
# name one toolchain).  ~/.pyenv/versions/3.12.1/bin/python -> ~/.pyenv/versions/3.12.1.
HOME_LAYOUTS = (
    (".pyenv/versions", 1),
    (".local/share/uv/python", 1),
    (".local/share/uv/tools", 1),
    (".nvm/versions/node", 1),
    (".nvm/versions/io.js", 1),
    (".rustup/toolchains", 1),
    (".asdf/installs", 2),
    (".volta/tools/image/node", 1),
    (".cargo/bin", 0),
    ("go/bin", 0),
    (".local/bin", 0),
    ("miniconda3/envs", 1),
    ("anaconda3/envs", 1),
    ("miniforge3/envs", 1),
    ("mambaforge/envs", 1),
    (".conda/envs", 1),
)
# Trees outside any home with their own layout: /nix/store/<hash-name>, /snap/<name>/<rev>.
ROOT_LAYOUTS = (("/nix/store", 1), ("/snap", 2))
MAX_SHEBANG = 256


@dataclass(frozen=True)
class Need:
    """One directory the jail must show read-only, and why (for the create result)."""

    path: str
    reason: str


def venv_home(cfg_text: str) -> str | None:
    """The ``home`` key of a venv's pyvenv.cfg (the interpreter's bin directory), or None."""
    for line in cfg_text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() == "home":
            value = value.strip()
            return posixpath.normpath(value) if value.startswith("/") else None
    return None


def shebang_interpreter(head: bytes) -> str | None:
    """The absolute interpreter a script's ``#!`` line names (not ``env``), or None."""
    if not head.startswith(b"#!"):
        return None
    line = head[2:MAX_SHEBANG].split(b"\n", 1)[0].strip()
    words = line.split()
    if not words or not words[0].startswith(b"/"):
        return None
    interpreter = words[0].decode("utf-8", "surrogateescape")
    if posixpath.basename(interpreter) == "env":
        return None
    return posixpath.normpath(interpreter)


def _layout_root(path: str, base: str, depth: int) -> str | None:
    """The toolchain root of ``path`` under ``base`` (``depth`` components below it)."""
    if not inside(path, base) or (path == base and depth):
        return None
    if depth == 0:
        return base
    parts = path[len(base):].strip("/").split("/")
    if len(parts) < depth:
        return None
    return posixpath.join(base, *parts[:depth])


def layout_root(path: str, homes: Iterable[str]) -> str | None:
    """The root of the toolchain whose known layout ``path`` lies in (``HOME_LAYOUTS`` under
    any of ``homes``, ``ROOT_LAYOUTS``), or None: a place only a toolchain manager fills."""
    for home in homes:
        for below, depth in HOME_LAYOUTS:
            root = _layout_root(path, posixpath.join(home, below), depth)
            if root is not None:
                return root
    for base, depth in ROOT_LAYOUTS:
        root = _layout_root(path, base, depth)
        if root is not None:
            return root
    return None


def toolchain_root(path: str, home: str | None) -> str | None:
    """The smallest directory that holds the toolchain ``path`` (resolved) belongs to.

    None when the jail shows ``path`` already (a system tree).  ``home`` is the
    caller's home (resolved), whose known layouts name their roots.
    """
    path = posixpath.normpath(path)
    if any(inside(path, tree) for tree in SHOWN_TREES):
        return None
    root = layout_root(path, [home] if home else [])
    if root is not None:
        return root
    parts = path.split("/")
    if "bin" in parts[2:]:
        # /a/b/bin/python3 -> /a/b: a prefix keeps its lib beside its bin.
        prefix = "/".join(parts[:len(parts) - 1 - parts[::-1].index("bin")])
        # ~/bin is a home's own bin, not a toolchain's: the home is never the prefix.
        if not (home and inside(home, prefix)):
            return prefix
    return path


def cover(needs: list[Need], workspace: str) -> list[Need]:
    """Sorted needs with none under the workspace or inside another need (first reason kept)."""
    roots: dict[str, str] = {}
    for need in needs:
        if not inside(need.path, workspace) and need.path != "/":
            roots.setdefault(need.path, need.reason)
    kept = [path for path in sorted(roots)
            if not any(other != path and inside(path, other) for other in roots)]
    return [Need(path, roots[path]) for path in kept]


# What a failed exec says when the program or its interpreter is not in the jail: the
# jail's own exec ("ccw: .venv/bin/python: No such file or directory", "ccw: nvmtool: command
# not found", "ccw: .venv/bin/pytest: bad interpreter: /opt/py/bin/python (named by ...": the
# interpreter is what is missing), a shell's "bad interpreter" and "not found" (dash: "sh: 1:
# mocha: not found"; bash: "bash: line 1: mocha: command not found"; zsh: "zsh: command not
# found: mocha"), env's "'node': No such file or directory".
_MISSING = re.compile(r"(?:^|: )'?([^\s:']+)'?: (?:(?:bad interpreter: )?No such file or directory"
                      r"|(?:command )?not found[ \t]*$)|command not found: ([^\s:']+)[ \t]*$"
                      rf"|^ccw: .*?: {re.escape(BAD_INTERPRETER)}(\S+){re.escape(NAMED_BY)}", re.MULTILINE)
MAX_HINT_PATHS = 4


def missing_paths(exit_code: int | None, stderr: str) -> list[str]:
    """The paths (as written, first MAX_HINT_PATHS) a failed exec's stderr says are missing.

    Only for exit 126/127 (the shell's and the jail's "could not run it"), so a test that
    prints ENOENT for its own files gives none.
    """
    if exit_code not in (126, 127):
        return []
    found: list[str] = []
    for match in _MISSING.finditer(stderr[-8192:]):
        name = match.group(1) or match.group(2) or match.group(3)
        if name not in found:
            found.append(name)
    return found[:MAX_HINT_PATHS]


def expose_hint(missing: str, target: str, root: str, off_path: str | None = None) -> str:
    """The note an exec result carries for a program the jail does not show; ``off_path``: the
    program's path on the host, when its directory is not on the jail's PATH either."""
    via = f" ({missing} leads to {target})" if target != missing else ""
    hint = (f"{target} is outside what the jail shows{via}; expose {root} read-only: capsule_create "
            f"with expose: [\"{root}\"], or ccw capsule create --expose {root}")
    if off_path is not None:
        hint += (f"; its directory is not on the jail's PATH either: run {off_path}, or also pass your PATH "
                 f"(env_whitelist: [\"PATH\"], --env PATH)")
    return hint


def off_path_hint(missing: str, located: str) -> str:
    """The note for a program the jail shows (an exposed toolchain's) but whose directory is not
    on the jail's PATH, which is its own unless PATH is whitelisted."""
    return (f"{missing} is {located}, which the jail shows, but {posixpath.dirname(located)} is not on the jail's "
            f"PATH (its own: the workspace's .venv/bin and the system dirs); run {located}, or pass your PATH: "
            f"capsule_create with env_whitelist: [\"PATH\"], or ccw capsule create --env PATH")


def link_hint(missing: str, link: str, target: str) -> str:
    """The note for a program reached through a workspace link whose target lies outside the
    workspace (a worktree's ``node_modules -> ../main/node_modules``): the jail shows the link,
    dangling, not what it leads to."""
    return (f"{missing} is reached through the workspace's link {link} -> {target}, which leads out of the "
            f"workspace, where the jail does not show it; expose {target} read-only: capsule_create "
            f"with expose: [\"{target}\"], or ccw capsule create --expose {target}")

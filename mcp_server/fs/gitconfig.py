"""The host's git config: which files of the workspace it names as config to read or code to run.

A tracked file is code on the host when the host's git config points at it:
``include.path = ../tools/gitconfig`` makes it config, ``core.hooksPath = .githooks``
makes a directory of hooks, ``filter.x.clean = ./scripts/clean.sh`` a program that
``git add`` runs.  A capsule that changes such a file plants code that the next git
command runs outside any jail, so promotion judges those paths as ``git_control``
(core/hazards.py ``ConfigNamed``).  This module finds them; it changes nothing.

Some facts about git config this is built on:

- Git reads the system file, the user's global files (``~/.gitconfig``,
  ``$XDG_CONFIG_HOME/git/config``), the repository's ``config`` and, with
  ``extensions.worktreeConfig``, its ``config.worktree``, and every file an
  ``include.path`` or a holding ``includeIf.<condition>.path`` names in any of them.
  ``git config --list --show-origin --show-scope -z`` lists every value with the file it
  came from, includes followed.  Listing runs nothing a value names.
- Those files are config too: a global one can lie in a workspace (a capsule of
  ``~/.config/git``, a dotfiles checkout that ``~/.gitconfig`` links into), where git reads
  it for every repository of the user's, so it is named as an include's target is
  (``config_files``), where git would look for it even before one is there.
- A relative include is relative to the directory of the file that includes it (the
  origin ``.git/../tools/gitconfig`` is ``tools/gitconfig``).  A conditional include
  whose condition does not hold now (``onbranch:``, ``gitdir:``) is not followed, yet
  counts as soon as the user checks out that branch: such a file found in the tree is
  listed on its own (``--file``), so what it names counts too.
- Git leaves out, silently, the config of a repository owned by another user
  (``safe.directory``): ``--list`` then shows no local values at all.  The danger is to
  that checkout's owner, whose git reads it, so the listing runs with
  ``-c safe.directory=*``; it runs nothing, so trusting the config there costs nothing.
- Git runs its commands from the top of the work tree (setup chdirs there before a
  command starts; git-config(1) says so of aliases), and hooks run there in a non-bare
  repository: a relative ``core.hooksPath`` or program path is relative to the top.
- A program value runs through ``sh -c`` when it has shell syntax.  Its first word is the
  program: without a ``/`` it is looked up on ``PATH``, not in the tree.  Any word with a
  ``/`` is taken as a path (``./fsmon``, ``python3 tools/conv.py``, ``~/bin/x``), and a
  later word that names an entry at the top of the work tree (``python3 conv.py``) as a
  file the command reads.  That reads the command, it does not run it: a script that
  finds its code by other means (``$(cat x)``, ``cd tools && ./x``) is not followed.
- Paths are compared as written (normalised) and as the live tree resolves them (a live
  ``tools -> conf`` link makes ``tools/gitconfig`` name ``conf/gitconfig`` too), and
  kept when they fall inside the workspace, as given or resolved.

Which keys, and what git does with them, are ``PATH_KEYS`` and ``PROGRAM_KEYS``.  Left
out: ``core.attributesFile`` and ``core.excludesFile`` (they select or ignore files and
run nothing, as hazards.py argues of ``.gitattributes``), ``commit.template`` and other
files git only shows or reads as data.

The config read is the promoting user's, as ``git check-ignore`` reads it
(fs/gitignore.py): no inherited ``GIT_*`` variables, so the front end's own
``GIT_CONFIG_GLOBAL`` or ``GIT_CONFIG_PARAMETERS`` count for nothing, and a root
promoter into another user's checkout does not see that user's global config.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from mcp_server.core.hazards import ConfigNamed
from mcp_server.fs.fingerprint import run_git
from sandbox.errors import CcwError

TIMEOUT_S = 30.0
MAX_HELD_FILES = 32  # conditional includes read on their own, at most (a bound, not a need)
_LIST = ("config", "--list", "--show-origin", "--show-scope", "-z")
_BOOLEANS = frozenset({"", "true", "false", "yes", "no", "on", "off", "1", "0"})

_CONFIG = "git reads it as config, which can name programs git runs"
# Keys whose value is a path (section.*.name: any subsection): (how git spells it, what it does, a directory?).
PATH_KEYS: dict[str, tuple[str, str, bool]] = {
    "include.path": ("include.path", _CONFIG, False),
    "includeif.*.path": ("includeIf.*.path", _CONFIG, False),
    "core.hookspath": ("core.hooksPath", "git runs the hooks in it on commit, merge, checkout and push", True),
    "init.templatedir": ("init.templateDir", "git init and clone copy the hooks in it into the new repository", True),
}
# Keys whose value is a command: (how git spells it, when git runs it).
PROGRAM_KEYS: dict[str, tuple[str, str]] = {
    "core.fsmonitor": ("core.fsmonitor", "git status, diff and add run it to learn what changed"),
    "core.sshcommand": ("core.sshCommand", "fetch, pull and push run it to reach an ssh remote"),
    "core.gitproxy": ("core.gitProxy", "fetch runs it to reach a git:// remote"),
    "core.pager": ("core.pager", "git pipes the output of log, diff and show through it"),
    "pager.*": ("pager.*", "git pipes that command's output through it"),
    "core.editor": ("core.editor", "commit, tag and rebase start it"),
    "sequence.editor": ("sequence.editor", "rebase -i starts it"),
    "core.askpass": ("core.askPass", "git runs it to ask for a password"),
    "credential.helper": ("credential.helper", "git runs it to fetch and store credentials"),
    "credential.*.helper": ("credential.*.helper", "git runs it to fetch and store credentials"),
    "gpg.program": ("gpg.program", "commit and tag run it to sign, log and verify to check"),
    "gpg.*.program": ("gpg.*.program", "commit and tag run it to sign, log and verify to check"),
    "gpg.ssh.defaultkeycommand": ("gpg.ssh.defaultKeyCommand", "commit and tag run it to choose the signing key"),
    "filter.*.clean": ("filter.*.clean", "add, status and diff run it on the files .gitattributes selects"),
    "filter.*.smudge": ("filter.*.smudge", "checkout and reset run it on the files .gitattributes selects"),
    "filter.*.process": ("filter.*.process", "add and checkout run it on the files .gitattributes selects"),
    "diff.external": ("diff.external", "git diff runs it"),
    "diff.*.command": ("diff.*.command", "git diff runs it on the files .gitattributes selects"),
    "diff.*.textconv": ("diff.*.textconv", "diff, log -p and blame run it on the files .gitattributes selects"),
    "interactive.difffilter": ("interactive.diffFilter", "add -p runs it"),
    "merge.*.driver": ("merge.*.driver", "merge, rebase and pull run it on the files .gitattributes selects"),
    "mergetool.*.cmd": ("mergetool.*.cmd", "git mergetool runs it"),
    "mergetool.*.path": ("mergetool.*.path", "git mergetool runs it"),
    "difftool.*.cmd": ("difftool.*.cmd", "git difftool runs it"),
    "difftool.*.path": ("difftool.*.path", "git difftool runs it"),
    "alias.*": ("alias.*", "the alias runs it (a value that starts with !)"),
    "remote.*.uploadpack": ("remote.*.uploadpack", "fetch runs it, on this host for a local remote"),
    "remote.*.receivepack": ("remote.*.receivepack", "push runs it, on this host for a local remote"),
    "trailer.*.cmd": ("trailer.*.cmd", "commit --trailer and interpret-trailers run it"),
}


@dataclass(frozen=True)
class Entry:
    """One value of ``git config --list``."""

    scope: str  # system, global, local, worktree, command
    origin: str  # the file it came from ("" when not a file: the command line, a blob)
    key: str  # as git lists it: section and name lowercased, the subsection as written
    value: str | None  # None: a key with no "=" (a boolean true)


def parse_listing(out: bytes) -> list[Entry]:
    """``git config --list --show-origin --show-scope -z``'s output as entries."""
    fields = out.split(b"\0")
    entries = []
    for at in range(0, len(fields) - 2, 3):
        scope, origin, item = (f.decode("utf-8", "surrogateescape") for f in fields[at:at + 3])
        key, newline, value = item.partition("\n")
        entries.append(Entry(scope, origin[len("file:"):] if origin.startswith("file:") else "", key,
                             value if newline else None))
    return entries


def key_rule(key: str) -> tuple[str, str, str] | None:
    """``key``'s pattern in PATH_KEYS or PROGRAM_KEYS, the key as git spells it, and which table ("path", "program")."""
    section, _, rest = key.partition(".")
    sub, dot, name = rest.rpartition(".")
    section = section.lower()
    # "pager.log" and "alias.st" put the variable part in the name, "filter.lfs.clean" in the subsection.
    tries = ([(f"{section}.*.{name.lower()}", sub)] if dot
             else [(f"{section}.{name.lower()}", ""), (f"{section}.*", name)])
    for pattern, part in tries:
        for table_name, table in (("path", PATH_KEYS), ("program", PROGRAM_KEYS)):
            if pattern in table:
                return pattern, table[pattern][0].replace("*", part, 1), table_name
    return None


def command_words(value: str) -> list[tuple[str, bool]]:
    """A command's words that may be paths, each with whether it must exist to count (module docstring)."""
    lexer = shlex.shlex(value, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: sh would refuse it too, the words as they stand are the best guess
        words = value.split()
    out, first = [], True
    for word in words:
        if word and all(c in "();<>|&" for c in word):
            first = True  # a new command of the line begins
            continue
        name, eq, assigned = word.partition("=")
        assignment = bool(eq) and first and name.isidentifier()  # NAME=value before the program
        if assignment or (eq and name.startswith("-")):
            word = assigned  # NAME=./lib, --file=./x: the value may be a path
        if word.startswith("$"):
            pass  # a variable's value is not known here
        elif "/" in word:
            out.append((word, False))
        elif word and not first and not word.startswith(("-", "%")):
            out.append((word, True))
        first = assignment
    return out


@dataclass(frozen=True)
class _Target:
    """A value's target before it is placed in the workspace: as written, and the directory it is relative to."""

    written: str
    base: str
    must_exist: bool
    named: ConfigNamed  # its ``path`` is set once placed


def _include_base(entry: Entry, top: str) -> str:
    """The directory an include in ``entry``'s file is relative to: that file's own."""
    return os.path.dirname(os.path.join(top, entry.origin)) if entry.origin else top


def _path_value(value: str) -> str:
    return value[len(":(optional)"):] if value.startswith(":(optional)") else value


def _shown(origin: str, top: str) -> str:
    """A config file as a reason names it: relative to the work tree's top when inside it."""
    path = os.path.normpath(os.path.join(top, origin))
    rel = os.path.relpath(path, top)
    return path if rel == ".." or rel.startswith("../") else rel


def _targets(entry: Entry, top: str) -> Iterator[_Target]:
    rule = key_rule(entry.key)
    if rule is None or entry.value is None:
        return
    pattern, spelled, table = rule
    origin = _shown(entry.origin, top) if entry.origin else f"the {entry.scope} config"
    value = entry.value
    if table == "path":
        _, use, subtree = PATH_KEYS[pattern]
        base = _include_base(entry, top) if pattern in ("include.path", "includeif.*.path") else top
        yield _Target(_path_value(value), base, False, ConfigNamed("", spelled, origin, use, subtree))
        return
    if pattern in ("core.fsmonitor", "pager.*") and value.strip().lower() in _BOOLEANS:
        return  # git's own fsmonitor daemon; paging on or off
    if pattern in ("alias.*", "credential.helper", "credential.*.helper"):
        if not value.startswith("!"):
            return  # a git command, or git-credential-NAME on PATH (a helper path with a "/" runs as it is)
        value = value[1:]
    use = PROGRAM_KEYS[pattern][1]
    for word, must_exist in command_words(value):
        yield _Target(word, top, must_exist, ConfigNamed("", spelled, origin, use))


def _placed(target: _Target, roots: Sequence[str]) -> set[str]:
    """The workspace-relative paths a target names (as written and as the live tree resolves it)."""
    path = os.path.join(target.base, os.path.expanduser(target.written))
    if target.must_exist and not os.path.lexists(path):
        return set()
    return _in_roots(path, roots)


def _in_roots(path: str, roots: Sequence[str]) -> set[str]:
    """An absolute path's forms, as written and resolved, relative to each of ``roots`` that holds them."""
    out = set()
    for form in {os.path.normpath(path), os.path.realpath(path)}:
        for root in roots:
            rel = os.path.relpath(form, root)
            if rel != ".." and not rel.startswith("../"):
                out.add("" if rel == "." else rel)
    return out


def _roots(workspace: str) -> list[str]:
    return sorted({os.path.abspath(workspace), os.path.realpath(workspace)})


def on_path(workspace: str, changed: Iterable[tuple[str, str]], path_env: str | None = None) -> dict[str, str]:
    """The ``changed`` files and links (workspace-relative path, kind) that the promoting user's PATH would
    run, each with why: one that hides a program of the same name in a later PATH directory, and a link
    standing in for a PATH directory (or a directory on the way to one).

    Not git config, but host config that names the tree as git's does: a capsule made over
    ``~/.local/bin`` (or ``~/.pyenv``, which holds ``shims``) can promote an executable named
    ``ls`` or ``sudo`` there, and the user's next command of that name runs it, outside any jail.
    A name that hides nothing (a project's own console script in an activated ``.venv/bin``) is
    the project's code, run when asked for by its name, and counts for nothing.  The PATH is the
    front end's own, as it started (the user's shell's, or the MCP client's); an entry counts as
    written and as resolved.  A relative entry (``.``, ``node_modules/.bin``) names a directory of
    wherever a command runs, and is not placed."""
    entries = [e for e in (os.environ.get("PATH", "") if path_env is None else path_env).split(os.pathsep)
               if e.startswith("/")]
    roots = _roots(workspace)
    placed = [_in_roots(entry, roots) for entry in entries]
    out = {}
    for path, kind in changed:
        head, _, name = path.rpartition("/")
        if kind == "symlink" and any(d == path or d.startswith(path + "/") for dirs in placed for d in dirs):
            out[path] = ("a link standing in for a directory on the promoting user's PATH: a command typed by "
                         "name runs what it leads to")
            continue
        at = next((i for i, dirs in enumerate(placed) if head in dirs), None)
        later = () if at is None else (os.path.join(entry, name) for entry in entries[at + 1:])
        hidden = next((program for program in later if os.path.isfile(program) and os.access(program, os.X_OK)), None)
        if hidden is not None:
            out[path] = (f"{head or 'the workspace'} comes before {os.path.dirname(hidden)} on the promoting user's "
                         f"PATH: typing {name} would run this instead of {hidden}")
    return out


def named_paths(entries: Sequence[Entry], top: str, workspace: str) -> list[ConfigNamed]:
    """The workspace paths ``entries`` name, each with the key that names it (the first, if several do);
    ``top``: the work tree's top, where git runs commands."""
    roots = _roots(workspace)
    seen: dict[tuple[str, bool], ConfigNamed] = {}
    for entry in entries:
        for target in _targets(entry, top):
            for rel in sorted(_placed(target, roots)):
                seen.setdefault((rel, target.named.subtree), replace(target.named, path=rel))
    return list(seen.values())


def _git(workspace: str, *args: str) -> subprocess.CompletedProcess[bytes]:
    return run_git(workspace, "-c", "safe.directory=*", *args, check=False, timeout_s=TIMEOUT_S)


def _listing(workspace: str, *args: str) -> list[Entry] | str:
    """The entries git lists (the command line's own aside), or why it could not."""
    proc = _git(workspace, *_LIST, *args)
    if proc.returncode != 0:
        return proc.stderr.decode(errors="replace").strip()
    return [entry for entry in parse_listing(proc.stdout) if entry.origin or entry.scope != "command"]


def _held_includes(entries: list[Entry], top: str) -> set[str]:
    """The files conditional includes name that exist (followed or not)."""
    held = (os.path.join(_include_base(e, top), os.path.expanduser(_path_value(e.value))) for e in entries
            if e.value and (key_rule(e.key) or ("",))[0] == "includeif.*.path")
    return {os.path.normpath(path) for path in held if os.path.isfile(path)}


def read(workspace: str) -> list[ConfigNamed]:
    """The paths of ``workspace`` that the host's git config names (none if git is not installed).

    INVALID_ARGUMENT if git cannot list its config there: what it names is then unknown,
    and a promotion must not guess.
    """
    try:
        top_proc = _git(workspace, "rev-parse", "--show-toplevel")
    except CcwError as exc:
        if exc.code == "UNSUPPORTED":
            return []  # no git on the host: nothing runs what a config names
        raise
    lines = top_proc.stdout.decode("utf-8", "surrogateescape").splitlines() if top_proc.returncode == 0 else []
    top = lines[0] if lines else os.path.abspath(workspace)  # outside a work tree, git runs from where it is
    entries = _listing(workspace)
    if isinstance(entries, str):
        raise CcwError("INVALID_ARGUMENT", f"git config --list failed in {workspace!r}, so which files its config "
                       f"names is unknown: {entries}; fix that config, then promote again")
    done = {os.path.normpath(os.path.join(top, e.origin)) for e in entries if e.origin}
    for _ in range(MAX_HELD_FILES):
        unread = sorted(_held_includes(entries, top) - done)
        if not unread:
            break
        done.add(unread[0])
        more = _listing(workspace, "--includes", "--file", unread[0])
        # One git cannot read names nothing knowable, and would stop git outright once its condition held.
        entries += [] if isinstance(more, str) else more
    return named_paths(entries, top, workspace) + config_files(entries, workspace)


def _global_files() -> list[str]:
    """Where git looks for the user's global config, whether a file is there yet or not."""
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    return [os.path.expanduser("~/.gitconfig"), os.path.join(xdg, "git", "config")]


def config_files(entries: Sequence[Entry], workspace: str) -> list[ConfigNamed]:
    """Git's own config files that lie in the workspace (as given or resolved): a global or system file it
    read, and the global ones where git would look (a workspace of ``~/.config/git``, a dotfiles checkout
    that ``~/.gitconfig`` links into).  Each is config for every repository of the user's, as an include's
    target is; the repository's own (``.git/config``) is git_control already, an include named by its key."""
    roots = _roots(workspace)
    read_files = {e.origin: e.scope for e in entries if e.origin and e.scope in ("global", "system")}
    files = {**{path: "global" for path in _global_files()}, **read_files}
    seen: dict[str, ConfigNamed] = {}
    for path, scope in files.items():
        use = f"git reads it as the {scope} config of every repository, which can name programs git runs"
        target = _Target(path, "/", False, ConfigNamed("", f"{scope} config", path, use))
        for rel in sorted(_placed(target, roots)):
            seen.setdefault(rel, replace(target.named, path=rel))
    return list(seen.values())

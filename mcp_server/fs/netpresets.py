"""Network presets: named sets of allowlist rules kept as data, used as ``preset:NAME``.

A preset is a JSON file, ``NAME.json``: a description, and its rules, each with why it is
there (``{"description": …, "rules": [{"rule": "pypi.org:443", "why": …}], "sources":
[…]}``; its JSON Schema is ``policies/network/network-preset.schema.json``, which the
schema tools list with the shipped presets as its examples).  ccw ships some in
``policies/network/`` (package data, through ``mcp_server/data``); a person adds their
own in ``<state dir>/policies/network/``.  ``ccw net presets`` lists them.

Choices made here:
- **Syntax.**  In any list of allowlist rules a capsule is given (capsule_create's and
  capsule_replay's ``network``, and a live change of a capsule's rules), an item
  ``preset:NAME`` stands for that preset's rules.  ``expand_rules`` and
  ``expand_network`` are the one place that happens; every caller parses what they
  return with ``core/netrules``.  A preset's own rules are rules, never presets (no
  nesting: what a name stands for is read in one file).
- **Expanded, never stored.**  The capsule's record, each run's and each witness's keep
  the rules themselves, not the preset's name: a record means the same after a preset
  file is edited, and a replay runs under the rules the capsule ran under.  The
  expansion goes through ``core/netrules`` like any rule, so ``core/netspace``'s
  refusals (the host itself, private space) hold for a preset's names as for any other.
- **Read when used.**  User presets are read at every expansion that names a preset (a
  few small files, on capsule create, not on a connection), so an edit counts from the
  next create without a restart; the shipped ones once per process.
- **A user preset never shadows a shipped one.**  A user file with a shipped preset's
  name makes ``preset:NAME`` an error (CONFLICT, naming the file, saying to rename it)
  rather than either one silently winning: ``preset:pypi`` must mean the same hosts in
  every state dir, because people read the shipped list (in the docs, in an agent's
  proposal) when they decide to grant it, and a local file that quietly widened it
  would grant what they did not read; nor should a person believe their own file is in
  force when it is not.
- **Whoever can write a preset decides what capsules reach.**  So the user's files are
  read without following a symlink at any step below the state dir (``O_NOFOLLOW``),
  must be regular files of at most ``MAX_FILE`` bytes owned by this uid (or root) that
  neither group nor others may write, in directories held to the same; anything else is
  refused, naming the file and what to change.
- **A broken user file spoils only its own name.**  It is reported by the listing and
  by an expansion that names it (INVALID_ARGUMENT naming the file and the field);
  ``preset:pypi`` still works beside a broken ``mine.json``.
"""

from __future__ import annotations

import functools
import json
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from mcp_server.core.netrules import parse_rule
from mcp_server.data import data_dir
from sandbox.errors import CcwError, from_oserror

PRESET = "preset:"  # a rule that names a preset: preset:NAME
USER_DIR = ("policies", "network")  # under the state dir: the user's presets
MAX_FILE = 64 << 10  # bytes per preset file
MAX_FILES = 256  # user preset files read at most
MAX_RULES = 64  # rules per preset
MAX_TEXT = 600  # characters of a description, a why or a source
NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,39}\Z")
FIELDS = ("description", "rules", "sources")
SCHEMA = "network-preset.schema.json"  # a preset file's JSON Schema, beside the shipped presets
LIST_HINT = "ccw net presets lists the presets and their rules"

Origin = Literal["shipped", "user"]


@dataclass(frozen=True)
class PresetRule:
    """One rule of a preset (canonical text) and why it is there."""

    rule: str
    why: str


@dataclass(frozen=True)
class Preset:
    """A named rule set, read from ``path``."""

    name: str
    origin: Origin
    path: str
    description: str
    rules: tuple[PresetRule, ...]
    sources: tuple[str, ...] = ()

    def texts(self) -> tuple[str, ...]:
        """The rules' texts, as a rule list takes them."""
        return tuple(rule.rule for rule in self.rules)

    def to_json(self) -> dict[str, Any]:
        """What the listing shows."""
        return {"name": self.name, "origin": self.origin, "path": self.path, "description": self.description,
                "rules": [{"rule": rule.rule, "why": rule.why} for rule in self.rules],
                "sources": list(self.sources)}


def _bad(path: str, where: str, problem: str) -> CcwError:
    return CcwError("INVALID_ARGUMENT", f"network preset {path}: {where}: {problem}; fix or remove the file "
                    f"({LIST_HINT})", {"path": path, "field": where})


def _text(value: Any, path: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > MAX_TEXT:
        raise _bad(path, where, f"must be a non-empty string of at most {MAX_TEXT} characters, not {value!r:.80}")
    return value.strip()


def _rule(item: Any, path: str, where: str) -> PresetRule:
    if not isinstance(item, Mapping) or set(item) != {"rule", "why"}:
        raise _bad(path, where, 'each rule is an object {"rule": "host:port", "why": "what needs it"} '
                   f"and nothing else, not {item!r:.80}")
    text = _text(item["rule"], path, f"{where}/rule")
    if text.lower().startswith(PRESET):
        raise _bad(path, f"{where}/rule", f"{text!r} names a preset; a preset's rules are rules, not presets")
    try:
        rule = parse_rule(text)
    except CcwError as exc:
        raise _bad(path, f"{where}/rule", exc.message) from None
    return PresetRule(rule.text, _text(item["why"], path, f"{where}/why"))


def parse_preset(doc: Any, name: str, origin: Origin, path: str) -> Preset:
    """A preset file's document, checked; INVALID_ARGUMENT naming ``path`` and the field."""
    if not isinstance(doc, Mapping):
        raise _bad(path, "/", f"a preset is a JSON object with {', '.join(FIELDS)}")
    unknown = sorted(set(doc) - set(FIELDS))
    if unknown:
        raise _bad(path, "/", f"unknown fields {unknown}; a preset has {', '.join(FIELDS)} "
                   "(its name is its file's name)")
    for needed in ("description", "rules"):
        if needed not in doc:
            raise _bad(path, f"/{needed}", "missing")
    rules = doc["rules"]
    if not isinstance(rules, list) or not 1 <= len(rules) <= MAX_RULES:
        raise _bad(path, "/rules", f"must be a list of 1 to {MAX_RULES} rules")
    parsed = [_rule(item, path, f"/rules/{i}") for i, item in enumerate(rules)]
    seen: dict[str, int] = {}
    for i, rule in enumerate(parsed):
        if rule.rule in seen:
            raise _bad(path, f"/rules/{i}/rule", f"{rule.rule} is already /rules/{seen[rule.rule]}")
        seen[rule.rule] = i
    sources = doc.get("sources", [])
    if not isinstance(sources, list) or len(sources) > 16:
        raise _bad(path, "/sources", "must be a list of at most 16 strings (where the hosts are documented)")
    return Preset(name, origin, path, _text(doc["description"], path, "/description"), tuple(parsed),
                  tuple(_text(s, path, f"/sources/{i}") for i, s in enumerate(sources)))


@functools.cache
def shipped() -> dict[str, Preset]:
    """The presets ccw ships (policies/network/*.json), by name; read once per process."""
    out: dict[str, Preset] = {}
    for path in sorted((data_dir("policies") / "network").glob("*.json")):
        if path.name == SCHEMA:
            continue
        with open(path, encoding="utf-8") as f:
            out[path.stem] = parse_preset(json.load(f), path.stem, "shipped", str(path))
    return out


@dataclass
class Catalogue:
    """The presets a state dir can use, and the user files that could not be used (by name)."""

    presets: dict[str, Preset]
    problems: dict[str, CcwError] = field(default_factory=dict)
    user_dir: str = ""

    def rules(self, name: str) -> tuple[str, ...]:
        """The rules ``preset:name`` stands for; a clear error if it stands for none."""
        if name in self.problems:
            raise self.problems[name]
        if name not in self.presets:
            known = ", ".join(sorted(self.presets)) or "none"
            raise CcwError("NOT_FOUND", f"no network preset {name!r} (rule {PRESET}{name}); presets: {known}. "
                           f"Add your own as {self.user_dir}/{name}.json; {LIST_HINT}",
                           {"preset": name, "presets": sorted(self.presets)})
        return self.presets[name].texts()

    def listing(self) -> dict[str, Any]:
        """Every preset and every refused user file, for ``ccw net presets``."""
        return {"syntax": f"{PRESET}NAME", "user_dir": self.user_dir,
                "presets": [self.presets[name].to_json() for name in sorted(self.presets)],
                "problems": [{"name": name, "code": exc.code, "message": exc.message,
                              "path": (exc.details or {}).get("path")}
                             for name, exc in sorted(self.problems.items())]}


def user_dir(state_dir: str | Path) -> Path:
    """Where the state dir's own presets live."""
    return Path(state_dir).joinpath(*USER_DIR)


def catalogue(state_dir: str | Path) -> Catalogue:
    """The shipped presets and the state dir's own, read now."""
    found = Catalogue(dict(shipped()), user_dir=str(user_dir(state_dir)))
    for name, path, outcome in _user_files(Path(state_dir)):
        if isinstance(outcome, CcwError):
            found.problems[name] = outcome
        elif name in found.presets:
            found.problems[name] = CcwError(
                "CONFLICT", f"network preset {path} has the name of a preset ccw ships ({found.presets[name].path}), "
                f"and a user preset never replaces a shipped one: rename the file (e.g. {name}-local.json) and use "
                f"{PRESET}{name}-local", {"path": path, "preset": name})
        else:
            found.presets[name] = outcome
    return found


def _safe(info: os.stat_result, path: str, kind: str) -> None:
    """Refuse what someone other than this uid (or root) could have written."""
    if info.st_uid not in (os.geteuid(), 0) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CcwError("PERMISSION_DENIED", f"refusing network preset {kind} {path}: it is owned by uid "
                       f"{info.st_uid} with mode {stat.S_IMODE(info.st_mode):04o}, and whoever can write it decides "
                       f"what capsules reach; make it yours and not writable by others (chown {os.geteuid()}, "
                       "chmod go-w)", {"path": path})


def _open_dir(parent: int, name: str, path: str) -> int | None:
    try:
        fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
    except FileNotFoundError:
        return None
    except OSError as exc:  # ELOOP or ENOTDIR: a symlink or a file, never followed
        raise from_oserror(exc, "open network presets directory", path,
                           "it must be a real directory (ccw never follows a symlink there)") from exc
    try:
        _safe(os.fstat(fd), path, "directory")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _user_files(state_dir: Path) -> list[tuple[str, str, Preset | CcwError]]:
    """Each ``*.json`` of the user's preset directory: (name, path, its preset or why not)."""
    try:
        fds = [os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise from_oserror(exc, "open state dir", str(state_dir), "set CCW_STATE_DIR to a directory you own") from exc
    try:
        where = state_dir
        for part in USER_DIR:
            where = where / part
            inner = _open_dir(fds[-1], part, str(where))
            if inner is None:
                return []
            fds.append(inner)
        names = sorted(n for n in os.listdir(fds[-1]) if n.endswith(".json") and not n.startswith(".") and n != SCHEMA)
        if len(names) > MAX_FILES:
            raise CcwError("INVALID_ARGUMENT", f"{where} holds {len(names)} preset files; ccw reads at most "
                           f"{MAX_FILES}: remove some", {"path": str(where)})
        return [(n[:-5], str(where / n), _user_preset(fds[-1], n, str(where / n))) for n in names]
    finally:
        for fd in fds:
            os.close(fd)


def _user_preset(dir_fd: int, file: str, path: str) -> Preset | CcwError:
    name = file[:-5]
    try:
        if not NAME.match(name):
            raise _bad(path, "file name", "a preset's name is its file's name: 1-40 of a-z, 0-9 and '-', "
                       "starting with a letter or digit")
        return parse_preset(_read(dir_fd, file, path), name, "user", path)
    except CcwError as exc:
        return exc


def _read(dir_fd: int, file: str, path: str) -> Any:
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:  # ELOOP: a symlink, never followed
        raise from_oserror(exc, "open network preset", path, "it must be a regular file, not a symlink") from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _bad(path, "file", "not a regular file")
        _safe(info, path, "file")
        data = os.read(fd, MAX_FILE + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE:
        raise _bad(path, "file", f"larger than {MAX_FILE} bytes")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _bad(path, "file", f"not UTF-8 JSON ({exc})") from None


def preset_name(value: Any) -> str | None:
    """The preset a rule list's item names (``preset:NAME``), or None if it is a rule."""
    if isinstance(value, str) and value.strip().lower().startswith(PRESET):
        return value.strip()[len(PRESET):].lower()
    return None


def expand_rules(values: Iterable[Any], state_dir: str | Path) -> list[Any]:
    """``values`` with each ``preset:NAME`` replaced by that preset's rules (the rest as given,
    for ``core/netrules`` to parse).  NOT_FOUND, CONFLICT or INVALID_ARGUMENT naming the
    preset or its file if one cannot be used; user presets are read only if one is named."""
    given = list(values)
    if not any(preset_name(value) is not None for value in given):
        return given
    found = catalogue(state_dir)
    out: list[Any] = []
    for value in given:
        name = preset_name(value)
        if name is None:
            out.append(value)
        elif not NAME.match(name):
            raise CcwError("INVALID_ARGUMENT", f"{value!r} is not a preset's name: {PRESET}NAME, NAME 1-40 of "
                           f"a-z, 0-9 and '-'; {LIST_HINT}", {"rule": value})
        else:
            out.extend(found.rules(name))
    return out


def expand_network(value: Any, state_dir: str | Path) -> Any:
    """A ``network`` argument (``core/netrules.parse_network``'s) with its presets expanded."""
    if isinstance(value, Mapping) and isinstance(value.get("allow"), Sequence) \
            and not isinstance(value["allow"], str | bytes):
        return {**value, "allow": expand_rules(value["allow"], state_dir)}
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return expand_rules(value, state_dir)
    return value

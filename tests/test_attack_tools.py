"""Tool-level attacks on every path-taking tool of the live worktree (issue 9).

Each tool gets hostile paths: ``..`` in every position, absolute paths, ``~``, symlinks
planted in the workspace that point at a canary directory outside it, NUL bytes, very
long names, invalid UTF-8 (surrogate escapes, lone surrogates, overlong sequences) and
Windows forms.  Every attempt must end in one of three ways: the input schema refuses it
(a JSON-RPC error in the server), a CcwError whose code is not INTERNAL, or a result that
stays inside the workspace.  After every tool's attacks the canary tree, and everything
beside the workspace, must be byte-identical.  A thread that swaps a symlink between an
inside directory and the canary while the tools run covers check-then-use races.

Capsule views (capsule_id, capsule_exec's cwd, promotion) are attacked in
``vm-tests/test_attack_capsules.py``, which needs the helper.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from mcp_server.config import TOOLSETS
from mcp_server.tools import rootspace as rootspace_tools
from mcp_server.tools.registry import Registry
from sandbox.errors import CcwError
from tests.support.canary import tree_digest
from tests.support.realprojects import git

REGISTRY = Registry.load(TOOLSETS)
SECRET = b"CANARY-SECRET do not touch\n"
SECRET_HASH = hashlib.sha256(SECRET).hexdigest()
INSIDE = b"inside\n"

# Hostile paths, in the repo-relative spelling (seed 000); the rootspace tools also see each
# one with a leading '/' and the hashline tools with the workspace's absolute prefix.
HOSTILE = [
    "..", "../canary", "../canary/secret.txt", "src/../../canary/secret.txt", "src/..", "a/../b",
    "./../canary/secret.txt", "src/./../../canary", "x/..", "src/a.txt/..", "src/a.txt/../../..",
    "....//canary", "%2e%2e/canary/secret.txt",
    "~", "~/x", "~root/.bashrc", "src/~/x",
    "out", "out/secret.txt", "out/new.txt", "outfile", "rel/secret.txt", "rel/new.txt",
    "deep/up/secret.txt", "loop", "loop/x", "src/../out/secret.txt",
    "src/a\x00.txt", "\x00", "out\x00/x",
    "n" * 256, "n" * 300 + "/b", "/".join(["d" * 250] * 16), "/".join(["e"] * 300) + "/f", "/".join(["l" * 255] * 17),
    "\udc80", "src/\udcff\udcfe", "\ud800", "x\udcc0\udcaf", "\udce0\udc80\udcaf/secret.txt",
    "C:\\Windows\\win.ini", "C:/x", "c:", "\\\\server\\share\\x", "..\\..\\canary\\secret.txt",
    "src\\..\\..\\x", "\\..\\canary",
]


@dataclass
class Arena:
    """A workspace with planted symlinks, and a canary directory beside it."""

    root: Path
    ws: Path
    canary: Path
    ctx: Any
    base_snapshot: str = ""

    def outside_digest(self) -> str:
        """sha256 over every entry beside the workspace and state dir (the canary included)."""
        return tree_digest(self.root, skip=("ws", "state"))


@pytest.fixture
def arena(tmp_path: Path, direct_ctx: Any) -> Iterator[Arena]:
    root = tmp_path.resolve()
    canary = root / "canary"
    (canary / "sub").mkdir(parents=True)
    (canary / "secret.txt").write_bytes(SECRET)
    (canary / "sub" / "inner.txt").write_bytes(SECRET)
    ws = root / "ws"
    (ws / "src").mkdir(parents=True, exist_ok=True)
    (ws / "src" / "a.txt").write_bytes(INSIDE)
    (ws / "deep").mkdir()
    os.symlink(str(canary), ws / "out")
    os.symlink(str(canary / "secret.txt"), ws / "outfile")
    os.symlink("../canary", ws / "rel")
    os.symlink("../../canary", ws / "deep" / "up")
    os.symlink("loop", ws / "loop")
    git(ws, "init", "-q")
    git(ws, "add", "-A")
    git(ws, "commit", "-qm", "init")
    yield Arena(root, ws, canary, direct_ctx)
    # The tools may create deep trees; rm -rf needs no recursion limit.
    subprocess.run(["rm", "-rf", str(ws)], check=True)


class Outcome:
    """How one attempt ended: 'schema', 'error' (with a code) or 'ok' (with a result)."""

    def __init__(self, kind: str, code: str = "", result: Any = None) -> None:
        self.kind, self.code, self.result = kind, code, result

    def __repr__(self) -> str:
        return f"Outcome({self.kind}, {self.code})"


def attempt(ctx: Any, name: str, args: dict[str, Any]) -> Outcome:
    """Call a tool as the server would; only structured outcomes may come out."""
    spec = REGISTRY.lookup(name)
    assert spec is not None, name
    if any(True for _ in jsonschema.Draft202012Validator(spec.input_schema).iter_errors(args)):
        return Outcome("schema")
    try:
        result = trio.run(spec.handler, ctx, args)
    except CcwError as exc:
        assert exc.code != "INTERNAL", (name, args, exc)
        json.dumps(exc.to_dict())
        return Outcome("error", exc.code)
    jsonschema.Draft202012Validator(spec.output_schema).validate(result)
    dumped = json.dumps(result)
    assert "CANARY" not in dumped and "Q0FOQVJZ" not in dumped, (name, args, result)  # nor in base64
    return Outcome("ok", result=result)


def _patch_creating(path: str) -> str:
    return f"--- /dev/null\n+++ b/{path}\n@@ -0,0 +1 @@\n+PWNED\n"


# tool name -> (spelling of the path, args for that path)
TOOLS: dict[str, tuple[str, Callable[[str, Arena], dict[str, Any]]]] = {
    "snapshot_file": ("rel", lambda p, a: {"path": p}),
    "snapshot_list": ("rel", lambda p, a: {"path": p, "recursive": True}),
    "snapshot_grep": ("rel", lambda p, a: {"pattern": "CANARY", "paths": [p]}),
    "snapshot_create": ("rel", lambda p, a: {"paths": [p]}),
    "snapshot_export": ("rel", lambda p, a: {"paths": [p]}),
    "snapshot_diff": ("rel", lambda p, a: {"base_snapshot_id": a.base_snapshot, "paths": [p]}),
    "workspace_write_file": ("rel", lambda p, a: {"path": p, "content": "PWNED", "create_dirs": True}),
    "workspace_delete": ("rel", lambda p, a: {"path": p, "recursive": True}),
    "workspace_apply_patch": ("rel", lambda p, a: {"patch": _patch_creating(p)}),
    "read_text_file": ("abs", lambda p, a: {"path": p}),
    "edit_text_file": ("abs", lambda p, a: {"path": p, "file_hash": SECRET_HASH,
                                             "ops": [{"op": "insert_after", "anchor": "0:", "content": "PWNED"}]}),
    "text_read": ("root", lambda p, a: {"path": p}),
    "text_replace": ("root", lambda p, a: {"path": p, "hash": SECRET_HASH, "lines": [1, 2],
                                           "old": SECRET.decode().rstrip("\n"), "new": "PWNED"}),
    "text_insert": ("root", lambda p, a: {"path": p, "hash": SECRET_HASH, "line": 1,
                                          "anchor": SECRET.decode().rstrip("\n"), "content": "PWNED"}),
    "text_append": ("root", lambda p, a: {"path": p, "hash": SECRET_HASH, "content": "PWNED"}),
    "file_create": ("root", lambda p, a: {"path": p, "content": "PWNED"}),
    "file_remove": ("root", lambda p, a: {"path": p, "hash": SECRET_HASH}),
    "get_schema": ("rel", lambda p, a: {"name": p}),
    "get_example": ("rel", lambda p, a: {"path": p}),
}


def spellings(path: str, style: str, ws: Path) -> list[str]:
    """The hostile path as a tool of this style would be given it, plus absolute forms."""
    forms = [path]
    if style == "root":
        forms.append("/" + path)
    if style == "abs":
        forms.append(f"{ws}/{path}")
    return forms


ABSOLUTE = ["/etc/passwd", "//etc/passwd", "/", "canary", "/../canary/secret.txt"]


def _absolutes(arena: Arena) -> list[str]:
    return [*ABSOLUTE, str(arena.canary / "secret.txt"), str(arena.canary), f"{arena.ws}/../canary/secret.txt",
            f"{arena.ws}/out/secret.txt", str(arena.canary / "new.txt")]


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_hostile_paths_give_structured_errors_and_leave_the_canary(arena: Arena, tool: str) -> None:
    style, make = TOOLS[tool]
    if tool == "snapshot_diff":
        arena.base_snapshot = attempt(arena.ctx, "snapshot_create", {}).result["snapshot_id"]
    before = arena.outside_digest()
    outcomes: dict[str, Outcome] = {}
    for hostile in HOSTILE:
        for path in spellings(hostile, style, arena.ws):
            outcomes[path] = attempt(arena.ctx, tool, make(path, arena))
    for path in _absolutes(arena):
        outcomes[path] = attempt(arena.ctx, tool, make(path, arena))
    assert arena.outside_digest() == before, tool
    assert (arena.canary / "secret.txt").read_bytes() == SECRET
    # A file read through a symlink to the canary never succeeds (writers may replace the
    # link itself, inside the workspace; the digest above shows the canary kept).
    if tool in ("snapshot_file", "read_text_file", "text_read"):
        for path in ("out/secret.txt", "outfile", "rel/secret.txt", "deep/up/secret.txt"):
            for form in spellings(path, style, arena.ws):
                out = outcomes[form]
                # snapshot_file names a symlink by its target, as git does; it never follows it.
                assert out.kind != "ok" or out.result.get("mode") == "120000", (tool, form, out)
    # Bad bytes in a path never reach the kernel as a success.
    for path in ("src/a\x00.txt", "\x00", "out\x00/x", "\ud800"):
        out = outcomes[path]
        assert out.kind in ("schema", "error") or (tool.startswith("get_") and not out.result["ok"]), (tool, path)
    assert len(outcomes) >= len(HOSTILE)


def test_list_resource_hostile_uris(arena: Arena) -> None:
    before = arena.outside_digest()
    tried = 0
    for hostile in [*HOSTILE, *_absolutes(arena)]:
        for uri in (f"list://{hostile}", f"list:///{hostile}"):
            tried += 1
            try:
                _mime, text = trio.run(rootspace_tools.list_resource, arena.ctx, uri)
            except CcwError as exc:
                assert exc.code != "INTERNAL", (uri, exc)
                continue
            listing = json.loads(text)
            names = {e["name"] for e in listing["entries"]}
            assert "secret.txt" not in names and "inner.txt" not in names, (uri, listing)
    assert arena.outside_digest() == before
    assert tried == 2 * (len(HOSTILE) + len(_absolutes(arena)))


def _swapper(ws: Path, canary: Path, stop: threading.Event) -> int:
    """Flip ws/swing between -> swing_real (inside) and -> canary (outside), atomically."""
    flips = 0
    while not stop.is_set():
        target = str(canary) if flips % 2 else "swing_real"
        tmp = ws / f".swing.{flips % 2}"
        os.symlink(target, tmp)
        os.replace(tmp, ws / "swing")
        flips += 1
    return flips


def test_symlink_swapped_between_check_and_use(arena: Arena) -> None:
    real = arena.ws / "swing_real"
    real.mkdir()
    (real / "secret.txt").write_bytes(INSIDE)
    os.symlink("swing_real", arena.ws / "swing")
    base = attempt(arena.ctx, "snapshot_create", {}).result["snapshot_id"]
    arena.base_snapshot = base
    before = arena.outside_digest()
    calls: list[tuple[str, dict[str, Any]]] = [
        ("text_read", {"path": "/swing/secret.txt"}),
        ("text_append", {"path": "/swing/secret.txt", "hash": SECRET_HASH, "content": "PWNED"}),
        ("file_create", {"path": "/swing/new.txt", "content": "PWNED"}),
        ("file_remove", {"path": "/swing/secret.txt", "hash": SECRET_HASH}),
        ("read_text_file", {"path": f"{arena.ws}/swing/secret.txt"}),
        ("edit_text_file", {"path": "swing/secret.txt", "file_hash": SECRET_HASH,
                            "ops": [{"op": "insert_after", "anchor": "0:", "content": "PWNED"}]}),
        ("snapshot_file", {"path": "swing/secret.txt"}),
        ("snapshot_list", {"path": "swing"}),
        ("workspace_write_file", {"path": "swing/new.txt", "content": "PWNED"}),
        ("workspace_apply_patch", {"patch": _patch_creating("swing/patched.txt")}),
        ("workspace_delete", {"path": "swing/secret.txt"}),
    ]
    stop = threading.Event()
    flips: list[int] = []
    thread = threading.Thread(target=lambda: flips.append(_swapper(arena.ws, arena.canary, stop)))
    thread.start()
    tried = 0
    try:
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            for name, args in calls:
                attempt(arena.ctx, name, args)
                tried += 1
    finally:
        stop.set()
        thread.join()
    assert flips and flips[0] > 10 and tried >= len(calls)
    assert arena.outside_digest() == before
    assert (arena.canary / "secret.txt").read_bytes() == SECRET and not (arena.canary / "new.txt").exists()


BAD_TEXT = ["\ud800", "a\udfffb", "\udc80", "ok\n\udcc0\udcaf\n"]


def test_lone_surrogates_in_content_are_invalid_arguments(arena: Arena) -> None:
    """JSON may carry "\\ud800"; content that is not UTF-8 text is refused, never INTERNAL."""
    (arena.ws / "t.txt").write_bytes(INSIDE)
    inside_hash = hashlib.sha256(INSIDE).hexdigest()
    tag = attempt(arena.ctx, "read_text_file", {"path": "t.txt"}).result["content"].split("|")[0]
    calls: list[Callable[[str], tuple[str, dict[str, Any]]]] = [
        lambda t: ("workspace_write_file", {"path": "w.txt", "content": t}),
        lambda t: ("workspace_apply_patch", {"patch": _patch_creating("p.txt").replace("PWNED", t)}),
        lambda t: ("file_create", {"path": "/c.txt", "content": t}),
        lambda t: ("text_replace", {"path": "/t.txt", "hash": inside_hash, "lines": [1, 2], "old": "inside", "new": t}),
        lambda t: ("text_insert", {"path": "/t.txt", "hash": inside_hash, "line": 1, "anchor": "inside", "content": t}),
        lambda t: ("text_append", {"path": "/t.txt", "hash": inside_hash, "content": t}),
        lambda t: ("edit_text_file", {"path": "t.txt", "file_hash": inside_hash,
                                      "ops": [{"op": "replace", "anchor": tag, "content": t}]}),
        lambda t: ("edit_text_file", {"path": "t.txt", "file_hash": inside_hash, "ops": [f"replace {tag} with '{t}'"]}),
        lambda t: ("snapshot_grep", {"pattern": t}),
    ]
    tried = 0
    for text in BAD_TEXT:
        for make in calls:
            name, args = make(text)
            out = attempt(arena.ctx, name, args)
            tried += 1
            if out.kind == "ok":
                # Only where surrogate escapes name raw bytes (seed 000 content, grep).
                assert name in ("workspace_write_file", "workspace_apply_patch", "snapshot_grep"), (name, text)
                assert "\ud800" not in text and "\udfff" not in text, (name, text)
    assert (arena.ws / "t.txt").read_bytes() == INSIDE
    assert tried == len(BAD_TEXT) * len(calls)

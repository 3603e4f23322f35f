"""Tool-level attacks on capsules, through a real embedded helper (issue 9).

capsule_create's workspace and base, capsule_exec's cwd, the file tools with a
capsule_id, workspace_apply_patch into a capsule, capsule_promote of capsules holding
symlinks that point outside (and of a capsule whose live tree grew a symlink where the
capsule wrote a directory), and witness_verify / capsule_replay given hostile paths.
Every attempt ends as a schema refusal, a CcwError that is not INTERNAL, or a result;
the canary directory beside the workspace stays byte-identical throughout.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from sandbox.errors import CcwError
from tests.support.canary import SECRET, hostile_patches, plant, tree_digest

HOSTILE_DIRS = [
    "\x00", "/tmp\x00/x", "\ud800", "\udc80", "a" * 5000, "/" + "n" * 300, "relative/dir", "..", "~nobody-here/x",
    "/nonexistent/ccw/attack", "C:\\x", "\\\\server\\share", "/proc/self/root", "/dev/null",
]
HOSTILE_CWDS = [
    "..", "../..", "a/../../..", "/etc", "/", "\x00", "\ud800", "C:\\", "\\\\server\\share", "n" * 300,
    "/".join(["x" * 255] * 20), "out", "d", "up/..", "~", "/proc/self/cwd",
]


class Attacks:
    """Runs attempts through the ToolRunner and counts them."""

    def __init__(self, t: Any) -> None:
        self.t = t
        self.tried = 0

    async def attempt(self, name: str, args: dict[str, Any]) -> tuple[str, Any]:
        """('schema', None), ('error', code) or ('ok', result); anything else fails the test."""
        self.tried += 1
        spec = self.t.registry.lookup(name)
        if any(True for _ in jsonschema.Draft202012Validator(spec.input_schema).iter_errors(args)):
            return "schema", None
        try:
            result = await spec.handler(self.t.ctx, args)
        except CcwError as exc:
            assert exc.code != "INTERNAL", (name, args, exc)
            return "error", exc.code
        jsonschema.Draft202012Validator(spec.output_schema).validate(result)
        assert SECRET not in str(result), (name, args)
        return "ok", result


@pytest.fixture
def arena(tmp_path: Path) -> tuple[Path, Path]:
    ws = tmp_path / "ws"
    ws.mkdir()
    plant(ws, tmp_path / "canary")
    return ws, tmp_path / "canary"


def test_capsule_create_and_exec_cwd_hostile(tools: Any, arena: tuple[Path, Path], tmp_path: Path,
                                             record_property: Any) -> None:
    ws, canary = arena
    before = tree_digest(canary)

    async def scenario(t: Any) -> int:
        a = Attacks(t)
        for hostile in HOSTILE_DIRS:
            for args in ({"workspace": hostile}, {"workspace": str(ws), "base": hostile}):
                kind, result = await a.attempt("capsule_create", args)
                if kind == "ok":
                    await t.call("capsule_destroy", {"capsule_id": result["capsule_id"]})
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        made = await t.call("capsule_exec", {"capsule_id": cap, "cmd": [
            "sh", "-c", f"ln -s {canary} d && ln -s .. up && mkdir real && echo in > real/y"]})
        assert made["exit_code"] == 0, made
        for cwd in HOSTILE_CWDS:
            kind, result = await a.attempt("capsule_exec", {
                "capsule_id": cap, "cwd": cwd,
                "cmd": ["sh", "-c", "pwd; echo PWNED > pwned.txt; echo PWNED >> secret.txt; cat secret.txt"]})
            if kind == "ok":
                assert SECRET not in result["stdout"], (cwd, result)
        await t.call("capsule_destroy", {"capsule_id": cap})
        return a.tried

    tried = tools.run(scenario)
    assert tree_digest(canary) == before
    assert not (ws / "d").exists() and not (ws / "pwned.txt").exists()  # nothing promoted
    record_property("attacks_tried", tried)


def test_file_tools_and_patches_inside_a_capsule(tools: Any, arena: tuple[Path, Path], record_property: Any) -> None:
    ws, canary = arena
    before = tree_digest(canary)
    secret_hash = hashlib.sha256((SECRET + "\n").encode()).hexdigest()
    paths = ["../canary/secret.txt", "out/secret.txt", "outfile", "rel/secret.txt", "d/secret.txt", "d/new.txt",
             "up/canary/secret.txt", "\x00", "\ud800", "/".join(["z" * 255] * 17), "C:\\x", "~/x"]

    async def scenario(t: Any) -> int:
        a = Attacks(t)
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", f"ln -s {canary} d && ln -s .. up"]})
        for path in paths:
            for name, args in (
                ("snapshot_file", {"capsule_id": cap, "path": path}),
                ("workspace_write_file", {"capsule_id": cap, "path": path, "content": "PWNED", "create_dirs": True}),
                ("workspace_delete", {"capsule_id": cap, "path": path}),
                ("text_read", {"capsule_id": cap, "path": "/" + path}),
                ("text_append", {"capsule_id": cap, "path": "/" + path, "hash": secret_hash, "content": "PWNED"}),
                ("file_create", {"capsule_id": cap, "path": "/" + path, "content": "PWNED"}),
                ("file_remove", {"capsule_id": cap, "path": "/" + path, "hash": secret_hash}),
                ("read_text_file", {"capsule_id": cap, "path": path}),
            ):
                await a.attempt(name, args)  # a read may see what an earlier write put in the capsule
        for patch in hostile_patches(str(canary)).values():
            await a.attempt("workspace_apply_patch", {"capsule_id": cap, "patch": patch})
        # Whatever the capsule now holds, promoting it writes nothing outside the workspace.
        await a.attempt("capsule_promote", {"capsule_id": cap, "policies": []})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return a.tried

    tried = tools.run(scenario)
    assert tree_digest(canary) == before
    assert os.readlink(ws / "out") == str(canary)
    record_property("attacks_tried", tried)


def test_promotion_never_writes_through_links(tools: Any, arena: tuple[Path, Path], record_property: Any) -> None:
    """Links a capsule made are promoted as links; a link the live tree grew is not followed."""
    ws, canary = arena
    before = tree_digest(canary)

    async def scenario(t: Any) -> tuple[int, list[tuple[str, Any]]]:
        a = Attacks(t)
        outcomes = []
        # 1. The capsule itself holds links pointing outside, beside real files.
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c",
            f"ln -s {canary} d && ln -s {canary}/secret.txt f && ln -s .. up && mkdir real && echo in > real/y"]})
        outcomes.append(await a.attempt("capsule_promote", {"capsule_id": cap, "policies": []}))
        # 1b. The capsule replaced the link 'outfile' (to the canary's file) with a directory of files.
        cap1b = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap1b, "cmd": ["sh", "-c",
            "rm outfile out && mkdir outfile out && echo PWNED > outfile/x && echo PWNED > out/secret.txt"]})
        await a.attempt("capsule_promote", {"capsule_id": cap1b, "policies": []})
        # 2. The capsule writes d2/x and g; meanwhile the live tree makes d2 and g links to the canary.
        cap2 = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap2, "cmd": ["sh", "-c",
            "mkdir -p d2/sub && echo PWNED > d2/x && echo PWNED > d2/sub/y && echo PWNED > g "
            "&& echo PWNED > src/a.txt"]})
        os.symlink(str(canary), ws / "d2")
        os.symlink(str(canary / "secret.txt"), ws / "g")
        outcomes.append(await a.attempt("capsule_promote", {"capsule_id": cap2, "policies": []}))
        # 3. The live tree turns src/ into a link to the canary after the capsule changed src/a.txt.
        os.rename(ws / "src", ws / "src.moved")
        os.symlink(str(canary), ws / "src")
        outcomes.append(await a.attempt("capsule_promote", {"capsule_id": cap2, "policies": []}))
        for capsule in (cap, cap1b, cap2):
            await t.call("capsule_destroy", {"capsule_id": capsule})
        return a.tried, outcomes

    tried, outcomes = tools.run(scenario)
    assert tree_digest(canary) == before, outcomes
    assert not (canary / "x").exists() and not (canary / "sub").exists()
    assert outcomes[0][0] == "ok" and outcomes[0][1]["promoted"] is True, outcomes[0]
    assert os.readlink(ws / "d") == str(canary) and (ws / "real" / "y").read_text() == "in\n"
    assert os.readlink(ws / "d2") == str(canary) and os.readlink(ws / "g") == str(canary / "secret.txt")
    record_property("attacks_tried", tried)


def test_witness_paths_hostile(tools: Any, arena: tuple[Path, Path], tmp_path: Path, record_property: Any) -> None:
    ws, canary = arena
    before = tree_digest(canary)
    (tmp_path / "garbage.tar.zst").write_bytes(b"\x28\xb5\x2f\xfd" + os.urandom(64))
    paths = ["/etc/passwd", str(canary / "secret.txt"), str(canary), "\x00", "\ud800", "../../../etc/shadow",
             "relative.tar.zst", "/dev/null", "/proc/self/environ", str(tmp_path / "garbage.tar.zst"),
             str(ws / "out" / "secret.txt"), "C:\\w.tar.zst", "~/w.tar.zst", "/" + "w" * 5000]

    async def scenario(t: Any) -> int:
        a = Attacks(t)
        for path in paths:
            for name in ("witness_verify", "capsule_replay"):
                kind, result = await a.attempt(name, {"path": path})
                assert kind != "ok" or result.get("valid", result.get("replay_ok")) is not True, (name, path, result)
        return a.tried

    tried = tools.run(scenario)
    assert tree_digest(canary) == before
    record_property("attacks_tried", tried)


def test_promotion_while_a_link_is_swapped_in_and_out(tools: Any, arena: tuple[Path, Path],
                                                      record_property: Any) -> None:
    """A thread flips ws/sw between a real directory and a link to the canary while capsules
    that write sw/x (and sw/sub/y) are promoted one after another, for two seconds."""
    ws, canary = arena
    (ws / "sw_real").mkdir()
    os.symlink("sw_real", ws / "sw")
    before = tree_digest(canary)
    stop = threading.Event()

    def swap() -> None:
        flips = 0
        while not stop.is_set():
            tmp = ws / f".sw.{flips % 2}"
            os.symlink(str(canary) if flips % 2 else "sw_real", tmp)
            os.replace(tmp, ws / "sw")
            flips += 1

    async def scenario(t: Any) -> int:
        a = Attacks(t)
        thread = threading.Thread(target=swap)
        thread.start()
        try:
            deadline = time.monotonic() + 2.0
            n = 0
            while time.monotonic() < deadline:
                cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
                await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c",
                    f"rm -f sw && mkdir -p sw/sub && echo PWNED{n} > sw/x && echo PWNED > sw/sub/y"]})
                await a.attempt("capsule_promote", {"capsule_id": cap, "policies": []})
                await a.attempt("workspace_write_file", {"capsule_id": cap, "path": "sw/z", "content": "PWNED"})
                await t.call("capsule_destroy", {"capsule_id": cap})
                n += 1
        finally:
            stop.set()
            thread.join()
        return a.tried

    tried = tools.run(scenario)
    assert tree_digest(canary) == before
    assert not (canary / "x").exists() and not (canary / "sub").exists()
    record_property("attacks_tried", tried)

"""Promotion scope on a real project (issue 25 item 4), as root.

more-itertools with its own .venv runs its tests in a capsule without pytest's
``-B``/``-p no:cacheprovider``, so the capsule holds ``__pycache__/`` and
``.pytest_cache/`` beside a source edit.  The workspace ignores them as a developer's
checkout does (here through ``.git/info/exclude``): the edit lands, they are left
behind and listed in ``skipped``; ``include_ignored``, ``paths`` and ``exclude`` select,
through the tool and through ``ccw capsule promote``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.support import realprojects
from tests.support.cli_process import ccw

PROJECT = realprojects.MORE_ITERTOOLS
EDIT = PROJECT.harmless[0]
TESTS = [".venv/bin/python", "-m", "pytest", "-q", "tests/test_more.py", "-k", "Chunked"]


def _workspace(tmp_path: Path) -> Path:
    ws = realprojects.pristine(PROJECT, tmp_path / "ws")
    with open(ws / ".git" / "info" / "exclude", "a") as exclude:
        exclude.write("__pycache__/\n.pytest_cache/\n")
    return ws


async def _capsule(call: Any, ws: Path) -> str:
    cap = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    ran = await call("capsule_exec", {"capsule_id": cap, "cmd": TESTS, "timeout_ms": 300_000})
    assert ran["exit_code"] == 0, ran
    edit = (f"import pathlib; p = pathlib.Path({EDIT.path!r}); "
            f"p.write_text(p.read_text().replace({EDIT.old!r}, {EDIT.new!r}))")
    done = await call("capsule_exec", {"capsule_id": cap, "cmd": [".venv/bin/python", "-c", edit]})
    assert done["exit_code"] == 0, done
    return str(cap)


def _reasons(result: dict[str, Any]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for s in result["skipped"]:
        out.setdefault(s["reason"], set()).add(s["path"].split("/")[0] if s["path"].startswith(".") else s["path"])
    return out


def test_ignored_build_output_is_left_behind(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> None:
        cap = await _capsule(t.call, ws)
        dry = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True})
        assert dry["applied"] == [EDIT.path], dry["applied"]
        skipped = {s["path"] for s in dry["skipped"] if s["reason"] == "ignored"}
        assert ".pytest_cache" in skipped and any("__pycache__" in p for p in skipped), skipped
        only_readme = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True, "paths": ["README.rst"]})
        assert only_readme["applied"] == [] and {s["reason"] for s in only_readme["skipped"]} >= {"not in paths"}
        excluded = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True, "exclude": ["more_itertools"]})
        assert excluded["applied"] == [] and {"path": EDIT.path, "reason": "excluded"} in excluded["skipped"]
        everything = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True, "include_ignored": True})
        assert EDIT.path in everything["applied"] and ".pytest_cache" in everything["applied"]
        assert everything["skipped"] == []
        done = await t.call("capsule_promote", {"capsule_id": cap})
        assert done["promoted"] and done["applied"] == [EDIT.path], done["applied"]
        assert {s["path"] for s in done["skipped"]} == {s["path"] for s in dry["skipped"]}

    tools.run(scenario)
    assert EDIT.new in (ws / EDIT.path).read_text()
    assert not (ws / ".pytest_cache").exists()
    assert not list(ws.glob("**/__pycache__")) or all(".venv" in str(p) for p in ws.glob("**/__pycache__"))


def test_include_ignored_promotes_them(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> None:
        cap = await _capsule(t.call, ws)
        done = await t.call("capsule_promote", {"capsule_id": cap, "include_ignored": True})
        assert done["promoted"] and done["skipped"] == []

    tools.run(scenario)
    assert (ws / ".pytest_cache").is_dir() and (ws / "tests" / "__pycache__").is_dir()


def test_cli_flags(cli_state: Path, tmp_path: Path) -> None:
    assert shutil.which("git")
    ws = _workspace(tmp_path)
    cap = ccw(cli_state, "capsule", "create", str(ws)).stdout.strip()
    ccw(cli_state, "capsule", "exec", cap, "--timeout-ms", "300000", "--", *TESTS)
    dry = ccw(cli_state, "capsule", "promote", cap, "--dry-run")
    assert "ignored files: " in dry.stderr and "--include-ignored" in dry.stderr, dry.stderr
    assert dry.stdout.strip() == ""  # the test run wrote only ignored files
    picked = ccw(cli_state, "capsule", "promote", cap, "--include-ignored", "--path", "tests/**",
                 "--exclude", "**/*.pyc")
    assert "excluded files" in picked.stderr and "files not in --path" in picked.stderr, picked.stderr
    assert not (ws / ".pytest_cache").exists()
    assert not list(ws.glob("tests/__pycache__/*.pyc"))


def test_a_second_promotion_of_the_same_capsule(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    readme = PROJECT.harmless[1]

    async def scenario(t: Any) -> None:
        cap = await _capsule(t.call, ws)
        edit = (f"import pathlib; p = pathlib.Path({readme.path!r}); "
                f"p.write_text(p.read_text().replace({readme.old!r}, {readme.new!r}))")
        assert (await t.call("capsule_exec", {"capsule_id": cap,
                                              "cmd": [".venv/bin/python", "-c", edit]}))["exit_code"] == 0
        first = await t.call("capsule_promote", {"capsule_id": cap, "paths": ["more_itertools/**"]})
        assert first["applied"] == [EDIT.path]
        # The capsule's base is the live tree: the path promoted is no change any more, so
        # a second promotion writes the rest and finds no conflict.
        dry = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True, "include_ignored": True,
                                               "paths": ["*.rst", "more_itertools/*.py"]})
        assert dry["applied"] == [readme.path], dry["applied"]
        second = await t.call("capsule_promote", {"capsule_id": cap})
        assert second["applied"] == [readme.path], second["applied"]

    tools.run(scenario)
    assert EDIT.new in (ws / EDIT.path).read_text() and readme.new in (ws / readme.path).read_text()


def test_a_hazard_left_behind_blocks_nothing(tools: Any, tmp_path: Path) -> None:
    """Hazards are judged on what is promoted: a setuid file in an ignored build dir, or in an
    excluded path, stays behind without refusing the edit; promoted, it is refused."""
    ws = tmp_path / "hazard"
    ws.mkdir()
    (ws / "main.c").write_text("int main(void) { return 0; }\n")
    (ws / ".gitignore").write_text("build/\n")
    assert subprocess.run(["git", "init", "-q", str(ws)], check=False).returncode == 0
    make = "mkdir -p build tools && echo '#!/bin/sh' > build/tool && chmod 4755 build/tool " \
           "&& cp build/tool tools/tool && echo '/* v2 */' >> main.c"

    async def scenario(t: Any) -> None:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        assert (await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", make]}))["exit_code"] == 0
        whole = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True, "include_ignored": True})
        kinds = {h["kind"] for h in whole["policy_report"]["hazards"]}
        assert whole["promoted"] is False and kinds == {"setuid"}, whole["policy_report"]
        tools_dir = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True})
        assert tools_dir["promoted"] is False  # build/ is ignored, but tools/tool is promoted and refused
        done = await t.call("capsule_promote", {"capsule_id": cap, "exclude": ["tools/**"]})
        assert done["promoted"] is True and done["applied"] == ["main.c"], done
        assert {s["path"] for s in done["skipped"]} >= {"build", "tools/tool"}, done["skipped"]

    tools.run(scenario)
    assert "v2" in (ws / "main.c").read_text()
    assert not (ws / "build").exists() and not (ws / "tools").exists()


def test_pytests_own_cache_is_left_behind_without_an_ignore_rule(tools: Any, tmp_path: Path) -> None:
    """A checkout that ignores only __pycache__/: pytest marks .pytest_cache/ with a .gitignore
    of '*', as git on the host would honour; promotion leaves it behind all the same."""
    ws = realprojects.pristine(PROJECT, tmp_path / "ws")
    with open(ws / ".git" / "info" / "exclude", "a") as exclude:
        exclude.write("__pycache__/\n")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = await _capsule(t.call, ws)
        done: dict[str, Any] = await t.call("capsule_promote", {"capsule_id": cap})
        return done

    done = tools.run(scenario)
    assert done["promoted"] and done["applied"] == [EDIT.path], done["applied"]
    assert {s["path"]: s["reason"] for s in done["skipped"]}[".pytest_cache"] == "ignored"
    assert not (ws / ".pytest_cache").exists()

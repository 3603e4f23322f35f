"""A replay judges what promotion would carry (issue 39), on minimist from the npm registry.

minimist's own ``npm run tests-only`` is ``nyc tape 'test/**/*.js'``: nyc writes
``.nyc_output/<random>.json`` and a ``coverage/`` report whose files can differ in
content on every run.  The repository ignores both (its ``.gitignore``, which
npm's tarball leaves out and the preparation puts back), so promotion leaves them behind,
and the witness replays ``replay_ok: true`` with no volatile glob given, listing them under
``ignored_differences``.  With ``strict_outputs`` they are compared: the replay fails, and
each coverage file whose bytes differ (the html report is stamped with the time of the run)
gets a suggested glob, as the random names do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support import realprojects

VERSION = "1.2.8"
# minimist's .gitignore as its repository has it (npm's tarball leaves it out).
GITIGNORE = ("# gitignore\n\nnode_modules\n\ncoverage/\n.nyc_output/\n\n# Only apps should have lockfiles\n"
             "npm-shrinkwrap.json\npackage-lock.json\nyarn.lock\n\n.npmignore\n")


def _prepare_minimist(downloads: Path, ws: Path) -> None:
    """The published package, its repository's .gitignore, and its devDependencies (nyc, tape ...)."""
    npm = list(realprojects.NPM_FLAGS)
    realprojects.run(["npm", "pack", f"minimist@{VERSION}", "--pack-destination", str(downloads), *npm], cwd=downloads)
    realprojects._unpack(downloads / f"minimist-{VERSION}.tgz", ws)
    (ws / ".gitignore").write_text(GITIGNORE)
    realprojects.run(["npm", "install", "--no-package-lock", "--ignore-scripts", *npm], cwd=ws)


MINIMIST = realprojects.Project(
    name="minimist", ecosystem="npm", version=VERSION, prepare=_prepare_minimist,
    test_cmd=("npm", "run", "tests-only"), full_cmd=("npm", "run", "tests-only"),
    harmless=(realprojects.Edit("index.js", "'use strict';", "'use strict'; // parse argv"),
              realprojects.Edit("CHANGELOG.md", "# Changelog", "# Changelog of minimist")),
    breaking=realprojects.Edit("index.js", "\treturn argv;", "\treturn {};"),
)


def _witness(tools: Any, ws: Path) -> dict[str, Any]:
    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": list(MINIMIST.test_cmd), "timeout_ms": 240_000})
        assert ran["exit_code"] == 0, ran
        return await t.call("capsule_witness", {"capsule_id": cap})

    made: dict[str, Any] = tools.run(record)
    return made


def _replay(tools: Any, made: dict[str, Any], **args: Any) -> dict[str, Any]:
    out: dict[str, Any] = tools.run(lambda t: t.call("capsule_replay", {"witness_id": made["witness_id"], **args}))
    return out


def _paths(mismatches: list[dict[str, Any]]) -> set[str]:
    return {m["path"] for m in mismatches if m["kind"] == "change"} | {
        p for m in mismatches if m.get("field") == "written" for p in m["expected_only"] + m["actual_only"]}


def test_nyc_outputs_promotion_leaves_behind_do_not_fail_the_replay(tools: Any, tmp_path: Path) -> None:
    ws = realprojects.pristine(MINIMIST, tmp_path / "ws")
    made = _witness(tools, ws)
    out = _replay(tools, made)
    assert out["replay_ok"] is True and out["volatile"]["globs"] == [], out["mismatches"]
    apart = _paths(out["ignored_differences"])
    # nyc's html report is stamped with the time of the run: its bytes differ on every run.
    assert "coverage/index.html" in apart, out["ignored_differences"]
    assert any(p.startswith(".nyc_output/") and p.endswith(".json") for p in apart), apart
    assert all(p.startswith(("coverage/", ".nyc_output/", "node_modules/")) for p in apart), apart

    strict = _replay(tools, made, strict_outputs=True)
    assert strict["replay_ok"] is False and "ignored_differences" not in strict
    # What differs is nyc's alone; which coverage files differ varies (coverage-final.json on some runs only).
    compared = _paths(strict["mismatches"])
    assert "coverage/index.html" in compared, strict["mismatches"]
    assert all(p.startswith(("coverage/", ".nyc_output/")) for p in compared), compared
    report = [m for m in strict["mismatches"] if m["kind"] == "change" and m["path"].startswith("coverage/")]
    assert report and all(m["suggest_volatile"] == [m["path"]] for m in report), report
    suggested = {glob for m in strict["mismatches"] for glob in m.get("suggest_volatile", ())}
    assert ".nyc_output/*.json" in suggested and "coverage/index.html" in suggested, strict["mismatches"]

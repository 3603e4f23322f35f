"""Volatile outputs (issue 25 item 5): a run that names a file at random replays once declared.

A coverage tool in the style of nyc writes ``.nyc_output/<uuid>.json`` on every run, so
its witness could never replay with the same written set.  Through the real tools: the
replay fails and suggests the glob; a capsule created with it, or a replayer naming it,
replays ``replay_ok: true`` with the random paths listed apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

COVER = """\
import json, os, uuid
os.makedirs(".nyc_output", exist_ok=True)
with open(os.path.join(".nyc_output", str(uuid.uuid4()) + ".json"), "w") as f:
    json.dump({"lines": 3}, f)
with open("report.txt", "w") as f:
    f.write("3 lines covered\\n")
"""
GLOB = ".nyc_output/*.json"


def _project(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    ws.mkdir()
    (ws / "cover.py").write_text(COVER)
    return ws


def _witness(tools: Any, ws: Path, create: dict[str, Any], cmd: list[str] | None = None) -> dict[str, Any]:
    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws), **create}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": cmd or ["/usr/bin/python3", "cover.py"]})
        assert ran["exit_code"] == 0, ran
        return await t.call("capsule_witness", {"capsule_id": cap})

    made: dict[str, Any] = tools.run(record)
    return made


def _replay(tools: Any, made: dict[str, Any], **args: Any) -> dict[str, Any]:
    out: dict[str, Any] = tools.run(lambda t: t.call("capsule_replay", {"witness_id": made["witness_id"], **args}))
    return out


def _apart(out: dict[str, Any]) -> list[tuple[bool, bool]]:
    paths = out["volatile"]["paths"]
    assert all(p["path"].startswith(".nyc_output/") and p["path"].endswith(".json") for p in paths), paths
    return sorted((p["recorded"], p["replayed"]) for p in paths if p["exec"] is not None)


def test_a_random_output_name_fails_the_replay_and_suggests_the_glob(tools: Any, tmp_path: Path) -> None:
    made = _witness(tools, _project(tmp_path), {})
    out = _replay(tools, made)
    assert out["replay_ok"] is False and out["output_identical"] is True
    written = [m for m in out["mismatches"] if m.get("field") == "written"]
    assert len(written) == 1 and written[0]["suggest_volatile"] == [GLOB], out["mismatches"]
    assert {m["path"] for m in out["mismatches"] if m["kind"] == "change"} == {
        *written[0]["expected_only"], *written[0]["actual_only"]}
    assert out["volatile"] == {"globs": [], "paths": []}


def test_a_capsule_created_with_the_glob_replays_and_lists_the_paths_apart(tools: Any, tmp_path: Path) -> None:
    made = _witness(tools, _project(tmp_path), {"volatile": [GLOB]})
    out = _replay(tools, made)
    assert out["replay_ok"] is True, out["mismatches"]
    assert out["volatile"]["globs"] == [GLOB]
    assert _apart(out) == [(False, True), (True, False)]


def test_a_replayer_may_declare_the_glob_for_an_old_witness(tools: Any, tmp_path: Path) -> None:
    made = _witness(tools, _project(tmp_path), {})
    out = _replay(tools, made, volatile=[GLOB])
    assert out["replay_ok"] is True, out["mismatches"]
    assert _apart(out) == [(False, True), (True, False)]
    # What the glob does not cover is still compared: report.txt is the same, so nothing else is listed.
    assert out["mismatches"] == []


def test_a_policy_replay_ignores_the_capsules_own_globs(tools: Any, tmp_path: Path) -> None:
    """``volatile: ["**"]`` is the agent's word: promotion's require_replay_ok still compares every file."""
    ws = _project(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws), "volatile": ["**"]}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["/usr/bin/python3", "cover.py"]})
        assert ran["exit_code"] == 0, ran
        own = await t.call("capsule_replay", {
            "witness_id": (await t.call("capsule_witness", {"capsule_id": cap}))["witness_id"]})
        assert own["replay_ok"] is True and own["volatile"]["globs"] == ["**"], own  # the replayer's view: declared
        promoted: dict[str, Any] = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["strict"],
                                                                    "dry_run": True})
        return promoted

    promoted = tools.run(scenario)
    report = promoted["policy_report"]
    assert promoted["promoted"] is False and report["replay_ok"] is False, report
    assert not (ws / ".nyc_output").exists()


def test_a_policys_own_globs_count_in_its_replay(tools: Any, tmp_path: Path) -> None:
    """The same capsule promotes once a policy (not the capsule) declares the random outputs."""
    ws = _project(tmp_path)

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        await t.call("policy_set", {"name": "coverage", "rules": {"require_replay_ok": True, "volatile": [GLOB]}})
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["/usr/bin/python3", "cover.py"]})
        assert ran["exit_code"] == 0, ran
        plain = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["strict"], "dry_run": True})
        declared = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["coverage"],
                                                    "include_ignored": True})
        return plain, declared

    plain, declared = tools.run(scenario)
    assert plain["promoted"] is False and plain["policy_report"]["replay_ok"] is False, plain
    assert declared["promoted"] is True and declared["policy_report"]["replay_ok"] is True, declared
    assert (ws / "report.txt").read_text() == "3 lines covered\n"
    assert len(list((ws / ".nyc_output").glob("*.json"))) == 1


def test_real_nyc_replays_once_its_outputs_are_declared(tools: Any, tmp_path: Path) -> None:
    """nyc itself (from npm) over a real package's tape suite: the replay fails and suggests
    globs for its random names; declared, the witness replays true."""
    from tests.support import realprojects

    ws = realprojects.pristine(realprojects.JSON_STABLE_STRINGIFY, tmp_path / "ws")
    realprojects.npm_install(ws, "nyc@17.1.0")
    made = _witness(tools, ws, {}, ["npx", "nyc", "--reporter=text-summary", "npm", "test"])
    failed = _replay(tools, made)
    assert failed["replay_ok"] is False
    suggested = sorted({glob for m in failed["mismatches"] for glob in m.get("suggest_volatile", ())})
    assert ".nyc_output/*.json" in suggested, failed["mismatches"]
    declared = _replay(tools, made, volatile=suggested)
    assert declared["replay_ok"] is True, declared["mismatches"]
    assert any(p["path"].startswith(".nyc_output/processinfo/") for p in declared["volatile"]["paths"])

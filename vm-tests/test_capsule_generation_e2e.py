"""A capsule's change generation through the real tools: the agent loop (tests pass and
write caches, an edit, tests fail and write caches, capsule_deltamin with the same
command) is minimised, not called flaky; a command that is flaky on the current
contents still is."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import CcwError

# A "test suite": writes its cache into the workspace on every run (as pytest does) and
# fails when src/calc.py is broken.
SUITE = ["sh", "-c", "mkdir -p .cache && date +%s%N > .cache/lastrun && ! grep -q BROKEN src/calc.py"]


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (ws / "README").write_text("calc\n")
    return ws


def test_the_agent_loop_is_minimised_not_called_flaky(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        created = await t.call("capsule_create", {"workspace": str(ws)})
        cap = created["capsule_id"]
        assert created["generation"] == 0
        passed = await t.call("capsule_exec", {"capsule_id": cap, "cmd": SUITE})
        assert passed["exit_code"] == 0
        assert (passed["started_generation"], passed["generation"]) == (0, 1)  # it wrote its cache
        await t.call("workspace_write_file", {"capsule_id": cap, "path": "README", "content": "calc, documented\n"})
        await t.call("workspace_write_file", {"capsule_id": cap, "path": "src/calc.py",
                                              "content": "def add(a, b):\n    return a - b  # BROKEN\n"})
        failed = await t.call("capsule_exec", {"capsule_id": cap, "cmd": SUITE})
        assert failed["exit_code"] == 1
        assert (failed["started_generation"], failed["generation"]) == (3, 4)
        listed = {c["capsule_id"]: c for c in (await t.call("capsule_list", {}))["capsules"]}
        assert listed[cap]["generation"] == 4 and listed[cap]["execs"] == 2
        # Before generations, the passing run before the edit counted as an observation
        # of the current change: "CONFLICT: target_cmd is flaky (full change: fail, pass, fail)".
        return await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": SUITE})

    out = tools.run(scenario)
    assert out["units"] == ["src/calc.py"] and out["replay_ok"] is True
    assert "BROKEN" in out["minimal_patch"] and "README" not in out["minimal_patch"]


def test_a_command_flaky_on_the_current_contents_is_still_refused(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    # Fails on every other run, whatever the contents: it keeps its state in the jail's
    # $HOME, which is not part of the capsule's contents (no generation change).
    flip = ["sh", "-c", "if [ -e ~/flip ]; then rm ~/flip; exit 1; fi; touch ~/flip"]

    async def scenario(t: Any) -> tuple[list[dict[str, Any]], CcwError]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("workspace_write_file", {"capsule_id": cap, "path": "src/calc.py", "content": "BROKEN\n"})
        runs = [await t.call("capsule_exec", {"capsule_id": cap, "cmd": flip}) for _ in range(2)]
        with pytest.raises(CcwError) as info:
            await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": flip})
        return runs, info.value

    runs, err = tools.run(scenario)
    assert [r["exit_code"] for r in runs] == [0, 1]
    assert [(r["started_generation"], r["generation"]) for r in runs] == [(1, 1), (1, 1)]
    assert err.code == "CONFLICT" and "flaky" in err.message
    assert err.details["generation"] == 1 and err.details["journaled"] == 2

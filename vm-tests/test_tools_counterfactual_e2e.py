"""capsule_deltamin and capsule_commutativity on generated workspaces, through real capsules."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import CcwError

N = 32


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for i in range(N):
        (ws / f"f{i:02}.txt").write_text("ok\n")
    return ws


def _check_cmd(culprits: list[int]) -> list[str]:
    # Reads every file (so read-set evidence cannot single out the culprits) and fails
    # only when every culprit file says BAD: k culprits that fail only together.
    files = " ".join(f"f{i:02}.txt" for i in culprits)
    return ["sh", "-c", f"cat f*.txt >/dev/null; for f in {files}; do grep -q BAD $f || exit 0; done; exit 1"]


def _change_all(culprits: list[int]) -> list[str]:
    script = "; ".join(
        f"echo {'BAD' if i in culprits else 'fine'} >> f{i:02}.txt" for i in range(N)
    )
    return ["sh", "-c", script]


def _git_apply(ws: Path, patch: str) -> None:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    subprocess.run(["git", "init", "-q"], cwd=ws, check=True, env=env)
    done = subprocess.run(["git", "apply", "-"], cwd=ws, input=patch.encode(), capture_output=True, env=env,
                          check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("culprits", [[7], [3, 29], [0, 16, 31]])
def test_deltamin_finds_exactly_the_culprits(tools: Any, tmp_path: Path, culprits: list[int]) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": _change_all(culprits)})
        failing = await t.call("capsule_exec", {"capsule_id": cap, "cmd": _check_cmd(culprits)})
        assert failing["exit_code"] == 1
        return await t.call("capsule/deltamin", {
            "capsule_id": cap, "target_cmd": _check_cmd(culprits), "failure_predicate": "exit_code",
            "budget_ms": 300_000,
        })

    out = tools.run(scenario)
    assert out["units"] == [f"f{i:02}.txt" for i in culprits]
    assert out["one_minimal"] is True and out["replay_ok"] is True
    assert out["root_hash"].startswith("blake3:")
    _git_apply(ws, out["minimal_patch"])
    assert [i for i in range(N) if "BAD" in (ws / f"f{i:02}.txt").read_text()] == culprits
    assert not any("fine" in (ws / f"f{i:02}.txt").read_text() for i in range(N))


def test_deltamin_narrows_to_one_hunk_of_ten(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "big.txt").write_text("".join(f"line {i}\n" for i in range(100)))
    (ws / "other.txt").write_text("x\n")
    edits = "; ".join(f"sed -i 's/^line {i}$/{'BAD' if i == 45 else 'edited'} {i}/' big.txt" for i in range(5, 100, 10))
    check = ["sh", "-c", "! grep -q '^BAD 45$' big.txt"]

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", edits + "; echo y >> other.txt"]})
        return await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": check})

    out = tools.run(scenario)
    assert out["units"] == ["big.txt"] and out["one_minimal"]
    patch = out["minimal_patch"]
    assert "+BAD 45" in patch and "edited" not in patch and "other.txt" not in patch
    _git_apply(ws, patch)
    lines = (ws / "big.txt").read_text().splitlines()
    assert lines[45] == "BAD 45" and lines[5] == "line 5"


def test_budget_exhaustion_returns_a_smaller_failing_set(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    culprits = [0, 1]
    slow = ["sh", "-c", "sleep 0.4; " + _check_cmd(culprits)[2]]

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": _change_all(culprits)})
        return await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": slow, "budget_ms": 2500})

    out = tools.run(scenario)
    assert out["one_minimal"] is False
    assert {"f00.txt", "f01.txt"} <= set(out["units"]) and len(out["units"]) < N
    assert out["replay_ok"] is True


def test_a_flaky_command_is_reported_not_minimised(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)
    coin = ["sh", "-c", "test $(od -An -N1 -tu1 /dev/urandom) -lt 128"]

    async def scenario(t: Any) -> CcwError:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": _change_all([1])})
        with pytest.raises(CcwError) as info:
            await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": coin, "confirm_runs": 8})
        return info.value

    err = tools.run(scenario)
    assert err.code == "CONFLICT" and "flaky" in err.message


def test_nothing_to_minimise_is_said_plainly(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> CcwError:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": _change_all([])})
        with pytest.raises(CcwError) as info:
            await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": ["true"]})
        return info.value

    err = tools.run(scenario)
    assert err.code == "INVALID_ARGUMENT" and "does not fail" in err.message


def test_commutativity_matches_the_seed_example_structure(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    (ws / "tests").mkdir()
    (ws / "docs").mkdir()
    (ws / "src" / "__init__.py").write_text("")
    (ws / "src" / "shared.py").write_text("BASE = 1\n")
    (ws / "src" / "module_a.py").write_text("from src.shared import BASE\n\ndef a():\n    return BASE\n")
    (ws / "src" / "module_b.py").write_text("from src import shared\n\ndef b():\n    return shared.BASE\n")
    (ws / "tests" / "test_a.py").write_text("from src.module_a import a\n\ndef test_a():\n    assert a()\n")
    (ws / "tests" / "test_b.py").write_text("from src.module_b import b\n\ndef test_b():\n    assert b()\n")
    (ws / "docs" / "README.md").write_text("docs\n")
    edit = "; ".join(f"echo '# changed' >> {p}" for p in (
        "src/shared.py", "src/module_a.py", "src/module_b.py", "tests/test_a.py", "tests/test_b.py", "docs/README.md"))

    async def scenario(t: Any) -> list[dict[str, Any]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", edit]})
        first = await t.call("capsule/commutativity", {"capsule_id": cap})
        second = await t.call("capsule_commutativity", {"capsule_id": cap})
        return [first, second]

    first, second = tools.run(scenario)
    assert first == second  # deterministic
    assert first["independent_sets"] == [
        ["docs/README.md"],
        ["src/module_a.py", "tests/test_a.py"],
        ["src/module_b.py", "tests/test_b.py"],
    ]
    assert first["conflict_pairs"] == [["src/module_a.py", "src/shared.py"], ["src/module_b.py", "src/shared.py"]]
    kinds = {tuple(e["pair"]): e["kinds"] for e in first["evidence"]}
    assert kinds[("src/module_a.py", "tests/test_a.py")] == ["import"]


def test_commutativity_verify_measures_a_pair_that_fails_only_together(tools: Any, tmp_path: Path) -> None:
    # Trials in scratch capsules (capsules/commutativity.py through the local executor): each
    # change alone passes, both together fail, so verify links the pair by measurement.
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text("ok\n")
    check = ["sh", "-c", 'test "$(cat a.txt)$(cat b.txt)" != "xx"']

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec",
                     {"capsule_id": cap, "cmd": ["sh", "-c", "for f in a b c; do echo x > $f.txt; done"]})
        result: dict[str, Any] = await t.call("capsule_commutativity", {"capsule_id": cap, "target_cmd": check,
                                                                      "verify": True})
        return result

    result = tools.run(scenario)
    assert result["independent_sets"] == [["a.txt", "b.txt"], ["c.txt"]], result
    assert result["evidence"] == [{"pair": ["a.txt", "b.txt"], "kinds": ["measured"], "details": [
        {"kind": "measured", "detail": "alone: pass, pass; together: fail"}]}], result


MODULE = "".join(f"def f{i}():\n    return {i}\n\n" for i in range(40))


@pytest.mark.parametrize("points_at", ["culprit", "harmless"])
def test_deltamin_tries_the_hunk_a_traceback_names_first(tools: Any, tmp_path: Path, points_at: str) -> None:
    # Three hunks of one file; the failing run prints "m.py:LINE:" as a test runner does.
    # Pointing at the culprit, one trial settles it; pointing at a harmless hunk, the guess
    # passes and the search goes on to the same answer.
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "m.py").write_text(MODULE)
    culprit_line = 3 * 30 + 2  # "return 30" of f30
    named = culprit_line if points_at == "culprit" else 3 * 5 + 2
    check = ["sh", "-c", f"grep -q 'return -30' m.py || exit 0; echo 'm.py:{named}: AssertionError'; exit 1"]
    edited = MODULE.replace("return 5\n", "return 5  # five\n").replace("return 30\n", "return -30\n").replace(
        "return 12\n", "return 12  # twelve\n")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        assert (await t.call("capsule_exec", {"capsule_id": cap, "cmd": check}))["exit_code"] == 0
        await t.call("workspace_write_file", {"capsule_id": cap, "path": "m.py", "content": edited})
        assert (await t.call("capsule_exec", {"capsule_id": cap, "cmd": check}))["exit_code"] == 1
        return await t.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": check})

    out = tools.run(scenario)
    changed = [line for line in out["minimal_patch"].splitlines()
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == ["-    return 30", "+    return -30"]
    assert out["one_minimal"] is True
    if points_at == "culprit":
        assert out["trials"] == 1  # both ends came from the journal, the named hunk failed alone
    else:
        assert out["trials"] > 1

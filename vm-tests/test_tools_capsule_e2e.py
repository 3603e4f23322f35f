"""Capsule tools end to end on the real kernel: create, exec, diff, promote, witness, replay.

Every call goes through the tool handlers with schema checks on both sides, to a real
embedded helper (privileged), so these are the behaviours an agent sees.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import CcwError


def _git(cwd: Path, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}
    return subprocess.run(["git", *args], cwd=cwd, input=data, capture_output=True, env=env, check=False)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "mod.py").write_text("def f():\n    return 1\n")
    (ws / "tests").mkdir()
    (ws / "tests" / "test_mod.py").write_text("from src.mod import f\n\ndef test_f():\n    assert f() == 1\n")
    (ws / "README").write_text("readme\n")
    (ws / "old.txt").write_text("to be deleted\n")
    (ws / "data.bin").write_bytes(b"\0\1\2")
    return ws


def test_exec_diff_and_git_apply(tools: Any, workspace: Path, tmp_path: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = await t.call("capsule/create", {"workspace": str(workspace)})
        assert cap["capsule_id"].startswith("cap_") and cap["isolation"]
        script = (
            "cat README >/dev/null; echo 'def g(): pass' >> src/mod.py; rm old.txt; "
            "printf 'new\\n' > added.txt; printf '\\3\\0' >> data.bin; chmod +x README; ln -s README link"
        )
        ran = await t.call("capsule_exec", {"capsule_id": cap["capsule_id"], "cmd": ["sh", "-c", script]})
        assert ran["exit_code"] == 0 and not ran["timed_out"], ran
        if ran["touched"]["read"] is not None:
            assert "README" in ran["touched"]["read"]
        assert {"added.txt", "src/mod.py"} <= set(ran["touched"]["written"])
        diff = await t.call("capsule_diff", {"capsule_id": cap["capsule_id"], "format": "unified"})
        js = await t.call("capsule_diff", {"capsule_id": cap["capsule_id"], "format": "json"})
        listed = await t.call("capsule_list", {})
        await t.call("capsule_destroy", {"capsule_id": cap["capsule_id"]})
        after = await t.call("capsule_list", {})
        return {"diff": diff, "json": js, "listed": listed, "after": after, "cap": cap}

    out = tools.run(scenario)
    # The real tree is untouched until promotion.
    assert (workspace / "old.txt").exists() and not (workspace / "added.txt").exists()
    assert out["diff"]["summary"] == {"added": 2, "deleted": 1, "modified": 3}
    by_path = {f["path"]: f for f in out["json"]["files"]}
    assert by_path["data.bin"]["binary"] is True and by_path["README"]["new_mode"] == "100755"
    assert [c["capsule_id"] for c in out["listed"]["capsules"]] == [out["cap"]["capsule_id"]]
    assert out["after"]["capsules"] == []
    # The unified diff applies with git apply to a copy of the base and reproduces the capsule.
    copy = tmp_path / "copy"
    shutil.copytree(workspace, copy, symlinks=True)
    _git(copy, "init", "-q")
    applied = _git(copy, "apply", "-", data=out["diff"]["diff"].encode())
    assert applied.returncode == 0, applied.stderr
    assert (copy / "added.txt").read_text() == "new\n"
    assert (copy / "data.bin").read_bytes() == b"\0\1\2\3\0"
    assert os.readlink(copy / "link") == "README" and not (copy / "old.txt").exists()


def test_promotion_applies_everything_and_only_when_policies_pass(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        # dd's 4 MiB buffer is the jail's own memory, so the "tiny" policy below has a real peak to refuse
        # (sh's pages are mostly the page cache's and libc's, charged to whoever read them first).
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": [
            "sh", "-c", "echo v2 > README; rm old.txt; mkdir -p new/deep; "
                        "echo x > new/deep/f; dd if=/dev/zero of=/dev/null bs=4M count=1 2>/dev/null"]})
        dry = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True})
        failing = await t.call("policy_set",
                               {"name": "needs-tests", "rules": {"require_tests": ["test -f nonexistent"]}})
        blocked = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["baseline", "needs-tests"]})
        await t.call("policy_set", {"name": "no-readme", "rules": {"deny_paths": ["README"]}})
        denied = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["no-readme"]})
        await t.call("policy_set", {"name": "tiny", "rules": {"max_rss_mb": 1}})
        starved = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["tiny"]})
        done = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["baseline"]})
        return {"dry": dry, "failing": failing, "blocked": blocked, "denied": denied, "starved": starved, "done": done}

    out = tools.run(scenario)
    assert out["dry"]["promoted"] is False and "README" in out["dry"]["applied"]
    assert out["blocked"]["promoted"] is False and out["blocked"]["policy_report"]["tests_ok"] is False
    assert out["blocked"]["policy_report"]["test_failures"][0]["cmd"] == "test -f nonexistent"
    assert out["denied"]["policy_report"]["deny_paths"] == ["README"]
    assert out["starved"]["policy_report"]["resource_ok"] is False
    assert out["done"]["promoted"] is True and out["done"]["policy_report"]["passed"] is True
    assert (workspace / "README").read_text() == "v2\n"
    assert not (workspace / "old.txt").exists()
    assert (workspace / "new" / "deep" / "f").read_text() == "x\n"


def test_repo_changed_refuses_and_writes_nothing(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> CcwError:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "echo capsule > README; echo n > other"]})
        (workspace / "README").write_text("edited live\n")  # someone edits the real tree meanwhile
        with pytest.raises(CcwError) as info:
            await t.call("capsule_promote", {"capsule_id": cap})
        return info.value

    err = tools.run(scenario)
    assert err.code == "REPO_CHANGED" and err.details["paths"] == ["README"]
    [moved] = err.details["conflicts"]  # each state an object, not its JSON text quoted in the JSON
    assert moved["expected"]["kind"] == moved["actual"]["kind"] == "file", moved
    assert moved["expected"]["blake3"] != moved["actual"]["blake3"]
    assert (workspace / "README").read_text() == "edited live\n" and not (workspace / "other").exists()


@pytest.mark.parametrize("how", ["rm -rf docs", "rm -rf docs && mkdir docs", "rm -rf docs && echo f > docs"])
def test_an_edit_below_a_directory_the_capsule_removed_refuses_its_promotion(
        tools: Any, tmp_path: Path, how: str) -> None:
    # The capsule's change names the directory alone (deleted, emptied or replaced), while the
    # person edits a file in it and adds another: promoting it would delete both.
    ws = tmp_path / "ws"
    (ws / "docs").mkdir(parents=True)
    (ws / "docs" / "a.txt").write_text("a\n")

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", how]})
        out: dict[str, Any] = {"clean": await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True})}
        (ws / "docs" / "a.txt").write_text("a, edited live\n")
        (ws / "docs" / "new.txt").write_text("new\n")
        for name, call in (("promote", "capsule_promote"), ("dry", "capsule_promote")):
            try:
                await t.call(call, {"capsule_id": cap, "dry_run": name == "dry"})
            except CcwError as exc:
                out[name] = exc
        return out

    out = tools.run(scenario)
    assert out["clean"]["promoted"] is False and out["clean"]["policy_report"]["passed"] is True, out["clean"]
    for name in ("promote", "dry"):
        assert out[name].code == "REPO_CHANGED" and out[name].details["paths"] == ["docs/"], out[name]
        [moved] = out[name].details["conflicts"]
        assert (moved["expected"]["kind"], moved["actual"]["entries"]) == ("tree", 2), moved
    assert sorted(p.name for p in (ws / "docs").iterdir()) == ["a.txt", "new.txt"]
    assert (ws / "docs" / "a.txt").read_text() == "a, edited live\n"


def test_a_symlink_the_capsule_planted_is_promoted_as_a_link_never_written_through(tools: Any, workspace: Path,
                                                                                   tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", f"rm -rf src && ln -s {outside} src"]})
        return await t.call("capsule_promote", {"capsule_id": cap})

    out = tools.run(scenario)
    assert out["promoted"] is True
    assert os.readlink(workspace / "src") == str(outside)
    assert list(outside.iterdir()) == []


def test_witness_is_deterministic_and_replays(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap,
                                      "cmd": ["sh", "-c", "cat README src/mod.py | wc -c > count.txt; cat count.txt"]})
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["tr", "a-z", "A-Z"], "stdin": "hello\n"})
        first = await t.call("capsule/witness", {"capsule_id": cap, "compress": "zstd", "include_blobs": True})
        second = await t.call("capsule_witness", {"capsule_id": cap})
        verified = await t.call("witness_verify", {"witness_id": first["witness_id"]})
        replayed = await t.call("capsule/replay", {"witness_id": first["witness_id"]})
        listed = await t.call("witness_list", {"capsule_id": cap})
        return {"first": first, "second": second, "verified": verified, "replayed": replayed, "listed": listed}

    out = tools.run(scenario)
    assert out["first"] == out["second"]
    assert Path(out["first"]["path"]).read_bytes() == Path(out["second"]["path"]).read_bytes()
    assert out["verified"]["ok"] is True
    assert out["replayed"]["replay_ok"] is True, out["replayed"]["mismatches"]
    assert out["replayed"]["root_hash"] == out["first"]["root_hash"]
    assert [w["witness_id"] for w in out["listed"]["witnesses"]] == [out["first"]["witness_id"]]


def test_a_witness_without_blobs_carries_a_change_that_copies_a_base_file(tools: Any, workspace: Path) -> None:
    """A copy of a base file the exec read has that file's blob; too big for the journal to keep
    its bytes, the change is read again from the capsule, not from the base the witness leaves out."""
    (workspace / "big.bin").write_bytes(os.urandom(3 << 20))

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "cat big.bin >/dev/null; "
                                                                              "cp big.bin copy.bin"]})
        assert ran["exit_code"] == 0, ran
        made = await t.call("capsule_witness", {"capsule_id": cap, "include_blobs": False})
        verified = await t.call("witness_verify", {"witness_id": made["witness_id"]})
        return {"made": made, "verified": verified}

    out = tools.run(scenario)
    assert out["verified"]["ok"] is True, out["verified"]
    assert out["made"]["size_bytes"] > 3 << 20  # the copy's bytes travel (random: zstd cannot shrink them)


def test_replay_names_the_exec_and_stream_that_differed(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["echo", "stable"]})
        await t.call("capsule_exec",
                     {"capsule_id": cap, "cmd": ["sh", "-c", "date +%s%N; od -An -N8 -tx8 /dev/urandom"]})
        made = await t.call("capsule_witness", {"capsule_id": cap})
        return await t.call("capsule_replay", {"witness_id": made["witness_id"]})

    out = tools.run(scenario)
    # Output alone does not fail a replay (ARCHITECTURE.md, "Decisions": what a replay means); it is shown,
    # by exec and stream.
    assert out["replay_ok"] is True and out["mismatches"] == []
    assert out["output_identical"] is False
    assert [(d["exec"], d["stream"]) for d in out["output_diffs"]] == [(2, "stdout")]
    assert len(out["output_diffs"][0]["lines"]) == 5  # a hunk header, two lines out, two in


def test_replay_after_the_workspace_is_deleted(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "sort README src/mod.py > sorted.txt"]})
        made = await t.call("capsule_witness", {"capsule_id": cap, "include_blobs": True})
        await t.call("capsule_destroy", {"capsule_id": cap})
        shutil.rmtree(workspace)
        return await t.call("capsule_replay", {"path": made["path"]})

    out = tools.run(scenario)
    assert out["replay_ok"] is True, out["mismatches"]
    assert not workspace.exists()


def test_promotion_blocked_by_cpu_time_and_by_a_replay_that_differs(tools: Any, workspace: Path) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        busy = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        spin = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo spun > spun.txt"
        ran = await t.call("capsule_exec", {"capsule_id": busy, "cmd": ["sh", "-c", spin]})
        await t.call("policy_set", {"name": "quick", "rules": {"max_cpu_ms": 1}})
        cpu = await t.call("capsule_promote", {"capsule_id": busy, "policies": ["quick"]})
        noisy = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        await t.call("capsule_exec",
                     {"capsule_id": noisy, "cmd": ["sh", "-c", "od -An -N8 -tx8 /dev/urandom > rand.txt"]})
        replay = await t.call("capsule_promote", {"capsule_id": noisy, "policies": ["strict"]})
        return {"ran": ran, "cpu": cpu, "replay": replay}

    out = tools.run(scenario)
    assert out["ran"]["usage"]["cpu_ms"] > 1
    report = out["cpu"]["policy_report"]
    assert out["cpu"]["promoted"] is False and report["resource_ok"] is False
    assert report["resource_violations"][0]["rule"] == "max_cpu_ms"
    replay = out["replay"]["policy_report"]
    assert out["replay"]["promoted"] is False and replay["replay_ok"] is False and replay["tests_ok"] is True
    assert "replay" in replay["details"]
    assert not (workspace / "spun.txt").exists() and not (workspace / "rand.txt").exists()


def test_a_file_read_then_copied_up_stays_in_the_read_set(tools: Any, workspace: Path) -> None:
    # The tracer reads events after the fact; a chmod right after the read copies the
    # file up, so its inode changes before the event is seen.  Ten tries, every one kept.
    async def scenario(t: Any) -> list[list[str] | None]:
        cap = (await t.call("capsule_create", {"workspace": str(workspace)}))["capsule_id"]
        reads = []
        for i in range(10):
            name = f"r{i}.txt"
            (workspace / name).write_text("x\n")
            ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", f"cat {name}; chmod +x {name}"]})
            reads.append(ran["touched"]["read"])
        return reads

    reads = tools.run(scenario)
    assert all(r is not None and f"r{i}.txt" in r for i, r in enumerate(reads)), reads

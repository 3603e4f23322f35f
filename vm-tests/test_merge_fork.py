"""capsule_merge into a new capsule that is a fork of the first input (issue 39), as root.

The merged capsule is forked from the first input, and only the second's change is
written into it: its parent is the first input, its diff still names both inputs'
files against the base, and the first input is frozen (its execs refused, naming the
fork) until the merged capsule is destroyed.  capsule_list says what holds each input
(``state`` frozen, ``held_by``) and what the merged capsule merged (``merged_from``), and
a capsule_resume of an input says why it stays frozen.  A first input running a service is not
forked (its service would freeze).  A workspace edited underneath the attempts after
they changed a file refuses the merge (REPO_CHANGED) and makes nothing, over the
workspace itself or over a snapshot given as the base, and a refusal while the inputs
are read (a file name that is not UTF-8) names the input it came from.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from sandbox.errors import CcwError


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (ws / name).write_text("".join(f"{name} line {i}\n" for i in range(1, 11)))
    return ws


async def _attempts(t: Any, ws: Path) -> tuple[str, str, str]:
    parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    one, two = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
    for capsule_id, script in ((one, "sed -i 's/line 2$/line two/' a.txt"),
                               (two, "sed -i 's/line 9$/line nine/' b.txt")):
        assert (await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", script]}))["exit_code"] == 0
    return parent, one, two


async def _merge_refused(t: Any, ids: list[str], into: str) -> dict[str, Any]:
    """The merge's refusal (None: it was made) and the capsules listed before and after it."""
    before = {c["capsule_id"] for c in (await t.call("capsule_list", {}))["capsules"]}
    try:
        await t.call("capsule_merge", {"capsule_ids": ids, "into": into})
        refused = None
    except CcwError as exc:
        refused = exc
    after = {c["capsule_id"] for c in (await t.call("capsule_list", {}))["capsules"]}
    return {"refused": refused, "before": before, "after": after}


def test_the_merged_capsule_is_a_fork_of_the_first_input(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        parent, one, two = await _attempts(t, ws)
        merged = await t.call("capsule_merge", {"capsule_ids": [one, two], "into": "new"})
        made = merged["capsule_id"]
        listed = {c["capsule_id"]: c for c in (await t.call("capsule_list", {}))["capsules"]}
        resumed = await t.call("capsule_resume", {"capsule_id": two})  # held by the merge, not paused
        diff = await t.call("capsule_diff", {"capsule_id": made, "format": "json"})
        look = await t.call("capsule_exec",
                            {"capsule_id": made, "cmd": ["sh", "-c", "sed -n 2p a.txt; sed -n 9p b.txt"]})
        try:
            await t.call("capsule_exec", {"capsule_id": one, "cmd": ["true"]})
            frozen = None
        except CcwError as exc:
            frozen = exc
        await t.call("capsule_destroy", {"capsule_id": made})
        again = await t.call("capsule_exec", {"capsule_id": one, "cmd": ["true"]})
        after = {c["capsule_id"]: c for c in (await t.call("capsule_list", {}))["capsules"]}
        return {"made": made, "listed": listed, "diff": diff, "look": look, "frozen": frozen, "again": again,
                "one": one, "two": two, "parent": parent, "resumed": resumed, "after": after}

    out = tools.run(scenario)
    made, one, two, listed = out["made"], out["one"], out["two"], out["listed"]
    assert listed[made]["parent"] == one and listed[made]["merged_from"] == [one, two]
    # what keeps each input frozen is listed, as the refusals say it: the merge stacked on both
    for held, by in ((one, [made]), (two, [made]), (out["parent"], [one, two])):
        assert (listed[held]["state"], listed[held]["held_by"]) == ("frozen", by), listed[held]
    assert listed[made]["state"] == "ready" and "held_by" not in listed[made]
    assert out["resumed"]["paused"] is True and out["resumed"]["held_by"] == [made]
    assert made in out["resumed"]["note"] and "destroyed" in out["resumed"]["note"]
    assert out["after"][two]["state"] == "ready" and "held_by" not in out["after"][two]
    assert {f["path"]: f["status"] for f in out["diff"]["files"]} == {"a.txt": "modified", "b.txt": "modified"}
    assert out["look"]["stdout"].splitlines() == ["a.txt line two", "b.txt line nine"]
    assert out["frozen"] is not None and out["frozen"].code == "CONFLICT" and out["made"] in out["frozen"].message
    assert out["again"]["exit_code"] == 0


def test_a_workspace_moved_underneath_refuses_the_merge_and_makes_nothing(tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        _, one, two = await _attempts(t, ws)
        (ws / "b.txt").write_text("edited on the host meanwhile\n")
        return await _merge_refused(t, [one, two], "new")

    out = tools.run(scenario)
    assert out["refused"] is not None and out["refused"].code == "REPO_CHANGED", out["refused"]
    assert out["refused"].details["paths"] == ["b.txt"]
    assert out["after"] == out["before"]


@pytest.mark.parametrize("into", ["new", "live"])
def test_an_edit_below_a_directory_an_input_removed_refuses_the_merge(tools: Any, tmp_path: Path, into: str) -> None:
    # The input's change names the directory alone; the person edits a file in it meanwhile.
    ws = _workspace(tmp_path)
    (ws / "docs").mkdir()
    (ws / "docs" / "conf.py").write_text("conf\n")

    async def scenario(t: Any) -> dict[str, Any]:
        _, one, two = await _attempts(t, ws)
        await t.call("capsule_exec", {"capsule_id": one, "cmd": ["rm", "-rf", "docs"]})
        (ws / "docs" / "conf.py").write_text("conf, edited on the host\n")
        (ws / "docs" / "new.txt").write_text("new\n")
        return await _merge_refused(t, [one, two], into)

    out = tools.run(scenario)
    assert out["refused"] is not None and out["refused"].code == "REPO_CHANGED", out["refused"]
    assert out["refused"].details["paths"] == ["docs/"]
    assert out["after"] == out["before"]
    assert sorted(p.name for p in (ws / "docs").iterdir()) == ["conf.py", "new.txt"]


def test_a_first_input_running_a_service_is_not_forked(tools: Any, tmp_path: Path) -> None:
    """Forking it would freeze its service: the merged capsule is a fork of the common ancestor
    then, with both inputs' files written, and the first input's service still answers."""
    ws = _workspace(tmp_path)
    serve = ["python3", "-m", "http.server", "8766", "--bind", "127.0.0.1"]
    fetch = ["python3", "-c", "import urllib.request as u; print(u.urlopen('http://127.0.0.1:8766/a.txt').status)"]

    async def scenario(t: Any) -> dict[str, Any]:
        parent, one, two = await _attempts(t, ws)
        await t.call("capsule_service_start", {"capsule_id": one, "name": "web", "cmd": serve,
                                               "ready": {"port": 8766}})
        merged = await t.call("capsule_merge", {"capsule_ids": [one, two], "into": "new"})
        listed = {c["capsule_id"]: c["parent"] for c in (await t.call("capsule_list", {}))["capsules"]}
        diff = await t.call("capsule_diff", {"capsule_id": merged["capsule_id"], "format": "json"})
        served = await t.call("capsule_exec", {"capsule_id": one, "cmd": fetch, "timeout_ms": 20_000})
        await t.call("capsule_service_stop", {"capsule_id": one, "name": "web", "grace_ms": 1000})
        return {"parent": parent, "made": merged["capsule_id"], "listed": listed, "diff": diff, "served": served}

    out = tools.run(scenario)
    assert out["listed"][out["made"]] == out["parent"]
    assert {f["path"]: f["status"] for f in out["diff"]["files"]} == {"a.txt": "modified", "b.txt": "modified"}
    assert out["served"]["exit_code"] == 0 and out["served"]["stdout"].strip() == "200", out["served"]


def test_a_refusal_while_the_inputs_are_read_names_the_capsule(tools: Any, tmp_path: Path) -> None:
    """A file name that is not UTF-8 in the second input refuses the merge as the change list refuses it,
    the message and details naming that input (merge_make.of_input), not only "the capsule's"; nothing is made."""
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        _, one, two = await _attempts(t, ws)
        make = 'printf x > "$(printf "n\\377.txt")"'
        bad = await t.call("capsule_exec", {"capsule_id": two, "cmd": ["sh", "-c", make]})
        before = {c["capsule_id"] for c in (await t.call("capsule_list", {}))["capsules"]}
        try:
            await t.call("capsule_merge", {"capsule_ids": [one, two], "into": "new"})
            refused = None
        except CcwError as exc:
            refused = exc
        after = {c["capsule_id"] for c in (await t.call("capsule_list", {}))["capsules"]}
        return {"bad": bad, "refused": refused, "before": before, "after": after, "one": one, "two": two}

    out = tools.run(scenario)
    assert out["bad"]["exit_code"] == 0
    refused = out["refused"]
    assert refused is not None and refused.code == "INVALID_ARGUMENT", refused
    assert refused.message.startswith(f"capsule {out['two']}: ") and "n\\xff.txt" in refused.message, refused.message
    assert out["one"] not in refused.message and refused.details["capsule_id"] == out["two"]
    assert refused.details["not_utf8"] == ["n\\xff.txt"]
    assert out["after"] == out["before"]


def test_attempts_over_a_snapshot_merge_and_the_workspace_is_checked_beside_the_read(
        tools: Any, tmp_path: Path) -> None:
    """Over a base given at creation (a copy of the workspace): the merge of two forks holds both
    changes, and the live workspace, read while the inputs are, refuses the merge once a path an
    input changed moved there (REPO_CHANGED), naming that path."""
    ws = _workspace(tmp_path)
    snapshot = tmp_path / "snapshot"
    shutil.copytree(ws, snapshot)

    async def scenario(t: Any) -> dict[str, Any]:
        parent = (await t.call("capsule_create", {"workspace": str(ws), "base": str(snapshot)}))["capsule_id"]
        one, two = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
        for capsule_id, script in ((one, "sed -i 's/line 2$/line two/' a.txt"),
                                   (two, "sed -i 's/line 9$/line nine/' b.txt")):
            assert (await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", script]}))[
                "exit_code"] == 0
        merged = await t.call("capsule_merge", {"capsule_ids": [one, two], "into": "new"})
        look = await t.call("capsule_exec", {"capsule_id": merged["capsule_id"],
                                             "cmd": ["sh", "-c", "sed -n 2p a.txt; sed -n 9p b.txt"]})
        await t.call("capsule_destroy", {"capsule_id": merged["capsule_id"]})
        (ws / "b.txt").write_text("edited on the host meanwhile\n")
        try:
            await t.call("capsule_merge", {"capsule_ids": [one, two], "dry_run": True})
            refused = None
        except CcwError as exc:
            refused = exc
        return {"merged": merged, "look": look, "refused": refused}

    out = tools.run(scenario)
    assert out["merged"]["base"] == {"capsule_id": out["merged"]["base"]["capsule_id"]} and out["merged"]["written"]
    assert out["look"]["stdout"].splitlines() == ["a.txt line two", "b.txt line nine"]
    refused = out["refused"]
    assert refused is not None and refused.code == "REPO_CHANGED", refused
    assert refused.details["paths"] == ["b.txt"]
    assert {moved["expected"]["kind"] for moved in refused.details["conflicts"]} == {"file"}, refused.details

"""capsule_merge into a new capsule that stacks the other inputs' layers over a fork of the first (issue 39), as root.

The merged capsule shows what only one input changed through that input's own layers, so
only what its layers would show otherwise than the merge is written.  These are the cases
where a donor's layers hold or hide a path its change list does not name, each of which a
merge that trusted the change list alone would get wrong:

- a file the second input rewrote with its own bytes (``sed -i`` that matched nothing:
  copied up, unchanged, unlisted) that the first input edited: the first's edit is shown;
- a directory the second input replaced (``rm -rf; mkdir``: opaque) where the first added
  a file: that file is shown beside the second's;
- a file the first input added where the second's own parent added one and the second
  deleted it (a whiteout over nothing in the base, in a layer stacked above the first's):
  the first's file is shown;
- a directory the first input made private, below which the second changed a file (its
  layer holds a copy of the directory with the mode it had): the mode is the first's.

Every input is frozen while the merged capsule lives (its execs refused, naming it, its file
tools' writes refused, and it cannot be destroyed), and runs again once that capsule is destroyed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio

from mcp_server.journal import Journal
from sandbox.errors import CcwError

LOOK = ("cat a.txt b.txt q.txt; ls d; stat -c '%a' sub; cat sub/x.txt; test -e c.txt || echo no-c; ls e")


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "e").mkdir()
    (ws / "sub").mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d/old.txt", "e/kept.txt", "e/gone.txt", "sub/x.txt"):
        (ws / name).write_text(f"{name} base\n")
    (ws / "sub").chmod(0o755)
    return ws


async def _attempts(t: Any, ws: Path, first: str, second: str) -> tuple[str, str]:
    """Two forks of a capsule over ``ws``, each after running its script."""
    parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    ids = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
    for capsule_id, script in zip(ids, (first, second), strict=True):
        await _exec(t, capsule_id, script)
    return ids[0], ids[1]


async def _exec(t: Any, capsule_id: str, script: str) -> dict[str, Any]:
    done = await t.call("capsule_exec", {"capsule_id": capsule_id, "cmd": ["sh", "-c", script]})
    assert done["exit_code"] == 0, done
    return done


async def _refused(t: Any, tool: str, capsule_id: str) -> CcwError | None:
    args = {"capsule_id": capsule_id, **({"cmd": ["true"]} if tool == "capsule_exec" else
                                         {"path": "new.txt", "content": "x"} if tool == "file_create" else {})}
    try:
        await t.call(tool, args)
    except CcwError as exc:
        return exc
    return None


def test_a_stacked_merge_shows_what_the_donors_layers_hold_or_hide_as_the_merge_has_it(
        tools: Any, tmp_path: Path) -> None:
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        first, middle = (await t.call("capsule_fork", {"capsule_id": parent, "count": 2}))["capsule_ids"]
        await _exec(t, first, "echo first > a.txt; echo from-first > d/first.txt; echo q-first > q.txt; chmod 700 sub; "
                              "rm -rf e; mkdir -p e/empty; echo 'e/kept.txt base' > e/kept.txt")
        await _exec(t, middle, "echo q-middle > q.txt")
        second = (await t.call("capsule_fork", {"capsule_id": middle}))["capsule_id"]
        await _exec(t, second, "sed -i 's/nothing-matches/x/' a.txt; echo second > b.txt; rm c.txt q.txt; "
                               "rm -rf d; mkdir d; echo from-second > d/second.txt; echo second > sub/x.txt")
        merged = await t.call("capsule_merge", {"capsule_ids": [first, second], "into": "new"})
        made = merged["capsule_id"]
        look = await _exec(t, made, LOOK)
        diff = await t.call("capsule_diff", {"capsule_id": made, "format": "json"})
        witness = await t.call("capsule_witness", {"capsule_id": made})
        replayed = await t.call("capsule_replay", {"witness_id": witness["witness_id"]})
        frozen = {name: await _refused(t, "capsule_exec", one) for name, one in (("first", first), ("second", second))}
        kept = await _refused(t, "capsule_destroy", second)
        written = await _refused(t, "file_create", second)
        await t.call("capsule_destroy", {"capsule_id": made})
        again = {name: await _refused(t, "capsule_exec", one) for name, one in (("first", first), ("second", second))}
        return {"made": made, "look": look["stdout"], "diff": diff, "frozen": frozen, "kept": kept, "again": again,
                "replayed": replayed, "written": written}

    out = tools.run(scenario)
    assert out["look"].splitlines() == ["first", "second", "q-first", "first.txt", "second.txt", "700", "second",
                                        "no-c", "empty", "kept.txt"]
    assert {f["path"]: f["status"] for f in out["diff"]["files"]} == {
        "a.txt": "modified", "b.txt": "modified", "c.txt": "deleted", "q.txt": "added", "d/old.txt": "deleted",
        "d/first.txt": "added", "d/second.txt": "added", "sub/x.txt": "modified", "e/gone.txt": "deleted"}
    # Both inputs replaced a directory (d, e: opaque), e with a file the base held: the journal
    # deletes and remakes them, so a replay from the base shows them as the merged capsule does.
    assert out["replayed"]["replay_ok"] is True, out["replayed"].get("mismatches")
    for name, refusal in out["frozen"].items():
        assert refusal is not None and refusal.code == "CONFLICT" and out["made"] in refusal.message, name
    assert out["kept"] is not None and out["kept"].code == "CONFLICT" and out["made"] in out["kept"].message
    assert out["again"] == {"first": None, "second": None}
    # A file tool's write to an input meets its read-only view: refused as held, not an internal EROFS.
    assert out["written"] is not None and out["written"].code == "CONFLICT", out["written"]
    assert "stacked on it" in out["written"].message and out["written"].details["errno"] == "EROFS"


def test_an_exec_sent_to_an_input_during_its_merge_waits_for_the_merge_and_finds_it_frozen(
        tools: Any, tmp_path: Path) -> None:
    """Found in a trial: an exec sent to the first input after its merge took the input's turn once
    the merge had read it, and ran; the merge's fork, queued behind it, was then refused (the input
    "changed while it was merged").  The merge holds its inputs' turns until its capsule is made."""
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        first, second = await _attempts(t, ws, "echo first > a.txt", "echo second > b.txt")
        out: dict[str, Any] = {}

        async def merge() -> None:
            try:
                out["made"] = (await t.call("capsule_merge", {"capsule_ids": [first, second]}))["capsule_id"]
            except CcwError as exc:
                out["made"] = exc

        async def late() -> None:
            try:
                out["late"] = await _exec(t, first, "echo late > late.txt")
            except CcwError as exc:
                out["late"] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(merge)
            while not t.runtime.capsule_queue.line(first):  # noqa: ASYNC110 (the lines signal no one)
                await trio.sleep(0.001)  # until the merge has its place in the first input's line
            nursery.start_soon(late)
        return out

    out = tools.run(scenario)
    assert isinstance(out["made"], str), out["made"]
    assert isinstance(out["late"], CcwError) and out["late"].code == "CONFLICT" and out["made"] in out["late"].message


def test_a_directory_the_first_input_removed_is_not_shown_from_a_donors_copy_of_it(tools: Any, tmp_path: Path) -> None:
    """Found in a trial: the second input's layer holds copies of the base's ``d/`` (a file made and
    removed in it) and ``e/`` (a file of it deleted), which no change names; the first input removed
    ``d`` and made ``e`` a file, and the merged capsule showed both as empty directories, its witness
    not replaying.  The view is asked at such a path and the copy deleted."""
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        first, second = await _attempts(t, ws, "rm -rf d e; echo now-a-file > e",
                                               "touch d/tmp; rm d/tmp; rm e/gone.txt")
        made = (await t.call("capsule_merge", {"capsule_ids": [first, second]}))["capsule_id"]
        look = await _exec(t, made, "test -e d || echo no-d; stat -c %F e; cat e")
        witness = await t.call("capsule_witness", {"capsule_id": made})
        replayed = await t.call("capsule_replay", {"witness_id": witness["witness_id"]})
        return {"look": look["stdout"], "replayed": replayed}

    out = tools.run(scenario)
    assert out["look"].splitlines() == ["no-d", "regular file", "now-a-file"]
    assert out["replayed"]["replay_ok"] is True, out["replayed"].get("mismatches")


def test_an_input_running_a_service_is_not_stacked_and_its_files_are_written(tools: Any, tmp_path: Path) -> None:
    """Stacking would freeze its service: the merged capsule is a fork of the first input alone, the
    second's files (left unread while the merge was planned) read and written into it, the second
    keeps running, and the merged capsule's witness replays."""
    ws = _workspace(tmp_path)
    serve = ["python3", "-m", "http.server", "8767", "--bind", "127.0.0.1"]

    async def scenario(t: Any) -> dict[str, Any]:
        first, second = await _attempts(t, ws, "echo first > a.txt",
                                               "echo second > b.txt; mkdir -p new/deep; echo deep > new/deep/n.txt")
        await t.call("capsule_service_start", {"capsule_id": second, "name": "web", "cmd": serve,
                                               "ready": {"port": 8767}})
        made = (await t.call("capsule_merge", {"capsule_ids": [first, second], "into": "new"}))["capsule_id"]
        look = await _exec(t, made, "cat a.txt b.txt new/deep/n.txt")
        running = await _refused(t, "capsule_exec", second)
        witness = await t.call("capsule_witness", {"capsule_id": made})
        replayed = await t.call("capsule_replay", {"witness_id": witness["witness_id"]})
        await t.call("capsule_service_stop", {"capsule_id": second, "name": "web", "grace_ms": 1000})
        return {"look": look["stdout"], "running": running, "replayed": replayed}

    out = tools.run(scenario)
    assert out["look"].splitlines() == ["first", "second", "deep"]
    assert out["running"] is None
    assert out["replayed"]["replay_ok"] is True, out["replayed"]


def test_a_stacked_merges_witness_carries_the_inputs_files_and_replays(tools: Any, tmp_path: Path) -> None:
    """The merged capsule's journal names the files only one input changed by that input (their bytes
    were never read), and its witness reads them there: it replays, and carries their bytes."""
    ws = _workspace(tmp_path)

    async def scenario(t: Any) -> dict[str, Any]:
        first, second = await _attempts(t, ws, "echo first > a.txt; printf 'bin\\000ary' > first.bin",
                                               "echo second > b.txt; mkdir -p new/deep; echo deep > new/deep/n.txt")
        made = (await t.call("capsule_merge", {"capsule_ids": [first, second], "into": "new"}))["capsule_id"]
        shown = await _exec(t, made, "stat -c '%n %.9Y' a.txt b.txt new/deep/n.txt")
        rows = {row["path"]: row for row in Journal(t.runtime.state).writes(made)}
        witness = await t.call("capsule_witness", {"capsule_id": made})
        replayed = await t.call("capsule_replay", {"witness_id": witness["witness_id"]})
        frozen = await _refused(t, "capsule_exec", second)
        return {"replayed": replayed, "frozen": frozen, "shown": shown["stdout"], "rows": rows}

    out = tools.run(scenario)
    assert out["replayed"]["replay_ok"] is True, out["replayed"]
    assert out["frozen"] is not None and out["frozen"].code == "CONFLICT"
    # journaled by the input holding each file, with the mtime the merged capsule shows (the helper's listing's)
    assert {path: (row["content_b64"], row.get("source")) for path, row in out["rows"].items()
            if path in ("a.txt", "b.txt")} == {"a.txt": (None, out["rows"]["a.txt"]["source"]),
                                               "b.txt": (None, out["rows"]["b.txt"]["source"])}
    assert out["rows"]["a.txt"]["source"] != out["rows"]["b.txt"]["source"]
    for line in out["shown"].splitlines():
        path, seconds = line.split()
        assert out["rows"][path]["mtime_ns"] == int(seconds.replace(".", "")), line

"""capsule_race on a real local cluster (BuildGrid 0.9.1 + PostgreSQL) and a ccw-bot (issue 39).

Three forks of one capsule hold three attempts: a good value, a bad one, and a good one
with a longer change.  With ``CCW_REAPI_URL`` set (as deltamin's trials use it) the race
runs each capsule's tree (its base with its change over it) as an Action on the bot: the
table says ``reapi`` for the race and every row, exits and ranks as the same race run
locally does, and nothing ran in the capsules (no exec journaled, the command's output
file in none of them).
"""

from __future__ import annotations

import dataclasses
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_server.devcluster.cluster import Cluster, start_bot, stop_bot, temporary_cluster
from tests.support.reapi_cluster import require_cluster_prerequisites

pytestmark = pytest.mark.slow
CHECK = ["sh", "-c", 'test "$(cat value.txt)" = good && echo ran > out.txt']
EDITS = ("echo good > value.txt", "echo bad > value.txt", "echo good > value.txt && seq 1 20 >> notes.txt")


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    require_cluster_prerequisites(request.config)
    with temporary_cluster() as running:
        yield running


@pytest.fixture(scope="module")
def bot(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[subprocess.Popen[bytes]]:
    root = tmp_path_factory.mktemp("race-bot")
    running = start_bot(cluster.url, "race-bot", root, capacity=2)
    try:
        yield running
    finally:
        stop_bot(running)
        log = root / "bot.log"
        if log.exists():
            print(f"--- bot:\n{log.read_text()[-2000:]}")


def test_a_race_runs_each_capsules_tree_on_the_cluster(tools: Any, tmp_path: Path, cluster: Cluster,
                                                        bot: subprocess.Popen[bytes]) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "value.txt").write_text("unset\n")
    (ws / "notes.txt").write_text("notes\n")

    async def scenario(t: Any) -> dict[str, Any]:
        parent = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ids = (await t.call("capsule_fork", {"capsule_id": parent, "count": 3}))["capsule_ids"]
        for capsule_id, edit in zip(ids, EDITS, strict=True):
            assert (await t.call("capsule_exec", {"capsule_id": capsule_id,
                                                  "cmd": ["sh", "-c", edit]}))["exit_code"] == 0
        t.runtime.config = dataclasses.replace(t.runtime.config, reapi_url=cluster.url, reapi_parallel=2)
        remote = await t.call("capsule_race", {"capsule_ids": ids, "cmd": CHECK, "wait_ms": None})
        diffs = [await t.call("capsule_diff", {"capsule_id": one, "format": "json"}) for one in ids]
        listed = {c["capsule_id"]: c["execs"] for c in (await t.call("capsule_list", {}))["capsules"]}
        t.runtime.config = dataclasses.replace(t.runtime.config, reapi_url="")
        local = await t.call("capsule_race", {"capsule_ids": ids, "cmd": CHECK, "wait_ms": None})
        return {"ids": ids, "remote": remote, "local": local, "diffs": diffs, "listed": listed}

    out = tools.run(scenario)
    good, bad, longer = out["ids"]
    remote, local = out["remote"], out["local"]
    assert remote["executor"] == "reapi" and {row["where"] for row in remote["rows"]} == {"reapi"}, remote
    assert [(row["capsule_id"], row["exit_code"]) for row in remote["rows"]] == [(good, 0), (longer, 0), (bad, 1)]
    assert remote["rows"][0]["diff"] == {"files": 1, "lines": 2} and remote["rows"][1]["diff"]["files"] == 2
    assert remote["race_id"] and remote["race_id"] != local["race_id"]
    # Nothing ran in the capsules: no exec journaled beyond each one's edit, no out.txt in any.
    assert [out["listed"][one] for one in out["ids"]] == [1, 1, 1]
    assert all("out.txt" not in {f["path"] for f in diff["files"]} for diff in out["diffs"])
    # The same race here ranks the same, with the same exits.
    assert local["executor"] == "local" and {row["where"] for row in local["rows"]} == {"local"}
    assert [(row["capsule_id"], row["exit_code"]) for row in local["rows"]] == [(good, 0), (longer, 0), (bad, 1)]

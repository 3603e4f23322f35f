"""A REAPI client's witness replayed by ccw-bot reads nothing of the bot's host (issue 24, class 2b).

A replay lease's witness is the client's, and so is the report: the bot answers with the
replay's result, output diffs included.  A witness's ``capsule.expose`` names host
directories its capsule showed read-only; a local replay of a witness not made in its
state dir shows only toolchains at their managers' places (capsules/exposure.py
``replayable``), and ccw-bot none at all.  Before the fix a witness naming a directory of
the bot's host and running ``cat`` on a file there got the file's text back in
``output_diffs``, and a local replay of it with ``allow_untrusted`` did the same.  Here
the bot's runner serves that lease through an in-memory CAS with a real embedded helper:
the report carries no canary and lists the directory as dropped, and so does a local
replay of the same witness, each saying why.
"""

from __future__ import annotations

import json
import secrets
import threading
from pathlib import Path
from typing import Any

import trio

from mcp_server.bot import runner as bot
from mcp_server.bot.runner import CapsuleRunner
from mcp_server.capsules.exposure import FOREIGN_EXPOSE
from mcp_server.capsules.replay import NO_HOST_DIRS
from mcp_server.reapi.merkle import FileEntry, build_tree, digest_bytes, key
from mcp_server.reapi.protos import re_pb2
from tests.support import witness_craft as craft
from tests.support.memory_cas import LeaseCas


def _lease(client: LeaseCas, root: re_pb2.Digest) -> re_pb2.Action:
    command = re_pb2.Command(arguments=["ccw-bot", "replay"])
    command.environment_variables.add(name=bot.CAPSULE_VAR, value=json.dumps({"replay": "witness.ccwz"}))
    command.environment_variables.add(name="PATH", value="/usr/bin:/bin")
    data = command.SerializeToString(deterministic=True)
    client.blobs[key(digest_bytes(data))] = data
    return re_pb2.Action(command_digest=digest_bytes(data), input_root_digest=root)


def test_a_bots_replay_shows_no_directory_of_the_bots_host(tools: Any, tmp_path: Path, record_property: Any) -> None:
    private = tmp_path / "bot-host-project"
    private.mkdir()
    canary = "CANARY-" + secrets.token_hex(8)
    (private / "db.env").write_text(f"PASSWORD={canary}\n")
    entry, blobs = craft.exec_entry(1, ["cat", str(private / "db.env")], stdout=b"nothing\n")
    made = craft.manifest("/work/ws", [entry], env_whitelist=["PATH"])
    made["capsule"]["expose"] = [str(private)]
    witness = craft.write(tmp_path / "witness.ccwz", made, blobs)
    tree = build_tree({"witness.ccwz": FileEntry(data=witness.read_bytes())})
    client = LeaseCas(tree.blobs)

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        service = t.ctx.capsules
        runner = CapsuleRunner(service, trio.lowlevel.current_trio_token(), Path(t.runtime.state.tmp_dir), "bot-a")
        outcome = await trio.to_thread.run_sync(runner, client, _lease(client, tree.root), threading.Event())
        stdout = outcome.result.stdout_digest
        remote = json.loads(client.blobs[(stdout.hash, stdout.size_bytes)])
        local = await t.call("capsule_replay", {"path": str(witness), "allow_untrusted": True})
        return remote, local

    remote, local = tools.run(scenario)
    record_property("escapes_tried", 2)
    assert canary not in json.dumps(remote), remote
    assert remote["expose"] == {"used": [], "dropped": [{"path": str(private), "reason": NO_HOST_DIRS}]}
    assert [m["field"] for m in remote["mismatches"]] == ["exit_code"], remote["mismatches"]
    # Replayed here, a stranger's witness has no such directory either: only a toolchain's.
    assert canary not in json.dumps(local), local
    assert local["expose"] == {"used": [], "dropped": [{"path": str(private), "reason": FOREIGN_EXPOSE}]}, local

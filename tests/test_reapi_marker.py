"""ccw-bot reads what a lease names as hostile (mcp_server/bot/marker.py; issue 24, class 2b).

Any REAPI client can send ccw-bot a lease.  Before the fix the bot joined the marker's
``replay`` to the lease root (an absolute path replaced it: the bot replayed any file
of its host) and crashed its lease thread on a marker of the wrong shape.  Here the
bot's runner is driven with a fake CAS and no helper: every bad lease must come back
as a refusal status, without the capsule service or the replay ever being reached,
and the runner must go on serving the next, good lease.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.bot import runner as bot
from mcp_server.bot.marker import Marker, check_command_paths
from mcp_server.bot.runner import CapsuleRunner
from mcp_server.reapi.merkle import DirEntry, FileEntry, SymlinkEntry, build_tree, digest_bytes, key
from mcp_server.reapi.protos import code_pb2, re_pb2
from sandbox.errors import CcwError
from sandbox.spec import Limits
from tests.support.memory_cas import LeaseCas

REFUSALS = {code_pb2.INVALID_ARGUMENT, code_pb2.PERMISSION_DENIED, code_pb2.FAILED_PRECONDITION}
INPUT_ROOT = build_tree({
    "witness.ccwz": FileEntry(data=b"a witness\n"),
    "escape": SymlinkEntry("/etc/shadow"),
    "up": SymlinkEntry("../../../../../../etc"),
    "inner-link": SymlinkEntry("witness.ccwz"),
    "dir/x.txt": FileEntry(data=b"x\n"),
    "empty": DirEntry(),
})
HOSTILE_MARKERS = [
    {"replay": "/etc/shadow"}, {"replay": "../../../../etc/shadow"}, {"replay": "dir/../../x"},
    {"replay": "escape"}, {"replay": "up/shadow"}, {"replay": "inner-link"}, {"replay": "dir"}, {"replay": "empty"},
    {"replay": "missing"}, {"replay": "."}, {"replay": 7}, {"replay": "a\x00b"},
    {"limits": {"memory_mb": -1}}, {"limits": {"swap_mb": 1}}, {"limits": "lots"}, {"clock_offset_sec": "1e99"},
    {"clock_offset_sec": 10**12}, {"workspace": "relative/dir"}, {"workspace": "/etc"}, {"workspace": "/"},
    {"workspace": "/proc/self"}, {"workspace": 5}, {"unknown": 1}, [1, 2], "just a string", None,
]
HOSTILE_TEXTS = ["not json", "{", "x" * 70_000]
HOSTILE_PATHS = [("/etc", []), ("../..", []), ("a/../../b", []), ("", ["/etc/shadow"]), ("", ["../x"]),
                 ("sub", ["../../x"]), ("sub", ["a/../../../y"])]


class _NoService:
    """A capsule service the refused leases must never reach."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the capsule service was used ({name}) for a lease that should be refused")


def _action(client: LeaseCas, marker_text: str | None, cwd: str = "", outputs: tuple[str, ...] = ()) -> re_pb2.Action:
    command = re_pb2.Command(arguments=["ccw-bot", "replay"], working_directory=cwd, output_paths=list(outputs))
    if marker_text is not None:
        command.environment_variables.add(name=bot.CAPSULE_VAR, value=marker_text)
    data = command.SerializeToString(deterministic=True)
    client.blobs[key(digest_bytes(data))] = data
    return re_pb2.Action(command_digest=digest_bytes(data), input_root_digest=INPUT_ROOT.root)


def test_hostile_leases_are_refused_and_the_bot_serves_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                record_property: Any) -> None:  # fmt: skip
    replayed: list[Path] = []

    async def fake_replay(service: Any, path: Path, expected_root: str | None, *options: Any) -> dict[str, Any]:
        replayed.append(path)
        return {"replay_ok": True}

    monkeypatch.setattr(bot, "replay", fake_replay)
    client = LeaseCas(INPUT_ROOT.blobs)
    leases = [json.dumps(marker) for marker in HOSTILE_MARKERS] + HOSTILE_TEXTS
    actions = [_action(client, text) for text in leases]
    actions += [_action(client, None, cwd, tuple(outputs)) for cwd, outputs in HOSTILE_PATHS]

    async def serve() -> list[Any]:
        scratch = tmp_path / "state" / "tmp"
        scratch.mkdir(parents=True)
        runner = CapsuleRunner(_NoService(), trio.lowlevel.current_trio_token(), scratch, "bot-test")  # type: ignore[arg-type]
        outcomes: list[Any] = []
        for action in [*actions, _action(client, json.dumps({"replay": "witness.ccwz", "expected_root": None}))]:
            try:
                outcomes.append(await trio.to_thread.run_sync(runner, client, action, threading.Event()))
            except Exception as error:  # what the bot's session would report as INTERNAL
                outcomes.append(error)
        return outcomes

    *refused, good = trio.run(serve)
    record_property("escapes_tried", len(refused))
    wrong = [(lease, outcome) for lease, outcome in zip([*leases, *HOSTILE_PATHS], refused, strict=True)
             if isinstance(outcome, Exception) or outcome.status_code not in REFUSALS
             or not outcome.message.startswith("refused: ")]
    assert wrong == []
    # The good lease after them all: the witness in its own input root, replayed.
    assert good.status_code == 0 and good.result.exit_code == 0
    assert [p.name for p in replayed] == ["witness.ccwz"] and replayed[0].read_bytes() == b"a witness\n"


def test_a_marker_is_read_into_its_checked_form() -> None:
    assert Marker.parse(None) == Marker() == Marker.parse("")
    marker = Marker.parse(json.dumps({"workspace": "/srv/proj/./x/..", "clock_offset_sec": -5,
                                      "limits": {"pids_max": 9}}))  # fmt: skip
    assert marker == Marker(workspace="/srv/proj", clock_offset_sec=-5, limits=Limits(pids_max=9))
    assert (Marker.parse(json.dumps({"replay": "./w/witness.ccwz", "expected_root": "blake3:ab"})).replay
            == "w/witness.ccwz")
    # The recorded workspace may be anyone's home: it is only where the jail shows the input root.
    assert Marker.parse(json.dumps({"workspace": "/root/project"})).workspace == "/root/project"
    with pytest.raises(CcwError) as info:
        Marker.parse(json.dumps({"workspace": "/usr/lib"}))
    assert info.value.code == "PERMISSION_DENIED" and "/usr" in info.value.message


def test_command_paths_are_names_inside_the_input_root() -> None:
    assert check_command_paths(re_pb2.Command(working_directory="", output_paths=["out", "a/b"])) == ""
    assert check_command_paths(re_pb2.Command(working_directory="./sub/", output_files=["x"])) == "sub"
    assert check_command_paths(re_pb2.Command(working_directory=".")) == ""

"""How ``ccw watch`` and ``ccw capsule log``/``show`` write what a capsule named: control
characters made visible, one line per event, the run table's columns."""

from __future__ import annotations

import json
from pathlib import Path

from mcp_server.cli import runlog, watch
from mcp_server.cli.output import json_text, visible
from mcp_server.events import Event, live_connection
from mcp_server.journal import Journal
from mcp_server.journal_view import exec_detail, exec_summary
from mcp_server.state import State
from tests.support.cli_process import ccw
from tests.support.journal_rows import capsule_record, exec_entry

ESC = "\x1b"


def test_visible_writes_every_control_character_as_an_escape() -> None:
    assert visible(f"a{ESC}[2Jb\x07c\x9bd\x7f") == "a\\x1b[2Jb\\x07c\\x9bd\\x7f"
    assert visible("line\n\tnext") == "line\\x0a\\x09next"
    assert visible("line\n\tnext", keep_newlines=True) == "line\n\tnext"
    assert visible("naïve → ok, שלום") == "naïve → ok, שלום"  # printable text is left alone
    # Bidi overrides and isolates, which a terminal doing bidi would obey (a diff's "Trojan Source").
    assert visible('is_admin = "user\u202e \u2066// admin\u2069 \u2066"\u200f') == \
        'is_admin = "user\\u202e \\u2066// admin\\u2069 \\u2066"\\u200f'


def _event(kind: str, **data: object) -> Event:
    return Event(7, "2026-11-27T06:00:01.234Z", "cap_1", kind, dict(data))


def test_watch_lines_say_what_happened_without_escapes() -> None:
    finished = watch.line(_event("run.finished", seq=3, argv=["sh", "-c", f"echo {ESC}]0;x{ESC}\\"], exit_code=2,
                                 duration_ms=40, writes=1, reads=None, connections=0, timed_out=False))
    assert finished.startswith("06:00:01.234 cap_1 run 3 exit 2 in 40 ms: sh -c") and ESC not in finished
    assert "(1 written, reads not traced, 0 connections)" in finished
    killed = watch.describe(_event("run.finished", seq=4, argv=["sleep", "9"], exit_code=None, signal=9,
                                   duration_ms=5, writes=0, reads=2, connections=0, timed_out=False))
    assert killed.startswith("run 4 killed by signal 9 in 5 ms: sleep 9 (0 written, 2 read, 0 connections")
    waiting = watch.describe(_event("run.queued", ticket=5, label="exec `pytest`"))
    assert waiting == "turn 5: exec `pytest` waits for its turn"
    failed = watch.describe(_event("run.failed", ticket=6, label="exec `pytest`", error=f"CONFLICT: frozen{ESC}[2J"))
    assert failed == "turn 6: exec `pytest` failed: CONFLICT: frozen\\x1b[2J"
    wrote = watch.line(_event("files.written", seq=3, count=5, paths=["a", f"b{ESC}[2J", "c", "d", "e"]))
    assert wrote.endswith("run 3 wrote a, b\\x1b[2J, c and 2 more")
    live = watch.describe(_event("files.written", seq=None, live=True, count=1, paths=["early.txt"]))
    assert live == "the running command wrote early.txt"
    denied = watch.describe(_event("net.connection", seq=1, host="evil.example", port=443, allowed=False,
                                   reason="not in the allowlist"))
    assert denied == "run 1 connection denied: evil.example:443 (not in the allowlist)"
    going = watch.describe(_event("net.connection", **live_connection(
        {"host": "pypi.org", "port": 443, "protocol": "https", "allowed": True, "rule": "pypi.org:443",
         "reason": None, "bytes_in": 9, "bytes_out": 4, "cut": None})))
    assert going == "the running command's connection allowed: pypi.org:443 (pypi.org:443)"
    refused = watch.describe(_event("promotion", applied=[], dry_run=False,
                                    refused={"code": "POLICY_FAILED", "message": "failed: tests"}))
    assert refused == "promotion refused: POLICY_FAILED: failed: tests"
    applied = watch.describe(_event("promotion", applied=["a", "b"], dry_run=False, refused=None))
    assert applied == "promotion applied 2 paths"
    committed = watch.describe(_event("promotion", applied=["a", "b"], dry_run=False, refused=None,
                                      branch={"name": f"ccw/{ESC}x", "commit": "0123456789abcdef"}))
    assert committed == "promotion committed 2 paths on branch ccw/\\x1bx (0123456789ab)"
    other = watch.describe(_event("witness", witness_id="wit_1", path=f"/s/{ESC}x"))
    assert other.startswith("witness ") and ESC not in other


def test_the_run_table_and_one_run() -> None:
    entry = {"seq": 1, "started_at": "2026-11-27T06:00:01.000000+00:00", "argv": ["pytest", "-q"], "cwd": "/ws",
             "exit_code": 1, "signal": None, "timed_out": False, "oom_killed": False, "duration_ms": 1500,
             "generation": 2, "generation_out": 3, "stdout_bytes": 3, "stderr_bytes": 0,
             "usage": {"cpu_ms": 900, "sources": {}, "unavailable": {}},
             "touched": {"read": [f"t{i}.py" for i in range(50)], "written": [f"{ESC}[31mred"],
                         "network": [{"host": "pypi.org", "port": 443, "protocol": "https", "allowed": True,
                                      "rule": "pypi.org", "bytes_in": 9, "bytes_out": 4}]}}
    table = runlog.render_log([exec_summary(entry)], color=False).splitlines()
    assert table[1].split() == ["1", "06:00:01", "2>3", "1", "1.5", "s", "50", "1", "1", "pytest", "-q"]
    shown = runlog.render_run(exec_detail(entry, {"stdout": (f"ok{ESC}[2J\n".encode(), 1 << 20),
                                                        "stderr": None}), color=False, raw=False, all_reads=False)
    assert ESC not in shown and "ok\\x1b[2J" in shown and "\\x1b[31mred" in shown
    assert "... and 10 more (--all lists them)" in shown and "(not kept:" in shown
    assert "allowed pypi.org:443 (https; pypi.org; in 9 B, out 4 B)" in shown
    raw = runlog.render_run(exec_detail(entry, {"stdout": (f"ok{ESC}[2J\n".encode(), 1), "stderr": None}),
                            color=False, raw=True, all_reads=True)
    assert f"ok{ESC}[2J" in raw and "t49.py" in raw


# What a terminal could take as a control: DEL, and C1 (U+009B is CSI to many terminals).
RAW_CONTROLS = [chr(c) for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))]


def test_json_output_carries_no_control_character_raw() -> None:
    hostile = {"path": f"a\x9b2J{ESC}]0;t\x07\x7fnaïve→.txt", "argv": ["\x85", "\x9d"]}
    text = json_text(hostile, indent=2)
    assert json.loads(text) == hostile  # the same value, for tools
    assert not [c for c in text if c in RAW_CONTROLS and c != "\n"], text
    assert "naïve→" in text  # printable text stays as itself


def test_watch_json_writes_a_capsules_names_escaped(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    journal = Journal(state)
    journal.add_capsule(capsule_record())
    journal.add_exec("cap_1", exec_entry({"read": [], "written": ["\x9b2Jowned.txt", f"{ESC}[2J"], "network": []}))
    state.close()
    done = ccw(tmp_path / "state", "watch", "--json", "--once", "--since", "0")
    events = [json.loads(line) for line in done.stdout.splitlines()]
    assert ["\x9b2Jowned.txt", f"{ESC}[2J"] in [e["data"].get("paths") for e in events], events
    assert not [c for c in done.stdout if c in RAW_CONTROLS and c != "\n"]


def test_deltamin_trials_say_what_they_tried() -> None:
    said = [watch.describe(_event("deltamin.trial", size=size, outcome=outcome, fresh=fresh))
            for size, outcome, fresh in ((4, "fail", True), (0, "pass", True), (1, "fail", False))]
    assert said == ["deltamin confirming the whole change, 4 changes: fail",
                    "deltamin confirming the empty change, 0 changes: pass",
                    "deltamin trial, 1 change: fail"]

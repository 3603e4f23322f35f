"""A race in ``ccw ui`` in a real headless browser (Debian's chromium, through chromedriver):
issue 39's "``ccw ui`` shows it", as root.

An agent (a stdio ``ccw-mcp`` driven by raw NDJSON) makes three forks with one
``capsule_fork`` ``count: 3``, gives each a different part (a file ``role``), and races one
command in the three with ``capsule_race``: one capsule edits a file, one adds three, one
fetches from the host's loopback server (which answers only when the test lets it) and
exits 3.  The race answers "running" past its ``wait_ms``; the page, opened before and
never reloaded, shows the race live with the two rows that ended and the one still
running, then, once the gate is released and ``capsule_run`` fetched the result, the
ranked table in the tool's order.  The agent's front end then ends, and a new ``ccw ui``
started afterwards still shows the table.  The screenshots are kept under the test's tmp
dir (its path is printed).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_process import serve_ui
from tests.support.netfixtures import HttpLoopback
from tests.support.raw_mcp import RawStdio, structured
from tests.support.webdriver import Browser, shot

FETCH = r"""
import os, socket, sys
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=120) as s:
    s.sendall(f"GET http://127.0.0.1:{sys.argv[1]}/ HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    print(s.recv(4096).split(b"\r\n")[0].decode())
"""
# The one command raced in every capsule; what it does depends on the capsule's ``role``.
RACE = f"""case "$(cat role)" in
  fix) echo fixed > a.txt ;;
  big) for i in 1 2 3; do echo "more $i" > "b$i.txt"; done ;;
  wait) python3 -c '{FETCH}' "$0"; exit 3 ;;
esac"""


@pytest.fixture
def gate() -> Iterator[HttpLoopback]:
    with HttpLoopback(held=True) as opened:
        yield opened


def _table(browser: Browser) -> list[list[str]]:
    """The shown race's rows, as the cells' texts."""
    rows = browser.script("return [...document.querySelectorAll('#race-table tbody tr')]"
                          ".map((tr) => [...tr.children].map((td) => td.textContent))")
    assert isinstance(rows, list)
    return rows


def _forks(agent: RawStdio, workspace: Path, port: int) -> dict[str, str]:
    """Three forks of one capsule, each given its role; the capsule id of each role."""
    parent = structured(agent.call("capsule_create", {"workspace": str(workspace), "auto_expose": False,
                                                       "network": {"allow": [f"127.0.0.1:{port}"]}}))["capsule_id"]
    made = structured(agent.call("capsule_fork", {"capsule_id": parent, "count": 3}))["capsule_ids"]
    roles = dict(zip(("fix", "big", "wait"), made, strict=True))
    for role, capsule_id in roles.items():
        wrote = structured(agent.call("capsule_exec",
                                      {"capsule_id": capsule_id, "cmd": ["sh", "-c", f"echo {role} > role"]}))
        assert wrote["exit_code"] == 0, wrote
    return roles


def test_a_race_over_mcp_shows_live_then_ranked_and_stays_after_a_restart(
        cli_state: Path, browser: Browser, gate: HttpLoopback, tmp_path: Path) -> None:
    state = cli_state
    workspace, shots = tmp_path / "ws", tmp_path / "screenshots"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a\n")
    with serve_ui(state) as url, RawStdio(state, "capsule", tasks=None) as agent:
        browser.get(url)
        browser.wait_until(lambda: browser.text("#status").startswith("live"), "the page following events")
        assert browser.script("return document.getElementById('races').hidden") is True  # no race yet
        roles = _forks(agent, workspace, gate.port)
        racers = [roles["wait"], roles["big"], roles["fix"]]
        try:
            answer = structured(agent.call("capsule_race", {"capsule_ids": racers,
                                                            "cmd": ["sh", "-c", RACE, str(gate.port)],
                                                            "wait_ms": 1000}, timeout=120))
            assert answer["status"] == "running", answer
            # Live: the two that ended are ranked, the one at the gate is still running.
            browser.wait_until(lambda: "running, 2 of 3 ended" in browser.text("#race-list tbody"), "the race, live")
            live = browser.wait_until(lambda: len(_table(browser)) == 3 and _table(browser), "two rows and one running")
            assert [row[1] for row in live] == [roles["fix"], roles["big"], roles["wait"]], live
            assert live[2][:3] == ["…", roles["wait"], "running"], live
            shot(browser, shots, "1-running")
        finally:
            gate.release.set()
        result = structured(agent.call("capsule_run", {"run_id": answer["run_id"], "wait_ms": None}, timeout=180))
        ranked = [(row["rank"], row["capsule_id"], row["exit_code"]) for row in result["rows"]]
        assert ranked == [(1, roles["fix"], 0), (2, roles["big"], 0), (3, roles["wait"], 3)], result["rows"]
        browser.wait_until(lambda: "finished" in browser.text("#race-list tbody"), "the race, finished")
        _check_table(browser, result, answer["run_id"])
        assert browser.script("return document.title") == "ccw dashboard"
        shot(browser, shots, "2-finished")
        assert agent.close() == 0  # the front end that ran the race ends

    with serve_ui(state) as again:  # a new dashboard, a new token; the race is kept in the state dir
        browser.get(again)
        browser.wait_until(lambda: answer["run_id"] in browser.text("#race-list tbody"), "the kept race")
        _check_table(browser, result, answer["run_id"])
        browser.click(f"#race-table tbody tr[data-capsule='{roles['big']}'] a")
        browser.wait_until(lambda: roles["big"] in browser.text("#cap-title"), "the capsule, chosen from its row")
        shot(browser, shots, "3-after-restart")


def _check_table(browser: Browser, result: dict[str, Any], run_id: str) -> None:
    """The page's table is the tool's: same order, exits, diff sizes and verdicts."""
    title = browser.wait_until(lambda: "finished" in browser.text("#race-title") and browser.text("#race-title"),
                               "the race's title")
    assert title.startswith(f"{run_id}: sh -c") and "policy baseline" in title and "3 capsules" in title, title
    shown = browser.wait_until(lambda: all(row[0] != "…" for row in _table(browser)) and _table(browser),
                               "the ranked table")
    expected = [[str(r["rank"]), r["capsule_id"], str(r["exit_code"]), str(r["diff"]["files"]), str(r["diff"]["lines"]),
                 r["verdict"]] for r in result["rows"]]
    assert [[row[0], row[1], row[2], row[6], row[7], row[8]] for row in shown] == expected, shown
    assert [(r["diff"]["files"], r["diff"]["lines"]) for r in result["rows"]] == [(2, 3), (4, 4), (1, 1)]
    assert all(re.fullmatch(r"\d+ ms|\d+\.\d s", row[3]) for row in shown), shown
    assert "passed first" in browser.text("#race-order")

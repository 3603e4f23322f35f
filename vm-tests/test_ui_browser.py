"""``ccw ui`` in a real headless browser (Debian's chromium, through chromedriver) while an
agent works through MCP: a stdio ``ccw-mcp`` driven by raw NDJSON, as root.

The page is opened once and never reloaded: the agent's run, the file it wrote, the
connection the egress proxy denied and the promotion's outcome must all reach it live.
One file the capsule writes is named like markup; it must be shown as its name, never
parsed.  Promotion is clicked twice: under a policy that refuses (the refusal is shown,
the workspace untouched), then under the default one (the file reaches the workspace).
A real ``capsule_deltamin`` runs while the page is open: each trial is drawn as it comes.
A capsule with 1200 runs (copies of the rows a real run made) among 120 others comes a
page at a time, older ones on a click; 600 more, added while the page is open, arrive live.
A capsule whose every field carries markup, a script URL, escapes and bidi controls: nothing
runs (no CSP violation, no canary set), and no bidi control reorders what is shown.
The screenshots are kept under the test's tmp dir (its path is printed).
"""

from __future__ import annotations

import dataclasses
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_server.capsules import races
from mcp_server.capsules.policy import PolicyStore
from mcp_server.cli.ui import launch_page
from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.state import State
from tests.support.cli_process import ccw, serve_ui
from tests.support.journal_rows import capsule_record, exec_entry
from tests.support.netfixtures import HttpLoopback
from tests.support.raw_mcp import RawStdio, structured
from tests.support.webdriver import Browser, shot

HOSTILE = "<img src=x onerror=document.title='pwned'>.txt"
# Through the jail's HTTP proxy: the host's gate (allowed; it answers when the test lets
# it), then a host the capsule's allowlist does not name (denied).
FETCH = r"""
import os, socket, sys
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
for url in (f"http://127.0.0.1:{sys.argv[1]}/", "http://denied.example/"):
    with socket.create_connection((host, int(port)), timeout=120) as s:
        s.sendall(f"GET {url} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
        print(s.recv(4096).split(b"\r\n")[0].decode())
"""
RUN = f"echo hello > out.txt; echo key > secret.txt; touch \"{HOSTILE}\"; python3 -c '{FETCH}' \"$0\""
GUARD = {"name": "no-secrets", "rules": {"deny_paths": ["secret.txt"]}}


@pytest.fixture
def gate() -> Iterator[HttpLoopback]:
    """The host's loopback server a run fetches from: it answers once the test releases it,
    so the run is still running until then."""
    with HttpLoopback(held=True) as opened:
        yield opened


@pytest.fixture
def state(tmp_path: Path, root_required: None) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    store = State(state_dir)
    PolicyStore(store).put(GUARD)
    store.close()
    yield state_dir
    ccw(state_dir, "helper", "stop", check=False)


@pytest.fixture
def dashboard(state: Path) -> Iterator[str]:
    """``ccw ui`` on the state dir: the URL it printed."""
    with serve_ui(state) as url:
        yield url


def test_the_page_follows_an_agent_live_and_promotes_through_the_policies(
        state: Path, dashboard: str, browser: Browser, gate: HttpLoopback, tmp_path: Path) -> None:
    workspace, shots = tmp_path / "ws", tmp_path / "screenshots"
    workspace.mkdir()
    (workspace / "a.txt").write_text("a\n")
    with RawStdio(state, "capsule", tasks=None) as agent:
        made = agent.call("capsule_create", {"workspace": str(workspace), "auto_expose": False,
                                             "network": {"allow": [f"127.0.0.1:{gate.port}"]}})
        cap = structured(made)["capsule_id"]
        browser.get(dashboard)
        browser.wait_until(lambda: cap in browser.text("#cap-title"), "the new capsule, selected")
        # The title comes with the capsule list, "live" with the event poll's first answer.
        browser.wait_until(lambda: "live" in browser.text("#status"), "the page following the events")
        assert browser.find("#runs tbody tr") == []
        shot(browser, shots, "1-before")

        answers: list[dict[str, Any]] = []
        running = threading.Thread(target=lambda: answers.append(agent.call("capsule_exec", {
            "capsule_id": cap, "cmd": ["sh", "-c", RUN, str(gate.port)]}, timeout=180)))
        running.start()
        try:  # the run shows while it runs (it waits at the gate)
            browser.wait_until(lambda: "running" in browser.text("#runs tbody tr.pending"), "the run, running")
            # Its connection, as the proxy decided it, while the run still waits on it.
            live = browser.wait_until(lambda: browser.text("#network tbody"), "the running command's connection")
            assert re.fullmatch(rf"…\s+allowed\s+127\.0\.0\.1\s+{gate.port}\s+http\s+127\.0\.0\.1:{gate.port}\s*",
                                live), live
            shot(browser, shots, "2-running")
        finally:
            gate.release.set()
            running.join(180)
        ran = structured(answers[0])
        assert ran["exit_code"] == 0 and ran["stdout"] == "HTTP/1.0 200 OK\nHTTP/1.1 403 Forbidden\n", ran
        verdicts = [(r["host"], r["allowed"]) for r in ran["touched"]["network"]]
        assert verdicts == [("127.0.0.1", True), ("denied.example", False)], ran["touched"]["network"]

        # The run, as it reaches the page by the event stream (the page is not reloaded).
        browser.wait_until(lambda: "out.txt" in browser.text("#runs tbody tr[data-run='1']"), "the agent's run")
        browser.click("#runs tbody tr[data-run='1']")
        written = browser.wait_until(lambda: browser.text("#run-written"), "the run's written files")
        assert "out.txt" in written and "secret.txt" in written and HOSTILE in written
        assert browser.script("return document.querySelectorAll('#run-detail img').length") == 0
        assert re.fullmatch(r"\d+ files", browser.text("#run-read summary"))
        assert browser.script("return document.title") == "ccw dashboard"
        # The run's own records (with bytes) in place of the live rows.
        network = browser.wait_until(lambda: "…" not in browser.text("#network tbody")
                                     and browser.text("#network tbody"), "the run's connections")
        assert re.search(r"1\s+denied\s+denied\.example\s+80", network), network
        assert re.search(rf"1\s+allowed\s+127\.0\.0\.1\s+{gate.port}", network), network
        assert len(browser.find("#network tbody tr")) == 2, network
        browser.click("#show-diff")
        assert "+hello" in browser.wait_until(lambda: "+hello" in browser.text("#diff") and browser.text("#diff"),
                                              "the diff")
        browser.script("document.getElementById('network').scrollIntoView()")
        shot(browser, shots, "3-run")
        browser.script("window.scrollTo(0, 0)")

        # Promotion under a policy that refuses: its message on the page, nothing written.
        browser.type("#policies", "no-secrets")
        browser.click("#promote")
        refused = browser.wait_until(lambda: "refused" in browser.text("#action-result")
                                     and browser.text("#action-result"), "the policy's refusal")
        assert "secret.txt" in refused, refused
        assert not (workspace / "out.txt").exists()
        browser.wait_until(lambda: "promotion refused" in browser.text("#reports"), "the refusal's event")
        shot(browser, shots, "4-refused")

        # Under the default policy: applied, and the file is in the workspace.
        browser.type("#policies", "")
        browser.click("#promote")
        done = browser.wait_until(lambda: "promoted:" in browser.text("#action-result")
                                  and browser.text("#action-result"), "the promotion")
        assert "refused" not in done
        assert (workspace / "out.txt").read_text() == "hello\n" and (workspace / HOSTILE).exists()
        shot(browser, shots, "5-promoted")

        browser.click("#destroy")
        assert browser.text("#destroy") == "Really destroy?"  # a second click, not a modal dialog
        browser.click("#destroy")
        browser.wait_until(lambda: "destroyed" in browser.text("#capsules li"), "the capsule, destroyed")
        assert browser.text("#action-result") == "destroyed"
    print(f"screenshots kept in {shots}")


def test_the_plots_and_reports_draw_what_the_events_say(tmp_path: Path, browser: Browser) -> None:
    """No helper: a journal and events as the tools write them, shown by a fresh page."""
    state_dir = tmp_path / "state"
    store = State(state_dir)
    journal, log = Journal(store), EventLog(store)
    journal.add_capsule(capsule_record())
    for duration in (120, 480, 240):
        seq = journal.add_exec("cap_1", {**exec_entry({"read": [], "written": [], "network": []}),
                                         "duration_ms": duration})
        journal.add_outputs("cap_1", seq, {"stdout": b"<script>document.title='pwned'</script>\n", "stderr": b""})
    trials = [(8, "fail"), (4, "pass"), (4, "fail"), (2, "fail"), (1, "pass"), (1, "unresolved")]
    for size, outcome in trials:
        log.add("deltamin.trial", "cap_1", {"size": size, "outcome": outcome, "fresh": True})
    log.add("deltamin.done", "cap_1", {"minimal": 2, "replay_ok": True, "trials": 6, "cache_hits": 1,
                                       "elapsed_ms": 900, "one_minimal": True})
    log.add("file.changed", "cap_1", {"seq": 1, "path": "notes.md", "action": "write"})
    log.add("witness", "cap_1", {"witness_id": "w_1", "path": "/w", "root_hash": "h", "size_bytes": 4096})
    log.add("replay", "cap_1", {"replay_ok": False, "root_hash": "h", "output_identical": False, "differences": 2})
    log.add("promotion", "cap_1", {"applied": ["a", "b"], "dry_run": False, "refused": None,
                                   "branch": {"name": "ccw/fix", "commit": "0123456789abcdef"}})
    log.add("promotion", "cap_1", {"applied": ["a"], "dry_run": False, "refused": None})
    store.close()
    with serve_ui(state_dir) as url:
        port = int(url.split(":")[2].split("/")[0])
        browser.get(launch_page(tmp_path, port, url).as_uri())  # the way ccw ui starts a browser
        browser.wait_until(lambda: browser.find("#deltamin-plot circle"), "deltamin's trials")
        assert browser.script("return location.href") == url
        assert len(browser.find("#runs tbody tr")) == 3
        assert [len(browser.find(f"#usage-plot svg:nth-child({i}) rect")) for i in (1, 2, 3)] == [3, 3, 3]
        heights = browser.script("return [...document.querySelectorAll('#usage-plot svg:first-child rect')]"
                                 ".map((r) => Number(r.getAttribute('height')))")
        assert heights[1] == max(heights) and heights[0] < heights[2] < heights[1]  # 120, 480, 240 ms
        fills = browser.script("return [...document.querySelectorAll('#deltamin-plot circle')]"
                               ".map((c) => c.getAttribute('fill'))")
        assert fills == ["#c62828", "#1a7f37", "#c62828", "#c62828", "#1a7f37", "#8a8f99"]
        assert "minimal: 2 hunks after 6 trials" in browser.text("#deltamin")
        reports = browser.text("#reports")
        assert "file tool: write notes.md" in reports
        assert "witness w_1 (4096 bytes)" in reports and "replay: differs, 2 outputs differ" in reports
        # A branch's promotion wrote a commit, not the workspace: it says so, unlike a live one.
        assert "committed 2 files on branch ccw/fix (0123456789ab)" in reports and "promoted: 1 files" in reports
        assert "promoted: 2 files" not in reports
        browser.click("#runs tbody tr")
        shown = browser.wait_until(lambda: browser.text("#run-stdout"), "the run's output")
        assert shown == "<script>document.title='pwned'</script>"
        assert browser.script("return document.title") == "ccw dashboard"
        browser.script("document.getElementById('deltamin-plot').scrollIntoView()")
        shot(browser, tmp_path / "screenshots", "plots")


TRIAL_COLORS = {"fail": "#c62828", "pass": "#1a7f37", "unresolved": "#8a8f99"}  # as core/deltamin.py names them


def test_a_real_deltamin_draws_its_trials_on_the_open_page(
        state: Path, dashboard: str, browser: Browser, tmp_path: Path) -> None:
    """``capsule_deltamin`` on a real capsule (as vm-tests/test_tools_counterfactual_e2e.py runs
    it): one of eight changed files breaks the check; each trial reaches the page as an event."""
    ws, shots = tmp_path / "ws", tmp_path / "screenshots"
    ws.mkdir()
    for i in range(8):
        (ws / f"f{i}.txt").write_text("ok\n")
    change = "; ".join(f"echo {'BAD' if i == 5 else 'fine'} >> f{i}.txt" for i in range(8))
    check = ["sh", "-c", "cat f*.txt > /dev/null; ! grep -q BAD f5.txt"]
    with RawStdio(state, "capsule", tasks=None) as agent:
        cap = structured(agent.call("capsule_create", {"workspace": str(ws), "auto_expose": False}))["capsule_id"]
        assert structured(agent.call("capsule_exec",
                                     {"capsule_id": cap, "cmd": ["sh", "-c", change]}))["exit_code"] == 0
        browser.get(dashboard)
        browser.wait_until(lambda: cap in browser.text("#cap-title"), "the capsule, selected")
        assert browser.find("#deltamin-plot circle") == []
        found = structured(agent.call("capsule_deltamin", {"capsule_id": cap, "target_cmd": check, "wait_ms": None},
                                      timeout=600))
    assert found["units"] == ["f5.txt"] and found["replay_ok"] is True, found
    store = State(state)
    trials = [e.data for e in EventLog(store).since(0, cap, 100_000) if e.kind == "deltamin.trial"]
    store.close()
    assert trials and {t["outcome"] for t in trials} >= {"fail", "pass"}, trials
    hunks = sum(1 for line in found["minimal_patch"].splitlines() if line.startswith("@@ "))
    summary = browser.wait_until(lambda: browser.text("#deltamin"), "deltamin's result")
    assert f"minimal: {hunks} hunks in 1 files after {found['trials']} trials" in summary, summary
    # Every trial the search ran, in order, coloured by its outcome (the page was never reloaded).
    fills = browser.script("return [...document.querySelectorAll('#deltamin-plot circle')]"
                           ".map((c) => c.getAttribute('fill'))")
    assert fills == [TRIAL_COLORS[t["outcome"]] for t in trials]
    titles = browser.script("return [...document.querySelectorAll('#deltamin-plot circle title')]"
                            ".map((t) => t.textContent)")
    assert [int(re.search(r": (\d+) changes", t)[1]) for t in titles] == [t["size"] for t in trials]  # type: ignore[index]
    browser.script("document.getElementById('deltamin-plot').scrollIntoView()")
    shot(browser, shots, "deltamin")
    print(f"screenshots kept in {shots}")


DENIED = r"""
import os, socket
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[-1].rsplit(":", 1)
with socket.create_connection((host, int(port)), timeout=60) as s:
    s.sendall(b"GET http://denied.example/ HTTP/1.0\r\nHost: x\r\n\r\n")
    print(s.recv(4096).split(b"\r\n")[0].decode())
"""


def _long_history(state: Path, cap: str, runs: int, capsules: int) -> None:
    """Copies of what a real capsule's journal holds: its last run until it has ``runs``, and
    ``capsules`` more (destroyed) capsules like it."""
    store = State(state)
    journal = Journal(store)
    entry = journal.execs(cap)[-1]
    copy = {key: value for key, value in entry.items() if key not in ("capsule_id", "seq", "generation_out")}
    for _ in range(runs - entry["seq"]):
        journal.add_exec(cap, copy)
    record = journal.capsule(cap)
    assert record is not None
    for i in range(capsules):
        journal.add_capsule(dataclasses.replace(record, capsule_id=f"{cap}_old{i:03}"))
        journal.mark_destroyed(f"{cap}_old{i:03}", record.created_at)
    store.close()


def _shown(browser: Browser, css: str) -> int:
    return len(browser.find(css))


def test_a_long_history_comes_a_page_at_a_time(state: Path, dashboard: str, browser: Browser, tmp_path: Path) -> None:
    ws, shots = tmp_path / "ws", tmp_path / "screenshots"
    ws.mkdir()
    with RawStdio(state, "capsule", tasks=None) as agent:
        made = agent.call("capsule_create", {"workspace": str(ws), "auto_expose": False,
                                             "network": {"allow": ["127.0.0.1:9"]}})
        cap = structured(made)["capsule_id"]
        ran = structured(agent.call("capsule_exec", {"capsule_id": cap, "cmd": ["python3", "-c", DENIED]}))
        assert ran["stdout"] == "HTTP/1.1 403 Forbidden\n", ran
    _long_history(state, cap, 1200, 120)
    browser.get(dashboard)
    browser.wait_until(lambda: cap in browser.text("#cap-title"), "the live capsule first, selected")
    browser.wait_until(lambda: browser.text("#runs-shown") and browser.text("#events-shown"), "the first pages")
    assert browser.text("#capsules-shown") == "50 of 121" and _shown(browser, "#capsules li") == 50
    assert _shown(browser, "#runs tbody tr") == 100 and browser.text("#runs tbody tr").startswith("1101")
    assert browser.text("#runs-shown") == "runs 1101–1200 (100 shown of 1200)"
    assert _shown(browser, "#network tbody tr") == 200 and "denied.example" in browser.text("#network tbody tr")
    assert [_shown(browser, f"#usage-plot svg:nth-child({i}) rect") for i in (1, 2, 3)] == [100, 100, 100]
    shot(browser, shots, "1-newest-pages")

    browser.click("#older-runs")
    browser.wait_until(lambda: _shown(browser, "#runs tbody tr") == 200, "the older runs")
    assert browser.text("#runs tbody tr").startswith("1001") and "runs 1001–1200" in browser.text("#runs-shown")
    browser.click("#older-events")
    browser.wait_until(lambda: _shown(browser, "#network tbody tr") == 400, "the older events")
    for shown in ("100 of 121", "121 of 121"):
        browser.click("#older-capsules")
        browser.wait_until(lambda: browser.text("#capsules-shown") == shown, f"{shown} capsules")  # noqa: B023
    assert browser.find("#older-capsules[hidden]") and not browser.find("#older-runs[hidden]")
    assert _shown(browser, "#capsules li.destroyed") == 120
    shot(browser, shots, "2-older-pages")

    # 600 more runs while the page is open: they come by the live stream, in batches; the
    # table ends at the newest, holds each run once and in order, and never more than it keeps.
    _long_history(state, cap, 1800, 0)
    browser.wait_until(lambda: browser.text("#runs-shown").endswith("of 1800)"), "the live runs")
    numbers = browser.script("return [...document.querySelectorAll('#runs tbody tr.run')]"
                             ".map((tr) => Number(tr.dataset.run))")
    assert numbers[-1] == 1800 and numbers == list(range(numbers[0], 1801)) and len(numbers) <= 1000, numbers
    browser.wait_until(lambda: _shown(browser, "#network tbody tr") == 1000, "the live connections")
    assert not browser.find("#older-runs[hidden]")
    print(f"screenshots kept in {shots}")


# What a capsule writes, aimed at the page: markup, a script URL, terminal escapes, and bidi
# controls that would make a line read as other code than it is (Trojan Source: an override
# and isolates turn `"user"` checks into what looks like a comment).
CANARY = "window.ccwPwned=1"
MARKUP = f"<img src=x onerror={CANARY}><script>{CANARY}</script><a href='javascript:{CANARY}'>ok</a>"
TROJAN = 'if role != "user\u202e \u2066// admins only\u2069 \u2066":'
BIDI = re.compile("[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def test_what_a_capsule_wrote_is_shown_as_text_never_run_or_reordered(tmp_path: Path, browser: Browser) -> None:
    state_dir = tmp_path / "state"
    store = State(state_dir)
    journal, log = Journal(store), EventLog(store)
    journal.add_capsule(capsule_record())
    network = [{"host": f"{MARKUP}\u202eexample.org", "port": 443, "protocol": "https", "allowed": False,
                "rule": None, "reason": MARKUP, "bytes_in": 0, "bytes_out": 0}]
    seq = journal.add_exec("cap_1", {**exec_entry({"read": [MARKUP], "written": [f"src/{MARKUP}", "gpj.\u202eexe"],
                                                   "network": network}), "argv": ["sh", "-c", TROJAN + MARKUP]})
    journal.add_outputs("cap_1", seq, {"stdout": f"{TROJAN}\n\x1b]0;pwned\x07{MARKUP}\n".encode() + b"\xff\xfe" * 9,
                                       "stderr": ("x" * 20000 + MARKUP).encode()})
    log.add("policy.report", "cap_1", {"passed": False, "report": {"details": f"\u202edessap {MARKUP}"}})
    log.add("promotion", "cap_1", {"applied": [], "dry_run": False, "branch": None,
                                   "refused": {"code": "POLICY", "message": MARKUP + "\u202e"}})
    log.add("file.changed", "cap_1", {"seq": 1, "path": MARKUP, "action": "write"})
    races.begin(store, "run_1", None, {"capsule_ids": ["cap_1"], "cmd": [TROJAN, MARKUP], "policy": MARKUP})
    races.end(store, "run_1", {"order": "exit_code", "rows": [
        {"capsule_id": "cap_1", "exit_code": 1, "timed_out": False, "duration_ms": 40, "usage": {},
         "diff": {"files": 1, "lines": 1}, "verdict": "failed", "verdict_details": TROJAN + MARKUP, "rank": 1}]})
    store.close()
    with serve_ui(state_dir) as url:
        browser.get(url)
        browser.wait_until(lambda: browser.text("#race-title") and browser.find("#runs tbody tr"), "the page")
        # From here, markup parsed anywhere would try to run: CSP blocks it, and says so.
        browser.script("window.ccwViolations = 0; document.addEventListener('securitypolicyviolation', "
                       "() => { window.ccwViolations += 1; })")
        browser.click("#race-table tbody tr a")  # the race's capsule link selects it again: all redrawn
        browser.click("#runs tbody tr")
        browser.wait_until(lambda: "admins only" in browser.text("#run-stdout"), "the run's output")
        browser.wait_until(lambda: "promotion refused" in browser.text("#reports"), "the reports")
        page = browser.script("return document.body.innerText")
        assert browser.script("return [window.ccwPwned, window.ccwViolations, document.title]") == \
            [None, 0, "ccw dashboard"]
        assert browser.script("return document.querySelectorAll('main img, main script, main a[href^=javascript]')"
                              ".length") == 0
        assert MARKUP in page and f"<img src=x onerror={CANARY}><script>" in browser.text("#run-written")
        # No bidi control reaches the screen: each is shown as its code, as the CLI shows it.
        assert not BIDI.search(page), [m.group() for m in BIDI.finditer(page)]
        assert 'if role != "user\\u202e \\u2066// admins only\\u2069 \\u2066":' in browser.text("#run-stdout")
        assert "gpj.\\u202eexe" in browser.text("#run-written")
        assert browser.text("#reports").count("\\u202e") == 2 and "\\u202e" in browser.text("#race-title")
        titles = browser.script("return [...document.querySelectorAll('[title]')].map((n) => n.title).join('')")
        assert TROJAN not in titles and "\\u2066// admins only" in titles
        shot(browser, tmp_path / "screenshots", "hostile")

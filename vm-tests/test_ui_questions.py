"""The connections waiting for a person's answer, in ``ccw ui`` in a real headless browser
(Debian's chromium, through chromedriver): issue 37's "a pending list with buttons in ccw
ui, so a person beside an agent whose client cannot elicit still can".

Questions are asked as the proxy asks them (capsules/asks.py) while the page is open: they
appear live (the page follows ``net.ask`` events), each with its buttons, their text
shown as text; a denial with a reason and an approval for the capsule are clicked, and the
answers are in the state dir with who gave them (the dashboard).  The screenshots are
kept under the test's tmp dir.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mcp_server.capsules import asks
from mcp_server.state import State
from tests.support.cli_process import ccw, serve_ui
from tests.support.webdriver import Browser, shot

HOSTILE = "<img src=x onerror=document.title='pwned'>.example"


@pytest.fixture
def state(tmp_path: Path, root_required: None) -> Iterator[Path]:
    state_dir = tmp_path / "state"
    State(state_dir).close()
    yield state_dir
    ccw(state_dir, "helper", "stop", check=False)


def test_questions_appear_live_and_are_answered_with_the_pages_buttons(
        state: Path, browser: Browser, tmp_path: Path) -> None:
    shots = tmp_path / "screenshots"
    with serve_ui(state) as url:
        browser.get(url)
        browser.wait_until(lambda: browser.text("#status").startswith("live"), "the page following events")
        assert browser.script("return document.getElementById('questions').hidden") is True  # none yet
        store = State(state)
        hostile = asks.ask(store, "cap_a", HOSTILE, 443, "https", ["curl", "<b>x</b>"], 120)
        pypi = asks.ask(store, "cap_a", "files.pythonhosted.org", 443, "https", ["pip", "install", "flask"], 120)
        browser.wait_until(lambda: len(browser.find("#question-list tbody tr")) == 2, "both questions, live")
        rows = browser.text("#question-list tbody")
        assert "files.pythonhosted.org:443" in rows and "pip install flask" in rows and HOSTILE in rows
        assert browser.script("return document.title") == "ccw dashboard"  # the host was text, not markup
        shot(browser, shots, "1-waiting")

        first = f"#question-list tr[data-question='{hostile.id}']"
        browser.type(f"{first} input", "this project never fetches from there")
        browser.click(f"{first} button[data-answer='denied']")
        browser.click(f"#question-list tr[data-question='{pypi.id}'] button[data-answer='capsule']")
        browser.wait_until(lambda: browser.script("return document.getElementById('questions').hidden"),
                           "the list empty once both are answered")
        shot(browser, shots, "2-answered")
        denied, allowed = asks.get(store, hostile.id), asks.get(store, pypi.id)
        assert denied is not None and allowed is not None
        assert (denied.state, denied.reason) == ("denied", "this project never fetches from there")
        assert allowed.state == "capsule" and allowed.who is not None and allowed.who.endswith("(ccw ui)")
        store.close()


def test_an_agents_proposal_is_approved_with_the_pages_approve_button(
        state: Path, browser: Browser, tmp_path: Path) -> None:
    with serve_ui(state) as url:
        browser.get(url)
        browser.wait_until(lambda: browser.text("#status").startswith("live"), "the page following events")
        store = State(state)
        made = asks.propose(store, "cap_a", ["pypi.org:443", "preset:pypi"], "the <i>index</i>", "token agent")
        browser.wait_until(lambda: len(browser.find("#question-list tbody tr")) == 1, "the proposal, live")
        rows = browser.text("#question-list tbody")
        assert "proposal of token agent: preset:pypi, pypi.org:443" in rows and "the <i>index</i>" in rows
        here = f"#question-list tr[data-question='{made.id}']"
        assert not browser.find(f"{here} button[data-answer='once']")  # a proposal is about rules: no "once"
        shot(browser, tmp_path / "screenshots", "proposal")
        browser.click(f"{here} button[data-answer='capsule']")
        browser.wait_until(lambda: browser.script("return document.getElementById('questions').hidden"),
                           "the list empty once it is approved")
        approved = asks.get(store, made.id)
        assert approved is not None and approved.state == "capsule"
        assert approved.who is not None and approved.who.endswith("(ccw ui)")
        store.close()

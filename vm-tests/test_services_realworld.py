"""A real web project run as a service, the way an agent and a person use it (issue 36).

The Flask tutorial's blog (flaskr, from Flask 3.0.3's sdist on PyPI, with Flask and
pytest pinned in the workspace's own ``.venv/``: tests/support/realprojects.py) and,
beside its own tests, a live suite that talks to the running app over HTTP.  An agent
drives it over MCP, through a real ``ccw-mcp`` on stdio: it makes the database, starts
the app as a service (``ready: {port}``), runs both suites from an exec, reads the
service's log (the live suite's requests are in it), forwards the port, and a person's
browser (Debian's headless chromium, through chromedriver) loads the page.  The agent
edits a template through the file tools, restarts the service (stop, start) and the
change shows in the browser and from an exec.  Afterwards ``ccw capsule log`` lists the
service's runs, and ``ccw capsule show`` the app's files they read.  The screenshots are
kept under the test's tmp dir (their paths are printed).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import trio

from tests.support import realprojects
from tests.support.agent_loop import Call, edit, leaf, mcp_stdio
from tests.support.cli_process import ccw
from tests.support.mcp_process import agent_server_env
from tests.support.webdriver import Browser, shot

PROJECT = realprojects.FLASKR
HEADING = PROJECT.harmless[0]  # the template's <h1>: "Flaskr", then "Flaskr, served from a capsule"
APP = [".venv/bin/python", "-m", "flask", "--app", "flaskr", "run", "--port", "5000"]
TESTS = [*realprojects.PYTEST, "-q", "tests", "tests_live"]
FETCH = [".venv/bin/python", "-c", "import urllib.request as u; print(u.urlopen('http://127.0.0.1:5000/', "
         "timeout=10).read().decode())"]

# The project's live suite: the app as it runs, over HTTP, against the capsule's service.
LIVE_TESTS = '''\
"""flaskr as it runs: a user registers, logs in and writes a post, over HTTP."""
import http.cookiejar
import urllib.parse
import urllib.request

BASE = "http://127.0.0.1:5000"


def _browser():
    return urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))


def _post(browser, path, **form):
    with browser.open(BASE + path, urllib.parse.urlencode(form).encode(), timeout=10) as answer:
        return answer.geturl(), answer.read().decode()


def test_a_new_user_writes_a_post_that_the_index_shows():
    browser = _browser()
    assert _post(browser, "/auth/register", username="agent", password="pw")[0] == BASE + "/auth/login"
    assert _post(browser, "/auth/login", username="agent", password="pw")[0] == BASE + "/"
    _post(browser, "/create", title="Written over HTTP", body="by the live suite")
    with browser.open(BASE + "/", timeout=10) as answer:
        page = answer.read().decode()
    assert "Written over HTTP" in page and "by agent on" in page


def test_a_wrong_password_is_refused():
    assert "Incorrect password." in _post(_browser(), "/auth/login", username="agent", password="wrong")[1]
'''


async def _log_with(call: Call, cap: str, text: str) -> dict[str, Any]:
    """The service's log once it holds ``text`` (its output comes in a few times a second)."""
    with trio.move_on_after(15):
        while True:
            logs = await call("capsule_service_logs", {"capsule_id": cap, "name": "web"})
            if text in logs["text"]:
                break
            await trio.sleep(0.1)
    return logs


def _page(browser: Browser, url: str, heading: str, shots: Path, name: str) -> dict[str, str]:
    """Load ``url`` until its heading reads ``heading``; the page's texts, and a screenshot."""
    def shows_it() -> bool:
        browser.get(url)  # again each time: a page the old server had already answered is not the new one's
        return browser.text("nav h1") == heading

    browser.wait_until(shows_it, f"the heading {heading!r}", timeout=30)
    shot(browser, shots, name)
    return {"heading": browser.text("nav h1"), "title": browser.script("return document.title"),
            "post": browser.text("article.post h1"), "about": browser.text("article.post .about")}


async def scenario(call: Call, ws: Path, browser: Browser, shots: Path) -> dict[str, Any]:
    """The agent's loop and the person's browser; what each step answered."""
    out: dict[str, Any] = {}
    cap = out["cap"] = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    out["init"] = await call("capsule_exec", {"capsule_id": cap, "cmd": [*APP[:5], "init-db"]})
    ready = {"port": 5000, "timeout_ms": 30_000}
    out["start"] = await call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": APP, "ready": ready})
    out["tests"] = await call("capsule_exec", {"capsule_id": cap, "cmd": TESTS, "timeout_ms": 300_000})
    out["logs"] = await _log_with(call, cap, '"POST /auth/login HTTP/1.1" 200')  # the live suite's last request
    out["port"] = await call("capsule_port", {"capsule_id": cap, "port": 5000})
    url = out["port"]["url"]
    out["before"] = await trio.to_thread.run_sync(_page, browser, url, "Flaskr", shots, "1-as-published")

    await edit(call, cap, ws, HEADING.path, HEADING.old, HEADING.new)
    out["stop"] = await call("capsule_service_stop", {"capsule_id": cap, "name": "web"})
    out["restart"] = await call("capsule_service_start", {"capsule_id": cap, "name": "web", "cmd": APP,
                                                          "ready": ready})
    out["after"] = await trio.to_thread.run_sync(_page, browser, url, "Flaskr, served from a capsule", shots,
                                                 "2-edited")
    out["fetch"] = await call("capsule_exec", {"capsule_id": cap, "cmd": FETCH})
    out["list"] = await call("capsule_service_list", {"capsule_id": cap})
    out["last_stop"] = await call("capsule_service_stop", {"capsule_id": cap, "name": "web"})
    await call("capsule_destroy", {"capsule_id": cap})
    return out


def test_an_agent_serves_flaskr_tests_it_live_and_a_browser_sees_its_edit(
        tmp_path: Path, root_required: None, browser: Browser) -> None:
    ws = realprojects.pristine(PROJECT, tmp_path / "ws")
    (ws / "tests_live").mkdir()
    (ws / "tests_live" / "test_running_app.py").write_text(LIVE_TESTS)
    realprojects.git(ws, "add", "tests_live")
    realprojects.git(ws, "commit", "-q", "-m", "a live suite, against the running app")
    state, shots = tmp_path / "state", tmp_path / "screenshots"
    state.mkdir()

    async def main() -> dict[str, Any]:
        async with mcp_stdio(agent_server_env(state, ws)) as call:
            return await scenario(call, ws, browser, shots)

    try:
        out = trio.run(main)
    except BaseExceptionGroup as group:  # the MCP client's task groups wrap the scenario's failure
        raise leaf(group) from None
    print(f"screenshots kept in {shots}")
    assert out["init"]["exit_code"] == 0 and "Initialized the database." in out["init"]["stdout"], out["init"]
    assert out["start"]["ready"] is True and out["start"]["state"] == "ready", out["start"]
    # flaskr's own 24 tests (the test client) and the live suite's 2 (HTTP to the service).
    tests = out["tests"]
    assert tests["exit_code"] == 0 and "26 passed" in tests["stdout"], tests["stdout"][-3000:] + tests["stderr"]
    log = re.sub(r"\x1b\[[0-9;]*m", "", out["logs"]["text"])  # werkzeug colours a redirect's line
    assert '"POST /auth/register HTTP/1.1" 302' in log and '"POST /create HTTP/1.1" 302' in log, log
    assert '"POST /auth/login HTTP/1.1" 200' in log, log  # the wrong password: the form again, with the message
    # The person's browser, through the forwarded port: the post the live suite wrote.
    assert out["port"]["url"].startswith("http://127.0.0.1:"), out["port"]
    assert out["before"] == {"heading": "Flaskr", "title": "Posts - Flaskr", "post": "Written over HTTP",
                             "about": out["before"]["about"]} and out["before"]["about"].startswith("by agent on ")
    # After the edit and the restart: the new heading, the same database.
    assert out["stop"]["state"] == "stopped" and out["restart"]["ready"] is True, (out["stop"], out["restart"])
    assert out["after"]["heading"] == "Flaskr, served from a capsule" and out["after"]["post"] == "Written over HTTP"
    assert "Flaskr, served from a capsule</a></h1>" in out["fetch"]["stdout"], out["fetch"]
    assert [s["state"] for s in out["list"]["services"]] == ["ready"], out["list"]
    assert [p["url"] for p in out["list"]["ports"]] == [out["port"]["url"]], out["list"]
    assert HEADING.old in (ws / HEADING.path).read_text()  # the edit stayed in the capsule
    _check_the_journal(state, out["cap"])


# A line of ``ccw capsule log``: run, started, generations, exit, time, read, wrote, net, command.
LOG_LINE = re.compile(r"^ *(\d+) +\S+ +\S+ +(\S+) +[\d.]+ m?s +(\d+|-) +(\d+) +(\d+) +(.*)$")


def _check_the_journal(state: Path, cap: str) -> None:
    """``ccw capsule log`` lists both runs of the service, ended by the stops, with what they read;
    ``ccw capsule show`` names the app's files the first one read and the database it wrote."""
    table = ccw(state, "capsule", "log", cap).stdout
    runs = [found.groups() for found in map(LOG_LINE.match, table.splitlines()) if found]
    served = [(run, exit_, int(reads)) for run, exit_, reads, _, _, command in runs
              if command == "[service web] " + shlex.join(APP)]  # the log marks a service's runs
    assert len(served) == 2 and all(exit_ == "SIGTERM" and reads > 50 for _, exit_, reads in served), table
    first = json.loads(ccw(state, "capsule", "show", cap, served[0][0], "--json").stdout)
    app_reads = [path for path in first["read"] if not path.startswith(".venv/")]
    for read in ("flaskr/templates/base.html", "flaskr/templates/blog/index.html", "flaskr/templates/auth/login.html",
                 "flaskr/static/style.css", "instance/flaskr.sqlite"):
        assert read in app_reads, (read, app_reads)
    # Its code: the bytecode init-db's exec left (Python stats the sources and opens that).
    assert {"auth", "blog", "db"} <= {re.sub(r"\..*", "", Path(path).name) for path in app_reads
                                      if path.startswith("flaskr/__pycache__/")}, app_reads
    assert "instance/flaskr.sqlite" in first["written"], first["written"]  # the user and post it stored

"""``ccw ui``'s server (mcp_server/ui/server.py): who may call it, the headers it sends, and
that what a capsule named comes back as data, on a real loopback socket.

The tools it calls are stood in for by a recorder here (the browser test in
vm-tests/test_ui_browser.py calls the real ones): these tests are about the boundary.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.capsules import asks
from mcp_server.cli import main
from mcp_server.config import Config
from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.state import State
from mcp_server.ui.api import DETAIL_PATHS, PAGES
from mcp_server.ui.server import MAX_BODY, Dashboard, serve
from sandbox.errors import CcwError
from tests.support.cli_process import CCW, ROOT, cli_env
from tests.support.journal_rows import capsule_record, exec_entry

TOKEN = "t0ken-for-tests"
HOSTILE_ARGV = ["sh", "-c", "<img src=x onerror=alert(1)>"]
HOSTILE_PATH = "<script>alert(2)</script>\x1b[2J.txt"

Response = tuple[int, dict[str, str], bytes]
Scenario = Callable[[Callable[..., Awaitable[Response]], list[tuple[str, dict[str, Any]]]], Awaitable[None]]


async def _http(port: int, method: str, path: str, headers: dict[str, str], body: bytes = b"") -> Response:
    """One HTTP/1.1 request on a fresh connection, exactly as given (Host included)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    await stream.send_all(f"{head}content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body)
    data = b""
    while chunk := await stream.receive_some():
        data += chunk
    await stream.aclose()
    top, _, payload = data.partition(b"\r\n\r\n")
    lines = top.decode("latin-1").split("\r\n")
    found = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in found.items()}, payload


def _run(state_dir: Path, scenario: Scenario, refuse: bool = False) -> None:
    """Serve a dashboard of ``state_dir`` and run ``scenario(request, tool_calls)`` against it."""
    calls: list[tuple[str, dict[str, Any]]] = []

    async def call_tool(config: Config, name: str, args: dict[str, Any]) -> dict[str, Any]:
        calls.append((name, args))
        if refuse:
            raise CcwError("REPO_CHANGED", "the workspace changed under the capsule; diff again")
        return {"promoted": True, "applied": ["b.txt"], "policy_report": {"passed": True}}

    async def main_task() -> None:
        state = State(state_dir)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        app = Dashboard(Config.from_env(), state, TOKEN, "127.0.0.1", port, call_tool)
        stop = trio.Event()

        async def request(method: str, path: str, token: str | None = TOKEN, host: str | None = None,
                          body: bytes = b"", **extra: str) -> Response:
            headers = {"host": host or f"127.0.0.1:{port}", **{k.replace("_", "-"): v for k, v in extra.items()}}
            if token is not None:
                headers["x-ccw-token"] = token
            return await _http(port, method, path, headers, body)

        async with trio.open_nursery() as nursery:
            await nursery.start(serve, app, sock, stop)
            await scenario(request, calls)
            stop.set()
        state.close()

    trio.run(main_task)


@pytest.fixture
def populated(state_dir: Path) -> Path:
    """A state dir with one capsule whose run carries hostile argv, path and output."""
    state = State(state_dir)
    journal, _ = Journal(state), EventLog(state)
    journal.add_capsule(capsule_record())
    entry = exec_entry({"read": ["a.py"], "written": [HOSTILE_PATH, "d/e.txt"], "network": []})
    entry["usage"] = {**entry["usage"], "rss_max_process_kb": 600}
    journal.add_outputs("cap_1", journal.add_exec("cap_1", {**entry, "argv": HOSTILE_ARGV}),
                        {"stdout": b"<b>bold</b>\n", "stderr": b""})
    state.close()
    return state_dir


def test_the_api_needs_the_token_and_this_servers_host(populated: Path) -> None:
    async def scenario(request: Any, calls: list[Any]) -> None:
        assert (await request("GET", "/api/capsules"))[0] == 200
        for token in (None, "", TOKEN[:-1], TOKEN + "x"):
            status, _, body = await request("GET", "/api/capsules", token=token)
            assert status == 401 and b"token" in body, token
        for host in ("evil.example", "evil.example:80", "127.0.0.1:1", "127.0.0.1"):
            assert (await request("GET", "/api/capsules", host=host))[0] == 421, host
            assert (await request("GET", "/", host=host))[0] == 421, host  # a rebound name gets not even the page
        status, _, _ = await request("GET", "/api/capsules", host=None)
        assert status == 200

    _run(populated, scenario)


def test_actions_from_another_origin_are_refused_before_any_tool_runs(populated: Path) -> None:
    async def scenario(request: Any, calls: list[Any]) -> None:
        for origin in ("http://evil.example", "null", "http://127.0.0.1:1"):
            status, _, _ = await request("POST", "/api/capsules/cap_1/promote", body=b"{}", origin=origin)
            assert status == 403, origin
        assert calls == []
        assert (await request("POST", "/api/capsules/cap_1/destroy", token=None, body=b"{}"))[0] == 401
        assert (await request("POST", "/api/capsules/cap_1/promote", body=b"x" * (MAX_BODY + 1)))[0] == 413
        assert calls == []
        status, _, body = await request("POST", "/api/capsules/cap_1/promote", body=b'{"policies": ["baseline"]}')
        assert status == 200 and json.loads(body)["result"]["promoted"] is True
        assert calls == [("capsule_promote", {"capsule_id": "cap_1", "dry_run": False, "policies": ["baseline"]})]

    _run(populated, scenario)


def test_a_tools_refusal_comes_back_for_the_page_to_show(populated: Path) -> None:
    async def scenario(request: Any, calls: list[Any]) -> None:
        status, _, body = await request("POST", "/api/capsules/cap_1/promote", body=b"{}")
        assert status == 200 and json.loads(body) == {"ok": False, "error": {
            "code": "REPO_CHANGED", "message": "the workspace changed under the capsule; diff again"}}

    _run(populated, scenario, refuse=True)


def test_every_answer_carries_the_security_headers_and_no_cookie(populated: Path) -> None:
    async def scenario(request: Any, calls: list[Any]) -> None:
        for path, token in (("/", None), ("/static/app.js", None), ("/static/style.css", None),
                            ("/api/capsules", TOKEN), ("/api/capsules", None), ("/nothing", None)):
            _, headers, _ = await request("GET", path, token=token)
            csp = headers["content-security-policy"]
            assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe" not in csp
            assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "no-referrer"
            assert "set-cookie" not in headers
        status, headers, body = await request("GET", "/static/app.js", token=None)
        assert status == 200 and headers["content-type"].startswith("text/javascript") and b"textContent" in body
        for path in ("/static/../server.py", "/static/", "/static/api.py", "/index.html/x"):
            assert (await request("GET", path, token=None))[0] == 404, path

    _run(populated, scenario)


def test_what_a_capsule_named_is_returned_verbatim_as_json(populated: Path) -> None:
    async def scenario(request: Any, calls: list[Any]) -> None:
        status, headers, body = await request("GET", "/api/capsules/cap_1/runs")
        assert status == 200 and headers["content-type"] == "application/json"
        (run,) = json.loads(body)["runs"]
        assert run["argv"] == HOSTILE_ARGV and (run["cpu_ms"], run["rss_max_kb"],
                                                run["rss_max_process_kb"]) == (7, 900, 600)
        detail = json.loads((await request("GET", "/api/capsules/cap_1/runs/1"))[2])
        assert detail["written"] == [HOSTILE_PATH, "d/e.txt"] and detail["output"]["stdout"] == "<b>bold</b>\n"
        assert (await request("GET", "/api/capsules/cap_1/runs/2"))[0] == 404
        assert (await request("GET", "/api/capsules/nope/runs"))[0] == 404

    _run(populated, scenario)


def test_the_page_renders_text_only_and_runs_no_inline_script() -> None:
    static = ROOT / "mcp_server" / "ui" / "static"
    script = (static / "app.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(",
                 "setAttribute(\"on", "DOMParser", "createContextualFragment"):
        assert sink not in script, sink
    page = (static / "index.html").read_text()
    assert re.findall(r"<script[^>]*>", page) == ['<script src="/static/app.js" defer>',
                                                  '<script src="/static/races.js" defer>']
    assert not re.search(r"\son\w+=|style=|https?://", page)


def test_the_event_stream_is_a_long_poll_that_answers_when_an_event_is_committed(populated: Path) -> None:
    async def scenario(request: Any, calls: list[Any]) -> None:
        first = json.loads((await request("GET", "/api/events?after=0&capsule=cap_1"))[2])["events"]
        assert [e["kind"] for e in first][:2] == ["capsule.created", "run.finished"]
        last = first[-1]["id"]
        assert json.loads((await request("GET", f"/api/events?after={last}&wait=0"))[2])["events"] == []

        async def other_process_writes() -> None:
            await trio.sleep(0.5)
            other = State(populated)  # its own connection, as another process has
            EventLog(other).add("capsule.destroyed", "cap_1", {})
            other.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(other_process_writes)
            status, _, body = await request("GET", f"/api/events?after={last}&wait=20000")
        assert status == 200 and [e["kind"] for e in json.loads(body)["events"]] == ["capsule.destroyed"]
        assert (await request("GET", "/api/events?after=x"))[0] == 400

    _run(populated, scenario)


def _get(response: Response) -> Any:
    status, _, body = response
    assert status == 200, body
    return json.loads(body)


@pytest.fixture
def long_history(state_dir: Path) -> Path:
    """A state dir with 260 capsules (every third destroyed), cap_0 with 620 runs (the last one
    wrote 2500 files) and a net.connection event per run."""
    state = State(state_dir)
    journal, _ = Journal(state), EventLog(state)
    for i in range(260):
        journal.add_capsule(dataclasses.replace(capsule_record(f"cap_{i}"),
                                                created_at=f"2026-11-27T{i // 60:02}:{i % 60:02}:00Z"))
        if i % 3 == 1:
            journal.mark_destroyed(f"cap_{i}", "2026-11-28T00:00:00Z")
    connection = {"host": "pypi.org", "port": 443, "protocol": "https", "allowed": True, "rule": "pypi.org:443"}
    for run in range(1, 621):
        written = [f"node_modules/p{n}/index.js" for n in range(2500)] if run == 620 else ["out.txt"]
        journal.add_exec("cap_0", exec_entry({"read": [], "written": written, "network": [connection]}))
    state.close()
    return state_dir


def test_runs_come_a_page_at_a_time_going_back_and_a_page_is_capped(long_history: Path) -> None:
    default, most = PAGES["runs"]

    async def scenario(request: Any, calls: list[Any]) -> None:
        newest = _get(await request("GET", "/api/capsules/cap_0/runs"))
        assert [r["run"] for r in newest["runs"]] == list(range(621 - default, 621))
        assert newest["more"] is True and newest["total"] == 620
        capped = _get(await request("GET", f"/api/capsules/cap_0/runs?before={621 - default}&limit=100000"))
        assert [r["run"] for r in capped["runs"]] == list(range(621 - default - most, 621 - default))
        assert capped["more"] is True
        oldest = _get(await request("GET", f"/api/capsules/cap_0/runs?before={621 - default - most}"))
        assert [r["run"] for r in oldest["runs"]] == list(range(1, 621 - default - most)) and oldest["more"] is False
        assert _get(await request("GET", "/api/capsules/cap_0/runs?limit=1"))["runs"][0]["run"] == 620
        for bad in ("limit=0", "limit=-5", "limit=ten", "before=x"):
            assert (await request("GET", f"/api/capsules/cap_0/runs?{bad}"))[0] == 400, bad
        detail = _get(await request("GET", "/api/capsules/cap_0/runs/620"))
        assert len(detail["written"]) == DETAIL_PATHS and detail["written_total"] == 2500
        assert detail["read"] == [] and detail["read_total"] == 0
        assert _get(await request("GET", "/api/capsules/cap_0/runs/3"))["written"] == ["out.txt"]
        assert (await request("GET", "/api/capsules/cap_0/runs/621"))[0] == 404

    _run(long_history, scenario)


def test_events_come_back_a_page_at_a_time_of_the_kinds_asked(long_history: Path) -> None:
    default, most = PAGES["events"]

    async def scenario(request: Any, calls: list[Any]) -> None:
        page = _get(await request("GET", "/api/events?capsule=cap_0&kinds=net.connection"))
        assert len(page["events"]) == default and page["more"] is True
        assert {e["kind"] for e in page["events"]} == {"net.connection"}
        assert [e["data"]["seq"] for e in page["events"]] == list(range(621 - default, 621))  # oldest first
        first = page["events"][0]["id"]
        older = _get(await request("GET", f"/api/events?capsule=cap_0&kinds=net.connection&before={first}&limit=5000"))
        assert len(older["events"]) == 620 - default and older["more"] is False  # fewer left than the cap
        assert older["events"][-1]["id"] < first
        every = _get(await request("GET", f"/api/events?capsule=cap_0&limit={most + 1}"))
        assert len(every["events"]) == most and every["more"] is True
        assert {e["kind"] for e in every["events"]} == {"run.finished", "files.written", "net.connection"}
        mixed = _get(await request("GET", "/api/events?capsule=cap_0&kinds=files.written,capsule.created&limit=1000"))
        assert [e["kind"] for e in mixed["events"][:2]] == ["capsule.created", "files.written"]
        assert (await request("GET", "/api/events?capsule=cap_0&kinds=net.connection,<img>"))[0] == 400
        assert (await request("GET", "/api/events?limit=0"))[0] == 400

    _run(long_history, scenario)


def test_capsules_come_a_page_at_a_time_live_first_and_newest_first(long_history: Path) -> None:
    default, most = PAGES["capsules"]
    live = [f"cap_{i}" for i in range(259, -1, -1) if i % 3 != 1]
    destroyed = [f"cap_{i}" for i in range(259, -1, -1) if i % 3 == 1]

    async def scenario(request: Any, calls: list[Any]) -> None:
        first = _get(await request("GET", "/api/capsules"))
        assert [c["capsule_id"] for c in first["capsules"]] == live[:default]
        assert first["more"] is True and first["total"] == 260
        shown, runs = [c["capsule_id"] for c in first["capsules"]], {}
        while True:
            page = _get(await request("GET", f"/api/capsules?after={shown[-1]}&limit=100000"))
            assert len(page["capsules"]) == min(most, 260 - len(shown))
            shown += [c["capsule_id"] for c in page["capsules"]]
            runs.update({c["capsule_id"]: c["runs"] for c in page["capsules"]})
            if not page["more"]:
                break
        assert shown == live + destroyed  # each once, in order, across the live/destroyed edge
        assert runs["cap_0"] == 620 and runs["cap_3"] == 0
        assert _get(await request("GET", f"/api/capsules?after={live[-1]}&limit=1"))["capsules"][0]["capsule_id"] \
            == destroyed[0]
        assert (await request("GET", "/api/capsules?after=cap_none"))[0] == 404
        assert (await request("GET", "/api/capsules?limit=0"))[0] == 400

    _run(long_history, scenario)


def test_ccw_ui_refuses_to_listen_beyond_loopback(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for listen in ("0.0.0.0:0", "192.0.2.1:8080", "[::]:0"):
        assert main(["--state-dir", str(state_dir), "ui", "--no-open", "--listen", listen]) == 1
        assert "PERMISSION_DENIED" in capsys.readouterr().err


def test_ccw_ui_prints_a_url_with_its_token_serves_it_and_stops_on_sigterm(state_dir: Path) -> None:
    proc = subprocess.Popen([*CCW, "ui", "--no-open"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env(state_dir), cwd=ROOT)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.fullmatch(r"ccw ui: http://127\.0\.0\.1:(\d+)/#token=([\w-]{40,})\n", line)
        assert found, line
        port, token = int(found[1]), found[2]

        async def fetch() -> tuple[Response, Response]:
            headers = {"host": f"127.0.0.1:{port}"}
            return (await _http(port, "GET", "/api/capsules", {**headers, "x-ccw-token": token}),
                    await _http(port, "GET", "/api/capsules", {**headers, "x-ccw-token": TOKEN}))

        good, bad = trio.run(fetch)
        assert good[0] == 200 and json.loads(good[2]) == {"capsules": [], "more": False, "total": 0, "last_event_id": 0}
        assert bad[0] == 401
    finally:
        proc.terminate()
        _, errors = proc.communicate(timeout=30)
    assert proc.returncode == 0, errors


def test_the_pages_files_are_package_data_of_the_wheel() -> None:
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["mcp_server"]
    static = ROOT / "mcp_server" / "ui" / "static"
    assert "ui/static/*" in data and all(path.is_file() for path in static.iterdir())  # the glob is one level
    assert {path.name for path in static.iterdir()} == {"index.html", "app.js", "races.js", "style.css"}


RECORDER = "import json, sys\nopen(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))\n"


def test_the_browser_is_started_with_a_private_page_not_the_token(state_dir: Path, tmp_path: Path) -> None:
    """A command line is public to every local user: the browser gets a 0600 file's path."""
    record, recorder = tmp_path / "argv.json", tmp_path / "recorder.py"
    recorder.write_text(RECORDER)
    env = {**cli_env(state_dir), "BROWSER": shlex.join([sys.executable, str(recorder), str(record)]) + " %s"}
    proc = subprocess.Popen([*CCW, "ui"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().removeprefix("ccw ui: ").strip()
        deadline = time.monotonic() + 60
        while not record.exists() or not record.read_text():  # sequencing: the launcher has run
            assert time.monotonic() < deadline and proc.poll() is None, "no browser was started"
            time.sleep(0.05)
        (opened,) = json.loads(record.read_text())
        token = url.split("#token=")[1]
        assert token not in opened and opened.startswith("file://")
        page = Path(opened.removeprefix("file://"))
        assert stat.S_IMODE(page.stat().st_mode) == 0o600 and page.stat().st_uid == os.getuid()
        assert f'content="0;url={url}"' in page.read_text()
    finally:
        proc.terminate()
        _, errors = proc.communicate(timeout=30)
    assert proc.returncode == 0, errors
    assert not page.exists()  # gone with the server


def test_a_proposal_approved_from_the_page_comes_back_as_its_question(populated: Path) -> None:
    state = State(populated)
    made = asks.propose(state, "cap_1", ["pypi.org:443"], "the index", "token agent")
    state.close()

    async def scenario(request: Any, calls: list[Any]) -> None:
        status, _, body = await request("POST", f"/api/questions/{made.id}", body=b'{"answer": "capsule"}')
        answered = json.loads(body)
        assert status == 200 and (answered["id"], answered["kind"], answered["state"]) == (made.id, "proposal",
                                                                                           "capsule")
        assert calls == [("capsule_network", {"capsule_id": "cap_1", "proposal": made.id})]  # its rules go in

    _run(populated, scenario)


def test_a_question_is_listed_and_answered_from_the_page_with_the_token_alone(populated: Path) -> None:
    state = State(populated)
    asked = asks.ask(state, "cap_1", "<b>evil</b>.example", 443, "https", ["curl", "<script>"], 30)
    other = asks.ask(state, "cap_1", "pypi.org", 443, "https", ["pip", "install", "x"], 30)
    state.close()

    async def scenario(request: Any, calls: list[Any]) -> None:
        status, _, body = await request("GET", "/api/questions")
        listed = json.loads(body)["questions"]
        assert status == 200 and [q["id"] for q in listed] == [asked.id, other.id]
        assert listed[0]["host"] == "<b>evil</b>.example"  # verbatim JSON; the page sets it as text
        assert (await request("POST", f"/api/questions/{asked.id}", token=None, body=b'{"answer": "once"}'))[0] == 401
        assert (await request("POST", f"/api/questions/{asked.id}", body=b'{"answer": "once"}',
                              origin="http://evil.example"))[0] == 403
        status, _, body = await request("POST", f"/api/questions/{asked.id}", body=b'{"answer": "denied"}')
        assert status == 400 and b"needs a reason" in body
        status, _, body = await request("POST", f"/api/questions/{asked.id}",
                                        body=b'{"answer": "denied", "reason": "not this host"}')
        answered = json.loads(body)
        assert status == 200 and (answered["state"], answered["reason"]) == ("denied", "not this host")
        assert answered["who"].endswith("(ccw ui)")
        assert (await request("POST", f"/api/questions/{asked.id}", body=b'{"answer": "once"}'))[0] == 409
        assert (await request("POST", "/api/questions/999", body=b'{"answer": "once"}'))[0] == 404
        status, _, body = await request("POST", f"/api/questions/{other.id}", body=b'{"answer": "capsule"}')
        assert status == 200 and json.loads(body)["state"] == "capsule"
        assert json.loads((await request("GET", "/api/questions"))[2])["questions"] == []
        assert calls == []  # no tool answers a question

    _run(populated, scenario)

"""Races kept for ``ccw ui`` (mcp_server/capsules/races.py) and served by its API
(mcp_server/ui/races.py, the routes in ui/server.py): a race is recorded as it goes (its
rows as they end, then its ranked table, or how it ended without one), read back by
another State as a restarted front end or the dashboard would, bounded, and said
``lost`` when the process running it is gone.  The API answers only this server's host
and token, pages the races newest first and returns what a capsule named verbatim.

The capsules' rows are stood in for (``race._one`` replaced): what runs in them is the
business of tests/test_race.py and vm-tests/test_race_realproject.py; the browser test
vm-tests/test_ui_races.py races real capsules over MCP.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.capsules import race, races
from mcp_server.capsules.service import CapsuleService
from mcp_server.config import Config
from mcp_server.events import EventLog
from mcp_server.journal import Journal
from mcp_server.state import State
from mcp_server.ui.server import Dashboard
from sandbox.errors import CcwError
from tests.support.call_hooks import Hooks
from tests.support.cli_process import ROOT
from tests.support.journal_rows import capsule_record

TOKEN = "races-t0ken"
HOSTILE = ["sh", "-c", "<img src=x onerror=alert(1)>"]


def _row(capsule_id: str, exit_code: int, lines: int) -> dict[str, Any]:
    return {"capsule_id": capsule_id, "exit_code": exit_code, "timed_out": False, "duration_ms": 40,
            "usage": {"cpu_ms": 30, "rss_max_kb": 2048}, "diff": {"files": 1, "lines": lines},
            "verdict": "passed", "verdict_details": "ok"}


class Told(Hooks):
    """The call's hooks, with an event set at the race's first progress report (a row is in)."""

    def __init__(self) -> None:
        super().__init__()
        self.reported = trio.Event()

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: Any = None) -> None:
        await super().progress(progress, total, message)
        self.reported.set()


@pytest.fixture
def service(tmp_path: Path) -> CapsuleService:
    state = State(tmp_path / "state")
    journal = Journal(state)
    for capsule_id in ("cap_a", "cap_b", "cap_c"):
        journal.add_capsule(capsule_record(capsule_id))

    async def no_helper() -> Any:
        raise AssertionError("the rows are stood in for: no helper is asked")

    return CapsuleService(state, no_helper, Told())


def _stand_in(monkeypatch: pytest.MonkeyPatch, rows: dict[str, dict[str, Any]],
              gates: dict[str, trio.Event] | None = None) -> None:
    """Each capsule's row is ``rows``'s (after its gate is set, if it has one); a
    row that is a CcwError is raised."""
    async def one(service: Any, quiet: Any, question: Any, capsule_id: str, limiter: Any, values: Any,
                  runner: Any) -> dict[str, Any]:
        if gates and capsule_id in gates:
            await gates[capsule_id].wait()
        found = rows[capsule_id]
        if isinstance(found, BaseException):
            raise found
        return found

    monkeypatch.setattr(race, "_one", one)


def test_a_race_is_kept_as_it_goes_and_read_back_by_another_process(
        service: CapsuleService, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gates = {"cap_a": trio.Event()}
    _stand_in(monkeypatch, {"cap_a": _row("cap_a", 0, 2), "cap_b": _row("cap_b", 1, 1)}, gates)
    seen: dict[str, Any] = {}
    hooks = service._call
    assert isinstance(hooks, Told)

    async def main() -> dict[str, Any]:
        async with trio.open_nursery() as nursery:
            async def racing() -> None:
                seen["result"] = await race.race(service, race.Question(("cap_a", "cap_b"), ("pytest", "-q")),
                                                 race_id="run_7_abc", owner="ci")
            nursery.start_soon(racing)
            await hooks.reported.wait()  # cap_b's row is in: the race reports after it keeps a row
            seen["running"] = races.get(service.state, "run_7_abc")
            gates["cap_a"].set()
        return seen

    trio.run(main)
    running = seen["running"]
    assert (running["state"], running["ended"], running["pending"]) == ("running", 1, ["cap_a"])
    assert [r["capsule_id"] for r in running["rows"]] == ["cap_b"] and running["owner"] == "ci"

    other = State(tmp_path / "state")  # what a restarted front end, or the dashboard, reads
    kept = races.get(other, "run_7_abc")
    assert kept["state"] == "finished" and kept["pending"] == [] and kept["ended_at"] is not None
    assert kept["rows"] == seen["result"]["rows"] and kept["order"] == race.ORDER
    assert [(r["rank"], r["capsule_id"]) for r in kept["rows"]] == [(1, "cap_a"), (2, "cap_b")]
    assert kept["cmd"] == ["pytest", "-q"] and kept["question"]["capsule_ids"] == ["cap_a", "cap_b"]
    told = [e.data for e in EventLog(other).since(0) if e.kind == "race"]
    assert [(d["state"], d.get("ended")) for d in told] == [("running", 0), ("running", 1), ("running", 2),
                                                           ("finished", None)]
    other.close()


def test_a_race_ended_without_a_table_says_how(service: CapsuleService, monkeypatch: pytest.MonkeyPatch) -> None:
    _stand_in(monkeypatch, {"cap_a": RuntimeError("a bug"), "cap_b": _row("cap_b", 0, 1)})
    with pytest.raises(BaseExceptionGroup):
        trio.run(race.race, service, race.Question(("cap_a", "cap_b"), ("true",)), None, "run_bug")
    failed = races.get(service.state, "run_bug")
    assert (failed["state"] == "failed" and failed["error"]["code"] == "INTERNAL"
            and "a bug" in failed["error"]["message"])

    gates = {"cap_a": trio.Event()}
    _stand_in(monkeypatch, {"cap_a": _row("cap_a", 0, 1)}, gates)

    async def cancelled() -> None:
        with trio.move_on_after(0.05):  # the race is cancelled (as capsule_run's cancel does) while cap_a runs
            await race.race(service, race.Question(("cap_a",), ("true",)), race_id="run_cut")

    trio.run(cancelled)
    cut = races.get(service.state, "run_cut")
    assert (cut["state"], cut["error"], cut["rows"]) == ("cancelled", None, [])


def test_a_race_whose_front_end_died_is_lost_and_ids_are_made_when_the_caller_waited(
        service: CapsuleService, monkeypatch: pytest.MonkeyPatch) -> None:
    races.begin(service.state, "run_dead", None, {"capsule_ids": ["cap_a"], "cmd": ["true"], "policy": "baseline"})
    assert races.get(service.state, "run_dead")["state"] == "running"  # this process runs it
    service.state.execute("UPDATE races SET process = ? WHERE race_id = 'run_dead'", (f"{2**22 + 7}:1",))
    assert races.get(service.state, "run_dead")["state"] == "lost"
    service.state.execute("UPDATE races SET process = ? WHERE race_id = 'run_dead'",
                          (races.this_process().split(":")[0] + ":1",))  # this pid, another start: reused
    assert races.get(service.state, "run_dead")["state"] == "lost"

    _stand_in(monkeypatch, {"cap_c": _row("cap_c", 0, 1)})
    trio.run(race.race, service, race.Question(("cap_c",), ("true",)))  # no run id: a ccw command waiting whole
    (newest,), _ = races.recent(service.state, 1)
    assert re.fullmatch(r"race_[0-9a-f]{12}", newest["race_id"]) and newest["best"]["capsule_id"] == "cap_c"


def test_races_are_bounded_and_long_details_are_cut(service: CapsuleService, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(races, "KEEP_RACES", 3)
    question = {"capsule_ids": ["cap_a"], "cmd": ["true"], "policy": "baseline"}
    for n in range(5):
        races.begin(service.state, f"run_{n}", None, question)
        races.end(service.state, f"run_{n}", {"order": "", "rows": [{**_row("cap_a", 0, 1), "rank": 1,
                                                                      "verdict_details": "x" * 5000}]})
    shown, more = races.recent(service.state, 10)
    assert [r["race_id"] for r in shown] == ["run_4", "run_3", "run_2"] and not more
    assert len(races.get(service.state, "run_4")["rows"][0]["verdict_details"]) == races.MAX_DETAILS + 1
    with pytest.raises(CcwError) as caught:
        races.get(service.state, "run_0")
    assert caught.value.code == "NOT_FOUND" and "at most 3" in caught.value.message


def _call(app: Dashboard, path: str, token: str | None = TOKEN, host: str = "127.0.0.1:8000") -> tuple[int, Any]:
    """One GET through the dashboard's ASGI app: its status and JSON body."""
    target, _, query = path.partition("?")
    headers = [(b"host", host.encode())] + ([(b"x-ccw-token", token.encode())] if token is not None else [])
    scope = {"type": "http", "method": "GET", "path": target, "query_string": query.encode(), "headers": headers}
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def main() -> None:
        await app(scope, receive, send)

    trio.run(main)
    body = sent[1]["body"]
    return sent[0]["status"], json.loads(body) if target.startswith("/api/") else body


def test_the_api_lists_races_newest_first_and_one_race_to_its_token_and_host_only(tmp_path: Path) -> None:
    state = State(tmp_path / "state")
    for n in range(25):
        question = {"capsule_ids": ["cap_a", "cap_b"], "cmd": HOSTILE if n == 24 else ["true"], "policy": "baseline"}
        races.begin(state, f"run_{n}", None, question)
        if n != 24:
            races.end(state, f"run_{n}", {"order": race.ORDER, "rows": [{**_row("cap_b", 0, 1), "rank": 1}]})

    async def no_tools(config: Config, name: str, args: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("reading races calls no tool")

    app = Dashboard(Config.from_env(), state, TOKEN, "127.0.0.1", 8000, no_tools)
    for token in (None, "", TOKEN + "x"):
        assert _call(app, "/api/races", token)[0] == 401
        assert _call(app, "/api/races/run_3", token)[0] == 401
    assert _call(app, "/api/races", host="evil.example:8000")[0] == 421

    status, page = _call(app, "/api/races")
    assert status == 200 and page["more"] and len(page["races"]) == 20  # the default page
    newest = page["races"][0]
    assert (newest["race_id"], newest["state"], newest["cmd"], newest["best"]) == ("run_24", "running", HOSTILE, None)
    older = _call(app, f"/api/races?limit=10&before={page['races'][-1]['seq']}")[1]
    assert [r["race_id"] for r in older["races"]] == ["run_4", "run_3", "run_2", "run_1", "run_0"] and not older["more"]
    assert _call(app, "/api/races?limit=0")[0] == 400 and _call(app, "/api/races?limit=x")[0] == 400
    assert len(_call(app, "/api/races?limit=5000")[1]["races"]) == 25  # at most the cap (100)

    status, one = _call(app, "/api/races/run_24")
    assert status == 200 and one["cmd"] == HOSTILE and one["pending"] == ["cap_a", "cap_b"] and one["rows"] == []
    finished = _call(app, "/api/races/run_3")[1]
    assert finished["state"] == "finished" and finished["order"] == race.ORDER and finished["rows"][0]["rank"] == 1
    status, missing = _call(app, "/api/races/run_nope")
    assert status == 404 and "NOT_FOUND" in missing["error"]
    state.close()


def test_the_races_script_is_served_and_sets_text_only(tmp_path: Path) -> None:
    script = (ROOT / "mcp_server" / "ui" / "static" / "races.js").read_text()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(",
                 "setAttribute(\"on", "DOMParser", "createContextualFragment"):
        assert sink not in script, sink

    async def no_tools(config: Config, name: str, args: dict[str, Any]) -> dict[str, Any]:
        raise AssertionError("no tool")

    app = Dashboard(Config.from_env(), State(tmp_path / "state"), TOKEN, "127.0.0.1", 8000, no_tools)
    status, served = _call(app, "/static/races.js", token=None)
    assert status == 200 and served == script.encode()
    assert b'<script src="/static/races.js" defer>' in _call(app, "/", token=None)[1]

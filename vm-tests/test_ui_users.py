"""``ccw ui`` as an unprivileged user, and what other users can reach of it.

A user made for the test runs an agent (a real MCP client over stdio: ``ccw-mcp`` with its
rootless helper, as vm-tests/test_realprojects_rootless.py does) in its own state dir, and
``ccw ui`` on that state dir, which starts "the browser" through ``$BROWSER`` with its
private launch page; the test's chromium opens that page.  It shows the capsules the
agent made (the second one live); promote and destroy clicked there work as the user.

Who else can use it:

- another uid: the API answers it 401 (no token, root's token) and 421 (a rebound name);
  the token is nowhere it can read: not in ``ccw ui``'s command line, not in its
  environment, not in the launch page or the state dir (0600 in 0700, the user's own);
- root's own dashboard, open in the same browser: a call from that page to the user's
  API with root's token is stopped by the browser (the token header needs a CORS
  preflight the server never grants), and a form-like POST that needs none is refused
  401 by the server: the user's capsule stays alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tests.support.cli_process import serve_ui
from tests.support.users import OTHER_UID, as_user, run_script_as
from tests.support.webdriver import Browser, shot

HERE = Path(__file__).resolve().parent

ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}

# The user's agent: a real MCP client of ccw-mcp on stdio, one tool call per line of stdin
# (JSON: tool, args), its result or error as one line on stdout.
AGENT = r"""
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import trio
from tests.support import agent_loop
from tests.support.mcp_process import agent_server_env
from sandbox.errors import CcwError

async def main():
    state, ws = Path(sys.argv[2]), Path(sys.argv[3])
    async with agent_loop.mcp_stdio(agent_server_env(state, ws)) as call:
        print(json.dumps({"ready": True}), flush=True)
        while line := await trio.to_thread.run_sync(sys.stdin.readline):
            asked = json.loads(line)
            try:
                answer = {"result": await call(asked["tool"], asked["args"])}
            except CcwError as exc:
                answer = {"error": {"code": exc.code, "message": exc.message}}
            print(json.dumps(answer), flush=True)

trio.run(main)
"""
UI = "import sys; from mcp_server.cli import main; sys.exit(main())"
RECORDER = "import json, sys\nopen(sys.argv[1], 'w').write(json.dumps(sys.argv[2:]))\n"

# Another uid, with root's token and what it can find of the user's.
OTHER = r"""
import http.client, json, os, sys
port, root_token, page, state, pid, capsule = sys.argv[1:]

def ask(method, path, headers):
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=60)
    conn.request(method, path, body=b"{}" if method == "POST" else None, headers=headers)
    answer = conn.getresponse()
    answer.read()
    return answer.status

def readable(path):
    try:
        with open(path, "rb") as found:
            found.read()
        return True
    except PermissionError:
        return False

print(json.dumps({
    "no_token": ask("GET", "/api/capsules", {}),
    "root_token": ask("GET", "/api/capsules", {"X-CCW-Token": root_token}),
    "rebound": ask("GET", "/api/capsules", {"Host": "evil.example:" + port, "X-CCW-Token": root_token}),
    "destroy": ask("POST", f"/api/capsules/{capsule}/destroy", {"X-CCW-Token": root_token}),
    "page": readable(page), "state_dir": readable(os.path.join(state, "ccw.sqlite3")),
    "environ": readable(f"/proc/{pid}/environ"),
    "cmdline": open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace"),
}))
"""


class UserAgent:
    """The ``AGENT`` script running as the user, for as long as the test needs it."""

    def __init__(self, uid: int, gid: int, home: Path, state: Path, ws: Path, log: IO[bytes]) -> None:
        self.keep: list[str] = []
        argv = [sys.executable, "-c", AGENT, str(HERE.parent), str(state), str(ws)]
        self.proc = subprocess.Popen(as_user(uid, gid, argv, self.keep), cwd=home, env=ENV, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log)
        assert self._answer() == {"ready": True}

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, "the user's agent ended (its stderr is in the test's tmp dir)"
        answer: dict[str, Any] = json.loads(line)
        return answer

    def call(self, tool: str, args: dict[str, Any]) -> dict[str, Any]:
        """The tool's structured result; fails on its error."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"tool": tool, "args": args}) + "\n")
        self.proc.stdin.flush()
        answer = self._answer()
        assert "result" in answer, answer
        result: dict[str, Any] = answer["result"]
        return result

    def close(self) -> None:
        """End the agent (its ccw-mcp with it)."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            if self.proc.stdout is not None:
                self.proc.stdout.close()
            for keep in self.keep:
                os.rmdir(keep)


@contextlib.contextmanager
def user_ui(uid: int, gid: int, home: Path, state: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    """``ccw ui`` as the user: its process, the URL it printed and the page it gave $BROWSER."""
    recorder, record = home / "recorder.py", home / "scratch" / "browser.json"
    recorder.write_text(RECORDER)
    keep: list[str] = []
    env = {**ENV, "CCW_STATE_DIR": str(state), "BROWSER": f"{sys.executable} {recorder} {record} %s"}
    proc = subprocess.Popen(as_user(uid, gid, [sys.executable, "-c", UI, "ui"], keep), cwd=home, env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.fullmatch(r"ccw ui: (http://127\.0\.0\.1:\d+/#token=[\w-]+)\n", line)
        assert found, line + (proc.stderr.read() if proc.stderr and proc.poll() is not None else "")
        deadline = time.monotonic() + 60
        while not record.exists() or not record.read_text():  # sequencing: the launcher has run
            assert time.monotonic() < deadline and proc.poll() is None, "no browser was started"
            time.sleep(0.05)
        (opened,) = json.loads(record.read_text())
        yield proc, found[1], Path(opened.removeprefix("file://"))
    finally:
        proc.terminate()
        _, errors = proc.communicate(timeout=60)
        for directory in keep:
            os.rmdir(directory)
    assert proc.returncode == 0, errors


def _port(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


def _owner_only(path: Path, uid: int, mode: int) -> None:
    st = path.lstat()
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (uid, mode), (path, st.st_uid, oct(st.st_mode))


def test_a_users_dashboard_is_that_users_alone(user_dir: tuple[int, int, Path], browser: Browser,
                                               tmp_path: Path) -> None:
    uid, gid, home = user_dir
    state, ws, ws2, scratch = home / "state", home / "ws", home / "ws2", home / "scratch"
    for directory in (ws, ws2, scratch):
        directory.mkdir()
    (ws / "a.txt").write_text("a\n")
    (ws2 / "b.txt").write_text("b\n")
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(ws), str(ws2), str(scratch)], check=True)
    shots = tmp_path / "screenshots"
    with open(tmp_path / "agent.stderr", "wb") as log:
        agent = UserAgent(uid, gid, home, state, ws, log)
        try:
            first = agent.call("capsule_create", {"workspace": str(ws), "auto_expose": False})["capsule_id"]
            ran = agent.call("capsule_exec", {"capsule_id": first, "cmd": ["sh", "-c", "echo hello > out.txt"]})
            assert ran["exit_code"] == 0, ran
            with user_ui(uid, gid, home, state) as (ui, url, page):
                browser.get(page.as_uri())  # the way ccw ui started the user's browser
                browser.wait_until(lambda: first in browser.text("#cap-title"), "the user's capsule")
                browser.wait_until(lambda: browser.find("#runs tbody tr[data-run='1']"), "its run")
                _memory_is_the_largest_process(browser)
                # A second capsule, made while the page is open, shows live.
                second = agent.call("capsule_create", {"workspace": str(ws2), "auto_expose": False})["capsule_id"]
                agent.call("capsule_exec", {"capsule_id": second, "cmd": ["sh", "-c", "echo y > y.txt"]})
                browser.wait_until(lambda: browser.find(f"#capsules li[data-capsule='{second}']"), "the new capsule")
                shot(browser, shots, "1-users-capsules")
                _others_are_refused(uid, state, tmp_path / "root-state", url, ui.pid, page, first, browser)
                _promote_and_destroy(browser, first, second, ws, uid, shots)
                listed = [c["capsule_id"] for c in agent.call("capsule_list", {})["capsules"]]
                assert first in listed and second not in listed, listed
            assert not page.exists()  # gone with the server
        finally:
            agent.close()
    print(f"screenshots kept in {shots}")


def _memory_is_the_largest_process(browser: Browser) -> None:
    """A rootless helper has no memory cgroup: the chart draws each run's largest process, and says so."""
    chart = browser.wait_until(lambda: browser.script(
        "const c = document.querySelector('#usage-plot svg:nth-child(3)');"
        "return c && [c.textContent, [...c.querySelectorAll('rect')].map((r) => +r.getAttribute('height'))]"),
        "the memory chart")
    label, heights = chart
    assert label.startswith("largest process's max RSS (MiB) per run") and "not measured" not in label, label
    assert heights and all(h > 0 for h in heights), chart


def _others_are_refused(uid: int, state: Path, root_state: Path, url: str, pid: int, page: Path, capsule: str,
                        chromium: Browser) -> None:
    """Nothing of the user's dashboard answers another uid, nor a page of root's own dashboard."""
    token = url.split("#token=")[1]
    # The ui's own file and its state dir: the user's, owner-only.
    _owner_only(state, uid, 0o700)
    _owner_only(page.parent, uid, 0o700)
    _owner_only(page, uid, 0o600)
    assert page.parent == state / "tmp" and token in page.read_text()
    port = _port(url)
    with serve_ui(root_state) as root_url:
        root_token = root_url.split("#token=")[1]
        other = run_script_as(OTHER_UID, OTHER_UID, [sys.executable, "-c", OTHER, str(port), root_token,
                                                     str(page), str(state), str(pid), capsule], Path("/"))
        assert (other["no_token"], other["root_token"], other["rebound"], other["destroy"]) == (401, 401, 421, 401)
        assert (other["page"], other["state_dir"], other["environ"]) == (False, False, False), other
        assert "ui" in other["cmdline"] and token not in other["cmdline"]
        # Root's page, in the same chromium, reaching for the user's API.
        chromium.get(root_url)
        chromium.wait_until(lambda: "live" in chromium.text("#status"), "root's own dashboard")
        target = f"http://127.0.0.1:{port}/api/capsules"
        read = chromium.script("return fetch(arguments[0], {headers: {'X-CCW-Token': arguments[1]}})"
                              ".then((r) => 'status ' + r.status, (e) => 'blocked: ' + e.message)",
                              target, root_token)
        assert read.startswith("blocked"), read
        sent = chromium.script("return fetch(arguments[0], {method: 'POST', mode: 'no-cors', body: '{}'})"
                              ".then((r) => r.type, (e) => 'blocked: ' + e.message)",
                              f"{target}/{capsule}/destroy")
        assert sent in ("opaque", "blocked: Failed to fetch"), sent
    chromium.get(page.as_uri())
    chromium.wait_until(lambda: capsule in chromium.text("#capsules"), "the user's page again")
    assert "destroyed" not in chromium.text(f"#capsules li[data-capsule='{capsule}']")


def _promote_and_destroy(chromium: Browser, first: str, second: str, ws: Path, uid: int, shots: Path) -> None:
    """Promote the first capsule and destroy the second from the user's page."""
    chromium.click(f"#capsules li[data-capsule='{first}']")
    chromium.wait_until(lambda: first in chromium.text("#cap-title"), "the first capsule, selected")
    chromium.click("#promote")
    done = chromium.wait_until(lambda: "promoted:" in chromium.text("#action-result")
                              and chromium.text("#action-result"), "the promotion")
    assert "refused" not in done
    assert (ws / "out.txt").read_text() == "hello\n" and (ws / "out.txt").stat().st_uid == uid
    chromium.click(f"#capsules li[data-capsule='{second}']")
    chromium.wait_until(lambda: second in chromium.text("#cap-title"), "the second capsule, selected")
    chromium.click("#destroy")
    chromium.click("#destroy")
    chromium.wait_until(lambda: "destroyed" in chromium.text(f"#capsules li[data-capsule='{second}']"),
                       "the second capsule, destroyed")
    assert chromium.text("#action-result") == "destroyed"
    shot(chromium, shots, "2-promoted-and-destroyed")

"""What a watcher costs the agent: capsule_exec of /bin/true end to end through ccw-mcp's
unix socket, with one ``ccw watch --json`` following the state dir against none, in one run
(issue 26; target <= 1.05x).

The watcher is a real process, as a person would start it: it polls the state dir's
database for new events (mcp_server/events.py) and prints each as a JSON line into a
file, counted after each block, so the run checks that it saw every exec.  The two
variants take turns in blocks (starting a watcher takes a Python start-up, ~0.5 s, so
it is not restarted for every exec); the order of the blocks alternates.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench.common import Row, median_ms

CCW = [sys.executable, "-c", "import sys; from mcp_server.cli import main; sys.exit(main())"]


class Watcher:
    """``ccw watch --json`` on ``state_dir``, printing into a file that is read after the block
    (a reader thread here would take the GIL from the loop being timed)."""

    def __init__(self, state_dir: Path) -> None:
        from mcp_server.events import EventLog
        from mcp_server.state import State

        state = State(state_dir)
        self._after = EventLog(state).last_id()
        state.close()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_"))}
        env["CCW_STATE_DIR"] = str(state_dir)
        self._out = tempfile.TemporaryFile("w+")  # noqa: SIM115 (closed in stop, after the block)
        # From the event before the newest: its first line says it is up and polling.
        self.proc = subprocess.Popen([*CCW, "watch", "--json", "--since", str(max(self._after - 1, 0))],
                                     stdout=self._out, stderr=subprocess.DEVNULL, env=env, text=True)
        deadline = time.monotonic() + 60
        while os.fstat(self._out.fileno()).st_size == 0:
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError("ccw watch printed nothing within 60 s")
            time.sleep(0.05)

    def cpu_s(self) -> float:
        """The CPU time it has used so far (user and system, /proc/PID/stat)."""
        with open(f"/proc/{self.proc.pid}/stat") as stat:
            fields = stat.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> int:
        """Stop it; the number of finished runs it printed."""
        time.sleep(0.5)  # the last exec's events: one poll interval and then some
        self.proc.terminate()
        self.proc.wait(10)
        self._out.seek(0)
        events = [json.loads(line) for line in self._out]
        self._out.close()
        return sum(1 for e in events if e["kind"] == "run.finished" and e["id"] > self._after)


async def measure(exec_once: Callable[[], Awaitable[float]], state_dir: Path, blocks: int, per_block: int) -> Row:
    """The row: ``exec_once()`` (seconds of one capsule_exec) with a watcher against none."""
    times: dict[bool, list[float]] = {True: [], False: []}
    watcher_cpu_s = 0.0
    for block in range(blocks * 2):
        watched = (block % 2 == 0) == (block // 2 % 2 == 0)  # on/off, off/on, on/off, ...
        watcher = Watcher(state_dir) if watched else None
        started = watcher.cpu_s() if watcher is not None else 0.0  # its start-up is not the agent's cost
        for _ in range(per_block):
            times[watched].append(await exec_once())
        if watcher is not None:
            watcher_cpu_s += watcher.cpu_s() - started
            seen = watcher.stop()
            if seen < per_block:
                raise RuntimeError(f"the watcher printed {seen} finished runs of {per_block}")
    return Row("capsule_exec /bin/true end to end, one ccw watch attached", median_ms(times[True]),
               baseline="no watcher", baseline_ms=median_ms(times[False]), target="<= 1.05x",
               extra={"runs": len(times[True]),
                      "watcher_cpu_ms_per_exec": round(watcher_cpu_s * 1000 / max(len(times[True]), 1), 3)})

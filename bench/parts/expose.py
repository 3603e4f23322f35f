"""Exposed toolchains' cost: capsule_create + capsule_exec of /bin/true, with auto-exposed
toolchains against the same with ``auto_expose: false``, in one run (issue 25 item 1).

The workspace's ``.venv`` is made from a pyenv-style interpreter under a scratch $HOME
(the system interpreter copied into ``~/.pyenv/versions/3.X.bench/bin``), and the
caller's PATH holds an nvm-style ``~/.nvm/versions/node/vX/bin``: two directories found
(pyvenv.cfg, PATH) and bound read-only at every exec.  What is timed is the tool calls
as an agent makes them: discovery and the helper's checks at create, the checks again
and the binds at exec.  The destroy after each pair is not timed.  The two variants take
turns in a new order every round (bench.common's habit).  Needs root.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Row, in_process_tools, median_ms
from mcp_server.statedir import make_state_dir


def _machine(base: Path) -> tuple[Path, str]:
    """A home with a pyenv-style Python and an nvm-style bin; a workspace whose .venv uses
    the former.  The workspace, and the PATH to run with."""
    python = Path(os.path.realpath("/usr/bin/python3"))
    home = base / "home"
    prefix = home / ".pyenv" / "versions" / f"{python.name.removeprefix('python')}.bench"
    (prefix / "bin").mkdir(parents=True)
    shutil.copy2(python, prefix / "bin" / python.name)
    node_bin = home / ".nvm" / "versions" / "node" / "v20.0.0" / "bin"
    node_bin.mkdir(parents=True)
    ws = base / "ws"
    (ws / ".venv" / "bin").mkdir(parents=True)
    (ws / ".venv" / "pyvenv.cfg").write_text(f"home = {prefix / 'bin'}\n")
    (ws / ".venv" / "bin" / "python").symlink_to(prefix / "bin" / python.name)
    return ws, f"{node_bin}:/usr/bin:/bin"


async def _create_exec(call: Any, ws: Path, auto: bool) -> float:
    """Seconds for one create + exec of /bin/true (the destroy after it not counted)."""
    start = time.perf_counter()
    made = await call("capsule_create", {"workspace": str(ws), "auto_expose": auto})
    ran = await call("capsule_exec", {"capsule_id": made["capsule_id"], "cmd": ["/bin/true"]})
    elapsed = time.perf_counter() - start
    await call("capsule_destroy", {"capsule_id": made["capsule_id"]})
    if ran["exit_code"] != 0 or len(made.get("exposed", [])) != (2 if auto else 0):
        raise RuntimeError(f"create+exec went wrong: {made.get('exposed')} {ran['stderr'][-300:]}")
    return elapsed


async def _measure(base: Path, repeat: int) -> dict[bool, list[float]]:
    ws, path = _machine(base)
    saved = {key: os.environ.get(key) for key in ("HOME", "PATH")}
    os.environ.update(HOME=str(base / "home"), PATH=path)  # the caller's, as capsule_create reads them
    try:
        async with in_process_tools(base / "state") as tools:
            times: dict[bool, list[float]] = {True: [], False: []}
            for auto in times:  # warm-up
                await _create_exec(tools.call, ws, auto)
            order, shuffler = [True, False], random.Random(0)
            for _ in range(repeat):
                shuffler.shuffle(order)
                for auto in order:
                    times[auto].append(await _create_exec(tools.call, ws, auto))
            return times
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def measure(repeat: int) -> list[Row]:
    """The create+exec row: auto-exposed toolchains against none."""
    import trio

    base = Path(tempfile.mkdtemp(prefix="ccw-bench-expose-"))
    make_state_dir(base / "state")  # 0700, as ccw makes one: Path.mkdir's 0755 is tightened with a warning
    try:
        times = trio.run(_measure, base, repeat)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return [Row("create+exec /bin/true, 2 toolchains exposed", median_ms(times[True]),
                baseline="auto_expose off", baseline_ms=median_ms(times[False]), target="<= 1.1x",
                extra={"runs": repeat})]

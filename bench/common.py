"""Side-by-side measurement: ccw and its baseline in the same run, medians and ratios.

Timings on these 2-core VMs are noisy, so every figure is a median over repeated runs,
and the number that matters is the ratio to a baseline measured in the same run.
"""

from __future__ import annotations

import contextlib
import json
import random
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]  # a tool handler by name


@dataclass(frozen=True)
class InProcess:
    """ccw's tools called in this process, as a transport calls them (no framing)."""

    call: Call
    ctx: Any  # mcp_server.context.CallContext, for suites that reach past the tools


@contextlib.asynccontextmanager
async def in_process_tools(state_dir: Path, env: dict[str, str] | None = None) -> AsyncIterator[InProcess]:
    """ccw's tools over a fresh server keeping its state in ``state_dir`` (other settings
    from ``env``, CCW_* names), called through the server's own pipeline (``CcwServer.call_tool``:
    the input schema checked, then the handler, with the ``CallContext`` a transport gives a
    call); its runtime (helper, egress sessions) is closed on the way out."""
    from mcp_server.config import Config
    from mcp_server.context import CallContext
    from mcp_server.server import CcwServer
    from mcp_server.state import State

    config = Config.from_env({**(env or {}), "CCW_STATE_DIR": str(state_dir)})
    server = CcwServer(config, State(config.state_dir))
    ctx = CallContext(server.runtime)

    async def call(name: str, args: dict[str, Any]) -> dict[str, Any]:
        spec = server.tools.registry.lookup(name)
        assert spec is not None, name
        return await server.call_tool(spec, args, ctx)

    try:
        yield InProcess(call, ctx)
    finally:
        await server.runtime.aclose()
        server.state.close()


def sample(fn: Callable[[], object], repeat: int, warmup: int = 1) -> list[float]:
    """Run ``fn`` ``warmup`` times unmeasured, then ``repeat`` times; seconds per run."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def interleaved(runners: dict[str, Callable[[], object]], repeat: int, seed: int = 0) -> dict[str, list[float]]:
    """Seconds per run of each runner, after one warm-up each, in a new order every round.

    Each run leaves kernel work behind (freeing a network namespace, RCU callbacks) to
    kworkers that share the 2 cores with whatever runs next; a fixed order would always
    bill it to the same runner.
    """
    for fn in runners.values():  # warm-up: page cache, first-use costs
        fn()
    times: dict[str, list[float]] = {name: [] for name in runners}
    shuffler = random.Random(seed)
    order = list(runners)
    for _ in range(repeat):
        shuffler.shuffle(order)
        for name in order:
            start = time.perf_counter()
            runners[name]()
            times[name].append(time.perf_counter() - start)
    return times


async def interleaved_async(runners: dict[str, Callable[[], Awaitable[float]]], repeat: int,
                            seed: int = 0, warmup: bool = True) -> dict[str, list[float]]:
    """``interleaved`` for runners that are coroutines and return their own figure (seconds,
    a throughput): each one's figures over ``repeat`` rounds after one warm-up each (none
    without ``warmup``: a smoke run's figures mean nothing), in a new order every round."""
    for runner in runners.values() if warmup else ():
        await runner()
    figures: dict[str, list[float]] = {name: [] for name in runners}
    order, shuffler = list(runners), random.Random(seed)
    for _ in range(repeat):
        shuffler.shuffle(order)
        for name in order:
            figures[name].append(await runners[name]())
    return figures


def median_ms(times: list[float]) -> float:
    """Median of a sample, in milliseconds."""
    return statistics.median(times) * 1000.0


@dataclass
class Row:
    """One comparison: ccw's median beside a baseline's, and their ratio."""

    name: str
    ccw_ms: float
    baseline: str = ""
    baseline_ms: float | None = None
    target: str = ""  # e.g. "<= 1.5x", "<= 5 ms"
    extra: dict[str, Any] = field(default_factory=dict)
    unit: str = "ms"  # what ccw_ms and baseline_ms hold: "ms", or "B" for the byte counts of `surface`

    @property
    def ratio(self) -> float | None:
        """ccw / baseline, or None without a baseline."""
        if self.baseline_ms in (None, 0):
            return None
        return self.ccw_ms / self.baseline_ms


@dataclass
class Report:
    """A suite's rows, printed as a table or as JSON."""

    suite: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def add(self, row: Row) -> Row:
        """Append a row and return it."""
        self.rows.append(row)
        return row

    def to_json(self) -> str:
        """Machine-readable form."""
        rows = []
        for row in self.rows:
            item = asdict(row)
            item["ratio"] = row.ratio
            rows.append(item)
        return json.dumps({"suite": self.suite, "rows": rows, "notes": self.notes}, indent=2)

    def to_text(self) -> str:
        """Human-readable table."""
        lines = [f"suite {self.suite}", ""]
        header = f"{'measure':44} {'ccw (median)':>14} {'baseline':>28} {'ratio':>8}  target"
        lines.append(header)
        lines.append("-" * len(header))
        for row in self.rows:
            base = ""
            if row.baseline:
                base = (f"{row.baseline} {_figure(row.baseline_ms, row.unit)}" if row.baseline_ms is not None
                        else f"{row.baseline} n/a")
            ratio = f"{row.ratio:.2f}x" if row.ratio is not None else ""
            lines.append(f"{row.name:44} {_figure(row.ccw_ms, row.unit):>14} {base:>28} {ratio:>8}  {row.target}")
            for key, value in row.extra.items():
                lines.append(f"{'':46}{key}: {value}")
        if self.notes:
            lines.append("")
            lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)


def _figure(value: float, unit: str) -> str:
    return f"{value:.0f} B" if unit == "B" else f"{value:.2f} {unit}"


async def timed_requests(path: str, method: str, params: dict[str, Any], count: int) -> list[float]:
    """Seconds per answer of ``count`` NDJSON requests sent one after another on one
    connection to the unix socket ``path``; an error answer raises RuntimeError."""
    import trio

    stream = await trio.open_unix_socket(path)
    times = []
    buffer = b""
    async with stream:
        for i in range(count):
            start = time.perf_counter()
            frame = {"jsonrpc": "2.0", "id": i, "method": method, "params": params}
            await stream.send_all(json.dumps(frame).encode() + b"\n")
            while b"\n" not in buffer:
                buffer += await stream.receive_some(1 << 16)
            line, buffer = buffer.split(b"\n", 1)
            times.append(time.perf_counter() - start)
            if "error" in json.loads(line):
                raise RuntimeError(f"{method} failed: {line[:300]!r}")
    return times

"""``python bench/run.py services``: a capsule's services (issue 36), each beside a baseline in one run.

- **Start to ready.**  ``capsule_service_start`` of ``python3 -m http.server PORT --bind
  127.0.0.1`` with ``ready: {port}``, timed from the call to its answer, against the same
  server started under ``bwrap --unshare-all --share-net --die-with-parent --ro-bind / /
  --dev /dev --proc /proc``, timed from the spawn until a connection to its port
  succeeds.  The baseline shares the host's network (``--share-net``) so that the bench
  can poll the port from outside, as ccw's ready check polls from the front end (through
  the helper's ``net_connect`` into the capsule's own namespace); with bwrap's own
  namespace there is nothing to connect from but a second process joining it, which
  would time that process's start instead.  So the baseline is a sandbox's start and the
  server's, and the ratio is what ccw adds: the capsule's jail (overlay, cgroup,
  fanotify), the journal and the helper's round trips, and its polling interval.  bwrap
  is polled every ``POLL_S``, as a script would, and in the same rounds at ccw's own
  interval for a port in its first second (``PORT_POLL_FIRST_S``), so the interval's share
  shows apart; the bare server (no sandbox)
  polled every ``POLL_S`` is the floor.  No target: the issue sets none.
- **Requests through a forwarded port.**  bench/parts/tiny_http.py's server (asyncio,
  keep-alive, a two-byte page: fast, so the relay in front of it shows) as a service in a
  capsule, reached through ``capsule_port``'s URL, against the same
  server, the same process, reached straight on its own loopback: the forwarded row's
  client program (``CLIENT``: the same interpreter and flags, unjailed, as root) joined to
  the capsule's network namespace (``nsenter --net=/proc/PID/ns/net``, PID the service's),
  so that the forward is the only difference between the two.  A client process sends N
  GETs one after another, each on a fresh connection (each: the owner check, a spare
  socket of the capsule's namespace connected by ccw-forward, two pipes; the front end
  only when the pool needs refilling) or all on one keep-alive connection (each: two more
  loopback hops and two wake-ups of ccw-forward); and N GETs on fresh connections to
  ``python3 -m http.server`` (HTTP/1.0, a dev server's pace).  Figures are microseconds
  per request, timed inside the client (its start is not counted); the ratio inverts into
  requests per second.  Target (the issue's "the same server reached directly on
  loopback"): the rate through the forward at least 0.8x the rate on the service's own
  loopback, the row's ratio and its "rate ratio"; beside it the median of the rounds' own
  ratios.  This ratio is what the forward costs, and nothing else: the server is jailed
  alike on both paths, so what the capsule costs a server (its overlayfs, the fanotify and
  seccomp tracing of its reads, its cgroup) falls on both.  What the capsule costs is
  shown apart, no target: the same server file run on the host, unjailed and reached on
  the host's loopback ("host-run server", a second process), against the capsule's server
  on its loopback (what the capsule costs the server; above 1 when the capsule's is the
  faster), and against the forward (the forward and the capsule together: the figure this
  row gave before it had the loopback baseline).  And the same client in an exec in the
  capsule (its own jail: what the capsule costs the client too).  Each row ends with the
  CPU per GET of each process on the path (ccw-forward, the server, the helper tracing the
  capsule's server), summed over the runs: on two shared cores a GET's time follows the
  CPU of everything on its path, and this says whose it is.  With a privileged helper the
  owner's connections take the kernel path (sandbox/kernel_ports.py: NAT over a link into
  the capsule, no process relaying), which the report's note names; relayed by ccw-forward
  instead (a rootless helper), a kept connection's requests stay under the target on this
  2-core VM: each adds two loopback hops and two wake-ups of ccw-forward to the direct
  path's two (ccw_forward.c's essay says where that time goes, and what was tried).
- **An exec beside a running service.**  ``capsule_exec ["true"]``, and a short command
  that writes a file and reads it back, in a capsule running an idle service (the
  http.server) against a capsule of the same workspace running none; halfway the service
  moves to the other capsule, so whatever differs between the two capsules falls on both.
  Target: at most 1.05x.  Beside it, the median of each round's own ratio, which drift
  between rounds does not move.

Rounds are interleaved in a new order each time (bench.common.interleaved's reason).
Needs root (the helper runs privileged, and the loopback baseline joins the capsule's
network namespace); the first part's baseline needs bwrap, the GETs' needs nsenter.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio

from bench.common import Call, Report, Row, in_process_tools, interleaved_async, median_ms
from bench.parts import tiny_http

PYTHON = "/usr/bin/python3"  # the server's interpreter on the host and in the capsule alike
TINY = Path(tiny_http.__file__)
# The client needs the standard library alone, so it skips the site hooks (-S; this VM's
# .pth files import certifi at every start): its start is not timed, this only shortens the run.
CLIENT = [PYTHON, "-S"]
PORT = 8765  # in a capsule: each has its own loopback
BWRAP = ["bwrap", "--unshare-all", "--share-net", "--die-with-parent", "--ro-bind", "/", "/",
         "--dev", "/dev", "--proc", "/proc"]
GETS = (("tiny", "fresh"), ("tiny", "keepalive"), ("http.server", "fresh"))  # (server, connections)
POLL_S = 0.005  # the baselines' readiness poll
READY_S = 20.0
TOUCH = ["sh", "-c", "echo bench > touched.txt && cat touched.txt > /dev/null"]


def http_server(port: int) -> list[str]:
    """The trivial server: started in the first part, idle beside the execs, one of the GETs' two."""
    return [PYTHON, "-m", "http.server", str(port), "--bind", "127.0.0.1"]


@dataclass(frozen=True)
class Sizes:
    """How much each part does."""

    start_rounds: int
    http_rounds: int
    fresh: int  # GETs on fresh connections per round
    keepalive: int  # GETs on one connection per round
    exec_rounds: int  # per half (the service in one capsule, then in the other)

    def gets(self, mode: str) -> int:
        """GETs per round on ``fresh`` connections or on one ``keepalive`` connection."""
        return self.fresh if mode == "fresh" else self.keepalive


FULL = Sizes(start_rounds=9, http_rounds=9, fresh=100, keepalive=1000, exec_rounds=40)
QUICK = Sizes(start_rounds=3, http_rounds=3, fresh=40, keepalive=300, exec_rounds=6)


# --- the host side: servers started and polled without ccw ---------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except OSError:
        return False
    return True


def _until_connects(port: int, poll_s: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_S
    while not _connects(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args!r} did not listen on {port} (exit {proc.returncode})")
        time.sleep(poll_s)


@contextlib.contextmanager
def _on_host(argv: list[str], port: int, poll_s: float = POLL_S, cwd: Path | None = None) -> Iterator[float]:
    """``argv`` started, and its seconds until ``port`` accepted; killed on the way out
    (bwrap's sandbox with it: ``--die-with-parent``)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            cwd=cwd)
    try:
        _until_connects(port, poll_s, proc)
        yield time.perf_counter() - start
    finally:
        proc.kill()
        proc.wait()


def _start_on_host(prefix: list[str], poll_s: float) -> float:
    """Seconds from spawning the http.server (under ``prefix``) until it accepts; on a new port each time."""
    port = _free_port()
    with _on_host([*prefix, *http_server(port)], port, poll_s) as seconds:
        return seconds


# --- the parts ---------------------------------------------------------------------------


async def _start_service(call: Call, cap: str, name: str, cmd: list[str], port: int) -> None:
    """Start ``cmd`` as a service, ready when ``port`` accepts; a start that is not ready raises."""
    started = await call("capsule_service_start",
                         {"capsule_id": cap, "name": name, "cmd": cmd, "ready": {"port": port}})
    if not started["ready"]:
        raise RuntimeError(f"service {name} was not ready: {started}")


async def _start_to_ready(call: Call, ws: Path, rounds: int) -> dict[str, list[float]]:
    """Seconds to ready: ccw's service start, bwrap's polled two ways, and the bare server."""
    from mcp_server.capsules.service_ready import PORT_POLL_FIRST_S

    cap = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]

    async def ccw() -> float:
        start = time.perf_counter()
        answer = await call("capsule_service_start", {
            "capsule_id": cap, "name": "web", "cmd": http_server(PORT), "ready": {"port": PORT}})
        elapsed = time.perf_counter() - start
        if not answer["ready"]:
            raise RuntimeError(f"the service was not ready: {answer}")
        await call("capsule_service_stop", {"capsule_id": cap, "name": "web", "grace_ms": 2000})
        return elapsed

    def on_host(prefix: list[str], poll_s: float) -> Callable[[], Awaitable[float]]:
        return lambda: trio.to_thread.run_sync(_start_on_host, prefix, poll_s)

    runners = {"ccw": ccw, "bare": on_host([], POLL_S)}
    if shutil.which("bwrap"):
        runners.update(bwrap=on_host(BWRAP, POLL_S), bwrap_ccw_poll=on_host(BWRAP, PORT_POLL_FIRST_S))
    try:
        return await interleaved_async(runners, rounds)
    finally:
        await call("capsule_destroy", {"capsule_id": cap})


async def _exec_beside(call: Call, ws: Path, rounds: int) -> dict[str, list[float]]:
    """Seconds per exec (``true``, the file command) in a capsule with an idle service and in one without."""
    caps = [(await call("capsule_create", {"workspace": str(ws)}))["capsule_id"] for _ in range(2)]

    def exec_in(which: int, cmd: list[str]) -> Callable[[], Awaitable[float]]:
        async def run() -> float:
            start = time.perf_counter()
            ran = await call("capsule_exec", {"capsule_id": caps[which], "cmd": cmd})
            elapsed = time.perf_counter() - start
            if ran["exit_code"] != 0:
                raise RuntimeError(f"{cmd} failed: {ran['stderr'][-300:]}")
            return elapsed
        return run

    times: dict[str, list[float]] = {}
    try:
        for served in (0, 1):  # the service in one capsule, then in the other
            await _start_service(call, caps[served], "idle", http_server(PORT), PORT)
            half = await interleaved_async({
                f"{name} {'beside' if which == served else 'alone'}": exec_in(which, cmd)
                for which in (0, 1) for name, cmd in (("true", ["true"]), ("touch", TOUCH))}, rounds, seed=served)
            await call("capsule_service_stop", {"capsule_id": caps[served], "name": "idle", "grace_ms": 2000})
            for name, figures in half.items():
                times.setdefault(name, []).extend(figures)
    finally:
        for cap in caps:
            await call("capsule_destroy", {"capsule_id": cap})
    return times


def _cpu_s(pid: int) -> float:
    """CPU seconds a process has used, its ended threads' included (utime + stime of
    /proc/PID/stat: http.server answers each connection in a thread of its own)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0  # it has ended: what it used is no longer told
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _descendants() -> dict[int, tuple[int, list[str]]]:
    """This process's descendants: each one's parent and argv. Every process's argv is
    read, other tests' among them, and theirs need not be UTF-8: undecodable bytes are
    kept as surrogates (as os.fsdecode does), never an error."""
    found: dict[int, tuple[int, list[str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                argv = (entry / "cmdline").read_bytes().split(b"\0")[:-1]
                found[int(entry.name)] = (parent, [os.fsdecode(arg) for arg in argv])
    mine, grew = {os.getpid()}, True
    while grew:
        more = {pid for pid, (parent, _) in found.items() if parent in mine} - mine
        mine |= more
        grew = bool(more)
    return {pid: found[pid] for pid in mine if pid in found}


@dataclass
class Charged:
    """CPU used during one runner's GETs, by the processes on their path, summed over its runs."""

    pids: dict[str, int]  # what each process is ("relay", "server", "helper"): its pid
    gets: int = 0
    seconds: dict[str, float] = field(default_factory=dict)

    async def around(self, run: Callable[[], Awaitable[float]], count: int) -> float:
        before = {name: _cpu_s(pid) for name, pid in self.pids.items()}
        figure = await run()
        for name, pid in self.pids.items():
            self.seconds[name] = self.seconds.get(name, 0.0) + _cpu_s(pid) - before[name]
        self.gets += count
        return figure

    def per_get_us(self) -> dict[str, float]:
        return {name: used * 1e6 / max(self.gets, 1) for name, used in self.seconds.items()}


def _path_pids(capsule_port: int, host: int, argv: Callable[[int], list[str]]) -> dict[str, dict[str, int]]:
    """The processes each kind of GET passes through: the forward's program (the relay),
    the server it reaches (the capsule's, or the host-run one on ``host``), and the helper
    the capsule's server runs under (which traces it)."""
    procs = _descendants()

    def pid_of(wanted: list[str]) -> int:
        return next(pid for pid, (_, args) in procs.items() if args == wanted)

    relay = next(pid for pid, (_, args) in procs.items()
                 if args and args[0].endswith("ccw-forward") and args[args.index("--port") + 1] == str(capsule_port))
    server = pid_of(argv(capsule_port))
    helper = procs[procs[server][0]][0]  # the server's jail's parent
    jailed = {"server": server, "helper": helper}
    return {"forwarded": {"relay": relay, **jailed}, "loopback": jailed,
            "host": {"server": pid_of(argv(host))}, "inside": jailed}


async def _client(port: int, count: int, mode: str, netns_of: int | None = None) -> float:
    """Seconds per GET of a client process's ``count`` sequential GETs to ``port``: on the
    host's loopback, or (``netns_of``, a pid) on the loopback of that process's network
    namespace, which the client joins before it starts (its start is not timed either way)."""
    join = ["nsenter", f"--net=/proc/{netns_of}/ns/net"] if netns_of is not None else []
    done = await trio.run_process([*join, *CLIENT, str(TINY), "get", str(port), str(count), mode],
                                  capture_stdout=True, capture_stderr=True)
    return float(done.stdout) / count


async def _client_in(call: Call, cap: str, port: int, count: int, mode: str) -> float:
    """The same from an exec in the capsule, to ``port`` on its own loopback (the exec's start not counted)."""
    ran = await call("capsule_exec",
                     {"capsule_id": cap, "cmd": [*CLIENT, TINY.name, "get", str(port), str(count), mode]})
    if ran["exit_code"] != 0:
        raise RuntimeError(f"the client in the capsule failed: {ran['stderr'][-300:]}")
    return float(ran["stdout"]) / count


async def _serving(call: Call, cap: str, name: str, cmd: list[str], port: int) -> int:
    """Start ``cmd`` as a service listening on ``port`` and forward it: the host port."""
    await _start_service(call, cap, name, cmd, port)
    host_port: int = (await call("capsule_port", {"capsule_id": cap, "port": port}))["host_port"]
    return host_port


async def _paths(call: Call, cap: str) -> dict[str, list[float]]:
    """Which path each forward takes: a figure "path kernel PORT", 1 for the kernel's NAT, 0 for the relay."""
    listed = (await call("capsule_service_list", {"capsule_id": cap}))["ports"]
    return {f"path kernel {forward['port']}": [1.0 if forward["path"] == "kernel" else 0.0] for forward in listed}


async def _forwarded(call: Call, ws: Path, sizes: Sizes) -> dict[str, list[float]]:
    """Seconds per GET through a forwarded port, straight to the same server on its
    capsule's loopback, to the same file run on the host, and from an exec in the capsule:
    the fast server on fresh connections and on one kept alive, and http.server (HTTP/1.0:
    a connection per request)."""
    tiny = [PYTHON, TINY.name, "serve"]
    inside = {"tiny": PORT, "http.server": PORT + 1}
    cap = (await call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
    try:
        forwards = {"tiny": await _serving(call, cap, "tiny", [*tiny, str(PORT)], PORT),
                    "http.server": await _serving(call, cap, "web", http_server(PORT + 1), PORT + 1)}
        host = {"tiny": _free_port(), "http.server": _free_port()}
        with _on_host([*tiny, str(host["tiny"])], host["tiny"], cwd=ws), \
                _on_host(http_server(host["http.server"]), host["http.server"], cwd=ws):
            runners: dict[str, Callable[[], Awaitable[float]]] = {}
            charged: dict[str, Charged] = {}
            argv = {"tiny": lambda port: [*tiny, str(port)], "http.server": http_server}
            for server, mode in GETS:
                count = sizes.gets(mode)
                pids = _path_pids(inside[server], host[server], argv[server])
                netns_of = pids["loopback"]["server"]
                for where, run in (("forwarded", partial(_client, forwards[server], count, mode)),
                                   ("loopback", partial(_client, inside[server], count, mode, netns_of)),
                                   ("host", partial(_client, host[server], count, mode)),
                                   ("inside", partial(_client_in, call, cap, inside[server], count, mode))):
                    name = f"{server} {mode} {where}"
                    charged[name] = Charged(pids[where])
                    runners[name] = partial(charged[name].around, run, count)
            figures = await interleaved_async(runners, sizes.http_rounds)
            figures.update(await _paths(call, cap))
            for name, used in charged.items():  # CPU per GET, its warm-up included: the same work
                figures.update({f"{name} cpu {what}": [us] for what, us in used.per_get_us().items()})
            return figures
    finally:
        await call("capsule_destroy", {"capsule_id": cap})


async def _measure(root: Path, sizes: Sizes) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Every part's figures, and the seconds each part took."""
    ws = root / "ws"
    ws.mkdir()
    (ws / "index.html").write_text("<p>served from a capsule</p>\n")
    shutil.copy2(TINY, ws / TINY.name)
    figures: dict[str, list[float]] = {}
    took: dict[str, float] = {}
    async with in_process_tools(root / "state") as tools:
        for part, measure in (("start", partial(_start_to_ready, tools.call, ws, sizes.start_rounds)),
                              ("exec", partial(_exec_beside, tools.call, ws, sizes.exec_rounds)),
                              ("GETs", partial(_forwarded, tools.call, ws, sizes))):
            start = time.perf_counter()
            figures.update(await measure())
            took[part] = time.perf_counter() - start
    return figures, took


# --- the report ----------------------------------------------------------------------------


def _start_rows(figures: dict[str, list[float]], rounds: int) -> list[Row]:
    from mcp_server.capsules.service_ready import PORT_POLL_FIRST_S

    name = "service start to ready: python3 -m http.server"
    ccw = median_ms(figures["ccw"])
    rows = []
    if "bwrap" in figures:
        rows.append(Row(name, ccw, f"bwrap, polled every {POLL_S * 1000:g} ms", median_ms(figures["bwrap"]),
                        "(no target)", {"rounds": rounds}))
        rows.append(Row(name, ccw, f"bwrap, polled every {PORT_POLL_FIRST_S * 1000:g} ms (ccw's)",
                        median_ms(figures["bwrap_ccw_poll"]), "(no target)"))
    else:
        rows.append(Row(name, ccw, "bwrap (not installed)", None, "(no target)"))
    rows.append(Row(name, ccw, f"bare, polled every {POLL_S * 1000:g} ms", median_ms(figures["bare"]), "(no target)"))
    return rows


def _http_row(figures: dict[str, list[float]], server: str, mode: str, count: int, rounds: int) -> Row:
    runs = {where: figures[f"{server} {mode} {where}"] for where in ("forwarded", "loopback", "host", "inside")}
    us = {where: median_ms(times) * 1000 for where, times in runs.items()}

    def rate_ratio(faster: str, slower: str) -> float:
        return round(us[faster] / us[slower], 3)

    def rounds_ratio(faster: str, slower: str) -> float:
        # Each round's runs are close in time: their own ratio drifts less with the load of
        # the moment than the medians' does.
        return round(statistics.median(f / s for f, s in zip(runs[faster], runs[slower], strict=True)), 3)

    label = "a fresh connection each" if mode == "fresh" else "one keep-alive connection"
    what = "tiny_http (asyncio)" if server == "tiny" else "python3 -m http.server"
    # Rows hold "lower is better" figures: microseconds per request, so that a rate of at
    # least 0.8x the loopback one is a ratio of at most 1.25.
    return Row(f"{count} GETs to {what}, {label} (per GET)", us["forwarded"], "its own loopback",
               us["loopback"], "<= 1.25 (req/s >= 0.8x)", unit="us",
               extra={"req/s forwarded, on its loopback": f"{1e6 / us['forwarded']:.0f}, {1e6 / us['loopback']:.0f}",
                      "rate ratio (the forward's cost)": rate_ratio("loopback", "forwarded"),
                      "median of the rounds' rate ratios": rounds_ratio("loopback", "forwarded"),
                      "host-run server (unjailed)": f"{us['host']:.0f} us/GET, {1e6 / us['host']:.0f} req/s",
                      "rate ratio, on its loopback vs host-run (the capsule's cost to the server)":
                          f"{rate_ratio('host', 'loopback')} (rounds' median {rounds_ratio('host', 'loopback')})",
                      "rate ratio, forwarded vs host-run (forward and capsule)":
                          f"{rate_ratio('host', 'forwarded')} (rounds' median {rounds_ratio('host', 'forwarded')})",
                      "from an exec in the capsule (no forward)": f"{us['inside']:.0f} us/GET", "rounds": rounds,
                      **{f"CPU per GET, {where}": _cpu_text(figures, f"{server} {mode} {where}")
                         for where in ("forwarded", "loopback", "host")}})


def _cpu_text(figures: dict[str, list[float]], runner: str) -> str:
    """What the processes on a GET's path used, in microseconds of CPU per GET (the
    clients' own excepted): where a forwarded GET's time goes when the two cores are shared."""
    used = {what: figures[f"{runner} cpu {what}"][0] for what in ("relay", "server", "helper")
            if f"{runner} cpu {what}" in figures}
    return ", ".join(f"{what} {us:.0f} us" for what, us in used.items())


def _exec_rows(figures: dict[str, list[float]]) -> list[Row]:
    rows = []
    for name, what in (("true", 'capsule_exec ["true"]'), ("touch", "capsule_exec sh: write a file, read it")):
        beside, alone = figures[f"{name} beside"], figures[f"{name} alone"]
        paired = statistics.median(b / a for b, a in zip(beside, alone, strict=True))
        rows.append(Row(f"{what}, an idle service beside", median_ms(beside), "no service", median_ms(alone),
                        "<= 1.05x", {"runs": len(beside), "median of the rounds' ratios": f"{paired:.3f}x"}))
    return rows


def run(quick: bool = False) -> Report:
    """Measure the three parts in one runtime and report medians and ratios."""
    if os.geteuid() != 0:
        raise SystemExit("the services suite needs root (the helper runs privileged)")
    sizes = QUICK if quick else FULL
    report = Report("services")
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="ccw-bench-services-") as tmp:
        figures, took = trio.run(_measure, Path(tmp), sizes)
    for row in _start_rows(figures, sizes.start_rounds):
        report.add(row)
    for server, mode in GETS:
        report.add(_http_row(figures, server, mode, sizes.gets(mode), sizes.http_rounds))
    for row in _exec_rows(figures):
        report.add(row)
    report.notes.append("start to ready: ccw from the tool call to its ready answer; the baselines from the spawn "
                        "until a connection to the port succeeds (bwrap --share-net: polled from the host)")
    report.notes.append("parts took " + ", ".join(f"{part} {seconds:.0f} s" for part, seconds in took.items())
                        + f"; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, on "
                        f"{os.cpu_count()} CPUs (each extra hop waits for a CPU when others are busy)")
    paths = {"kernel's NAT" if figures[name][0] else "ccw-forward's splice relay" for name in figures
             if name.startswith("path kernel ")}
    report.notes.append("GETs: a client process (bench/parts/tiny_http.py get) against one server in a capsule, "
                        f"behind capsule_port (by the {' and the '.join(sorted(paths))}) and on the capsule's loopback "
                        "(the client joined to its network namespace: the target's baseline); and against the "
                        "same file run on the host; its own start is not counted; CPU per GET from "
                        "/proc/PID/stat, in 10 ms ticks summed over every run of a row")
    return report

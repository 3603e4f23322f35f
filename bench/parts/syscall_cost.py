"""Where a capsule's extra CPU goes (issue 36): one syscall-heavy workload, each mechanism added in turn.

The workload (``WORKLOAD``, the system Python, the standard library alone) times its own
CPU (``time.process_time``) per operation of each phase: open+read+close of a workspace
file, ``stat``, ``listdir``, a loopback TCP ping-pong, a GET of a file from an
``http.server`` in the same process (its log off), and posix_spawn of /bin/true.  Only
the loop is timed, never the interpreter's start.  It runs, interleaved round by round
(bench.common.interleaved's reason):

- on the host, in the overlay's lower dir (the floor);
- on the host, in the overlay's merged dir (what the overlay costs);
- in the jail (``supervise.run``, as uid 65534) without its seccomp filter;
- in the jail;
- in the jail and an exec cgroup (memory and pids limits, as an exec has);
- in the jail, the cgroup, recorded by the overlay's fanotify group: a capsule's exec.

Each row is one phase in the capsule's exec against the host's floor, with every step's
median beside it, so a step's cost is the difference of two neighbours of one run.  The
jail runs as uid 65534, which the workspace files do not belong to, so its permission
checks look further (the files' ACLs) than the host's root does: part of the "jail
without seccomp" step.  Needs root.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import statistics
import subprocess
import unittest.mock
from collections.abc import Callable

from bench.common import Row, interleaved
from bench.parts.tracing import _overlay_tree

PYTHON = "/usr/bin/python3"
WORKSPACE = "/srv/bench-syscalls"
FILES = 100
WORKLOAD = """\
import http.client, http.server, json, os, socket, threading, time
out, files = {}, ["many/" + n for n in sorted(os.listdir("many"))]
def phase(name, count, fn):
    start = time.process_time()
    for _ in range(count):
        fn()
    out[name] = (time.process_time() - start) / count * 1e6
def read_all():
    for f in files:
        with open(f, "rb") as h:
            h.read()
def stat_all():
    for f in files:
        os.stat(f)
phase("open+read+close", 20, lambda: read_all())
phase("stat", 50, lambda: stat_all())
phase("listdir", 1000, lambda: os.listdir("many"))
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen()
client = socket.create_connection(srv.getsockname()); served, _ = srv.accept()
def ping():
    client.send(b"x"); served.recv(1); served.send(b"y"); client.recv(1)
phase("loopback TCP ping-pong", 3000, ping)
class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args): pass
httpd = http.server.HTTPServer(("127.0.0.1", 0), Quiet)
threading.Thread(target=httpd.serve_forever, daemon=True).start()
def get():
    c = http.client.HTTPConnection("127.0.0.1", httpd.server_address[1])
    c.request("GET", "/" + files[1]); c.getresponse().read(); c.close()
phase("http.server GET", 300, get)
phase("posix_spawn /bin/true", 50, lambda: os.waitpid(os.posix_spawn("/bin/true", ["/bin/true"], {}), 0))
print(json.dumps(out))
"""
# Per phase, how many operations one figure counts (the rows say "per file" or "per op").
PER = {"open+read+close": FILES, "stat": FILES}
STEPS = ("host", "host, on the overlay", "jail without seccomp", "jail", "jail + cgroup",
         "jail + cgroup + fanotify (a capsule's exec)")


def measure(rounds: int) -> list[Row]:
    """One row per phase: the capsule's exec against the host, each step's median beside it."""
    figures: dict[str, list[dict[str, float]]] = {step: [] for step in STEPS}
    with _overlay_tree(FILES) as base:
        for name in ("tmp", "home"):
            os.mkdir(os.path.join(base, name))
        with open(os.path.join(base, "tmp", "syscalls.py"), "w") as handle:
            handle.write(WORKLOAD)
        runners = _runners(base)

        def keeping(step: str) -> Callable[[], None]:
            return lambda: figures[step].append(runners[step]())

        try:
            interleaved({step: keeping(step) for step in STEPS}, rounds)
        finally:
            from sandbox import fanotify

            fanotify.close_group(os.path.join(base, "merged"))
    for runs in figures.values():
        del runs[0]  # the warm-up's
    rows = []
    for phase in figures[STEPS[0]][0]:
        med = {step: statistics.median(run[phase] for run in figures[step]) / PER.get(phase, 1) for step in STEPS}
        unit = "us per file" if phase in PER else "us per op"
        rows.append(Row(f"{phase}: CPU in a capsule's exec", med[STEPS[-1]], baseline="on the host",
                        baseline_ms=med["host"], unit=unit,
                        extra={"steps": ", ".join(f"{s} {med[s]:.2f} ({med[s] / med['host']:.2f}x)" for s in STEPS),
                               "rounds": rounds}))
    return rows


def _runners(base: str) -> dict[str, Callable[[], dict[str, float]]]:
    from sandbox import cgroups, contain, exec_cgroup, fanotify, seccomp, spare_cgroups, supervise

    spec = contain.JailSpec(
        merged_dir=os.path.join(base, "merged"), workspace=WORKSPACE, tmp_dir=os.path.join(base, "tmp"),
        home_dir=os.path.join(base, "home"), argv=[PYTHON, "-S", "/tmp/syscalls.py"], cwd=WORKSPACE,
        env={"PATH": "/usr/bin:/bin", "HOME": "/home/bench", "LANG": "C.UTF-8"}, uid=65534, gid=65534,
    )
    layout = cgroups.detect_layout()

    def host(where: str) -> Callable[[], dict[str, float]]:
        argv = [PYTHON, "-S", os.path.join(base, "tmp", "syscalls.py")]
        return lambda: json.loads(subprocess.run(argv, cwd=os.path.join(base, where), check=True,
                                                 capture_output=True).stdout)

    def jail(filtered: bool = True, cgroup: bool = False, traced: bool = False) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            with contextlib.ExitStack() as stack:
                if not filtered:
                    stack.enter_context(unittest.mock.patch.object(seccomp, "prepare", lambda notifying=False: None))
                limits = exec_cgroup.Limits(memory_bytes=1 << 30, pids_max=256)
                name = f"bench-syscalls-{random.randrange(1 << 30)}"
                cg = spare_cgroups.take(layout, name, limits) if cgroup else None
                recording = fanotify.group_of(spec.merged_dir).record(cg, visible_at=WORKSPACE) if traced else None
                result = supervise.run(spec, cg)
                if recording is not None:
                    traced_files = recording.collect()
                    recording.close()
                    if traced_files.read is None or len(traced_files.read) < FILES:
                        raise RuntimeError(f"the capsule's exec recorded {traced_files.read!r}, not every file it read")
                result.ending.release()
                if result.exit_code != 0:
                    raise RuntimeError(f"the workload failed in the jail: {result.stderr[-500:]!r}")
                return dict(json.loads(result.stdout))
        return run

    return {"host": host("lower"), "host, on the overlay": host("merged"), "jail without seccomp": jail(False),
            "jail": jail(), "jail + cgroup": jail(cgroup=True),
            "jail + cgroup + fanotify (a capsule's exec)": jail(cgroup=True, traced=True)}

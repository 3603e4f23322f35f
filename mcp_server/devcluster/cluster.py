"""A local REAPI cluster in one command: private PostgreSQL + BuildGrid, loopback only (issue 17).

``python -m mcp_server.devcluster.cluster up [--state-dir DIR]`` brings it up, prints the
endpoint (``CCW_REAPI_URL=grpc://127.0.0.1:PORT``) and tears it all down on Ctrl-C or
SIGTERM; the vm-tests' fixture drives the same ``Cluster`` class.

Some facts about BuildGrid, as the cluster runs it:

- BuildGrid 0.9.1 needs Python >= 3.13 while ccw runs on 3.11, so the server lives in
  its own venv on a 3.13 interpreter (found by ``find_server_python``; Debian 12 has
  none, pyenv or Debian 13 do), made once and kept in ``~/.cache/ccw`` across clusters.
  It is a separate service reached over gRPC, so the two never share a process.
- Its scheduler needs PostgreSQL (``!sql-scheduler``; the SQLite one is gone), whose
  schema ``bgd migrate apply`` creates.  CAS and action cache are in memory
  (``!lru-storage``, ``!lru-action-cache``): a cluster is thrown away whole.
- Every wait in BuildGrid is a poll, 1 s by default (the scheduler's job watcher, bot
  long polls, the assigner).  At 0.2 s a short action takes a fraction of a second
  end to end instead of seconds.  The assigner also adds a random 0-1 s to each of
  its sleeps (``jitter-factor`` 1.0, meant to spread many assigners apart); with one
  assigner that is only latency (a trivial action's round trip through a bot, median
  of 5 on this project's 2-core VM: 620 ms with it, 220 ms without), so it is 0.02.
  ``proactive-fetch-to-capacity`` stays off: with it the server spins a core.
- No released BuildGrid ships a worker; ``ccw-bot`` (next) speaks its Remote Workers
  API.  Until a bot is attached, Execute queues (a cache hit still answers).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from mcp_server.devcluster import postgres
from mcp_server.reapi.protos import re_grpc, re_pb2
from mcp_server.reapi.worker import parse_properties
from sandbox.errors import CcwError

BUILDGRID_VERSION = "0.9.1"
SERVER_PYTHON_MIN = (3, 13)
POLL_INTERVAL_S = 0.2
READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0


def _python_version(python: str) -> tuple[int, int] | None:
    """``(major, minor)`` of an interpreter, or None when it does not run (a pyenv shim may not)."""
    try:
        done = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"],
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    except OSError:
        return None
    parts = done.stdout.split()
    return (int(parts[0]), int(parts[1])) if done.returncode == 0 and len(parts) == 2 else None


def server_python_candidates(env: Mapping[str, str]) -> list[str]:
    """Where a Python >= 3.13 may be, in the order tried.

    ``python3.13`` on PATH may be pyenv's shim, which fails unless 3.13 is a selected
    pyenv version (as on this project's VM), so pyenv's own versions are tried as well.
    """
    names = ["python3.14", "python3.13", "python3"]
    found = [p for name in names if (p := _which(name, env))]
    pyenv_root = Path(env.get("PYENV_ROOT") or Path(env.get("HOME", "/root")) / ".pyenv")
    versions = pyenv_root / "versions"
    if versions.is_dir():
        found += [str(v / "bin" / "python3") for v in sorted(versions.iterdir(), reverse=True)]
    return found


def _which(name: str, env: Mapping[str, str]) -> str | None:
    return shutil.which(name, path=env.get("PATH", os.defpath))


def find_server_python(env: Mapping[str, str] = os.environ) -> str:
    """An interpreter BuildGrid 0.9.1 runs on: ``CCW_BGD_PYTHON``, else the first >= 3.13 found."""
    wanted = ".".join(map(str, SERVER_PYTHON_MIN))
    if chosen := env.get("CCW_BGD_PYTHON"):
        version = _python_version(chosen)
        if version is None or version < SERVER_PYTHON_MIN:
            raise CcwError("UNSUPPORTED", f"CCW_BGD_PYTHON={chosen} is not a Python >= {wanted}")
        return chosen
    for python in server_python_candidates(env):
        version = _python_version(python)
        if version is not None and version >= SERVER_PYTHON_MIN:
            return python
    raise CcwError(
        "UNSUPPORTED",
        f"BuildGrid {BUILDGRID_VERSION} needs Python >= {wanted} and none was found "
        "(tried python3.14, python3.13, python3 on PATH and pyenv's versions): install one "
        "(Debian 13: apt-get install python3; elsewhere: pyenv install 3.13) or set "
        "CCW_BGD_PYTHON to its path",
    )


def default_venv_dir(env: Mapping[str, str] = os.environ) -> Path:
    """Where BuildGrid's venv is kept between clusters (``CCW_BGD_VENV`` overrides)."""
    if chosen := env.get("CCW_BGD_VENV"):
        return Path(chosen)
    cache = Path(env.get("XDG_CACHE_HOME") or Path(env.get("HOME", "/root")) / ".cache")
    return cache / "ccw" / f"buildgrid-{BUILDGRID_VERSION}"


def ensure_buildgrid(venv_dir: Path, python: str) -> Path:
    """The ``bgd`` of a venv with BuildGrid installed, creating the venv once (under a lock)."""
    bgd = venv_dir / "bin" / "bgd"
    stamp = venv_dir / ".ccw-installed"
    venv_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(venv_dir.parent / f".{venv_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and bgd.exists():
            return bgd
        for argv in ([python, "-m", "venv", "--clear", str(venv_dir)],
                     [str(venv_dir / "bin" / "python"), "-m", "pip", "install", "-q",
                      "--disable-pip-version-check", f"buildgrid=={BUILDGRID_VERSION}"]):  # fmt: skip
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise CcwError("UNAVAILABLE", f"{' '.join(argv)} failed with {done.returncode}: "
                                              f"{done.stderr[-3000:]}")  # fmt: skip
        stamp.write_text(f"{python}\n")
    return bgd


# BuildGrid's configuration (its reference: buildgrid/server/app/settings/reference.yml).
BGD_CONFIG = """\
server:
  - !channel
    address: "127.0.0.1:{grpc_port}"
    insecure-mode: true
authorization:
  method: none
connections:
  - !sql-connection &sql
    connection-string: {sql_url}
    pool-size: 10
    max-overflow: 20
storages:
  - !lru-storage &cas
    size: {cas_size}
caches:
  - !lru-action-cache &ac
    storage: *cas
    max-cached-refs: 100000
    allow-updates: true
    cache-failed-actions: true
schedulers:
  - !sql-scheduler &scheduler
    sql: *sql
    storage: *cas
    action-cache: *ac
    poll-interval: {poll_interval}
    bot-poll-interval: {poll_interval}
    proactive-fetch-to-capacity: false
    bot-session-keepalive-timeout: {bot_keepalive_s}
    session-expiry-timer-interval: 2.0
    property-set: !dynamic-property-set
      match-property-keys: {keys}
    assigners:
      - !priority-age-assigner
        count: 1
        interval: {poll_interval}
        jitter-factor: 0.02
instances:
  - name: ""
    services:
      - !action-cache
        cache: *ac
      - !execution
        scheduler: *scheduler
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
thread-pool-size: 40
"""


def bgd_config(grpc_port: int, sql_url: str, *, poll_interval: float = POLL_INTERVAL_S,
               cas_size: str = "2GB", match_keys: Sequence[str] = (),
               bot_keepalive_s: int = 30) -> str:
    """BuildGrid's YAML for one loopback instance (the unnamed one) with CAS, AC, execution, bots.

    ``match_keys`` are the platform properties (beyond OSFamily and ISA) that jobs may
    set and that must match a bot's; a bot silent for ``bot_keepalive_s`` is dropped
    and its leases requeued.
    """
    keys = "[" + ", ".join(f'"{k}"' for k in match_keys) + "]"
    return BGD_CONFIG.format(grpc_port=grpc_port, sql_url=sql_url, poll_interval=poll_interval,
                             cas_size=cas_size, keys=keys, bot_keepalive_s=bot_keepalive_s)  # fmt: skip


PORT_TRIES = 3  # picks of a free port for bgd, which may lose each to another process


def free_loopback_port() -> int:
    """A TCP port free on 127.0.0.1 right now (the kernel's pick)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until_serving(target: str, process: subprocess.Popen[bytes], log: Path,
                       timeout: float = READY_TIMEOUT_S) -> None:
    """Return once GetCapabilities answers on ``target``; fail if the server dies or time runs out."""
    deadline = time.monotonic() + timeout
    with grpc.insecure_channel(target) as channel:
        stub = re_grpc.CapabilitiesStub(channel)
        while True:
            if process.poll() is not None:
                raise CcwError("UNAVAILABLE", f"bgd server exited with {process.returncode}: "
                                              f"{log.read_text(errors='replace')[-3000:]}")  # fmt: skip
            try:
                stub.GetCapabilities(re_pb2.GetCapabilitiesRequest(instance_name=""), timeout=1.0)
                return
            except grpc.RpcError:
                if time.monotonic() > deadline:
                    raise CcwError("TIMEOUT", f"bgd server on {target} did not answer in {timeout}s "
                                              f"(log: {log})") from None  # fmt: skip
                time.sleep(0.1)


@dataclass
class Cluster:
    """PostgreSQL + ``bgd server`` under ``state_dir``; ``up()`` then ``down()`` (or ``with``)."""

    state_dir: Path
    venv_dir: Path = field(default_factory=default_venv_dir)
    match_keys: Sequence[str] = ()
    bot_keepalive_s: int = 30
    timings: dict[str, float] = field(default_factory=dict)
    server_python: str = ""
    grpc_port: int = 0
    _db: postgres.PrivatePostgres | None = None
    _server: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        """gRPC target, ``127.0.0.1:PORT``."""
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def url(self) -> str:
        """The endpoint as ``CCW_REAPI_URL`` takes it."""
        return f"grpc://{self.target}"

    def _timed(self, name: str, started: float) -> float:
        now = time.monotonic()
        self.timings[name] = round(now - started, 3)
        return now

    def up(self) -> None:
        """Install what is missing, start PostgreSQL, migrate, start the server, wait until it answers."""
        t0 = mark = time.monotonic()
        self.state_dir.mkdir(parents=True, exist_ok=True)
        bin_dir = postgres.ensure_installed()
        self.server_python = find_server_python()
        bgd = ensure_buildgrid(self.venv_dir, self.server_python)
        mark = self._timed("install_s", mark)
        self._db = postgres.PrivatePostgres(bin_dir, self.state_dir / "pg", free_loopback_port(),
                                            self.state_dir / "postgres.log")  # fmt: skip
        try:
            self._db.create()
            self._db.start()
            mark = self._timed("postgres_s", mark)
            subprocess.run([str(bgd), "migrate", "apply", self._db.url], check=True,
                           capture_output=True)  # fmt: skip
            mark = self._timed("migrate_s", mark)
            self.start_server()
            self._timed("server_s", mark)
        except BaseException:
            self.down()
            raise
        self.timings["ready_s"] = round(time.monotonic() - t0, 3)

    def start_server(self) -> None:
        """Start ``bgd server`` (on the same port when restarting) and wait until it answers."""
        assert self._db is not None, "up() first"
        picked = not self.grpc_port  # else the person's port, or the one a restart keeps
        for attempt in range(PORT_TRIES):
            self.grpc_port = self.grpc_port or free_loopback_port()
            config = self.state_dir / "bgd.yml"
            config.write_text(bgd_config(self.grpc_port, self._db.url, match_keys=self.match_keys,
                                         bot_keepalive_s=self.bot_keepalive_s))  # fmt: skip
            log = self.state_dir / "bgd.log"
            with open(log, "ab") as sink:
                self._server = subprocess.Popen(
                    [str(self.venv_dir / "bin" / "bgd"), "server", "start", str(config)],
                    stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, start_new_session=True,
                )  # fmt: skip
            try:
                wait_until_serving(self.target, self._server, log)
                return
            except CcwError as exc:
                # bgd binds the port itself, from its config: a port found free can be taken by
                # another process before bgd gets to it.  Another pick then, if the pick was ours.
                if not picked or attempt == PORT_TRIES - 1 or "Address already in use" not in exc.message:
                    raise
                self.grpc_port = 0

    def stop_server(self) -> None:
        """SIGTERM the server, SIGKILL it after a grace period."""
        server, self._server = self._server, None
        if server is None or server.poll() is not None:
            return
        server.terminate()
        try:
            server.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()

    def restart_server(self) -> None:
        """Restart BuildGrid alone: its in-memory CAS and action cache start empty."""
        self.stop_server()
        self.start_server()

    def down(self) -> None:
        """Stop the server and PostgreSQL and remove the database (idempotent)."""
        self.stop_server()
        db, self._db = self._db, None
        if db is not None:
            db.stop()
            shutil.rmtree(db.data_dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()


@contextlib.contextmanager
def temporary_cluster(**options: object) -> Iterator[Cluster]:
    """A cluster in a fresh state dir under /tmp that PostgreSQL's user can reach, removed after."""
    state_dir = Path(tempfile.mkdtemp(prefix="ccw-cluster-"))
    state_dir.chmod(0o711)
    try:
        with Cluster(state_dir, **options) as cluster:  # type: ignore[arg-type]
            yield cluster
    finally:
        shutil.rmtree(state_dir, ignore_errors=True)


def start_bot(url: str, bot_id: str, state_dir: Path, capacity: int = 1,
              properties: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """A ccw-bot process serving ``url``, with its own state dir (and embedded helper); log in bot.log there.

    ``properties``: ``name=value`` platform properties it advertises (beyond OSFamily=linux).
    """
    state_dir.mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key != "CCW_HELPER_SOCKET"}
    env["CCW_STATE_DIR"] = str(state_dir)
    with open(state_dir / "bot.log", "ab") as sink:
        extra = [arg for item in properties for arg in ("--property", item)]
        return subprocess.Popen([sys.executable, "-m", "mcp_server.bot", "--reapi", url, "--bot-id", bot_id,
                                 "--capacity", str(capacity), *extra], stdin=subprocess.DEVNULL, stdout=sink,
                                stderr=sink, env=env, start_new_session=True)  # fmt: skip


def stop_bot(bot: subprocess.Popen[bytes], grace_s: float = 30.0) -> int:
    """SIGTERM a bot (it signs off and hands back its leases), SIGKILL it after ``grace_s``."""
    if bot.poll() is None:
        bot.terminate()
        try:
            bot.wait(grace_s)
        except subprocess.TimeoutExpired:
            bot.kill()
    return bot.wait()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """``up``: start a cluster, print its URL, stay up until Ctrl-C or SIGTERM, then tear down."""
    parser = argparse.ArgumentParser(prog="python -m mcp_server.devcluster.cluster",
                                     description="A local BuildGrid cluster on loopback")  # fmt: skip
    parser.add_argument("command", choices=["up"])
    parser.add_argument("--state-dir", type=Path, help="default: a fresh directory under /tmp")
    parser.add_argument("--bots", type=int, default=0, help="ccw-bots to start beside it (each with its own helper)")
    parser.add_argument("--capacity", type=int, default=1, help="leases at once per bot")
    parser.add_argument("--property", action="append", default=[], metavar="NAME=VALUE",
                        help="a platform property the bots advertise and jobs may ask for (repeat)")
    args = parser.parse_args(argv)
    try:
        properties = parse_properties(args.property)
    except CcwError as error:
        parser.error(error.message)
    keys = sorted(set(properties) - {"OSFamily", "ISA"})  # what the scheduler matches on beyond its own
    signal.signal(signal.SIGTERM, _interrupt)
    state = args.state_dir
    made = state is None
    if state is None:
        state = Path(tempfile.mkdtemp(prefix="ccw-cluster-"))
        state.chmod(0o711)
    cluster = Cluster(state, match_keys=keys)
    bots: list[subprocess.Popen[bytes]] = []
    try:
        cluster.up()
        bots += [start_bot(cluster.url, f"bot-{i}", state / f"bot-{i}", args.capacity, args.property)
                 for i in range(args.bots)]  # fmt: skip
        print(f"CCW_REAPI_URL={cluster.url}", flush=True)
        if args.bots:  # the slots one deltamin can fill at once
            print(f"CCW_REAPI_PARALLEL={args.bots * args.capacity}", flush=True)
        if keys:
            print(f"CCW_REAPI_PLATFORM={','.join(f'{k}={v}' for k, v in properties.items())}", flush=True)
        print(f"ready in {cluster.timings['ready_s']} s {cluster.timings}, state in {state}; "
              "Ctrl-C stops it", file=sys.stderr, flush=True)  # fmt: skip
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        for bot in bots:
            stop_bot(bot)
        cluster.down()
        if made:
            shutil.rmtree(state, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Tests that need root and a real kernel.

They skip on a host that cannot run them, except when ``CCW_MUST_WORK=1`` (CI sets it):
then a missing privilege or kernel feature fails the test instead (bubblewrap's
``BWRAP_MUST_WORK`` habit).  Use the ``require`` fixture, ``require(condition, why)``, for every such check.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MUST_WORK = os.environ.get("CCW_MUST_WORK") == "1"

# Fixtures every vm-test can take by name: other users' (a script run as a uid, a directory
# all can traverse, a system user made for the test: tests/support/users.py) and the
# rootless jail's directories (tests/support/rootless_jail.py).
from tests.support.rootless_jail import base  # noqa: E402, F401
from tests.support.users import public_dir, run_as, user_dir  # noqa: E402, F401
from tests.support.webdriver import Browser  # noqa: E402


def require(condition: bool, why: str) -> None:
    """Skip (or, under CCW_MUST_WORK=1, fail) unless ``condition`` holds."""
    if condition:
        return
    if MUST_WORK:
        pytest.fail(f"CCW_MUST_WORK=1 but {why}")
    pytest.skip(why)


@pytest.fixture(name="require")
def require_fixture() -> object:
    """The ``require`` function, for tests (test modules cannot import conftest)."""
    return require


@pytest.fixture
def root_required() -> None:
    """The test needs to run as root."""
    require(os.geteuid() == 0, "needs root")


class ToolRunner:
    """Calls tool handlers through a real Runtime (embedded helper), checking both schemas."""

    def __init__(self, state_dir: Path, env: dict[str, str] | None = None) -> None:
        from mcp_server.config import TOOLSETS, Config
        from mcp_server.context import CallContext, Runtime
        from mcp_server.state import State
        from mcp_server.tools.registry import Registry

        self.config = Config.from_env({**(env or {}), "CCW_STATE_DIR": str(state_dir)})  # env: other CCW_* settings
        self.registry = Registry.load(TOOLSETS)
        self.runtime = Runtime(self.config, State(state_dir), self.registry.run_outcome)  # as the server's
        self.ctx = CallContext(self.runtime)

    async def call(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """Validate ``args``, run the tool, validate and return its result."""
        import jsonschema

        spec = self.registry.lookup(name)
        assert spec is not None, name
        jsonschema.Draft202012Validator(spec.input_schema).validate(args)
        result: dict[str, Any] = await spec.handler(self.ctx, args)
        jsonschema.Draft202012Validator(spec.output_schema).validate(result)
        return result

    def run(self, fn: Callable[[ToolRunner], Awaitable[Any]]) -> Any:
        """Run ``fn(self)`` under trio, then stop the embedded helper."""
        import trio

        async def main() -> Any:
            try:
                return await fn(self)
            finally:
                await self.runtime.aclose()

        return trio.run(main)


NOBODY = 65534


@pytest.fixture
def nobody_dir(root_required: None) -> Iterator[Path]:
    """A directory under /var/tmp everyone can traverse, for a script run as nobody (``as_nobody``)."""
    path = Path(tempfile.mkdtemp(prefix="ccw-nobody-test-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path)


@pytest.fixture
def as_nobody(root_required: None) -> Callable[[str, Path | None], dict[str, Any]]:
    """Run a Python script as nobody (a rootless helper's caller) and read back the JSON it prints,
    after giving nobody the tree ``owned`` (None: nothing); where this kernel forbids unprivileged
    user namespaces, ``require`` says so."""
    def run(script: str, owned: Path | None = None) -> dict[str, Any]:
        require(os.path.exists("/usr/bin/python3"), "needs /usr/bin/python3 for the unprivileged user")
        for dirpath, dirnames, filenames in os.walk(owned) if owned is not None else ():
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.chown(name, NOBODY, NOBODY)
        proc = subprocess.run(["/usr/bin/python3", "-c", script], capture_output=True, text=True, timeout=60,
                              user=NOBODY, group=NOBODY, extra_groups=[], cwd="/")
        require("Operation not permitted" not in proc.stderr or proc.returncode == 0,
                f"unprivileged user namespaces are not allowed here: {proc.stderr[-300:]}")
        assert proc.returncode == 0, proc.stderr
        return dict(json.loads(proc.stdout))
    return run


@pytest.fixture
def tools(tmp_path: Path, root_required: None) -> ToolRunner:
    """A ToolRunner over a fresh state dir (needs root: the helper runs privileged)."""
    state = tmp_path / "state"
    state.mkdir()
    return ToolRunner(state)


@pytest.fixture
def cli_state(tmp_path: Path, root_required: None) -> Iterator[Path]:
    """A state dir for ``ccw`` commands, whose detached helper is stopped (and checked gone,
    its mounts too) at the end."""
    from tests.support.cli_process import ccw

    state_dir = tmp_path / "state"
    yield state_dir
    stopped = ccw(state_dir, "helper", "stop", "--force", "--json", check=False)  # whatever a test left running
    assert stopped.returncode == 0, stopped.stderr
    assert ccw(state_dir, "helper", "status", check=False).returncode == 1
    with open("/proc/self/mountinfo") as f:
        assert str(state_dir) not in f.read()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    """A headless chromium through chromedriver (tests/support/webdriver.py), closed at the end."""
    opened = Browser(tmp_path / "profile")
    yield opened
    opened.close()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the counts the security suites record (``record_property("escapes_tried", 1)``).

    Any user property whose name ends in ``_tried`` is summed over the run and printed as
    "escapes tried: N" (issue 9 asks for the count of escapes tried at the end of the run).
    """
    totals: dict[str, int] = {}
    for reports in terminalreporter.stats.values():
        for report in reports:
            if getattr(report, "when", None) != "call":
                continue
            for key, value in getattr(report, "user_properties", ()):
                if isinstance(key, str) and key.endswith("_tried"):
                    totals[key] = totals.get(key, 0) + int(value)
    for key in sorted(totals):
        terminalreporter.write_line(f"{key.replace('_', ' ')}: {totals[key]}")


# --- the host's password files, replaced the way useradd does -------------------------

SECRET_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-")


@contextlib.contextmanager
def _pwd_lock() -> Iterator[None]:
    """lckpwdf(3)'s lock, which useradd and passwd take: no other edit lands between copy and rename."""
    fd = os.open("/etc/.pwd.lock", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _identity(path: str) -> tuple[bytes, int, int, int]:
    info = os.stat(path)
    return Path(path).read_bytes(), info.st_mode, info.st_uid, info.st_gid


def replace_secrets_by_rename() -> None:
    """Replace each of the host's /etc/shadow, gshadow (and their backups) by a copy of itself.

    As useradd does: a new file renamed over the old one.  Same bytes, mode, owner and
    times, so the machine is unharmed; checked after each file.
    """
    with _pwd_lock():
        for path in SECRET_FILES:
            if not os.path.exists(path):
                continue
            before = _identity(path)
            copy = path + ".ccwtest"
            try:
                subprocess.run(["cp", "-p", path, copy], check=True)
                assert _identity(copy) == before, f"cp -p changed {path}"
                os.rename(copy, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(copy)
            assert _identity(path) == before, f"{path} changed: restore it from {path}- or a backup"


@pytest.fixture
def rename_secrets(root_required: None) -> Callable[[], None]:
    """``replace_secrets_by_rename``, for tests (test modules cannot import conftest)."""
    return replace_secrets_by_rename


def launch_helper(socket_path: Path, state_dir: Path, log_path: Path, *extra: str,
                  umask: int | None = None, prefix: Sequence[str] = ()) -> subprocess.Popen[bytes]:
    """A root ``ccw-helper`` on ``socket_path``, returned once it listens (its ready fd says so).

    ``umask`` runs it under that umask, as deploy/ccw-helper.service's ``UMask=`` does;
    ``prefix`` runs it under a command (``unshare --net``, as its ``PrivateNetwork=yes`` does).
    """
    ready_r, ready_w = os.pipe()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [*prefix, sys.executable, "-m", "sandbox", "--socket", str(socket_path), "--state-dir", str(state_dir),
             "--ready-fd", str(ready_w), *extra],
            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=log, pass_fds=(ready_w,),
            preexec_fn=None if umask is None else lambda: os.umask(umask),
        )  # fmt: skip
    os.close(ready_w)
    with os.fdopen(ready_r, "rb") as ready:
        if ready.read(1) != b"1":
            process.wait(30)
            raise AssertionError(log_path.read_text())
    return process


@pytest.fixture(name="launch_helper")
def launch_helper_fixture() -> Callable[..., subprocess.Popen[bytes]]:
    """The ``launch_helper`` function, for tests."""
    return launch_helper


# --- which tests may run beside which (./dev test runs vm-tests/ on two xdist workers) --

# Tests that assert something about the whole machine, which a test running beside them
# on the other worker changes: they run in a pass of their own, after the parallel one
# (``-m serial``).  A file name takes all its tests; ``file::test`` only that one.
SERIAL = {
    # The host's mount table before and after each escape attempt: a capsule made by a
    # test beside it (their workspaces under /var/tmp, /srv) mounts and unmounts there.
    "test_escape_jail.py": "a photo of the host's mount points",
    # The freezer state of every exec cgroup on the host ("FROZEN" not in it once thawed),
    # and no ThreadingHTTPServer process left anywhere.
    "test_helper_services.py": "every exec cgroup's freezer state; pgrep of all processes",
    # Its cleanup_stale must be the one that removes the crashed helper's cgroups: any
    # helper starting beside it removes every dead helper's cgroups (CapsuleManager.recover).
    "test_cgroups_real.py::test_cleanup_stale_removes_a_crashed_helpers_cgroups":
        "cleanup_stale races every other helper's start",
    # Every ccw nf_tables table and forwarded port's link on the host, before and after: a
    # forward opened by a test beside it makes its own.
    "test_kernel_ports.py": "every ccw table and link on the host",
}

# Files that may run beside any other test but not beside each other: one group runs on one
# worker, one file after the other.  Every other file is a group of its own (--dist
# loadfile: a module-scoped fixture, such as the REAPI cluster, is set up once).
SHARED = {
    # They all serve "python3 -m http.server 8765" in capsules, and test_services_tools
    # asserts that no such process is left on the host (pgrep).
    "test_services_tools.py": "http.server 8765",
    "test_services_rootless.py": "http.server 8765",
    "test_services_attribution.py": "http.server 8765",
    "test_bench_smoke_services.py": "http.server 8765",  # bench/run.py services, in capsules and on the host
    # They put the host end of a veth on fixed addresses (tests/support/netfixtures.py:
    # HOST_ADDRESS and SERVER_ADDRESS, 10.98.0.1 and .2; the lab's): two at once take the
    # same address twice, and one's upstream is refused while the other's namespace holds it.
    "test_network_e2e.py": "netfixtures' fixed addresses",
    "test_network_rootless.py": "netfixtures' fixed addresses",
    "test_escape_network.py": "netfixtures' fixed addresses",
    "test_attack_egress.py": "netfixtures' fixed addresses",
    "test_network_presets.py": "netfixtures' fixed addresses",
    "test_netlive_e2e.py": "netfixtures' fixed addresses",
    "test_network_ask.py": "netfixtures' fixed addresses",
    "test_network_propose.py": "netfixtures' fixed addresses",
    "test_attack_proposals.py": "netfixtures' fixed addresses",
    "test_bench_smoke_network.py": "netfixtures' fixed addresses",  # bench/run.py network
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark SERIAL's tests ``serial``."""
    for item in items:
        path = Path(str(item.fspath))
        if path.parent != Path(__file__).parent:
            continue
        name = f"{path.name}::{item.originalname}" if isinstance(item, pytest.Function) else path.name
        if path.name in SERIAL or name in SERIAL:
            item.add_marker(pytest.mark.serial)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``--dist loadfile``, xdist's per-file scheduling with SHARED's files as one.

    Not xdist_group marks with --dist loadgroup: xdist 3.8 writes a group into a node id
    through an attribute pytest 9 no longer reads, so the marks are silently ignored.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedFileScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return SHARED.get(Path(file).name, file)

    return SharedFileScheduling(config, log)

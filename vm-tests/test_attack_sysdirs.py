"""A capsule over a system directory, a home or a key store is refused (issue 24, class 6).

The jail hides /etc/shadow by name in its own /etc, but a capsule whose workspace *is*
/etc is bound over that, and the front end reads a capsule's files with its own rights.
So ``capsule_create`` refuses such directories (sandbox/hostdirs.py: ``check_capsule_dir``),
and the helper refuses them again on the path as resolved and under every other path the
directory is mounted at.  Each attempt here is made as root, the caller whose jail could
read the hashes: through the tools, through ``ccw capsule create``, and straight through
the helper's socket, bypassing the front end.  A capsule that is made anyway is probed
(the jail's ``head -1`` and the front end's read of ``shadow``) and the test fails if the
first line of /etc/shadow, or a key planted in another user's ~/.ssh, comes back; a
project inside that home is made, and shows nothing beside it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from sandbox.client import HelperClient
from sandbox.errors import CcwError

ROOT = Path(__file__).resolve().parent.parent
CCW = [sys.executable, "-c", "import sys; from mcp_server.cli import main; sys.exit(main())"]
PROBE = ("head -1 /etc/shadow; head -1 shadow; head -1 etc/shadow; cat .ssh/id_ed25519 ../.ssh/id_ed25519 "
         "proj/../.ssh/id_ed25519; true")
SYSTEM = ["/", "/etc", "/etc/../etc", "//etc", "/root", "/usr", "/boot", "/proc", "/sys", "/dev", "/var", "/home",
          "/run", "/tmp"]


def shadow_line() -> str:
    line = Path("/etc/shadow").read_text().splitlines()[0]
    assert line.strip(), "the host's /etc/shadow has no first line: the test would prove nothing"
    return line


@pytest.fixture
def victim(root_required: None) -> Iterator[tuple[str, Path, str]]:
    """A throwaway login user with a key in its home and a project beside it: (name, project, secret)."""
    name = f"ccwv{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", name], check=True, capture_output=True)
    try:
        home = Path(os.path.expanduser(f"~{name}"))
        project = home / "proj"
        project.mkdir()
        (project / "a.txt").write_text("fine\n")
        (home / ".ssh").mkdir(mode=0o700)
        secret = f"VICTIM-SECRET-{secrets.token_hex(8)}"
        (home / ".ssh" / "id_ed25519").write_text(secret + "\n")
        yield name, project, secret
    finally:
        subprocess.run(["userdel", "-r", "-f", name], check=False, capture_output=True)


@pytest.fixture
def places(tmp_path: Path, victim: tuple[str, Path, str]) -> Iterator[dict[str, str]]:
    """Every directory a capsule must refuse, made before any helper starts (its mount
    namespace copies the bind mounts): name -> path."""
    found = {path: path for path in SYSTEM}
    found["another user's home"] = str(victim[1].parent)
    found["another user's key store"] = str(victim[1].parent / ".ssh")
    ssh = Path("/root/.ssh")
    made_ssh = not ssh.exists()
    ssh.mkdir(mode=0o700, exist_ok=True)
    (tmp_path / "link-to-etc").symlink_to("/etc")
    found["a symlink to /etc"] = str(tmp_path / "link-to-etc")
    found["/root/.ssh"] = str(ssh)
    binds = []
    for source, name in (("/etc", "etc-bind"), ("/etc/ssh", "ssh-bind")):
        if os.path.isdir(source):
            (tmp_path / name).mkdir()
            subprocess.run(["mount", "--bind", source, str(tmp_path / name)], check=True)
            binds.append(tmp_path / name)
            found[f"a bind mount of {source}"] = str(tmp_path / name)
    try:
        yield found
    finally:
        for bind in binds:
            subprocess.run(["umount", "-l", str(bind)], check=False)
        if made_ssh:
            shutil.rmtree(ssh, ignore_errors=True)


def leaks(text: str, victim_secret: str) -> bool:
    """Whether ``text`` shows the host's first shadow line or the victim's secret."""
    return shadow_line() in text or victim_secret in text


def test_capsule_create_refuses_system_dirs_homes_and_key_stores(
        tools: Any, places: dict[str, str], victim: tuple[str, Path, str], tmp_path: Path,
        record_property: Any) -> None:  # fmt: skip
    project = tmp_path / "project"
    project.mkdir()
    (project / "a.txt").write_text("fine\n")
    root_project = Path("/root") / f"ccw-sysdirs-{secrets.token_hex(4)}"
    root_project.mkdir()

    async def escape(t: Any, args: dict[str, Any]) -> str:
        """"refused", or what a capsule made anyway showed: "leaked" (a secret) or "made"."""
        try:
            made = await t.call("capsule_create", args)
        except CcwError as error:
            assert error.code != "INTERNAL", (args, error)
            return "refused"
        shown = ""
        try:
            with contextlib.suppress(CcwError):  # a jail that cannot be built shows nothing
                ran = await t.call("capsule_exec", {"capsule_id": made["capsule_id"], "cmd": ["sh", "-c", PROBE]})
                shown += ran["stdout"]
            with contextlib.suppress(CcwError):  # the front end's own read, where no jail mask applies
                shown += str(await t.call("snapshot_file", {"capsule_id": made["capsule_id"], "path": "shadow"}))
        finally:
            await t.call("capsule_destroy", {"capsule_id": made["capsule_id"]})
        return "leaked" if leaks(shown, victim[2]) else "made"

    async def scenario(t: Any) -> tuple[int, dict[str, str]]:
        outcomes = {}
        for what, path in places.items():
            for args in ({"workspace": path}, {"workspace": str(project), "base": path}):
                outcomes[f"{what}: {sorted(args.items())}"] = await escape(t, args)
        # Ordinary projects still work, under /tmp, under root's own home and inside another
        # user's home (a root CI job on its runner's checkout), and show nothing beside them.
        for workspace in (project, root_project, victim[1]):
            made = await t.call("capsule_create", {"workspace": str(workspace)})
            ran = await t.call("capsule_exec", {"capsule_id": made["capsule_id"], "cmd": ["sh", "-c", "ls; " + PROBE]})
            assert ran["exit_code"] == 0 and ("a.txt" in ran["stdout"]) == (workspace != root_project), ran
            assert not leaks(ran["stdout"], victim[2]), ran
            await t.call("capsule_destroy", {"capsule_id": made["capsule_id"]})
        return len(outcomes), outcomes

    try:
        tried, outcomes = tools.run(scenario)
    finally:
        shutil.rmtree(root_project, ignore_errors=True)
    record_property("escapes_tried", tried)
    assert {k: v for k, v in outcomes.items() if v != "refused"} == {}


def test_the_helper_refuses_them_without_the_front_end(
        launch_helper: Callable[..., subprocess.Popen[bytes]], places: dict[str, str],
        victim: tuple[str, Path, str], tmp_path: Path, record_property: Any) -> None:  # fmt: skip
    """A hacked front end sends the create straight to the helper's socket: refused there too."""
    socket_path = tmp_path / "helper.sock"
    process = launch_helper(socket_path, tmp_path / "helper-state", tmp_path / "helper.log")
    project = tmp_path / "raw-project"
    project.mkdir()

    async def scenario() -> dict[str, str]:
        client = HelperClient(str(socket_path))
        made_anyway = {}
        try:
            for what, path in places.items():
                for args in ({"workspace": path}, {"workspace": str(project), "base": path}):
                    try:
                        made = await client.request("create", args)
                    except CcwError as error:
                        assert error.code != "INTERNAL", (what, args, error)
                        made_anyway[f"{what}: {sorted(args.items())}"] = "refused"
                        continue
                    await client.request("destroy", {"capsule_id": made["capsule_id"]})
                    made_anyway[f"{what}: {sorted(args.items())}"] = "made"
            made = await client.request("create", {"workspace": str(project)})
            await client.request("destroy", {"capsule_id": made["capsule_id"]})
        finally:
            await client.aclose()
        return made_anyway

    try:
        outcomes = trio.run(scenario)
    finally:
        process.terminate()
        assert process.wait(30) == 0
    record_property("escapes_tried", len(outcomes))
    assert {k: v for k, v in outcomes.items() if v != "refused"} == {}


def test_ccw_capsule_create_over_etc_is_refused(root_required: None, tmp_path: Path, record_property: Any) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_")) or k == "CCW_MUST_WORK"}
    env["CCW_STATE_DIR"] = str(tmp_path / "state")

    def ccw(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*CCW, *argv], capture_output=True, text=True, env=env, timeout=120, cwd=ROOT)

    tried = 0
    try:
        for path in ("/etc", "/", "/root"):
            tried += 1
            created = ccw("capsule", "create", path)
            if created.returncode == 0:
                capsule_id = created.stdout.strip()
                ran = ccw("capsule", "exec", capsule_id, "--", "sh", "-c", PROBE)
                ccw("capsule", "destroy", capsule_id)
                assert not leaks(ran.stdout, secrets.token_hex(8)), f"ccw capsule create {path}: {ran.stdout}"
                pytest.fail(f"ccw capsule create {path} made {capsule_id}")
            assert "PERMISSION_DENIED" in created.stderr and "project directory" in created.stderr, created.stderr
    finally:
        ccw("helper", "stop")
    record_property("escapes_tried", tried)

"""The helper and other users: SO_PEERCRED authorisation, and rootless mode as a real user.

Both tests run Python as another uid, through tests/support/users.py (which says how),
as the ``run_as`` fixture here does for the tests that take it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.users import OTHER_UID

PEER_SCRIPT = r"""
import json, sys, trio
from sandbox.client import HelperClient
from sandbox.errors import CcwError

async def main(path, foreign, own_ws, root_ws):
    client = HelperClient(path)
    out = {"list": [c["capsule_id"] for c in (await client.request("list", {}))["capsules"]]}
    calls = [("changes", {"capsule_id": foreign}), ("exec", {"capsule_id": foreign, "argv": ["true"]}),
             ("fork", {"capsule_id": foreign}), ("destroy", {"capsule_id": foreign}),
             ("create", {"workspace": root_ws})]
    for op, args in calls:
        try:
            await client.request(op, args)
            out[op] = "ok"
        except CcwError as exc:
            out[op] = exc.code
    try:
        await client.open_root(foreign)
        out["open_root"] = "ok"
    except CcwError as exc:
        out["open_root"] = exc.code
    own = await client.request("create", {"workspace": own_ws})
    out["own_listed"] = [c["capsule_id"] for c in (await client.request("list", {}))["capsules"]] == [own["capsule_id"]]
    out["own_destroyed"] = (await client.request("destroy", {"capsule_id": own["capsule_id"]}))["destroyed"]
    await client.aclose()
    print(json.dumps(out))

trio.run(main, *sys.argv[1:])
"""


def root_call(path: Path, op: str, args: dict[str, Any]) -> dict[str, Any]:
    import trio

    from sandbox.client import HelperClient

    async def main() -> dict[str, Any]:
        client = HelperClient(str(path))
        try:
            return await client.request(op, args)
        finally:
            await client.aclose()

    return trio.run(main)


def test_capsule_of_one_uid_is_denied_to_another(run_as: Callable[..., Any], public_dir: Path,
                                                  launch_helper: Callable[..., Any]) -> None:
    root_ws = public_dir / "root-ws"
    root_ws.mkdir()
    (root_ws / "secret.txt").write_text("root's\n")
    own_ws = public_dir / "other-ws"
    own_ws.mkdir()
    os.chown(own_ws, OTHER_UID, OTHER_UID)
    socket_path = public_dir / "helper.sock"
    state = public_dir / "state"
    log_path = public_dir / "helper.log"
    process = launch_helper(socket_path, state, log_path, "--socket-mode", "0666")
    try:
        foreign = root_call(socket_path, "create", {"workspace": str(root_ws)})["capsule_id"]
        out = run_as(OTHER_UID, OTHER_UID, PEER_SCRIPT, str(socket_path), foreign, str(own_ws), str(root_ws))
        assert out == {
            "list": [],
            "changes": "PERMISSION_DENIED",
            "exec": "PERMISSION_DENIED",
            "fork": "PERMISSION_DENIED",
            "destroy": "PERMISSION_DENIED",
            "create": "PERMISSION_DENIED",  # a root-owned 0755 dir is not the caller's to write
            "open_root": "PERMISSION_DENIED",
            "own_listed": True,
            "own_destroyed": True,
        }
        # The owner still has its capsule, untouched.
        assert [c["capsule_id"] for c in root_call(socket_path, "list", {})["capsules"]] == [foreign]
        assert root_call(socket_path, "changes", {"capsule_id": foreign}) == {"changes": []}
        root_call(socket_path, "destroy", {"capsule_id": foreign})
    finally:
        process.terminate()
        assert process.wait(30) == 0, log_path.read_text()
    assert not socket_path.exists()


# Not raw, so that a backslash-newline joins a long line: the script never sees it.
ROOTLESS_SCRIPT = """
import base64, json, os, sys, trio
from mcp_server.config import Config
from mcp_server.launcher import connect_or_spawn

async def main(state, ws):
    client = await connect_or_spawn(Config(state_dir=state))
    out = {"embedded": client.process is not None}
    try:
        hello = await client.hello()
        out["mode"] = hello["mode"]
        out["user_namespace"] = hello["mechanisms"]["user_namespace"]
        out["cgroups"] = hello["mechanisms"]["cgroups"]
        out["cgroups_unavailable"] = hello["mechanisms"].get("cgroups_unavailable", {})
        capsule = await client.request("create", {"workspace": ws})
        ran = await client.request("exec", {"capsule_id": capsule["capsule_id"], "argv": ["cat", "data.txt"], \
"cwd": ws})
        out["stdout"] = base64.b64decode(ran["stdout_b64"]).decode()
        out["touched_read"] = ran["touched"]["read"]
        out["read_reason"] = ran.get("touched_unavailable", {}).get("read")
        out["changes"] = (await client.request("changes", {"capsule_id": capsule["capsule_id"]}))["changes"]
        await client.request("destroy", {"capsule_id": capsule["capsule_id"]})
    finally:
        await client.aclose()
    out["helper_exit"] = client.process.process.poll()
    out["socket_left"] = os.path.exists(os.path.join(state, "helper", "helper.sock"))
    print(json.dumps(out))

trio.run(main, *sys.argv[1:])
"""


@pytest.fixture
def unprivileged_user(root_required: None, require: Callable[[bool, str], None]) -> Iterator[tuple[int, int]]:
    """A system user created for the test and deleted after it."""
    require(shutil.which("useradd") is not None, "needs useradd")
    name = f"ccwipc{secrets.token_hex(4)}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                   check=True, capture_output=True)
    try:
        import pwd

        entry = pwd.getpwnam(name)
        yield entry.pw_uid, entry.pw_gid
    finally:
        subprocess.run(["userdel", name], check=True, capture_output=True)


def test_rootless_helper_as_an_unprivileged_user(
    run_as: Callable[..., Any], unprivileged_user: tuple[int, int], public_dir: Path
) -> None:
    uid, gid = unprivileged_user
    ws = public_dir / "ws"
    ws.mkdir()
    (ws / "data.txt").write_text("user data\n")
    state = public_dir / "state"
    state.mkdir()
    for path in (ws, ws / "data.txt", state):
        os.chown(path, uid, gid)
    out = run_as(uid, gid, ROOTLESS_SCRIPT, str(state), str(ws), cwd=str(public_dir))
    assert out["embedded"] is True
    assert out["mode"] == "rootless" and out["user_namespace"] is True
    # No cgroup of this host is writable by the user: hello claims none, and says why (io is
    # measured from the jail's wait4 rusage, which needs no cgroup).
    assert all(value is None or not value.startswith("cgroup") for value in out["cgroups"].values()), out["cgroups"]
    assert set(out["cgroups_unavailable"]) == {key for key, value in out["cgroups"].items() if value is None}
    assert out["stdout"] == "user data\n"
    # fanotify cannot work from a user namespace: no read set, and a reason instead of a guess.
    assert out["touched_read"] is None and out["read_reason"]
    assert out["changes"] == []
    assert out["helper_exit"] == 0 and out["socket_left"] is False
    # Everything the rootless helper made belongs to the user, not to root.
    for dirpath, dirnames, filenames in os.walk(state):
        for name in dirnames + filenames:
            assert os.lstat(os.path.join(dirpath, name)).st_uid == uid, name

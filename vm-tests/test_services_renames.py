"""Whose rename and deletion: while a service and an exec of one capsule overlap, each
renames one file and deletes another; each run's journal row must name only its own
(issue 36: "an exec must still end as it does now (... its own touched files)").

A run's row names its own renames (both names) and deletions, from the upper dir's
changes (sandbox/execution.py ``upper_diff``); which run each change belongs to comes
from the seccomp user notifications of its jail (sandbox/unotify.py: one listener per
run that can overlap another), as root and through the rootless helper.  Every run has
one seccomp filter (its Seccomp_filters count): the jail's own, in its notifying form
where it can overlap another run, never that and a second filter over it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from mcp_server.journal import Journal
from mcp_server.state import State
from tests.support.agent_loop import scenario_command
from tests.support.users import run_script_as

# The two runs take turns through files of the workspace, so that the service's rename and
# deletion fall inside the exec's run and the exec's inside the service's.
SERVICE = ("echo up; while [ ! -e go ]; do sleep 0.05; done; "
           "mv s-old.txt s-new.txt; rm s-gone.txt; echo > s.done; exec sleep 600")
EXEC = ("echo > go; while [ ! -e s.done ]; do sleep 0.05; done; "
        "mv e-old.txt e-new.txt; rm e-gone.txt")
SERVICE_OWN = {"s-old.txt", "s-new.txt", "s-gone.txt"}
EXEC_OWN = {"e-old.txt", "e-new.txt", "e-gone.txt"}


def _rows(tools: Any, tmp_path: Path, service_sh: str = SERVICE, exec_sh: str = EXEC,
          files: tuple[str, ...] = ("s-old.txt", "s-gone.txt", "e-old.txt", "e-gone.txt")) -> dict[str, set[str]]:
    """The written sets of the exec's and the service's journal rows."""
    ws = tmp_path / "ws"
    ws.mkdir()
    for name in files:
        (ws / name).parent.mkdir(parents=True, exist_ok=True)
        (ws / name).write_text(name + "\n")

    async def scenario(t: Any) -> dict[str, set[str]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "mover", "cmd": ["sh", "-c", service_sh],
                                               "ready": {"line": "up", "timeout_ms": 30_000}})
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", exec_sh], "timeout_ms": 60_000})
        assert ran["exit_code"] == 0, ran
        await t.call("capsule_service_stop", {"capsule_id": cap, "name": "mover", "grace_ms": 1000})
        rows = Journal(t.runtime.state).execs(cap)
        await t.call("capsule_destroy", {"capsule_id": cap})
        [service] = [row for row in rows if row.get("service") == "mover"]
        [exec_row] = [row for row in rows if row.get("service") is None]
        return {"exec": set(exec_row["touched"]["written"]), "service": set(service["touched"]["written"])}

    out: dict[str, set[str]] = tools.run(scenario)
    return out


def test_each_runs_row_names_its_own_renames_and_deletions(tools: Any, tmp_path: Path) -> None:
    out = _rows(tools, tmp_path)
    assert EXEC_OWN | {"go"} <= out["exec"], out
    assert SERVICE_OWN | {"s.done"} <= out["service"], out
    # What the other run wrote (closed after writing) is not taken: fanotify names its writer.
    assert "s.done" not in out["exec"] and "go" not in out["service"], out


def test_a_rename_or_deletion_is_only_its_makers(tools: Any, tmp_path: Path) -> None:
    out = _rows(tools, tmp_path)
    assert not out["exec"] & SERVICE_OWN, f"the exec's row names the service's {sorted(out['exec'] & SERVICE_OWN)}"
    assert not out["service"] & EXEC_OWN, f"the service's row names the exec's {sorted(out['service'] & EXEC_OWN)}"


# Whole trees: the service removes one and moves a directory (overlayfs answers EXDEV for a
# lower directory, so mv copies and removes), the exec removes another, made in the upper dir.
TREE_SERVICE = ("echo up; while [ ! -e go ]; do sleep 0.05; done; "
                "rm -rf s-tree; mv s-dir s-dir2; echo > s.done; exec sleep 600")
TREE_EXEC = ("mkdir -p e-tree/deep && echo x > e-tree/deep/f.txt && echo > go; "
             "while [ ! -e s.done ]; do sleep 0.05; done; rm -rf e-tree e-lower")


def test_a_tree_removed_or_moved_is_only_its_makers(tools: Any, tmp_path: Path) -> None:
    out = _rows(tools, tmp_path, TREE_SERVICE, TREE_EXEC,
                ("s-tree/a/one.txt", "s-tree/two.txt", "s-dir/three.txt", "e-lower/four.txt"))
    assert {"s-tree", "s-dir", "s-dir2/three.txt"} <= out["service"], out
    assert not {path for path in out["service"] if path.startswith(("e-tree", "e-lower"))}, out
    assert "e-lower" in out["exec"], out
    assert not {path for path in out["exec"] if path.startswith(("s-tree", "s-dir"))}, out


async def scenario(call: Any, setup: dict[str, str]) -> dict[str, Any]:
    """The same two runs through a user's own ``ccw-mcp`` (its helper rootless): each row's written set."""
    ws = setup["ws"]
    cap = (await call("capsule_create", {"workspace": ws, "auto_expose": False}))["capsule_id"]
    await call("capsule_service_start", {"capsule_id": cap, "name": "mover", "cmd": ["sh", "-c", SERVICE],
                                         "ready": {"line": "up", "timeout_ms": 30_000}})
    ran = await call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", EXEC], "timeout_ms": 60_000})
    await call("capsule_service_stop", {"capsule_id": cap, "name": "mover", "grace_ms": 1000})
    rows = Journal(State(Path(setup["scratch"]) / "state")).execs(cap)
    await call("capsule_destroy", {"capsule_id": cap})
    [service] = [row for row in rows if row.get("service") == "mover"]
    [exec_row] = [row for row in rows if row.get("service") is None]
    return {"exit": ran["exit_code"], "exec": exec_row["touched"]["written"], "service": service["touched"]["written"]}


def test_a_rename_or_deletion_is_only_its_makers_rootless(user_dir: tuple[int, int, Path]) -> None:
    uid, gid, home = user_dir
    ws, scratch = home / "ws", home / "scratch"
    for directory in (ws, scratch):
        directory.mkdir()
    for name in ("s-old.txt", "s-gone.txt", "e-old.txt", "e-gone.txt"):
        (ws / name).write_text(name + "\n")
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(ws), str(scratch)], check=True)
    out = run_script_as(uid, gid, scenario_command("test_services_renames", {"ws": str(ws), "scratch": str(scratch)}),
                        home)
    written = {"exec": set(out["exec"]), "service": set(out["service"])}
    assert out["exit"] == 0, out
    # Rootless there is no fanotify (no read set, nor whose writes): the renames and
    # deletions, whose attribution is the notifications', are what is asserted.
    assert written["exec"] >= EXEC_OWN and written["service"] >= SERVICE_OWN, json.dumps(out)
    assert not written["exec"] & SERVICE_OWN, json.dumps(out)
    assert not written["service"] & EXEC_OWN, json.dumps(out)


FILTERS = ["sh", "-c", "grep '^Seccomp_filters' /proc/self/status"]


def test_every_run_has_one_seccomp_filter_beside_a_service_or_not(tools: Any, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()

    async def scenario(t: Any) -> dict[str, str]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        out = {"alone": (await t.call("capsule_exec", {"capsule_id": cap, "cmd": FILTERS}))["stdout"]}
        await t.call("capsule_service_start", {"capsule_id": cap, "name": "idle",
                                               "cmd": ["sh", "-c", "echo up; exec sleep 600"],
                                               "ready": {"line": "up", "timeout_ms": 30_000}})
        out["beside"] = (await t.call("capsule_exec", {"capsule_id": cap, "cmd": FILTERS}))["stdout"]
        await t.call("capsule_service_stop", {"capsule_id": cap, "name": "idle", "grace_ms": 1000})
        out["after"] = (await t.call("capsule_exec", {"capsule_id": cap, "cmd": FILTERS}))["stdout"]
        await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    # One filter each: beside a service it is the notifying form (the attribution tests above
    # show it notifies), not a second filter over the jail's own, which every call would run.
    assert out == {"alone": "Seccomp_filters:\t1\n", "beside": "Seccomp_filters:\t1\n",
                   "after": "Seccomp_filters:\t1\n"}, out

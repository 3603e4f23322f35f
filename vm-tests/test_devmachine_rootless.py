"""Promotion scope and volatile outputs (issue 25 items 4 and 5) as an unprivileged user.

The rootless helper runs everything in the user's own user namespace, and the front end
asks git about the live workspace as that user.  The user's more-itertools checkout
(its own ``.venv/``) ignores ``__pycache__/`` and ``.pytest_cache/``; in one capsule the
agent runs the tests, edits a source file and runs a nyc-style coverage step that names
its output at random.  The witness replays ``replay_ok: true`` once the glob is
declared, and the default promotion writes the edit and the coverage report and leaves
the ignored outputs behind, listed in ``skipped``.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


from tests.support import realprojects  # noqa: E402
from tests.support.users import run_script_as  # noqa: E402

SCRIPT = (r"""
import json, os, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import trio
from tests.support import agent_loop
from tests.support.mcp_process import agent_server_env

ws, scratch, edit = Path(sys.argv[2]), Path(sys.argv[3]), json.loads(sys.argv[4])
COVER = ("import json, os, uuid; os.makedirs('.nyc_output', exist_ok=True); "
         "open(os.path.join('.nyc_output', str(uuid.uuid4()) + '.json'), 'w').write('{}'); "
         "open('coverage.txt', 'w').write('covered\\n')")
"""  # raw above, for the script's own backslash; not raw below, so that a backslash-newline joins a long line
"""
async def main():
    os.mkdir(scratch / "state")
    async with agent_loop.mcp_stdio(agent_server_env(scratch / "state", scratch)) as call:
        cap = (await call("capsule_create", {"workspace": str(ws), "volatile": [".nyc_output/*.json"]}))["capsule_id"]
        tests = await call("capsule_exec", {"capsule_id": cap, "timeout_ms": 300000,
                                            "cmd": [".venv/bin/python", "-m", "pytest", "-q", "tests/test_more.py", \
"-k", "Chunked"]})
        change = ("import pathlib; p = pathlib.Path(%r); p.write_text(p.read_text().replace(%r, %r))"
                  % (edit["path"], edit["old"], edit["new"]))
        edited = await call("capsule_exec", {"capsule_id": cap, "cmd": [".venv/bin/python", "-c", change]})
        covered = await call("capsule_exec", {"capsule_id": cap, "cmd": [".venv/bin/python", "-c", COVER]})
        witness = await call("capsule_witness", {"capsule_id": cap})
        replayed = await call("capsule_replay", {"witness_id": witness["witness_id"]})
        promoted = await call("capsule_promote", {"capsule_id": cap})
    return {"exits": [tests["exit_code"], edited["exit_code"], covered["exit_code"]],
            "replay_ok": replayed["replay_ok"], "volatile": replayed["volatile"], "mismatches": replayed["mismatches"],
            "promoted": promoted["promoted"], "applied": promoted["applied"], "skipped": promoted["skipped"]}

print(json.dumps(trio.run(main)))
""")


def test_scope_and_volatile_as_an_unprivileged_user(user_dir: tuple[int, int, Path]) -> None:
    import json
    import subprocess

    uid, gid, home = user_dir
    project = realprojects.MORE_ITERTOOLS
    edit = project.harmless[0]
    ws = realprojects.pristine(project, home / "ws")
    with open(ws / ".git" / "info" / "exclude", "a") as exclude:
        exclude.write("__pycache__/\n.pytest_cache/\n")
    scratch = home / "scratch"
    scratch.mkdir()
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(ws), str(scratch)], check=True)
    spec = json.dumps({"path": edit.path, "old": edit.old, "new": edit.new})
    out = run_script_as(uid, gid, [sys.executable, "-c", SCRIPT, str(HERE.parent), str(ws), str(scratch), spec], home)
    assert out["exits"] == [0, 0, 0], out
    assert out["replay_ok"] is True, out["mismatches"]
    assert out["volatile"]["globs"] == [".nyc_output/*.json"] and out["volatile"]["paths"], out["volatile"]
    assert out["promoted"] is True
    assert sorted(out["applied"]) == sorted([edit.path, "coverage.txt", ".nyc_output"] +
                                            [p for p in out["applied"] if p.startswith(".nyc_output/")]), out["applied"]
    reasons = {s["path"]: s["reason"] for s in out["skipped"]}
    assert reasons.get(".pytest_cache") == "ignored", reasons
    assert edit.new in (ws / edit.path).read_text()
    assert not (ws / ".pytest_cache").exists()
    assert (ws / "coverage.txt").stat().st_uid == uid

"""Witnesses that carry what their runs need, replayed after the workspace moved away.

A real interpreter venv lives inside the workspace (``python3 -m venv``: ``bin/python ->
python3 -> /usr/bin/python3``, ``lib64 -> lib``), a script lists a directory and
imports the modules it finds there, and a ``bin/`` symlink chain leads to a shell
script.  Everything runs through the real tools; the replay runs on a fresh state dir
with the workspace renamed, so only the witness can provide the base.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

MAIN = """\
import importlib, os, sys
names = sorted(n[:-3] for n in os.listdir("plugins") if n.endswith(".py"))
sys.path.insert(0, "plugins")
for name in names:
    print(name, importlib.import_module(name).VALUE)
print("prefix-is-venv", sys.prefix.endswith("/.venv"))
sys.path.insert(0, "lib")
import helpers
print(helpers.NAME)
"""


def _project(tmp_path: Path) -> Path:
    ws = tmp_path / "project"
    (ws / "plugins").mkdir(parents=True)
    # The system interpreter: the jail binds the host's system dirs, not a home dir.
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(ws / ".venv")], check=True)
    (ws / "main.py").write_text(MAIN)
    for name, value in (("alpha", 1), ("beta", 2), ("gamma", 3)):
        (ws / "plugins" / f"{name}.py").write_text(f"VALUE = {value}\n")
    (ws / "plugins" / "notes.txt").write_text("listed, never opened\n")
    (ws / "scripts").mkdir()
    (ws / "scripts" / "run.sh").write_text("#!/bin/sh\nexec .venv/bin/python main.py \"$@\"\n")
    (ws / "scripts" / "run.sh").chmod(0o755)
    (ws / "bin").mkdir()
    os.symlink("../scripts/run.sh", ws / "bin" / "run-real")
    os.symlink("run-real", ws / "bin" / "run")
    (ws / "out").mkdir()  # an empty directory a run writes into
    (ws / "plugins").chmod(0o750)  # a mode the rebuilt base must keep
    # A package with valid bytecode: Python stats its source and opens only the .pyc.
    (ws / "lib" / "helpers").mkdir(parents=True)
    (ws / "lib" / "helpers" / "__init__.py").write_text("NAME = 'helpers'\n")
    subprocess.run(["/usr/bin/python3", "-m", "compileall", "-q", str(ws / "lib")], check=True)
    return ws


def _fresh(tools: Any, state: Path) -> Any:
    state.mkdir()
    return type(tools)(state)


def _replay_elsewhere(tools: Any, tmp_path: Path, witness: str) -> dict[str, Any]:
    """The witness replayed on a fresh state dir: a key it does not trust, so replayed only when asked."""
    out: dict[str, Any] = _fresh(tools, tmp_path / "state2").run(
        lambda t: t.call("capsule_replay", {"path": witness, "allow_untrusted": True}))
    assert out["signature"] == "unknown key" and out["network"] == {"recorded": "none", "used": "none"}, out
    return out


def test_a_venv_project_replays_after_the_workspace_moved(tools: Any, tmp_path: Path) -> None:
    ws = _project(tmp_path)
    cmds = [
        [".venv/bin/python", "main.py"],
        ["bin/run"],
        ["sh", "-c", ".venv/bin/python -c 'import sys; print(sys.version_info[0])' > out/version.txt"],
        ["ls", "plugins"],
        ["stat", "-c", "%n %a %F", "plugins", "scripts/run.sh", "bin/run", ".venv/bin/python3"],
    ]

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        runs = [await t.call("capsule_exec", {"capsule_id": cap, "cmd": cmd}) for cmd in cmds]
        made = await t.call("capsule_witness", {"capsule_id": cap})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"runs": runs, "made": made}

    recorded = tools.run(record)
    runs = recorded["runs"]
    assert [r["exit_code"] for r in runs] == [0] * len(cmds), [r["stderr"] for r in runs]
    assert runs[0]["stdout"] == "alpha 1\nbeta 2\ngamma 3\nprefix-is-venv True\nhelpers\n"
    if runs[0]["touched"]["read"] is not None:
        assert "plugins" in runs[0]["touched"]["listed"]
        assert "scripts/run.sh" in runs[1]["touched"]["executed"]
        assert "lib/helpers/__init__.py" not in runs[0]["touched"]["read"]  # only stat-ed

    base = recorded["made"]["base"]
    if base["read_sets_complete"]:  # only what the runs used: .venv/include and bin/activate stay home
        assert base["carried"] == "used" and base["symlinks"] >= 6, base
    moved = tmp_path / "moved-away"
    ws.rename(moved)
    replayed = _replay_elsewhere(tools, tmp_path, recorded["made"]["path"])
    assert not ws.exists()
    assert replayed["mismatches"] == [] and replayed["replay_ok"] is True, replayed
    # The same output: the same names listed and imported, the same modes and link types.
    assert replayed["output_identical"] is True, replayed["output_diffs"]
    assert runs[4]["stdout"] == ("plugins 750 directory\nscripts/run.sh 755 regular file\n"
                                 "bin/run 777 symbolic link\n.venv/bin/python3 777 symbolic link\n")


def test_a_duration_in_the_output_is_shown_but_does_not_fail_the_replay(tools: Any, tmp_path: Path) -> None:
    ws = _project(tmp_path)
    timed = ["sh", "-c", "echo collected 3 items; echo \"== 3 passed in 0.$(date +%N)s ==\"; echo done"]

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": [".venv/bin/python", "main.py"]})
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": timed})
        return await t.call("capsule_witness", {"capsule_id": cap})

    made = tools.run(record)
    ws.rename(tmp_path / "moved-away")
    out = _replay_elsewhere(tools, tmp_path, made["path"])
    assert out["replay_ok"] is True, out["mismatches"]
    assert out["output_identical"] is False
    (diff,) = out["output_diffs"]
    assert (diff["exec"], diff["stream"]) == (2, "stdout")
    changed = [line for line in diff["lines"] if line[:1] in "-+"]
    assert len(changed) == 2 and all(" passed in 0." in line for line in changed), diff
    assert changed[0].startswith("-") and changed[1].startswith("+")


def test_a_written_file_that_differs_fails_the_replay_and_is_named(tools: Any, tmp_path: Path) -> None:
    ws = _project(tmp_path)

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "date +%s%N > out/stamp.txt"]})
        return await t.call("capsule_witness", {"capsule_id": cap})

    made = tools.run(record)
    ws.rename(tmp_path / "moved-away")
    out = _replay_elsewhere(tools, tmp_path, made["path"])
    assert out["replay_ok"] is False
    assert out["output_identical"] is True
    assert [(m["kind"], m["path"]) for m in out["mismatches"]] == [("change", "out/stamp.txt")]


def test_strict_passes_a_run_that_prints_durations_unless_output_must_be_identical(tools: Any, tmp_path: Path) -> None:
    ws = _project(tmp_path)
    timed = ["sh", "-c", "echo \"3 passed in 0.$(date +%N)s\" && .venv/bin/python main.py > out/result.txt"]

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": timed})
        await t.call("policy_set", {"name": "same-output", "rules": {"require_identical_output": True}})
        same = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["same-output"], "dry_run": True})
        strict = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["strict"]})
        return {"same": same, "strict": strict}

    out = tools.run(scenario)
    same = out["same"]["policy_report"]
    assert out["same"]["promoted"] is False and same["passed"] is False
    assert same["replay_ok"] is True and same["output_identical"] is False
    assert "identical output" in same["details"] and "exec 1 stdout" in same["details"]
    strict = out["strict"]["policy_report"]
    assert out["strict"]["promoted"] is True, strict["details"]
    assert strict["replay_ok"] is True and strict["output_identical"] is False
    assert (ws / "out" / "result.txt").read_text().startswith("alpha 1\n")


@pytest.mark.parametrize("bytecode", ["written", "off", "same exec"])
def test_bytecode_of_a_file_a_command_edited_replays_unless_the_same_command_compiled_it(
        tools: Any, tmp_path: Path, bytecode: str) -> None:
    # What the README says: the replay gives each file an exec wrote the mtime that exec
    # left (journaled), so the .pyc a later exec compiles from it (it records its
    # source's mtime) has the same bytes.  A source rewritten and compiled by one
    # command gets its new mtime before the compile: that .pyc still differs.
    ws = _project(tmp_path)
    edit = ["sh", "-c", "echo 'VALUE = 9' > plugins/alpha.py"]
    run = [".venv/bin/python", "main.py"]
    if bytecode == "off":
        run = ["env", "PYTHONDONTWRITEBYTECODE=1", *run]
    if bytecode == "same exec":
        edit, run = ["true"], ["sh", "-c", "echo 'VALUE = 9' > plugins/alpha.py && .venv/bin/python main.py"]

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": edit})
        assert "alpha 9" in (await t.call("capsule_exec", {"capsule_id": cap, "cmd": run}))["stdout"]
        return await t.call("capsule_witness", {"capsule_id": cap})

    made = tools.run(record)
    second = int(time.time())
    while int(time.time()) == second:  # the replay's edit must fall in a later second (.pyc mtimes are seconds)
        time.sleep(0.05)
    out = _replay_elsewhere(tools, tmp_path, made["path"])
    if bytecode != "same exec":
        assert out["replay_ok"] is True, out["mismatches"]
    else:
        assert out["replay_ok"] is False
        tag = subprocess.run(["/usr/bin/python3", "-c", "import sys; print(sys.implementation.cache_tag)"],
                             capture_output=True, text=True, check=True).stdout.strip()
        assert [m["path"] for m in out["mismatches"]] == [f"plugins/__pycache__/alpha.{tag}.pyc"]
    assert out["output_identical"] is True



def test_bytecode_of_a_file_a_tool_edited_replays_identically(tools: Any, tmp_path: Path) -> None:
    # An agent's edit goes through a file tool: the journal keeps the file's mtime and the
    # replay gives the rewritten file the same one, so the .pyc that Python writes from it
    # (it records its source's mtime) has the same bytes.
    ws = _project(tmp_path)

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("workspace_write_file", {"capsule_id": cap, "path": "plugins/alpha.py", "content": "VALUE = 9\n"})
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": [".venv/bin/python", "main.py"]})
        assert "alpha 9" in ran["stdout"]
        return await t.call("capsule_witness", {"capsule_id": cap})

    made = tools.run(record)
    second = int(time.time())
    while int(time.time()) == second:  # a fresh mtime would fall in a later second (.pyc mtimes are seconds)
        time.sleep(0.05)
    out = _replay_elsewhere(tools, tmp_path, made["path"])
    assert out["replay_ok"] is True, out["mismatches"]
    assert out["output_identical"] is True



def test_a_run_that_sleeps_replays(tools: Any, tmp_path: Path) -> None:
    # Python's time.sleep is clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME), which
    # libfaketime 0.9.10 refuses (EINVAL) under any wall-clock shift: a replay that
    # shifted its clock back to the original's time failed every test that sleeps.
    ws = _project(tmp_path)
    sleeper = [".venv/bin/python", "-c", "import time; time.sleep(0.05); print('slept')"]

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": sleeper})
        assert ran["exit_code"] == 0, ran["stderr"]
        return await t.call("capsule_witness", {"capsule_id": cap})

    made = tools.run(record)
    time.sleep(1.5)  # the replay comes seconds after the capsule was made, as it always does
    out = _replay_elsewhere(tools, tmp_path, made["path"])
    assert out["replay_ok"] is True, out["mismatches"]
    assert out["output_identical"] is True


ROOTLESS_SCRIPT = r"""
import json, os, sys, trio
from mcp_server.config import TOOLSETS, Config
from mcp_server.context import CallContext, Runtime
from mcp_server.state import State
from mcp_server.tools.registry import Registry

async def tools(state, calls):
    runtime = Runtime(Config.from_env({"CCW_STATE_DIR": state}), State(state))
    ctx, registry = CallContext(runtime), Registry.load(TOOLSETS)
    try:
        return await calls(lambda name, args: registry.lookup(name).handler(ctx, args))
    finally:
        await runtime.aclose()

async def record(call):
    cap = (await call("capsule_create", {"workspace": ws}))["capsule_id"]
    ran = await call("capsule_exec", {"capsule_id": cap, "cmd": [".venv/bin/python", "main.py"]})
    made = await call("capsule_witness", {"capsule_id": cap})
    await call("capsule_destroy", {"capsule_id": cap})
    return {"ran": ran, "made": made}

async def main():
    out = await tools(state1, record)
    os.rename(ws, moved)
    out["replayed"] = await tools(state2, lambda call: call("capsule_replay", {"path": out["made"]["path"],
                                                                               "allow_untrusted": True}))
    print(json.dumps(out))

ws, moved, state1, state2 = sys.argv[1:]
trio.run(main)
"""


def test_a_rootless_witness_carries_the_whole_base_and_replays(tmp_path: Path, root_required: None,
                                                                require: Any) -> None:
    # Unknown reads (no fanotify in a user namespace): the witness carries the whole base.
    import shutil
    import tempfile

    from tests.support.users import as_user  # the interpreter made reachable to another uid

    require(shutil.which("setpriv") is not None and shutil.which("unshare") is not None, "needs util-linux")
    public = Path(tempfile.mkdtemp(prefix="ccw-replay-"))
    keep_dirs: list[str] = []
    try:
        public.chmod(0o755)
        ws = _project(public)
        for state in ("state1", "state2"):
            (public / state).mkdir()
        subprocess.run(["chown", "-R", "65534:65534", str(public)], check=True)
        argv = [sys.executable, "-c", ROOTLESS_SCRIPT, str(ws), str(public / "moved"), str(public / "state1"),
                str(public / "state2")]
        done = subprocess.run(as_user(65534, 65534, argv, keep_dirs), cwd=str(public), capture_output=True,
                              timeout=240, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
        assert done.returncode == 0, done.stderr.decode()
        out = json.loads(done.stdout.decode().splitlines()[-1])
    finally:
        for keep in keep_dirs:
            os.rmdir(keep)
        shutil.rmtree(public)
    assert out["ran"]["exit_code"] == 0 and out["ran"]["touched"]["read"] is None
    assert out["ran"]["touched"]["listed"] is None and out["ran"]["touched"]["executed"] is None
    assert out["made"]["base"]["carried"] == "all" and out["made"]["base"]["read_sets_complete"] is False
    replayed = out["replayed"]
    assert replayed["replay_ok"] is True, replayed["mismatches"]
    assert replayed["output_identical"] is True


def _node_project(tmp_path: Path) -> Path:
    ws = tmp_path / "nodep"
    for d in ("node_modules/mytool/bin", "node_modules/.bin", "node_modules/mylib", "fixtures"):
        (ws / d).mkdir(parents=True)
    (ws / "package.json").write_text(
        '{"name": "nodep", "version": "1.0.0", "private": true, "scripts": {"test": "mytool && node test.js"}}\n')
    cli = ws / "node_modules/mytool/bin/cli.js"
    cli.write_text('#!/usr/bin/env node\nconsole.log("mytool ran");\n')
    cli.chmod(0o755)
    os.symlink("../mytool/bin/cli.js", ws / "node_modules/.bin/mytool")
    (ws / "node_modules/mylib/package.json").write_text('{"name": "mylib", "main": "index.js"}\n')
    (ws / "node_modules/mylib/index.js").write_text("module.exports = (x) => x * 2;\n")
    (ws / "test.js").write_text(
        'const fs = require("fs"); const double = require("mylib");\n'
        'for (const f of fs.readdirSync("fixtures").sort()) '
        'console.log(f, double(Number(fs.readFileSync("fixtures/" + f, "utf8"))));\n')
    for name, value in (("a.txt", 1), ("b.txt", 2)):
        (ws / "fixtures" / name).write_text(f"{value}\n")
    return ws


def test_an_npm_project_replays_after_the_workspace_moved(tools: Any, tmp_path: Path, require: Any) -> None:
    import shutil

    require(shutil.which("npm") is not None and shutil.which("node") is not None, "needs node and npm")
    ws = _node_project(tmp_path)
    # npm must not look for its own updates (no network in a capsule).
    npm_test = ["env", "npm_config_update_notifier=false", "npm", "test"]

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": npm_test})
        made = await t.call("capsule_witness", {"capsule_id": cap})
        return {"ran": ran, "made": made}

    recorded = tools.run(record)
    assert recorded["ran"]["exit_code"] == 0, recorded["ran"]["stderr"]
    assert "mytool ran\na.txt 2\nb.txt 4\n" in recorded["ran"]["stdout"]
    ws.rename(tmp_path / "moved-away")
    out = _replay_elsewhere(tools, tmp_path, recorded["made"]["path"])
    assert out["replay_ok"] is True, out["mismatches"]
    assert out["output_identical"] is True, out["output_diffs"]


@pytest.mark.parametrize("carry", ["used", "all"])
def test_make_with_up_to_date_targets_replays(tools: Any, tmp_path: Path, require: Any, carry: str) -> None:
    # make opens none of its sources when all is up to date, but it lists the
    # directories it looks in (its directory cache), so they travel all the same.
    import shutil

    require(shutil.which("make") is not None and shutil.which("cc") is not None, "needs make and cc")
    ws = tmp_path / "cproj"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "hello.c").write_text('#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n')
    (ws / "Makefile").write_text("hello: hello.o\n\tcc -o $@ $^\nhello.o: src/hello.c\n\tcc -c -o $@ $<\n")
    subprocess.run(["make", "-s"], cwd=ws, check=True, capture_output=True)

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        built = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "make && ./hello"]})
        assert built["exit_code"] == 0 and "up to date" in built["stdout"], built
        assert "src/hello.c" not in (built["touched"]["read"] or []) and "src" in built["touched"]["listed"]
        return await t.call("capsule_witness", {"capsule_id": cap, "carry": carry})

    made = tools.run(record)
    ws.rename(tmp_path / "moved-away")
    out = _replay_elsewhere(tools, tmp_path, made["path"])
    # mtimes travel too: make finds hello and hello.o up to date again and rebuilds nothing.
    assert out["replay_ok"] is True and out["output_identical"] is True, out


def test_git_commands_in_the_capsule_replay(tools: Any, tmp_path: Path) -> None:
    # .git is not walked for a witness, but what git opened and listed in it travels.
    ws = tmp_path / "repo"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "PATH": "/usr/bin:/bin",
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=ws, env=env, check=True)
    # --no-optional-locks: status must not refresh the index, whose stat data (inode,
    # ctime) a rebuilt base cannot have.
    show = ["sh", "-c", "echo two >> a.txt && git log --format=%s && git --no-optional-locks status --short"]

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": show})
        return {"ran": ran, "made": await t.call("capsule_witness", {"capsule_id": cap})}

    recorded = tools.run(record)
    assert recorded["ran"]["stdout"] == "base\n M a.txt\n", recorded["ran"]["stderr"]
    ws.rename(tmp_path / "moved-away")
    out = _replay_elsewhere(tools, tmp_path, recorded["made"]["path"])
    assert out["replay_ok"] is True and out["output_identical"] is True, out

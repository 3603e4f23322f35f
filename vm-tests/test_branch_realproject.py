"""capsule_promote ``as_branch`` on a real project (issue 39, "Shown by": a branch).

flaskr (Flask 3.0.3's tutorial app, from PyPI, tests/support/realprojects.py) with its
``.venv`` in the workspace and its own pytest suite.  A capsule adds a route to a module
and a test for it, and runs the suite (which leaves ignored caches behind).  Then
``as_branch`` makes a branch whose one commit holds exactly those two changes, parented
on the commit the capsule was made from although the host has committed since; the work
tree, the index file's bytes and ``git status`` are as before, and the branch's own
checkout passes the suite.  The refusals: an existing branch, a name git rejects, a
workspace with no repository, a repository with no commit (no base commit recorded).
The attacks: a git hook, a setuid file and a planted ``.vscode`` link are refused as a
branch exactly when promotion refuses them (the same verdict and hazards), and a symlink
pointing out of the tree is committed as the link it is, never as what it points at.
The same through ``ccw capsule branch`` as an unprivileged user on a checkout they own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from sandbox.errors import CcwError
from tests.support import branch_steps, realprojects
from tests.support.users import run_script_as

PROJECT = realprojects.FLASKR


def _flaskr(require: Any, root: Path) -> Path:
    require(os.path.exists(realprojects.SYSTEM_PYTHON) and shutil.which("git") is not None,
            f"needs {realprojects.SYSTEM_PYTHON} and git")
    return realprojects.pristine(PROJECT, root / "ws")


async def _refused(t: Any, args: dict[str, Any]) -> dict[str, Any]:
    try:
        return {"unexpected": await t.call("capsule_promote", args)}
    except CcwError as exc:
        return {"code": exc.code, "message": exc.message}


def check_branch(ws: Path, name: str, base: str) -> str:
    """The branch's one commit holds exactly the two changes on ``base``; its message."""
    assert realprojects.git(ws, "rev-parse", f"{name}^").strip() == base
    assert realprojects.git(ws, "diff", "--name-status", base, name).splitlines() == [
        "M\tflaskr/__init__.py", "A\ttests/test_ping.py"]
    patch = realprojects.git(ws, "log", "-p", "-1", "--format=", name)
    added = [line[1:] for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++")]
    assert added == ['    @app.route("/ping")', "    def ping():", '        return "pong"', "",
                     *branch_steps.NEW_TEST.splitlines()]
    assert not [line for line in patch.splitlines() if line.startswith("-") and not line.startswith("---")]
    return realprojects.git(ws, "log", "-1", "--format=%B", name)


def test_a_branch_holds_exactly_the_change_and_leaves_tree_and_index(tools: Any, require: Any,
                                                                     tmp_path: Path) -> None:
    ws = _flaskr(require, tmp_path)
    base = realprojects.git(ws, "rev-parse", "HEAD").strip()

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = [await t.call("capsule_exec", {"capsule_id": cap, "cmd": argv, "timeout_ms": 120_000})
               for argv in branch_steps.edits(".venv/bin/python")]
        # The host commits meanwhile: the branch still starts where the capsule did.
        realprojects.git(ws, "commit", "-q", "--allow-empty", "-m", "the host moves on")
        before = branch_steps.snapshot(ws)
        dry = await t.call("capsule_promote", {"capsule_id": cap, "as_branch": "ccw/ping", "dry_run": True})
        dry_ref = realprojects.git(ws, "for-each-ref", "refs/heads/ccw/")
        made = await t.call("capsule_promote", {"capsule_id": cap, "as_branch": "ccw/ping"})
        after = branch_steps.snapshot(ws)
        again = await _refused(t, {"capsule_id": cap, "as_branch": "ccw/ping"})
        bad = await _refused(t, {"capsule_id": cap, "as_branch": "no..dots"})
        return {"ran": ran, "dry": dry, "dry_ref": dry_ref, "made": made, "before": before, "after": after,
                "again": again, "bad": bad}

    out = tools.run(scenario)
    assert [r["exit_code"] for r in out["ran"]] == [0, 0, 0], [r["stderr"][-800:] for r in out["ran"]]
    assert "passed" in out["ran"][2]["stdout"] + out["ran"][2]["stderr"]
    dry = out["dry"]
    assert dry["promoted"] is False and dry["dry_run"] is True and out["dry_ref"] == "", dry
    assert dry["applied"] == ["flaskr/__init__.py", "tests/test_ping.py"] and "commit" not in dry["branch"], dry
    made = out["made"]
    assert made["promoted"] is True and made["policy_report"]["passed"] is True, made
    assert made["branch"]["parent"] == base and made["branch"]["ref"] == "refs/heads/ccw/ping", made["branch"]
    assert made["applied"] == ["flaskr/__init__.py", "tests/test_ping.py"], made["applied"]
    assert out["after"] == out["before"]
    message = check_branch(ws, "ccw/ping", base)
    assert "tests/test_ping.py" in message and "-m pytest" in message and "#3 " in message, message
    assert "Policies (baseline): passed" in message, message
    assert realprojects.git(ws, "rev-parse", "ccw/ping").strip() == made["branch"]["commit"]
    assert out["again"]["code"] == "CONFLICT" and out["bad"]["code"] == "INVALID_ARGUMENT", out
    # The branch, checked out apart with the project's venv, passes the project's suite with the new test.
    checkout = tmp_path / "checkout"
    realprojects.git(ws, "worktree", "add", "-q", str(checkout), "ccw/ping")
    (checkout / ".venv").symlink_to(ws / ".venv")
    for argv in (PROJECT.test_cmd, (*PROJECT.test_cmd[:-1], "tests/test_ping.py")):
        suite = subprocess.run(argv, cwd=checkout, capture_output=True, text=True, timeout=300, check=False)
        assert suite.returncode == 0 and " passed" in suite.stdout, suite.stdout[-2000:]
    assert "1 passed" in suite.stdout, suite.stdout[-2000:]


def test_refusals_without_a_repository_or_a_base_commit_and_a_fork_s_base(tools: Any, tmp_path: Path) -> None:
    plain, unborn, repo = tmp_path / "plain", tmp_path / "unborn", tmp_path / "repo"
    for ws in (plain, unborn, repo):
        ws.mkdir()
        (ws / "a.txt").write_text("a\n")
    realprojects.git(unborn, "init", "-q", "-b", "main")
    realprojects.git(repo, "init", "-q", "-b", "main")
    realprojects.git(repo, "add", "-A")
    realprojects.git(repo, "commit", "-q", "-m", "initial")
    base = realprojects.git(repo, "rev-parse", "HEAD").strip()

    async def scenario(t: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for ws in (plain, unborn):
            cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
            await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", "echo b > a.txt"]})
            out[ws.name] = await _refused(t, {"capsule_id": cap, "as_branch": "x"})
        # A fork's base is its parent's, though the host committed between the two.
        parent = (await t.call("capsule_create", {"workspace": str(repo)}))["capsule_id"]
        realprojects.git(repo, "commit", "-q", "--allow-empty", "-m", "later")
        fork = (await t.call("capsule_fork", {"capsule_id": parent}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": fork, "cmd": ["sh", "-c", "echo b > a.txt"]})
        out["fork"] = await t.call("capsule_promote", {"capsule_id": fork, "as_branch": "from-fork"})
        return out

    out = tools.run(scenario)
    assert out["fork"]["branch"]["parent"] == base, out["fork"]
    assert realprojects.git(repo, "show", "from-fork:a.txt") == "b\n"
    assert realprojects.git(repo, "rev-parse", "from-fork^").strip() == base
    assert out["plain"]["code"] == "UNSUPPORTED" and "not the top of a git repository" in out["plain"]["message"]
    assert out["unborn"]["code"] == "UNSUPPORTED" and "is unknown" in out["unborn"]["message"], out["unborn"]
    assert (plain / "a.txt").read_text() == "a\n" and (unborn / "a.txt").read_text() == "a\n"


def test_a_change_the_workspace_caught_up_with_still_lands_on_the_branch(tools: Any, tmp_path: Path) -> None:
    # The change list is read against the live workspace: a change promoted already (the
    # capsule's own, or a merge holding it), or made by hand, is no difference there, yet
    # the branch is cut from the base commit, which lacks it.
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("a.txt", "b.txt", "gone.txt"):
        (repo / name).write_text(f"{name}\n")
    realprojects.git(repo, "init", "-q", "-b", "main")
    realprojects.git(repo, "add", "-A")
    realprojects.git(repo, "commit", "-q", "-m", "initial")
    base = realprojects.git(repo, "rev-parse", "HEAD").strip()
    edit = "echo fixed > a.txt && echo new > c.txt && rm gone.txt && echo back > b.txt && echo b.txt > b.txt"

    async def scenario(t: Any) -> dict[str, Any]:
        whole = (await t.call("capsule_create", {"workspace": str(repo)}))["capsule_id"]
        part = (await t.call("capsule_create", {"workspace": str(repo)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": part, "cmd": ["sh", "-c", "echo mine > d.txt"]})
        await t.call("capsule_exec", {"capsule_id": whole, "cmd": ["sh", "-c", edit]})
        promoted = await t.call("capsule_promote", {"capsule_id": whole})
        (repo / "d.txt").write_text("mine\n")  # the same edit by hand
        (repo / "b.txt").write_text("b.txt edited on the host\n")
        dry = await t.call("capsule_promote", {"capsule_id": whole, "as_branch": "w", "dry_run": True})
        return {"promoted": promoted, "dry": dry,
                "whole": await t.call("capsule_promote", {"capsule_id": whole, "as_branch": "w"}),
                "part": await t.call("capsule_promote", {"capsule_id": part, "as_branch": "p"})}

    out = tools.run(scenario)
    assert out["promoted"]["applied"] == ["a.txt", "c.txt", "gone.txt"], out["promoted"]
    # b.txt, changed and changed back, differs from the host's edit of it, but not from the base commit.
    assert out["dry"]["applied"] == ["a.txt", "b.txt", "c.txt", "gone.txt"], out["dry"]
    assert out["whole"]["applied"] == out["dry"]["applied"], out["whole"]
    assert realprojects.git(repo, "diff", "--name-status", base, "w").splitlines() == [
        "M\ta.txt", "A\tc.txt", "D\tgone.txt"]
    assert realprojects.git(repo, "show", "w:a.txt") == "fixed\n"
    assert realprojects.git(repo, "diff", "--name-status", base, "p").splitlines() == ["A\td.txt"], out["part"]
    assert [realprojects.git(repo, "rev-parse", f"{name}^").strip() for name in ("w", "p")] == [base, base]


ATTACKS = {
    "hook": ("printf '#!/bin/sh\\ntouch pwned\\n' > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit",
             ("git_control", ".git/hooks/pre-commit")),
    "setuid": ("cp /bin/sh s && chmod 6755 s", ("setuid", "s")),
    "vscode link": ("mkdir decoy && echo '{}' > decoy/tasks.json && ln -s decoy .vscode", ("autorun", ".vscode")),
    "link out": ("ln -s /etc/shadow leak && ln -s ../../../../etc/passwd up", None),
}


def test_what_promotion_refuses_is_refused_as_a_branch(tools: Any, tmp_path: Path) -> None:
    template = tmp_path / "template"
    template.mkdir()
    (template / "app.py").write_text("x = 1\n")
    realprojects.git(template, "init", "-q", "-b", "main")
    realprojects.git(template, "add", "-A")
    realprojects.git(template, "commit", "-q", "-m", "initial")

    async def scenario(t: Any) -> dict[str, Any]:
        out = {}
        for i, (name, (script, _)) in enumerate(ATTACKS.items()):
            ws = tmp_path / f"ws{i}"
            shutil.copytree(template, ws, symlinks=True)
            cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
            ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]})
            assert ran["exit_code"] == 0, (name, ran["stderr"])
            promoted = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True})
            branched = await t.call("capsule_promote", {"capsule_id": cap, "as_branch": f"b{i}"})
            out[name] = {"ws": str(ws), "promoted": promoted, "branched": branched}
        return out

    out = tools.run(scenario)
    for name, (_, hazard) in ATTACKS.items():
        o = out[name]
        ws = Path(o["ws"])
        found = [(h["kind"], h["path"]) for h in o["branched"]["policy_report"]["hazards"]]
        assert found == [(h["kind"], h["path"]) for h in o["promoted"]["policy_report"]["hazards"]], name
        assert o["branched"]["policy_report"]["passed"] is o["promoted"]["policy_report"]["passed"], name
        has_branch = subprocess.run(["git", "-C", str(ws), "rev-parse", "--verify", "-q", "refs/heads/b" + str(
            list(ATTACKS).index(name))], capture_output=True, check=False).returncode == 0
        if hazard is not None:
            assert hazard in found and o["branched"]["promoted"] is False and not has_branch, (name, o["branched"])
            assert not (ws / "pwned").exists()
        else:  # promotion writes such links as links; the branch records them as links, never their targets' bytes
            assert o["branched"]["promoted"] is True and has_branch, o["branched"]
            b = o["branched"]["branch"]["name"]
            assert realprojects.git(ws, "show", f"{b}:leak") == "/etc/shadow"
            assert realprojects.git(ws, "show", f"{b}:up") == "../../../../etc/passwd"
            assert realprojects.git(ws, "ls-tree", b, "leak").startswith("120000 blob ")


USER_SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from tests.support.branch_steps import cli_session
print(json.dumps(cli_session(Path(sys.argv[2]), Path(sys.argv[3]))))
"""


def test_the_command_as_an_unprivileged_user_on_their_checkout(user_dir: tuple[int, int, Path], require: Any) -> None:
    uid, gid, home = user_dir
    ws = _flaskr(require, home)
    base = realprojects.git(ws, "rev-parse", "HEAD").strip()
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(ws)], check=True)
    out = run_script_as(uid, gid, [sys.executable, "-c", USER_SCRIPT, str(realprojects.ROOT), str(home / "state"),
                                   str(ws)], home)
    assert out["made"]["returncode"] == 0, out["made"]
    commit = out["made"]["stdout"].strip()
    assert out["before"] == out["after"], out
    assert "committed" in out["made"]["stderr"] and "ccw/ping" in out["made"]["stderr"], out["made"]
    assert out["again"]["returncode"] == 1 and "CONFLICT" in out["again"]["stderr"], out["again"]
    assert realprojects.git(ws, "rev-parse", "ccw/ping").strip() == commit
    check_branch(ws, "ccw/ping", base)
    owners = {p.stat().st_uid for p in (ws / ".git").rglob("*")}
    assert owners == {uid}, owners  # every object and ref the branch wrote is the user's

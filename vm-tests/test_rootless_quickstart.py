"""The README's quick start, run as written by root and by a user created for the test; and
promotion through a rootless helper, where the total memory of an exec cannot be measured.

The user runs the worktree's own ``.venv`` (``./dev setup`` as a user only builds a venv;
doing that here would download the world).  Its interpreter may live under a directory
other users cannot enter (``/root/.pyenv``): ``as_user`` of tests/support/users.py runs the
commands in a private mount namespace that shows just what is needed there.  The project
is a small Python package with pytest in its own ``.venv/`` (pytest and its
dependencies copied from the worktree's venv: no network), as real projects have it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pwd
import re
import secrets
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.users import as_user

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
README = ROOT / "README.md"


@pytest.fixture
def user(root_required: None, require: Callable[[bool, str], None]) -> Iterator[pwd.struct_passwd]:
    """A login user with a home, created for the test and deleted (home included) after it."""
    for tool in ("useradd", "userdel", "setpriv", "unshare"):
        require(shutil.which(tool) is not None, f"needs {tool}")
    name = f"ccwqs{secrets.token_hex(3)}"
    subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True, capture_output=True)
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", "--remove", name], check=True, capture_output=True)


def _requirements(name: str, seen: set[str]) -> None:
    """``name`` and every distribution it needs on this platform, into ``seen``."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    if canonicalize_name(name) in seen:
        return
    seen.add(canonicalize_name(name))
    for text in importlib.metadata.requires(name) or []:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            _requirements(requirement.name, seen)


def make_project(path: Path) -> None:
    """A Python package with one passing test, and pytest in its own .venv/."""
    path.mkdir()
    (path / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (path / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    venv = path / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
    site = Path(subprocess.run([str(venv / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               check=True, capture_output=True, text=True).stdout.strip())
    needed: set[str] = set()
    _requirements("pytest", needed)
    for name in sorted(needed):
        dist = importlib.metadata.distribution(name)
        for file in dist.files or []:
            if file.parts[0] == "..":
                continue  # console scripts and the like, outside site-packages
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(Path(str(dist.locate_file(file))), target)  # mtimes kept: the .pyc stay valid
    pytest_script = venv / "bin" / "pytest"
    pytest_script.write_text(f"#!{venv}/bin/python\n"
                             "import sys\nfrom pytest import console_main\nsys.exit(console_main())\n")
    pytest_script.chmod(0o755)


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    for dirpath, dirnames, filenames in os.walk(path):
        for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
            os.lchown(name, uid, gid)


def quick_start_lines() -> list[str]:
    """The commands of the README's quick start block, comments dropped."""
    section = README.read_text().split("## Quick start", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines() if line.strip()]


def run_quick_start(project: Path, home: Path,
                    as_user: Callable[[list[str]], list[str]] | None) -> list[dict[str, Any]]:
    """Run each quick start line in one bash, the way a user pastes them; each line's output and status.

    ``./dev setup && . .venv/bin/activate`` becomes activating the worktree's venv, and
    ``cd ~/src/your-project`` going to ``project``; every other line runs as written.
    """
    lines = quick_start_lines()
    assert lines[0] == "./dev setup && . .venv/bin/activate" and lines[2].startswith("cd "), lines
    lines[0] = f". {shlex.quote(str(ROOT / '.venv' / 'bin' / 'activate'))}"
    lines[2] = f"cd {shlex.quote(str(project))}"
    out_dir = home / "quick-start"
    out_dir.mkdir()
    script = []
    for number, line in enumerate(lines):
        script.append(f"{{ {line} ; }} >{out_dir}/{number}.out 2>{out_dir}/{number}.err; "
                      f"echo $? >{out_dir}/{number}.rc")
    script.append("ccw helper stop >/dev/null")  # not in the README: the helper would outlive the test
    (home / "quick-start.sh").write_text("\n".join(script) + "\n")
    owner = home.stat()
    _chown_tree(home, owner.st_uid, owner.st_gid)
    argv = ["bash", str(home / "quick-start.sh")]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    done = subprocess.run(argv if as_user is None else as_user(argv), cwd=str(home), env=env,
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    return [{"line": line, "rc": int((out_dir / f"{n}.rc").read_text()), "out": (out_dir / f"{n}.out").read_text(),
             "err": (out_dir / f"{n}.err").read_text()} for n, line in enumerate(lines)]


QUICK_START = ("activate", "doctor", "cd", "create", "exec", "diff", "dry_run", "promote")


def _check_common(steps: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """What holds for root and user alike; the steps by name."""
    named = dict(zip(QUICK_START, steps, strict=True))
    assert "--policy strict --dry-run" in named["dry_run"]["line"] and "destroy" in named["promote"]["line"]
    for name, step in named.items():
        if name != "dry_run":
            assert step["rc"] == 0, step
    assert "1 passed" in named["exec"]["out"], named["exec"]
    # pytest's cache ignores itself: the diff, showing what promotion would carry, names it apart
    assert ".pytest_cache/" not in named["diff"]["out"], named["diff"]
    assert "ignored, not shown" in named["diff"]["err"] and ".pytest_cache/" in named["diff"]["err"], named["diff"]
    assert named["dry_run"]["rc"] in (0, 1) and "calc.py" not in named["dry_run"]["err"]
    assert "promoted:" in named["promote"]["err"] and "destroyed cap_" in named["promote"]["out"], named["promote"]
    return named


def _promoted_without_the_cache(project: Path, promote: dict[str, Any]) -> None:
    """The run's bytecode is promoted (the project is no git checkout: nothing is ignored),
    but not pytest's cache, which marks itself ignored with its own .gitignore."""
    assert (project / "__pycache__").is_dir()
    assert not (project / ".pytest_cache").exists()
    assert "ignored files: .pytest_cache, .pytest_cache/.gitignore" in promote["err"], promote


def test_quick_start_as_written_by_root(root_required: None, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    make_project(home / "project")
    named = _check_common(run_quick_start(home / "project", home, None))
    assert "capsules can run here: privileged mode" in named["doctor"]["out"]
    # Privileged: every figure is measured, so a refusal can only come from another check.
    assert "cannot be checked" not in named["dry_run"]["err"], named["dry_run"]
    _promoted_without_the_cache(home / "project", named["promote"])


def test_quick_start_as_written_by_a_user(user: pwd.struct_passwd) -> None:
    home = Path(user.pw_dir)
    make_project(home / "project")
    keep_dirs: list[str] = []
    try:
        steps = run_quick_start(home / "project", home,
                                lambda argv: as_user(user.pw_uid, user.pw_gid, argv, keep_dirs))
    finally:
        for keep in keep_dirs:
            os.rmdir(keep)
    named = _check_common(steps)
    assert "capsules can run here: rootless mode" in named["doctor"]["out"], named["doctor"]
    dry_run = named["dry_run"]
    # What a newcomer reads: which check failed, the figure that was not measured, why, and the fix.
    assert dry_run["rc"] == 1, dry_run
    assert "would not promote: policy strict failed" in dry_run["err"]
    assert ("max_rss_mb 2048 cannot be checked: rss_max_kb (the exec's total memory) was not measured for "
            "exec(s) 1 (no memory cgroup") in dry_run["err"], dry_run["err"]
    assert "if_unmeasured: refuse" in dry_run["err"] and "fix: " in dry_run["err"]
    # The plain promote (baseline) passes the unmeasured figure and says so.
    promote = named["promote"]
    assert "policy baseline passed" in promote["err"] and "if_unmeasured: pass" in promote["err"], promote
    _promoted_without_the_cache(home / "project", promote)
    assert (home / "project" / "__pycache__").stat().st_uid == user.pw_uid


PROMOTE_SCRIPT = r"""
set -e
export CCW_STATE_DIR="$1/state"
cd "$1/ws"
CAP=$(ccw capsule create .)
ccw capsule exec --json "$CAP" -- python3 -c "b = b'x' * (64 << 20); open('out.txt', 'w').write('hi')" >"$1/exec.json"
rc=0; ccw capsule promote --json "$CAP" --policy strict --dry-run >"$1/strict.json" || rc=$?
[ "$rc" -eq 1 ]  # strict refuses it, and --json exits as the human form does
ccw capsule promote --json "$CAP" >"$1/baseline.json"
ccw capsule destroy "$CAP" >/dev/null
ccw helper stop >/dev/null
"""


def test_rootless_promote_baseline_passes_strict_names_the_unmeasured_figure(user: pwd.struct_passwd) -> None:
    """Regression (issue 13, item 4): baseline refused every rootless promotion."""
    home = Path(user.pw_dir)
    (home / "ws").mkdir()
    (home / "ws" / "keep.txt").write_text("k\n")
    (home / "run.sh").write_text(PROMOTE_SCRIPT)
    _chown_tree(home, user.pw_uid, user.pw_gid)
    keep_dirs: list[str] = []
    argv = ["bash", str(home / "run.sh"), str(home)]
    env = {"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8"}
    try:
        done = subprocess.run(as_user(user.pw_uid, user.pw_gid, argv, keep_dirs), env=env,
                              capture_output=True, timeout=300)
    finally:
        for keep in keep_dirs:
            os.rmdir(keep)
    assert done.returncode == 0, done.stderr.decode()
    ran = json.loads((home / "exec.json").read_text())
    usage, sources = ran["usage"], ran["usage_sources"]
    # Each missing cgroup named, its reason (the helper's, the same for every exec) given once elsewhere.
    assert usage["rss_max_kb"] is None and ran["usage_unavailable"]["rss_max_kb"] == (
        "no memory cgroup (why: capsule_create's isolation.cgroups_unavailable)")
    assert usage["cpu_ms"] is not None and sources["cpu_ms"] == "wait4 rusage of the jail's init"
    assert usage["rss_max_process_kb"] >= 64 << 10 and sources["rss_max_process_kb"].startswith("wait4 rusage")
    strict = json.loads((home / "strict.json").read_text())
    assert strict["promoted"] is False and strict["policy_report"]["passed"] is False
    [refused] = strict["policy_report"]["resource_violations"]
    assert (refused["rule"], refused["figure"], refused["value"]) == ("max_rss_mb", "rss_max_kb", None)
    assert "rss_max_kb" in strict["policy_report"]["details"]
    baseline = json.loads((home / "baseline.json").read_text())
    assert baseline["promoted"] is True, baseline["policy_report"]["details"]
    assert baseline["policy_report"]["resource_unmeasured"][0]["figure"] == "rss_max_kb"
    assert (home / "ws" / "out.txt").read_text() == "hi"

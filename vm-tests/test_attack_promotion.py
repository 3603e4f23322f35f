"""Promotion as a way out of the capsule (issue 24): what would run or escalate on the host.

A capsule run by root can make a setuid-root binary, write a git hook or git config
that the next ``git commit`` or ``git status`` on the host runs outside any jail, or
plant files that tools run by themselves (direnv, VS Code, husky, submodules).  Each
attack here is a capsule that does one of those things; its promotion under
``baseline`` must be refused (a named hazard in the dry run and in the report, nothing
written), and the host tree must never gain the file nor run it.  Then the same capsule
is promoted with the explicit ``allow_hazards`` and gets the designed behaviour: kept
as the capsule has it, except setuid/setgid bits, which promotion never writes.

An ordinary capsule (source edits, a new executable script, a commit made in the
capsule, a setgid directory) still promotes under ``baseline`` unchanged.

The host's own git config can make a tracked file code (issue 35): ``include.path``
naming a file of the tree, ``core.hooksPath`` a directory of it, a filter driver a
script in it.  A capsule that changes such a file, and nothing under ``.git``, is
refused the same way, the hazard naming the file and the key.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mcp_server.fs.gitconfig import read as config_named

GIT_ENV = {
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "host", "GIT_AUTHOR_EMAIL": "host@example.invalid",
    "GIT_COMMITTER_NAME": "host", "GIT_COMMITTER_EMAIL": "host@example.invalid",
}
# In the capsule: the same fixed identity, no user or system config.
GIT_IN_CAPSULE = "git -c user.name=agent -c user.email=agent@example.invalid"
MARKER = "pwned-on-host"  # what a planted hook or fsmonitor would create when the host runs it


def _git(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=ws, env=env, capture_output=True, text=True, check=False)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _ran_on_host(ws: Path, *git_args: str) -> bool:
    """Run a git command on the host tree, as a user would next, and say whether planted code ran."""
    _git(ws, *git_args)
    return (ws / MARKER).exists()


HOOK = f"printf '#!/bin/sh\\ntouch {MARKER}\\n'"


@dataclass(frozen=True)
class Attack:
    """A capsule that plants something, the hazard promotion must name, and how to tell it escaped."""

    name: str
    script: str  # run with sh -c in the capsule, at the workspace
    kind: str  # the hazard kind the dry run names
    path: str  # the path it names
    escaped: Callable[[Path], bool]  # true if the host tree got what the capsule planted
    allowed: Callable[[Path], bool]  # after promotion with allow_hazards [kind]: the designed behaviour


def _exists(rel: str) -> Callable[[Path], bool]:
    return lambda ws: os.path.lexists(ws / rel)


ATTACKS = [
    Attack("setuid root shell", "cp /bin/sh s && chmod 6755 s", "setuid", "s",
           lambda ws: (ws / "s").exists() and _mode(ws / "s") & 0o6000 != 0,
           lambda ws: _mode(ws / "s") == 0o755),
    Attack("setuid by chmod of an existing file", "chmod 4755 tool", "setuid", "tool",
           lambda ws: _mode(ws / "tool") & 0o4000 != 0,
           lambda ws: _mode(ws / "tool") == 0o755),
    Attack("setgid on an edited file", "echo 'echo edited' >> tool && chmod 2755 tool", "setuid", "tool",
           lambda ws: _mode(ws / "tool") & 0o2000 != 0,
           lambda ws: _mode(ws / "tool") == 0o755 and b"edited" in (ws / "tool").read_bytes()),
    Attack("git pre-commit hook",
           f"{HOOK} > .git/hooks/pre-commit && chmod +x .git/hooks/pre-commit", "git_control", ".git/hooks/pre-commit",
           lambda ws: _ran_on_host(ws, "commit", "-q", "--allow-empty", "-m", "next"),
           _exists(".git/hooks/pre-commit")),
    Attack("core.hooksPath",
           f"mkdir hooks && {HOOK} > hooks/pre-commit && chmod +x hooks/pre-commit && git config core.hooksPath hooks",
           "git_control", ".git/config",
           lambda ws: _ran_on_host(ws, "commit", "-q", "--allow-empty", "-m", "next"),
           lambda ws: "hooksPath" in (ws / ".git" / "config").read_text()),
    Attack("core.fsmonitor",
           f"{HOOK} > fsmon && chmod +x fsmon && git config core.fsmonitor \"$PWD/fsmon\"",
           "git_control", ".git/config",
           lambda ws: _ran_on_host(ws, "status"),
           lambda ws: "fsmonitor" in (ws / ".git" / "config").read_text()),
    Attack("direnv .envrc", f"echo 'touch {MARKER}' > .envrc", "autorun", ".envrc",
           _exists(".envrc"), _exists(".envrc")),
    Attack("VS Code task on folder open",
           "mkdir .vscode && echo '{\"tasks\": [{\"command\": \"id\", \"runOptions\": {\"runOn\": \"folderOpen\"}}]}'"
           " > .vscode/tasks.json", "autorun", ".vscode/tasks.json",
           _exists(".vscode/tasks.json"), _exists(".vscode/tasks.json")),
    Attack(".vscode as a link to planted settings",
           "mkdir decoy && echo '{}' > decoy/tasks.json && ln -s decoy .vscode", "autorun", ".vscode",
           _exists(".vscode"), lambda ws: os.readlink(ws / ".vscode") == "decoy"),
    Attack(".gitmodules",
           "printf '[submodule \"x\"]\\n\\tpath = x\\n\\turl = https://example.invalid/x\\n\\tupdate = !id\\n'"
           " > .gitmodules", "autorun", ".gitmodules",
           _exists(".gitmodules"), _exists(".gitmodules")),
    Attack("husky hook", f"mkdir .husky && {HOOK} > .husky/pre-commit", "autorun", ".husky/pre-commit",
           _exists(".husky/pre-commit"), _exists(".husky/pre-commit")),
    Attack("a nested repository's hook",
           f"mkdir -p sub/.git/hooks && {HOOK} > sub/.git/hooks/post-checkout && chmod +x sub/.git/hooks/post-checkout",
           "git_control", "sub/.git/hooks/post-checkout",
           _exists("sub/.git/hooks/post-checkout"), _exists("sub/.git/hooks/post-checkout")),
    Attack("a .git file redirecting the gitdir",
           "mkdir -p sub2 && echo 'gitdir: ../planted' > sub2/.git", "git_control", "sub2/.git",
           _exists("sub2/.git"), _exists("sub2/.git")),
    Attack("an embedded bare repository's config",
           "git init -q --bare vendor/inner.git && git config -f vendor/inner.git/config core.pager 'touch pwned'",
           "git_control", "vendor/inner.git/config",
           _exists("vendor/inner.git/config"), _exists("vendor/inner.git/config")),
    Attack("a repository pointer's commondir naming a look-alike with the config",
           "mkdir -p evil x/objects x/refs && echo 'ref: refs/heads/main' > evil/HEAD && echo ../x > evil/commondir"
           " && git config -f x/config core.pager 'touch pwned; cat'", "git_control", "x/config",
           _exists("x/config"), _exists("x/config")),
    Attack("a link in .git/objects bringing a work-tree file as its alternates",
           "rm -rf .git/objects/info && mkdir alt && echo /tmp/elsewhere/objects > alt/alternates"
           " && ln -s ../../alt .git/objects/info", "git_control", ".git/objects/info",
           lambda ws: os.path.islink(ws / ".git/objects/info"), lambda ws: os.path.islink(ws / ".git/objects/info")),
    Attack("a loose object of HEAD's tree given other content, the work tree untouched",
           "o=$(git rev-parse HEAD:src/app.py) && f=.git/objects/$(echo $o | cut -c1-2)/$(echo $o | cut -c3-)"
           " && chmod u+w $f && python3 -c 'import sys, zlib; b = b\"def answer():\\n    return 666\\n\";"
           " open(sys.argv[1], \"wb\").write(zlib.compress(b\"blob %d\\0\" % len(b) + b))' $f",
           "git_control", ".git/objects/10/83d263a12f8ca0b19827526030ed286669b9df",  # the template's src/app.py
           lambda ws: "666" in _git(ws, "show", "HEAD:src/app.py").stdout,
           lambda ws: "666" in _git(ws, "show", "HEAD:src/app.py").stdout),
    Attack("a replace ref giving HEAD's src/app.py other content",
           "o=$(git rev-parse HEAD:src/app.py) && n=$(printf 'def answer():\\n    return 666\\n' | git hash-object -w"
           " --stdin) && git update-ref refs/replace/$o $n", "git_control",
           ".git/refs/replace/1083d263a12f8ca0b19827526030ed286669b9df",
           lambda ws: "666" in _git(ws, "show", "HEAD:src/app.py").stdout,
           lambda ws: "666" in _git(ws, "show", "HEAD:src/app.py").stdout),
    Attack("an index staging a blob the work tree does not hold, for the host's next commit",
           "n=$(printf 'def answer():\\n    return 666\\n' | git hash-object -w --stdin)"
           " && git update-index --cacheinfo 100644,$n,src/app.py", "git_control", ".git/index",
           lambda ws: "666" in _git(ws, "diff", "--cached").stdout,
           lambda ws: "666" in _git(ws, "diff", "--cached").stdout and "41" in (ws / "src/app.py").read_text()),
    Attack("a world-writable script", "echo 'echo hi' > open.sh && chmod 0777 open.sh", "world_writable", "open.sh",
           _exists("open.sh"), lambda ws: _mode(ws / "open.sh") == 0o777),
]


@pytest.fixture
def template(tmp_path: Path) -> Path:
    """A small git repository: a source file and an executable script, committed."""
    ws = tmp_path / "template"
    (ws / "src").mkdir(parents=True)
    (ws / "src" / "app.py").write_text("def answer():\n    return 41\n")
    (ws / "tool").write_text("#!/bin/sh\necho tool\n")
    os.chmod(ws / "tool", 0o755)
    assert _git(ws, "init", "-q", "-b", "main").returncode == 0
    assert _git(ws, "add", "-A").returncode == 0
    assert _git(ws, "commit", "-q", "-m", "initial").returncode == 0
    return ws


def _hazards(result: dict[str, Any]) -> list[tuple[str, str]]:
    return [(h["kind"], h["path"]) for h in result["policy_report"]["hazards"]]


def test_promotion_refuses_what_would_run_or_escalate_on_the_host(tools: Any, template: Path, tmp_path: Path,
                                                                  record_property: Any) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        out = {}
        for i, attack in enumerate(ATTACKS):
            ws = tmp_path / f"ws{i}"
            shutil.copytree(template, ws, symlinks=True)
            cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
            ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", attack.script]})
            assert ran["exit_code"] == 0, (attack.name, ran["stderr"])
            refused = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["baseline"]})
            escaped = attack.escaped(ws)
            dry = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True})
            allowed = await t.call("capsule_promote", {"capsule_id": cap, "allow_hazards": [attack.kind]})
            out[attack.name] = {"escaped": escaped, "refused": refused, "dry": dry, "allowed": allowed,
                                "allowed_ok": attack.allowed(ws), "ws": ws}
            await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    record_property("escapes_tried", len(ATTACKS))
    assert [name for name, o in out.items() if o["escaped"]] == []
    for attack in ATTACKS:
        o = out[attack.name]
        report = o["refused"]["policy_report"]
        assert o["refused"]["promoted"] is False and o["refused"]["applied"] == [], attack.name
        assert report["passed"] is False and report["hazards_ok"] is False, (attack.name, report)
        assert (attack.kind, attack.path) in _hazards(o["refused"]), (attack.name, report["hazards"])
        assert "allow_hazards" in report["details"] and attack.path in report["details"], report["details"]
        assert (attack.kind, attack.path) in _hazards(o["dry"]) and o["dry"]["promoted"] is False, attack.name
        assert o["dry"]["applied"], attack.name  # the dry run still lists what would be written
        assert not (o["ws"] / MARKER).exists(), attack.name
        # Allowed explicitly: promoted, the hazard listed as allowed, the designed behaviour.
        assert o["allowed"]["promoted"] is True, (attack.name, o["allowed"]["policy_report"])
        listed = [h for h in o["allowed"]["policy_report"]["hazards"] if h["path"] == attack.path]
        assert listed and all(h["allowed"] for h in listed), (attack.name, listed)
        assert o["allowed_ok"], attack.name


def test_an_ordinary_capsule_still_promotes_under_baseline(tools: Any, template: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(template, ws, symlinks=True)
    script = (
        "sed -i 's/41/42/' src/app.py && printf '#!/bin/sh\\necho run\\n' > run.sh && chmod 755 run.sh && "
        "mkdir shared && chmod 2775 shared && echo x > shared/f && "
        f"{GIT_IN_CAPSULE} add -A && {GIT_IN_CAPSULE} commit -q -m 'answer 42'"
    )

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]})
        assert ran["exit_code"] == 0, ran["stderr"]
        dry = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True})
        done = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["baseline"]})
        await t.call("capsule_destroy", {"capsule_id": cap})
        return {"dry": dry, "done": done}

    out = tools.run(scenario)
    report = out["done"]["policy_report"]
    assert out["done"]["promoted"] is True, report
    assert report["passed"] is True and report["hazards_ok"] is True and report["hazards"] == [], report
    assert report["details"] == "All checks passed"
    assert out["dry"]["policy_report"]["hazards"] == [] and out["dry"]["applied"] == out["done"]["applied"]
    assert "run.sh" in out["done"]["applied"] and any(p.startswith(".git/objects/") for p in out["done"]["applied"])
    assert _mode(ws / "run.sh") == 0o755 and _mode(ws / "shared") == 0o2775
    assert "return 42" in (ws / "src" / "app.py").read_text()
    assert _git(ws, "rev-list", "--count", "HEAD").stdout == "2\n"
    assert _git(ws, "status", "--porcelain").stdout == ""
    assert _git(ws, "fsck", "--strict", "--no-dangling").returncode == 0


@dataclass(frozen=True)
class NamedAttack:
    """A host repository whose config names a tracked file, a capsule that changes that file, and how it would run."""

    name: str
    tracked: dict[str, str]  # files the host commits (a name ending in .sh or a hook is made executable)
    config: tuple[tuple[str, str], ...]  # `git config KEY VALUE` on the host, before the capsule is made
    script: str  # run with sh -c in the capsule, at the workspace
    path: str  # the hazard's path
    key: str  # the config key its reason names
    ran: Callable[[Path], bool]  # the host's next git command after a promotion: whether planted code ran


def _added_on_host(ws: Path) -> bool:
    (ws / "notes.txt").write_text("changed on the host\n")
    return _ran_on_host(ws, "add", "notes.txt")


NAMED_ATTACKS = [
    NamedAttack("include.path names a tracked config file",
                {"tools/gitconfig": "[user]\n\tname = host\n"},
                (("include.path", "../tools/gitconfig"),),
                f"printf '[core]\\n\\tfsmonitor = touch {MARKER}; false\\n' >> tools/gitconfig",
                "tools/gitconfig", "include.path",
                lambda ws: _ran_on_host(ws, "status")),
    NamedAttack("core.hooksPath names a tracked directory: a hook edited",
                {".githooks/pre-commit": "#!/bin/sh\nexit 0\n"},
                (("core.hooksPath", ".githooks"),),
                f"{HOOK} > .githooks/pre-commit",
                ".githooks/pre-commit", "core.hooksPath",
                lambda ws: _ran_on_host(ws, "commit", "-q", "--allow-empty", "-m", "next")),
    NamedAttack("core.hooksPath names a tracked directory: a hook added",
                {".githooks/pre-commit": "#!/bin/sh\nexit 0\n"},
                (("core.hooksPath", ".githooks"),),
                f"{HOOK} > .githooks/post-commit && chmod +x .githooks/post-commit",
                ".githooks/post-commit", "core.hooksPath",
                lambda ws: _ran_on_host(ws, "commit", "-q", "--allow-empty", "-m", "next")),
    NamedAttack("a filter driver runs a tracked script",
                {"scripts/clean.sh": "#!/bin/sh\ncat\n", ".gitattributes": "*.txt filter=tidy\n",
                 "notes.txt": "notes\n"},
                (("filter.tidy.clean", "./scripts/clean.sh"),),
                f"printf '#!/bin/sh\\ntouch {MARKER}\\ncat\\n' > scripts/clean.sh",
                "scripts/clean.sh", "filter.tidy.clean",
                _added_on_host),
]


def _host_repo(template: Path, ws: Path, attack: NamedAttack) -> None:
    shutil.copytree(template, ws, symlinks=True)
    for rel, text in attack.tracked.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
        if rel.endswith(".sh") or "hooks/" in rel:
            os.chmod(ws / rel, 0o755)
    assert _git(ws, "add", "-A").returncode == 0
    assert _git(ws, "commit", "-q", "-m", "tooling").returncode == 0
    for key, value in attack.config:
        assert _git(ws, "config", key, value).returncode == 0


def test_promotion_refuses_a_change_to_what_the_host_git_config_names(tools: Any, template: Path, tmp_path: Path,
                                                                       record_property: Any) -> None:
    async def scenario(t: Any) -> dict[str, Any]:
        out = {}
        for i, attack in enumerate(NAMED_ATTACKS):
            ws = tmp_path / f"named{i}"
            _host_repo(template, ws, attack)
            before = (ws / attack.path).read_bytes() if (ws / attack.path).exists() else None
            cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
            ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", attack.script]})
            assert ran["exit_code"] == 0, (attack.name, ran["stderr"])
            dry = await t.call("capsule_promote", {"capsule_id": cap, "dry_run": True})
            refused = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["baseline"]})
            untouched = ((ws / attack.path).read_bytes() if (ws / attack.path).exists() else None) == before
            escaped = attack.ran(ws)
            allowed = await t.call("capsule_promote", {"capsule_id": cap, "allow_hazards": ["git_control"]})
            capsule_has = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["cat", attack.path]})
            out[attack.name] = {"dry": dry, "refused": refused, "untouched": untouched, "escaped": escaped,
                                "allowed": allowed, "promoted_as_capsule_has":
                                (ws / attack.path).read_bytes() == capsule_has["stdout"].encode()}
            await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    record_property("escapes_tried", len(NAMED_ATTACKS))
    assert [name for name, o in out.items() if o["escaped"]] == []
    for attack in NAMED_ATTACKS:
        o = out[attack.name]
        for result in (o["dry"], o["refused"]):
            report = result["policy_report"]
            assert result["promoted"] is False and report["hazards_ok"] is False, (attack.name, report)
            [hazard] = [h for h in report["hazards"] if h["path"] == attack.path]
            assert hazard["kind"] == "git_control" and not hazard["allowed"], (attack.name, hazard)
            assert f"({attack.key} in .git/config)" in hazard["reason"], (attack.name, hazard)
            assert attack.path in report["details"] and attack.key in report["details"], report["details"]
        assert o["dry"]["applied"] == [attack.path] and o["refused"]["applied"] == [], attack.name
        assert o["untouched"], attack.name  # nothing written to the live tree
        # Allowed explicitly: promoted as the capsule has it, the hazard listed as allowed.
        assert o["allowed"]["promoted"] is True, (attack.name, o["allowed"]["policy_report"])
        listed = [h for h in o["allowed"]["policy_report"]["hazards"] if h["path"] == attack.path]
        assert listed and all(h["allowed"] for h in listed), (attack.name, listed)
        assert o["promoted_as_capsule_has"], attack.name


def test_a_checkout_owned_by_another_user_is_read_as_its_owner_git_reads_it(root_required: None, template: Path,
                                                                           tmp_path: Path) -> None:
    # git leaves out, silently, the config of a repository another uid owns (safe.directory); that
    # owner's git reads it, and runs what it names.
    ws = tmp_path / "theirs"
    _host_repo(template, ws, NAMED_ATTACKS[0])
    subprocess.run(["chown", "-R", "65534:65534", str(ws)], check=True)
    assert "include.path" not in _git(ws, "config", "--list").stdout  # what git as root shows here
    assert [(n.path, n.key) for n in config_named(str(ws))] == [("tools/gitconfig", "include.path")]


def test_a_moved_tag_or_rewound_branch_is_refused_and_new_refs_and_commits_promote(tools: Any, template: Path,
                                                                                  tmp_path: Path) -> None:
    """Refs are git's data, but a moved one changes what a name means where no diff shows it."""
    _git(template, "tag", "v1.0")
    (template / "src" / "app.py").write_text("def answer():\n    return 43\n")
    assert _git(template, "commit", "-q", "-am", "second").returncode == 0
    first, second = (_git(template, "rev-parse", rev).stdout.strip() for rev in ("HEAD~1", "HEAD"))
    cases = {
        "rewound": (f"{GIT_IN_CAPSULE} reset -q --hard HEAD~1", ".git/refs/heads/main", "branch main moved"),
        "tag moved": (f"{GIT_IN_CAPSULE} tag -f v1.0 HEAD", ".git/refs/tags/v1.0", "tag v1.0 moved"),
        "ordinary": ("sed -i 's/43/44/' src/app.py && git add -A && "
                     f"{GIT_IN_CAPSULE} commit -q -m third && git branch feature && git tag v2.0 HEAD~1 && "
                     f"{GIT_IN_CAPSULE} commit -q --amend -m 'third, amended' && git status --porcelain", None, None),
    }

    async def scenario(t: Any) -> dict[str, Any]:
        out = {}
        for name, (script, _, _) in cases.items():
            ws = tmp_path / name.replace(" ", "-")
            shutil.copytree(template, ws, symlinks=True)
            cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
            ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["sh", "-c", script]})
            assert ran["exit_code"] == 0, (name, ran["stderr"])
            out[name] = (ws, await t.call("capsule_promote", {"capsule_id": cap, "policies": ["baseline"]}))
            await t.call("capsule_destroy", {"capsule_id": cap})
        return out

    out = tools.run(scenario)
    for name, (_, path, said) in cases.items():
        ws, result = out[name]
        report = result["policy_report"]
        if path is None:
            assert result["promoted"] is True and report["hazards"] == [], (name, report)
            continue
        assert result["promoted"] is False and result["applied"] == [], (name, report)
        named = [h for h in report["hazards"] if h["path"] == path]
        assert [h["kind"] for h in named] == ["git_control"] and said in named[0]["reason"], (name, report["hazards"])
        assert _git(ws, "rev-parse", "main", "v1.0").stdout.split() == [second, first], name
    ws = out["ordinary"][0]
    third = _git(ws, "rev-parse", "main").stdout.strip()
    assert _git(ws, "log", "--format=%s", "main").stdout.split("\n")[:2] == ["third, amended", "second"]
    assert _git(ws, "log", "-1", "--format=%s %P", "feature").stdout.strip() == f"third {second}"
    assert _git(ws, "rev-parse", "v2.0", "v1.0").stdout.split() == [second, first]
    assert third != second and _git(ws, "status", "--porcelain").stdout == ""

"""Toolchains under the caller's home (issue 25 item 1), as root and as a user with a rootless helper.

A developer's machine keeps its interpreters under $HOME: a pyenv Python
(``~/.pyenv/versions/3.X``), node from nvm (``~/.nvm/versions/node/vX``).  Here both are
made for real from the system's (the interpreter copied into a pyenv-style prefix whose
stdlib is the system's, node copied into an nvm-style tree), in the real home of the
caller (root's /root, or the home /etc/passwd gives a user made for the test).  Through
``ccw-mcp`` on stdio, with nothing asked:

* more-itertools' ``.venv`` made from the pyenv interpreter runs its tests in a capsule
  (the prefix found through pyvenv.cfg and listed in ``exposed``); with ``auto_expose``
  off the same exec is exit 127 with a hint naming the prefix;
* a ``#!/usr/bin/env node`` script finds the nvm node on the caller's PATH, and a real npm
  project's tests run with it;
* THE SECRETS TEST: with those toolchains shown, a command in the capsule lists and reads
  every key store of the caller's home (canaries planted in each) and finds none;
  asking ``expose`` for any of them is PERMISSION_DENIED, and a workspace whose
  pyvenv.cfg points into ~/.ssh exposes nothing secret;
* the capsule's witness replays with the same directories shown, and an unsigned witness
  whose capsule "exposed" ~/.ssh replays without it (listed in ``expose.dropped``): its
  exec's attempt to read the stores shows no canary.

And a root helper serving another uid over its socket shows that uid only what it may
read itself, checked again at every exec.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent


from tests.support import realprojects  # noqa: E402
from tests.support.agent_loop import scenario_command  # noqa: E402
from tests.support.users import OTHER_UID, run_script_as  # noqa: E402

# Key stores of a home (issue 25's list): directories, then files.
SECRET_DIRS = (".ssh", ".gnupg", ".aws", ".config/gcloud", ".kube", ".docker", ".local/share/keyrings",
               ".mozilla", ".config/google-chrome", ".config/chromium", ".password-store")
SECRET_FILES = (".netrc", ".git-credentials", ".pypirc", ".npmrc")

# Run in the capsule by the pyenv interpreter: every key store, listed and read.
PROBE = r"""
import json, os, sys
home, seen = sys.argv[1], {}
for rel in sys.argv[2:]:
    path = os.path.join(home, rel)
    found = []
    for root, dirs, files in os.walk(path):
        found += [os.path.join(root, name) for name in dirs + files]
    if os.path.isfile(path):
        found.append(path)
    text = ""
    for name in found:
        try:
            with open(name, errors="replace") as handle:
                text += handle.read()
        except OSError as exc:
            text += f"<{exc.strerror}>"
    seen[rel] = {"exists": os.path.lexists(path), "found": found, "text": text}
print(json.dumps({"seen": seen, "home": sorted(os.listdir(home)) if os.path.isdir(home) else None}))
"""

def system_python() -> Path:
    """The system interpreter's real file (/usr/bin/python3 -> python3.X)."""
    return Path(os.path.realpath(realprojects.SYSTEM_PYTHON))


def python_prefix(prefix: Path) -> Path:
    """A Python installation at ``prefix``: the system interpreter copied into its bin, its
    stdlib the system's (a symlink the jail resolves in /usr)."""
    python = system_python()
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    shutil.copy2(python, prefix / "bin" / python.name)
    (prefix / "bin" / "python3").symlink_to(python.name)
    (prefix / "lib" / python.name).symlink_to(f"/usr/lib/{python.name}")
    return prefix


def make_pyenv(home: Path, tag: str) -> Path:
    """A pyenv-style prefix under ``home``, as ``pyenv install`` leaves one."""
    version = system_python().name.removeprefix("python")  # 3.11
    return python_prefix(home / ".pyenv" / "versions" / f"{version}.{tag}")


def venv_from(ws: Path, prefix: Path) -> None:
    """Turn the workspace's .venv into one made from ``prefix`` (same minor version, so its
    site-packages stay valid): what ``~/.pyenv/versions/3.X/bin/python -m venv .venv`` writes."""
    python = prefix / "bin" / "python3"
    (ws / ".venv" / "pyvenv.cfg").write_text(
        f"home = {prefix / 'bin'}\ninclude-system-site-packages = false\n"
        f"executable = {os.path.realpath(python)}\ncommand = {python} -m venv {ws / '.venv'}\n")
    link = ws / ".venv" / "bin" / "python3"
    link.unlink()
    link.symlink_to(python)


def make_nvm(home: Path, tag: str) -> Path:
    """An nvm-style node under ``home``: the system's node binary copied to ~/.nvm/versions/node/vX/bin."""
    node = Path(os.path.realpath(shutil.which("node") or "/usr/bin/node"))
    version = subprocess.run([str(node), "--version"], capture_output=True, text=True, check=True).stdout.strip()
    bin_dir = home / ".nvm" / "versions" / "node" / f"{version}-{tag}" / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy2(node, bin_dir / "node")
    return bin_dir.parent


def new_top(home: Path, rel: str) -> Path | None:
    """The topmost directory of ``home/rel`` that does not exist yet (what to remove after), or None."""
    return next((home / p for p in [*reversed(Path(rel).parents), Path(rel)]
                 if str(p) != "." and not (home / p).exists()), None)


def make_uv(home: Path, tag: str) -> tuple[Path, Path]:
    """A uv-style managed Python: a full prefix, and the minor-version link to it that uv's venvs name."""
    version = system_python().name.removeprefix("python")
    pythons = home / ".local" / "share" / "uv" / "python"
    real = python_prefix(pythons / f"cpython-{version}.99-{tag}-linux-x86_64-gnu")
    link = pythons / f"cpython-{version}-{tag}-linux-x86_64-gnu"
    link.symlink_to(real.name)
    return real, link


def plant_secrets(home: Path, canary: str, made: list[Path]) -> None:
    """A canary file in each key store of ``home``; a store file that exists already is left
    alone (root's real ~/.npmrc).  What is made is appended to ``made`` (top first)."""
    for rel in SECRET_DIRS:
        store = home / rel
        top = new_top(home, rel)
        if top is not None:
            made.append(top)
        store.mkdir(parents=True, exist_ok=True)
        (store / f"ccw-canary-{canary}").write_text(f"{canary} key material\n")
        made.append(store / f"ccw-canary-{canary}")
    for rel in SECRET_FILES:
        if not (home / rel).exists():
            (home / rel).write_text(f"password {canary}\n")
            made.append(home / rel)


async def _refused(call: Any, args: dict[str, Any]) -> str:
    """The error code of a capsule_create that must fail (or "created")."""
    from sandbox.errors import CcwError

    try:
        await call("capsule_create", args)
    except CcwError as exc:
        return exc.code
    return "created"


async def scenario(call: Any, setup: dict[str, Any]) -> dict[str, Any]:
    """The calls, as the caller; what they answered (the test asserts)."""
    out: dict[str, Any] = {}
    py, node, home = setup["py_ws"], setup["node_ws"], setup["home"]
    created = await call("capsule_create", {"workspace": py})
    out["py_created"] = created
    out["py_tests"] = await call("capsule_exec", {"capsule_id": created["capsule_id"], "cmd": setup["py_cmd"]})
    out["py_probe"] = await call("capsule_exec", {
        "capsule_id": created["capsule_id"],
        "cmd": [".venv/bin/python", "-c", PROBE, home, *SECRET_DIRS, *SECRET_FILES]})
    fork = await call("capsule_fork", {"capsule_id": created["capsule_id"]})
    out["fork_run"] = await call("capsule_exec", {"capsule_id": fork["capsule_id"], "cmd": [
        ".venv/bin/python", "-c", "import sys; print(sys.base_prefix)"]})
    await call("capsule_destroy", {"capsule_id": fork["capsule_id"]})
    witness = await call("capsule_witness", {"capsule_id": created["capsule_id"]})
    out["replay"] = await call("capsule_replay", {"witness_id": witness["witness_id"]})
    out["crafted"] = await call("capsule_replay", {"path": setup["crafted"], "allow_untrusted": True})
    uv = await call("capsule_create", {"workspace": setup["uv_ws"]})
    out["uv_created"] = uv
    out["uv_tests"] = await call("capsule_exec", {"capsule_id": uv["capsule_id"], "cmd": setup["py_cmd"]})
    off = await call("capsule_create", {"workspace": py, "auto_expose": False})
    out["py_off"] = await call("capsule_exec", {"capsule_id": off["capsule_id"], "cmd": setup["py_cmd"]})
    made = await call("capsule_create", {"workspace": node, "env_whitelist": ["PATH"]})
    out["node_created"] = made
    out["node_run"] = await call("capsule_exec", {"capsule_id": made["capsule_id"], "cmd": [
        "sh", "-c", "node_modules/.bin/whoami-node && node_modules/.bin/tape test/*.js"]})
    out["asked"] = {rel: await _refused(call, {"workspace": py, "expose": [os.path.join(home, rel)]})
                    for rel in (*SECRET_DIRS, *SECRET_FILES, "")}
    planted = await call("capsule_create", {"workspace": setup["planted_ws"]})
    out["planted_created"] = planted
    out["planted_probe"] = await call("capsule_exec", {
        "capsule_id": planted["capsule_id"], "cmd": ["/usr/bin/python3", "-c", PROBE, home, ".ssh"]})
    return out


def crafted_witness(path: Path, home: Path, prefix: Path) -> Path:
    """An unsigned witness (anyone could write it) whose capsule exposed ~/.ssh beside the
    pyenv prefix and a toolchain this machine lacks, and whose exec reads the stores."""
    from tests.support import witness_craft

    entry, blobs = witness_craft.exec_entry(1, ["/bin/sh", "-c", f"cat {home}/.ssh/* {home}/.netrc; ls -a {home}"])
    manifest = witness_craft.manifest(str(path.parent / "crafted-ws"), [entry])
    manifest["capsule"]["expose"] = [f"{home}/.ssh", str(prefix), f"{home}/.pyenv/versions/0.0.gone"]
    return witness_craft.write(path, manifest, blobs)


def prepare(home: Path, scratch: Path, tag: str) -> dict[str, Any]:
    """The toolchains under ``home``, the three workspaces under ``scratch``, and the call setup."""
    prefix = make_pyenv(home, tag)
    node_root = make_nvm(home, tag)
    py_ws = realprojects.pristine(realprojects.MORE_ITERTOOLS, scratch / "py")
    venv_from(py_ws, prefix)
    uv_real, uv_link = make_uv(home, tag)
    uv_ws = realprojects.pristine(realprojects.MORE_ITERTOOLS, scratch / "uv")
    venv_from(uv_ws, uv_link)
    node_ws = realprojects.pristine(realprojects.JSON_STABLE_STRINGIFY, scratch / "node")
    # A bin script as npm links them: found through PATH by env, like every node CLI.
    (node_ws / "node_modules" / ".bin" / "whoami-node").write_text(
        "#!/usr/bin/env node\nconsole.log(process.execPath)\n")
    (node_ws / "node_modules" / ".bin" / "whoami-node").chmod(0o755)
    planted = scratch / "planted"
    (planted / ".venv" / "bin").mkdir(parents=True)
    (planted / ".venv" / "pyvenv.cfg").write_text(f"home = {home}/.ssh\n")
    (planted / ".venv" / "bin" / "python").symlink_to(f"{home}/.ssh/id_ed25519")
    (planted / ".venv" / "bin" / "tool").write_text(f"#!{home}/.aws/bin/python\n")
    return {
        "crafted": str(crafted_witness(scratch / "crafted.ccw", home, prefix)),
        "home": str(home), "scratch": str(scratch), "prefix": str(prefix), "node_root": str(node_root),
        "py_ws": str(py_ws), "node_ws": str(node_ws), "planted_ws": str(planted),
        "uv_ws": str(uv_ws), "uv_real": str(uv_real), "uv_link": str(uv_link),
        "py_cmd": list(realprojects.MORE_ITERTOOLS.test_cmd),
        # The caller's environment: nvm's node first on PATH, as nvm's shell hook puts it.
        "environ": {"HOME": str(home), "PATH": f"{node_root}/bin:/usr/local/bin:/usr/bin:/bin"},
    }


def check(out: dict[str, Any], setup: dict[str, Any], canary: str) -> None:
    """Everything the scenario must show."""
    prefix, node_root = setup["prefix"], setup["node_root"]
    exposed = {item["path"]: item["reason"] for item in out["py_created"]["exposed"]}
    assert exposed.get(prefix) == "pyvenv.cfg home of .venv", exposed
    assert out["py_tests"]["exit_code"] == 0, out["py_tests"]["stderr"][-3000:]
    assert " passed" in out["py_tests"]["stdout"], out["py_tests"]["stdout"][-2000:]
    # A fork shows what its parent exposed.
    assert out["fork_run"]["exit_code"] == 0 and out["fork_run"]["stdout"] == f"{prefix}\n", out["fork_run"]
    # uv's minor-version link: shown at the link's path as well as its own.
    assert {item["path"] for item in out["uv_created"]["exposed"]} >= {setup["uv_real"], setup["uv_link"]}, out
    assert out["uv_tests"]["exit_code"] == 0, out["uv_tests"]["stderr"][-3000:]
    # Exposure off: the interpreter is missing, and the hint names its prefix.
    off = out["py_off"]
    assert off["exit_code"] == 127, off
    assert any(prefix in hint and "--expose" in hint for hint in off.get("hints", [])), off
    # node: the nvm one (process.execPath), and the npm project's tests pass with it.
    assert {item["path"] for item in out["node_created"]["exposed"]} >= {node_root}, out["node_created"]
    ran = out["node_run"]
    assert ran["exit_code"] == 0, ran["stderr"][-3000:]
    assert ran["stdout"].splitlines()[0] == f"{node_root}/bin/node", ran["stdout"][:500]
    assert "# ok" in ran["stdout"], ran["stdout"][-1000:]
    # THE SECRETS TEST: no store is there, nothing is read, the canary appears nowhere.
    for probe in (out["py_probe"], out["planted_probe"]):
        assert probe["exit_code"] == 0, probe["stderr"][-2000:]
        assert canary not in probe["stdout"] + probe["stderr"]
        seen = json.loads(probe["stdout"])
        for rel, what in seen["seen"].items():
            assert what == {"exists": False, "found": [], "text": ""}, (rel, what)
        # The home shows only the toolchains' own trees.
        assert set(seen["home"] or ()) <= {".pyenv", ".nvm"}, seen["home"]
    assert out["asked"] == dict.fromkeys(out["asked"], "PERMISSION_DENIED"), out["asked"]
    # A replay shows what the witness's capsule exposed, as this replayer's checks allow.
    assert out["replay"]["expose"] == {"used": sorted([prefix, node_root]), "dropped": []}, out["replay"]
    assert out["replay"]["replay_ok"] is True, out["replay"]["mismatches"]
    crafted = out["crafted"]
    assert crafted["expose"]["used"] == [prefix], crafted
    assert [item["path"] for item in crafted["expose"]["dropped"]] == [
        f"{setup['home']}/.ssh", f"{setup['home']}/.pyenv/versions/0.0.gone"], crafted
    assert canary not in json.dumps(crafted), crafted
    shown = [item["path"] for item in out["planted_created"].get("exposed", [])]
    assert not any(path.startswith(f"{setup['home']}/.") and not path.startswith(
        (f"{setup['home']}/.pyenv/", f"{setup['home']}/.nvm/")) for path in shown), shown


@contextlib.contextmanager
def _removed_after(paths: list[Path]) -> Iterator[None]:
    try:
        yield
    finally:
        for path in reversed(paths):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()


def test_toolchains_in_roots_home_run_and_its_secrets_stay_hidden(root_required: None, tmp_path: Path) -> None:
    home = Path(pwd.getpwuid(0).pw_dir)
    tag, canary = f"ccw{secrets.token_hex(3)}", f"CANARY-{secrets.token_hex(8)}"
    made: list[Path] = []
    with _removed_after(made):
        made += [top for top in (new_top(home, tree) for tree in (".pyenv/versions", ".nvm", ".local/share/uv/python"))
                 if top is not None]
        setup = prepare(home, tmp_path, tag)
        made += [Path(setup[key]) for key in ("prefix", "node_root", "uv_real", "uv_link")]
        plant_secrets(home, canary, made)
        # Not through run_script_as: its private mount namespace covers /root with a tmpfs
        # showing only the interpreter, which would hide the very stores this test plants.
        done = subprocess.run(scenario_command("test_devmachine_expose", setup), cwd=tmp_path,
                              capture_output=True, text=True, timeout=500,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"})
        assert done.returncode == 0, done.stderr[-6000:]
        out = json.loads(done.stdout.splitlines()[-1])
        check(out, setup, canary)


@pytest.fixture
def login_user(root_required: None, require: Callable[[bool, str], None]) -> Iterator[tuple[int, int, Path]]:
    """A regular login user made for the test (uid in login.defs' range), its home in /etc/passwd."""
    require(all(shutil.which(tool) for tool in ("useradd", "setpriv", "unshare")), "needs useradd, setpriv and unshare")
    base = Path(tempfile.mkdtemp(prefix="ccw-expose-", dir="/var/tmp"))
    base.chmod(0o755)
    home = base / "home"
    name = f"ccwx{secrets.token_hex(4)}"
    for attempt in range(10):  # other tests add users too: /etc/passwd's lock may be held a moment
        made = subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/usr/sbin/nologin", name],
                              capture_output=True, text=True, check=False)
        if made.returncode == 0:
            break
        time.sleep(0.2 * (attempt + 1))
    assert made.returncode == 0, made.stderr
    try:
        entry = pwd.getpwnam(name)
        home.mkdir(mode=0o700)
        os.chown(home, entry.pw_uid, entry.pw_gid)
        yield entry.pw_uid, entry.pw_gid, home
    finally:
        shutil.rmtree(base, ignore_errors=True)
        subprocess.run(["userdel", name], check=True, capture_output=True)


def test_toolchains_in_a_users_home_run_rootless_and_its_secrets_stay_hidden(
        login_user: tuple[int, int, Path]) -> None:
    uid, gid, home = login_user
    tag, canary = f"ccw{secrets.token_hex(3)}", f"CANARY-{secrets.token_hex(8)}"
    scratch = home.parent / "scratch"
    scratch.mkdir()
    setup = prepare(home, scratch, tag)
    plant_secrets(home, canary, [])
    subprocess.run(["chown", "-R", f"{uid}:{gid}", str(home), str(scratch)], check=True)
    out = run_script_as(uid, gid, scenario_command("test_devmachine_expose", setup), scratch, timeout=500)
    check(out, setup, canary)


# --- a root helper serving another uid: the caller's own access counts ----------------------

PEER = r"""
import json, os, sys, trio
from sandbox.client import HelperClient
from sandbox.errors import CcwError

async def main(path, ws, tools, hidden, store):
    client = HelperClient(path)
    out = {}
    for name, expose in (("hidden", [hidden]), ("store", [store])):
        try:
            await client.request("create", {"workspace": ws, "expose": expose})
            out[name] = "created"
        except CcwError as exc:
            out[name] = exc.code
    made = await client.request("create", {"workspace": ws, "expose": [tools]})
    argv = ["cat", os.path.join(tools, "hello.txt")]
    ran = await client.request("exec", {"capsule_id": made["capsule_id"], "argv": argv, "cwd": ws})
    out["shown"] = [ran["exit_code"], ran["stdout_b64"]]
    # The caller swaps its toolchain for a link into what it may not read: the next exec is refused.
    os.rename(tools, tools + ".old")
    os.symlink(hidden, tools)
    try:
        await client.request("exec", {"capsule_id": made["capsule_id"], "argv": argv, "cwd": ws})
        out["swapped"] = "ran"
    except CcwError as exc:
        out["swapped"] = exc.code
    await client.request("destroy", {"capsule_id": made["capsule_id"]})
    await client.aclose()
    print(json.dumps(out))

trio.run(main, *sys.argv[1:])
"""


def test_a_root_helper_shows_a_caller_only_what_the_caller_may_read(
        run_as: Callable[..., Any], public_dir: Path, launch_helper: Callable[..., Any]) -> None:
    ws, mine = public_dir / "ws", public_dir / "mine"
    ws.mkdir()
    (mine / "tools" / "bin").mkdir(parents=True)
    (mine / "tools" / "hello.txt").write_text("the caller's own toolchain\n")
    for path in (ws, mine, mine / "tools"):
        os.chown(path, OTHER_UID, OTHER_UID)
    # Root's: a toolchain dir in a 0700 directory (the root helper could open it, the caller cannot).
    hidden = public_dir / "private" / "tools"
    hidden.mkdir(parents=True)
    (public_dir / "private").chmod(0o700)
    (hidden / "hello.txt").write_text("root's only\n")
    socket_path, log_path = public_dir / "helper.sock", public_dir / "helper.log"
    process = launch_helper(socket_path, public_dir / "state", log_path, "--socket-mode", "0666")
    try:
        out = run_as(OTHER_UID, OTHER_UID, PEER, str(socket_path), str(ws), str(mine / "tools"), str(hidden),
                     f"{pwd.getpwuid(0).pw_dir}/.ssh")
    finally:
        process.terminate()
        assert process.wait(30) == 0, log_path.read_text()
    assert out["hidden"] == "PERMISSION_DENIED", out
    assert out["store"] in ("PERMISSION_DENIED", "NOT_FOUND"), out  # root's ~/.ssh: refused by rule (or absent)
    assert out["shown"] == [0, base64.b64encode(b"the caller's own toolchain\n").decode()], out
    assert out["swapped"] == "PERMISSION_DENIED", out


PINNED = r"""
import errno, json, os, sys
from sandbox import syscalls
base = sys.argv[1]
os.symlink(os.path.join(base, "real"), os.path.join(base, "swapped"))  # the swap: a link to another dir
out = {}
for name in ("real", "swapped"):
    target = os.path.join(base, "at-" + name)
    try:
        os.mkdir(target)
        syscalls.bind(os.path.join(base, name, "tools"), target, nofollow=True)  # the exposed dirs' bind
        out[name] = sorted(os.listdir(target))
    except OSError as exc:
        out[name] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps(out))
"""


def test_an_exposed_dir_swapped_for_a_link_before_the_mount_is_not_followed(root_required: None,
                                                                            tmp_path: Path) -> None:
    # The helper checks a path, then the jail mounts it: a component swapped for a symlink in
    # between (the caller racing its own exec) must not lead the bind elsewhere.
    (tmp_path / "real" / "tools").mkdir(parents=True)
    (tmp_path / "real" / "tools" / "hello").write_text("hi\n")
    done = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable, "-c", PINNED,
                           str(tmp_path)], capture_output=True, text=True, timeout=60, cwd=HERE.parent)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"real": ["hello"], "swapped": "ELOOP"}


def test_a_policy_names_the_toolchains_a_promoted_capsule_may_have_shown(tools: Any, tmp_path: Path) -> None:
    """A toolchain the policy's expose globs do not name refuses promotion; one they name passes."""
    toolchain = Path(tempfile.mkdtemp(prefix="ccw-toolchain-", dir="/var/tmp"))
    try:
        (toolchain / "bin").mkdir()
        tool = toolchain / "bin" / "gen"
        tool.write_text("#!/bin/sh\necho generated > out.txt\n")
        tool.chmod(0o755)
        ws = tmp_path / "ws"
        ws.mkdir()

        async def run(t: Any) -> tuple[dict[str, Any], dict[str, Any]]:
            await t.call("policy_set", {"name": "elsewhere", "rules": {"expose": ["/opt/toolchains/*"]}})
            await t.call("policy_set",
                         {"name": "ours", "rules": {"expose": [str(toolchain.parent) + "/ccw-toolchain-*"]}})
            cap = (await t.call("capsule_create", {"workspace": str(ws), "expose": [str(toolchain)],
                                                   "auto_expose": False}))["capsule_id"]
            assert (await t.call("capsule_exec", {"capsule_id": cap, "cmd": [str(tool)]}))["exit_code"] == 0
            refused = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["elsewhere"], "dry_run": True})
            passed = await t.call("capsule_promote", {"capsule_id": cap, "policies": ["ours"]})
            return refused, passed

        refused, passed = tools.run(run)
        report = refused["policy_report"]
        assert refused["promoted"] is False and report["expose_ok"] is False, report
        assert [v["path"] for v in report["expose_violations"]] == [str(toolchain)]
        assert passed["promoted"] is True and passed["policy_report"]["expose_ok"] is True
        assert (ws / "out.txt").read_text() == "generated\n"
    finally:
        shutil.rmtree(toolchain)

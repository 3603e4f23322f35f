"""A root caller on a tree owned by another uid (issue 25 item 3): the capsule writes where the host's root would.

CI runs as root on a checkout of the runner's uid; ``tar`` as root keeps an sdist's
owners.  A root caller's jail keeps CAP_CHOWN, CAP_DAC_OVERRIDE, CAP_FOWNER and
CAP_FSETID (sandbox/rootcaps.py), so:

- the real project (more-itertools with its .venv, chowned to 1234:1234) takes a new
  file, a C extension's build, its own tests and their ``.pyc`` files in a capsule; its
  witness records the owners and replays true; deltamin finds the breaking edit
  instead of refusing with "the base without any change already fails";
- and what the four do not give stays refused (each test below names the capability
  that would make it fail): the system trees, the sealed root, the masked secrets,
  mounts, handles, device nodes, other users' identities, the init's /proc entries,
  the hostname, and set-id bits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mcp_server.fs.witness import read_signature
from sandbox import contain, mounts, supervise
from tests.support import realprojects
from tests.support.rootless_jail import USER, run_rootless
from tests.support.users import run_script_as

OWNER = 1234
WORKSPACE = "/srv/ccw-owners"


@pytest.fixture
def jail_dirs(root_required: None, tmp_path: Path) -> Iterator[dict[str, str]]:
    """A merged view owned by uid 1234 (mode 0755, a 0444 file in it), and the jail's /tmp and $HOME."""
    found = {}
    for name in ("merged", "tmp", "home"):
        (tmp_path / name).mkdir()
        found[name] = str(tmp_path / name)
    merged = tmp_path / "merged"
    (merged / "pkg").mkdir()
    (merged / "pkg" / "ro.txt").write_text("a\n")
    os.chmod(merged / "pkg" / "ro.txt", 0o444)
    for path in (merged, merged / "pkg", merged / "pkg" / "ro.txt"):
        os.chown(path, OWNER, OWNER)
    yield found


def jail(dirs: dict[str, str], script: str, uid: int = 0) -> supervise.JailResult:
    """Run ``sh -c script`` as ``uid`` in a jail over ``dirs``."""
    return supervise.run(contain.JailSpec(
        merged_dir=dirs["merged"], workspace=WORKSPACE, tmp_dir=dirs["tmp"], home_dir=dirs["home"],
        argv=["/bin/sh", "-c", script], cwd=WORKSPACE, env={"PATH": "/usr/bin:/bin", "HOME": "/root"},
        uid=uid, gid=uid, timeout_ms=30_000))


def lines(result: supervise.JailResult) -> list[str]:
    return result.stdout.decode().splitlines()


def test_root_keeps_exactly_the_four_and_nobody_none(jail_dirs: dict[str, str]) -> None:
    # Any broader set (CAP_DAC_READ_SEARCH, CAP_SYS_ADMIN, ...) changes these masks.
    script = "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status | cut -f2"
    assert lines(jail(jail_dirs, script)) == ["0" * 16, "000000000000001b", "000000000000001b",
                                              "000000000000001b", "0" * 16]
    assert lines(jail(jail_dirs, script, uid=65534)) == ["0" * 16] * 5


def test_root_writes_where_the_hosts_root_would(jail_dirs: dict[str, str]) -> None:
    result = jail(jail_dirs, "echo b > pkg/new.txt && echo c >> pkg/ro.txt && chown 5678:5678 pkg/new.txt "
                             "&& chmod 600 pkg/ro.txt && touch -d @0 pkg/ro.txt "
                             "&& stat -c '%u:%g %a' pkg/new.txt pkg/ro.txt")
    assert (result.exit_code, lines(result)) == (0, ["5678:5678 644", f"{OWNER}:{OWNER} 600"]), result.stderr
    assert Path(jail_dirs["merged"], "pkg", "ro.txt").read_text() == "a\nc\n"
    refused = jail(jail_dirs, "echo b > pkg/other.txt", uid=65534)
    assert refused.exit_code != 0 and b"Permission denied" in refused.stderr


def test_system_trees_and_the_sealed_root_stay_read_only(jail_dirs: dict[str, str]) -> None:
    # EROFS whatever the capabilities: no DAC capability passes a read-only mount.
    script = "; ".join(f"{cmd} 2>&1 | grep -q 'Read-only file system' && echo refused || echo WROTE"
                       for cmd in ("touch /usr/ccw-x", "chown 1:1 /usr/bin/env", "chmod 777 /etc/passwd",
                                   "mkdir /ccw-x", "touch /etc/ccw-x", "touch /sys/ccw-x",
                                   "sh -c 'echo ccw > /proc/sys/kernel/domainname'"))
    assert lines(jail(jail_dirs, script)) == ["refused"] * 7


def test_the_masked_secrets_read_empty(jail_dirs: dict[str, str]) -> None:
    assert Path("/etc/shadow").stat().st_size > 0
    result = jail(jail_dirs, "cat /etc/shadow /etc/gshadow | wc -c; stat -c '%a %s' /etc/shadow")
    assert lines(result) == ["0", "0 0"], result.stderr


def test_no_mount_handle_or_device_node(jail_dirs: dict[str, str]) -> None:
    # seccomp denies these too; CAP_SYS_ADMIN, CAP_DAC_READ_SEARCH and CAP_MKNOD are the second wall.
    probe = (
        "import ctypes, os\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "buf = ctypes.create_string_buffer(136); ctypes.c_uint.from_buffer(buf).value = 128\n"
        "mid = ctypes.c_int()\n"
        "for name, call in (('mount', lambda: libc.mount(b'none', b'/usr', None, 0x20 | 0x1000, None)),\n"
        "                   ('handle', lambda: libc.name_to_handle_at(-100, b'/usr', buf, ctypes.byref(mid), 0)),\n"
        "                   ('open_by_handle', lambda: libc.syscall(304, os.open('/usr', os.O_RDONLY), buf, 0)),\n"
        "                   ('mknod', lambda: libc.mknod(b'/tmp/null', 0o20666, os.makedev(1, 3)))):\n"
        "    print(name, 'refused' if call() != 0 else 'DONE')\n"
    )
    result = jail(jail_dirs, f"python3 -c \"{probe}\"; mount -o remount,rw /usr 2>/dev/null || echo remount refused")
    assert lines(result) == ["mount refused", "handle refused", "open_by_handle refused", "mknod refused",
                             "remount refused"], result.stderr


def test_no_other_identity_hostname_or_init_entries(jail_dirs: dict[str, str]) -> None:
    # CAP_SETUID/SETGID, CAP_SYS_ADMIN (sethostname in the jail's own uts namespace) and
    # CAP_SYS_PTRACE (the non-dumpable init's /proc/1/root, fd/N, exe, environ) would each pass one.
    # (Listing /proc/1/fd passes: the directory is root's; opening what it lists is a ptrace check.)
    probe = (
        "import os, socket\n"
        "for name, call in (('setuid', lambda: os.setuid(1234)), ('setgid', lambda: os.setgid(1234)),\n"
        "                   ('hostname', lambda: socket.sethostname('ccw-x')),\n"
        "                   ('init-root', lambda: os.listdir('/proc/1/root')),\n"
        f"                   ('init-fd', lambda: os.open('/proc/1/fd/{contain._FD_REPORT}', os.O_WRONLY)),\n"
        "                   ('init-exe', lambda: os.readlink('/proc/1/exe')),\n"
        "                   ('init-environ', lambda: open('/proc/1/environ').read())):\n"
        "    try:\n"
        "        call(); print(name, 'DONE')\n"
        "    except PermissionError:\n"
        "        print(name, 'refused')\n"
    )
    result = jail(jail_dirs, f"python3 -c \"{probe}\"")
    assert lines(result) == [f"{name} refused" for name in ("setuid", "setgid", "hostname", "init-root", "init-fd",
                                                            "init-exe", "init-environ")], result.stderr


def test_set_id_bits_made_in_the_capsule_are_inert(jail_dirs: dict[str, str]) -> None:
    # CAP_FOWNER lets root make a set-uid file of uid 1234 in its tree; no_new_privs keeps it inert.
    result = jail(jail_dirs, "cp /usr/bin/id pkg/id && chown 1234:1234 pkg/id && chmod 6755 pkg/id "
                             "&& stat -c %a pkg/id && pkg/id -u && pkg/id -g")
    assert (result.exit_code, lines(result)) == (0, ["6755", "0", "0"]), result.stderr


# --- what the four reach: the capsule's own trees, nothing else the jail sees (issue 35) ----------

OTHER = 4321  # a uid that owns nothing of the capsule's


@pytest.fixture
def others_files(jail_dirs: dict[str, str]) -> Iterator[dict[str, str]]:
    """Private files outside the capsule: another uid's, and the workspace owner's own, in 0700
    directories under /opt; and a toolchain dir of another uid (0755) holding a 0600 token."""
    top = Path(tempfile.mkdtemp(prefix="ccw-others-", dir="/opt"))
    try:
        top.chmod(0o755)
        made = {}
        for name, uid in (("other", OTHER), ("owner", OWNER)):
            private = top / name
            private.mkdir(mode=0o700)
            (private / "secret").write_text(f"{name}'s secret\n")
            (private / "secret").chmod(0o600)
            for path in (private, private / "secret"):
                os.chown(path, uid, uid)
            made[name] = str(private / "secret")
        tool = top / "tool"
        (tool / "bin").mkdir(parents=True)
        (tool / "bin" / "tool").write_text("#!/bin/sh\necho tool ran\n")
        (tool / "bin" / "tool").chmod(0o755)
        (tool / "token").write_text("ghp_token\n")
        (tool / "token").chmod(0o600)
        for path in (tool, tool / "bin", tool / "bin" / "tool", tool / "token"):
            os.chown(path, OTHER, OTHER)
        made["tool"] = str(tool)
        yield made
    finally:
        shutil.rmtree(top)


def test_root_reads_no_other_users_private_file_outside_its_trees(jail_dirs: dict[str, str],
                                                                  others_files: dict[str, str]) -> None:
    # On the host root reads them all (CAP_DAC_OVERRIDE); in the jail the four pass mode bits only in
    # the capsule's own trees, so every other tree falls back to them, even for the workspace's owner.
    tool = others_files["tool"]
    assert Path(others_files["other"]).read_text() == "other's secret\n"
    script = "; ".join(f"cat {path} 2>&1 | grep -q 'Permission denied' && echo refused || echo READ"
                       for path in (others_files["other"], others_files["owner"], f"{tool}/token"))
    result = supervise.run(contain.JailSpec(
        merged_dir=jail_dirs["merged"], workspace=WORKSPACE, tmp_dir=jail_dirs["tmp"], home_dir=jail_dirs["home"],
        argv=["/bin/sh", "-c", f"{script}; {tool}/bin/tool; ls {os.path.dirname(others_files['other'])} || true; "
              "echo b > pkg/new.txt && echo c >> pkg/ro.txt && echo wrote"],
        cwd=WORKSPACE, env={"PATH": "/usr/bin:/bin", "HOME": "/root"}, timeout_ms=30_000,
        binds=(mounts.Bind(tool, tool, exact=True),)))
    assert lines(result) == ["refused", "refused", "refused", "tool ran", "wrote"], result.stderr
    assert b"Permission denied" in result.stderr  # ls of the other uid's 0700 directory


def test_a_root_capsule_sees_no_other_users_private_file_end_to_end(tools: Any, others_files: dict[str, str],
                                                                    tmp_path: Path) -> None:
    ws = owned_checkout_small(tmp_path)
    tool = others_files["tool"]

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws), "expose": [tool], "auto_expose": False}))
        ran: dict[str, Any] = await t.call("capsule_exec", {"capsule_id": cap["capsule_id"], "cmd": [
            "sh", "-c", f"cat {others_files['other']} {tool}/token; {tool}/bin/tool; echo b > new.txt && echo wrote"]})
        return ran

    ran = tools.run(scenario)
    assert ran["stdout"] == "tool ran\nwrote\n", ran
    assert ran["stderr"].count("Permission denied") == 2 and "secret" not in ran["stdout"], ran["stderr"]


def owned_checkout_small(tmp_path: Path) -> Path:
    """A two-file workspace owned by uid 1234."""
    ws = tmp_path / "small"
    ws.mkdir()
    (ws / "a.txt").write_text("a\n")
    for path in (ws, ws / "a.txt"):
        os.chown(path, OWNER, OWNER)
    return ws


# --- the real project: more-itertools (its .venv and suite) plus a C extension, owned by uid 1234 ----------

PROJECT = realprojects.MORE_ITERTOOLS
EXT_C = """\
#include <Python.h>
static PyObject *answer(PyObject *self, PyObject *args) { return PyLong_FromLong(42); }
static PyMethodDef methods[] = {{"answer", answer, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_owners", NULL, -1, methods};
PyMODINIT_FUNC PyInit__owners(void) { return PyModule_Create(&module); }
"""
SETUP = """\
from setuptools import Extension, setup
setup(name="owners-ext", version="0", py_modules=[], ext_modules=[Extension("_owners", ["owners.c"])])
"""
# In a directory of its own (setuptools would read the project's flit pyproject.toml); the .so lands in the package.
BUILD = "(cd ext && /usr/bin/python3 setup_owners.py -q build_ext -b ../more_itertools)"
TESTS = ".venv/bin/python -m pytest -q -p no:cacheprovider tests/test_more.py -k 'Chunked or Ichunked or Sliced'"


def owned_checkout(tmp_path: Path) -> Path:
    """A copy of the prepared project with a C extension to build, every entry (links too) owned by 1234."""
    ws = realprojects.pristine(PROJECT, tmp_path / "ws")
    (ws / "ext").mkdir()
    (ws / "ext" / "owners.c").write_text(EXT_C)
    (ws / "ext" / "setup_owners.py").write_text(SETUP)
    for top, dirs, files in os.walk(ws):
        for name in [*dirs, *files]:
            os.lchown(os.path.join(top, name), OWNER, OWNER)
    os.chown(ws, OWNER, OWNER)
    return ws


async def _exec(t: Any, cap: str, script: str | list[str]) -> str:
    cmd = ["sh", "-c", script] if isinstance(script, str) else script
    ran = await t.call("capsule_exec", {"capsule_id": cap, "cmd": cmd, "timeout_ms": 300_000})
    assert ran["exit_code"] == 0, (ran["stdout"][-2000:], ran["stderr"][-3000:])
    return str(ran["stdout"])


# The workspace's top: no base entry, yet what git's "dubious ownership" and any st_uid comparison read.
TOP = "stat -c %u:%g:%a ."


def test_a_root_capsule_builds_tests_and_replays_a_checkout_of_another_uid(tools: Any, tmp_path: Path) -> None:
    ws = owned_checkout(tmp_path)
    ws.chmod(0o750)  # not the 0755 a rebuilt base's top would have anyway

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        out = [await _exec(t, cap, "echo b > more_itertools/new.txt && stat -c %u:%g more_itertools/new.txt"),
               await _exec(t, cap, f"{BUILD} && .venv/bin/python -c "
                                   "'import more_itertools._owners as m; print(m.answer())'"),
               await _exec(t, cap, TESTS),
               await _exec(t, cap, "ls more_itertools/__pycache__ tests/__pycache__ | grep -c '[.]pyc$'"),
               await _exec(t, cap, "stat -c %u:%g more_itertools/more.py ext/setup_owners.py"),
               await _exec(t, cap, TOP)]
        made = await t.call("capsule_witness", {"capsule_id": cap})
        replayed = await t.call("capsule_replay", {"witness_id": made["witness_id"]})
        return made, replayed, out

    made, replayed, out = tools.run(scenario)
    assert out[0] == "0:0\n"  # the host's root would make it root's too
    assert out[1].splitlines()[-1] == "42"
    assert "passed" in out[2]
    assert int(out[3]) >= 3  # .pyc files written: Python no longer skips them silently
    assert out[4] == f"{OWNER}:{OWNER}\n{OWNER}:{OWNER}\n"
    assert out[5] == f"{OWNER}:{OWNER}:750\n"
    assert not (ws / "more_itertools" / "new.txt").exists()  # the capsule wrote its own layer only
    with open(made["path"], "rb") as archive:
        manifest, _, _ = read_signature(archive, None)
    carried = {e["path"]: (e.get("uid"), e.get("gid")) for e in manifest["base"]["files"]}
    assert carried["more_itertools/more.py"] == carried["ext/setup_owners.py"] == (OWNER, OWNER)
    assert carried[".venv/bin/python"] == (OWNER, OWNER)  # a link's own owner
    # The replay rebuilt the base, its top too, with the recorded owners and modes, so the stat execs printed
    # the same. Only pytest's timing line may differ, and it may by chance not (CI once saw both runs take the
    # same hundredths).
    assert replayed["replay_ok"] is True, replayed["mismatches"]
    assert {d["argv"][-1] for d in replayed["output_diffs"]} <= {TESTS}, replayed["output_diffs"]
    assert manifest["base"]["top"] == {"mode": 0o750, "uid": OWNER, "gid": OWNER}
    assert replayed["owners"] == {"recorded": len(carried) + 1, "restored": len(carried) + 1, "reason": None}


def test_deltamin_finds_the_breaking_edit_instead_of_blaming_the_base(tools: Any, tmp_path: Path) -> None:
    ws = owned_checkout(tmp_path)
    edits = [*PROJECT.harmless, PROJECT.breaking]
    script = "; ".join(f"p = pathlib.Path({e.path!r}); p.write_text(p.read_text().replace({e.old!r}, {e.new!r}, 1))"
                       for e in edits)

    async def scenario(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await _exec(t, cap, [".venv/bin/python", "-c", f"import pathlib; {script}"])
        found: dict[str, Any] = await t.call("capsule_deltamin", {
            "capsule_id": cap, "target_cmd": ["sh", "-c", f"{BUILD} && {TESTS}"]})
        return found

    found = tools.run(scenario)
    changed = [line for line in found["minimal_patch"].splitlines()
               if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert changed == [f"-{PROJECT.breaking.old}", f"+{PROJECT.breaking.new}"], found["minimal_patch"]
    # Root's git refuses another uid's checkout, so what promotion leaves behind is not known: said, not failed.
    assert any(note.startswith("nothing left out as promotion would") and "dubious ownership" in note
               for note in found.get("notes", [])), found.get("notes")


def test_promotion_keeps_a_replaced_files_owner_and_refuses_set_id_bits(tools: Any, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    ws = owned_checkout(tmp_path)
    # Promotion asks the caller's git which paths are ignored, and root's git refuses a repository of
    # another uid ("dubious ownership") unless the caller's config trusts it, as CI's checkout step does.
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text(f"[safe]\n\tdirectory = {ws}\n")
    monkeypatch.setenv("HOME", str(home))
    edit = PROJECT.harmless[0]
    script = f"p = pathlib.Path({edit.path!r}); p.write_text(p.read_text().replace({edit.old!r}, {edit.new!r}, 1))"

    async def scenario(t: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await _exec(t, cap, [".venv/bin/python", "-c", f"import pathlib; {script}"])
        # CAP_FOWNER lets root make a set-uid file of uid 1234: promotion must still refuse it.
        await _exec(t, cap, "echo new > more_itertools/new.txt && cp /bin/sh more_itertools/sh "
                            "&& chown 1234:1234 more_itertools/sh && chmod 6755 more_itertools/sh")
        refused = await t.call("capsule_promote", {"capsule_id": cap})
        done = await t.call("capsule_promote", {"capsule_id": cap, "exclude": ["more_itertools/sh"]})
        return refused, done

    refused, done = tools.run(scenario)
    assert refused["promoted"] is False
    assert [(h["kind"], h["path"]) for h in refused["policy_report"]["hazards"]] == [("setuid", "more_itertools/sh")]
    assert done["promoted"] is True and set(done["applied"]) == {edit.path, "more_itertools/new.txt"}, done
    assert edit.new in (ws / edit.path).read_text()
    kept, new = (ws / edit.path).stat(), (ws / "more_itertools" / "new.txt").stat()
    assert (kept.st_uid, kept.st_gid) == (OWNER, OWNER)  # as `echo > file` by the host's root
    assert (new.st_uid, new.st_gid) == (0, 0)  # as a file the host's root creates
    assert not (ws / "more_itertools" / "sh").exists()


def test_a_rootless_callers_jail_is_its_own_uid_and_gains_nothing(base: Path) -> None:
    # The rootless helper maps its user to 0, and its command gets the user's own uid back
    # (namespaces.py's essay): another uid's directory stays closed to it in the capsule, as
    # on the host, and it keeps no capability.
    other = base / "merged" / "other"
    other.mkdir()
    os.chown(other, OWNER, OWNER)
    result = run_rootless(base, "id -u; grep -E '^Cap(Prm|Eff|Bnd)' /proc/self/status | cut -f2; "
                                "stat -c %u other; echo b > other/new.txt || echo refused")
    assert result["exit_code"] == 0, result["stderr"]
    assert str(result["stdout"]).splitlines() == [str(USER), "0" * 16, "0" * 16, "0" * 16, "65534", "refused"]
    assert not (other / "new.txt").exists() and USER != OWNER


REPLAY_AS_USER = r"""
import json, sys, trio
from mcp_server.config import TOOLSETS, Config
from mcp_server.context import CallContext, Runtime
from mcp_server.state import State
from mcp_server.tools.registry import Registry

async def main(state, witness):
    runtime = Runtime(Config.from_env({"CCW_STATE_DIR": state}), State(state))
    try:
        handler = Registry.load(TOOLSETS).lookup("capsule_replay").handler
        print(json.dumps(await handler(CallContext(runtime), {"path": witness, "allow_untrusted": True})))
    finally:
        await runtime.aclose()

trio.run(main, *sys.argv[1:])
"""


def test_a_replayer_that_is_not_root_says_it_could_not_restore_the_owners(tools: Any, tmp_path: Path,
                                                                         require: Any) -> None:
    ws = tmp_path / "ws"
    (ws / "ro").mkdir(parents=True)
    (ws / "data.txt").write_text("d\n")
    (ws / "ro" / "kept.txt").write_text("k\n")
    for path in (ws, ws / "data.txt", ws / "ro", ws / "ro" / "kept.txt"):
        os.chown(path, OWNER, OWNER)
    for directory in (ws / "ro", ws):  # read-only, as the rebuilt base will be: the replayer still removes it
        directory.chmod(0o555)

    async def record(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await _exec(t, cap, "cat data.txt ro/kept.txt >/dev/null && stat -c %u:%g data.txt")
        made: dict[str, Any] = await t.call("capsule_witness", {"capsule_id": cap})
        return made

    made = tools.run(record)
    require(shutil.which("setpriv") is not None and shutil.which("unshare") is not None, "needs util-linux")
    public = Path(tempfile.mkdtemp(prefix="ccw-owners-replay-"))
    try:
        public.chmod(0o755)
        (public / "state").mkdir()
        shutil.copy(made["path"], public / "w.tar.zst")
        subprocess.run(["chown", "-R", "65534:65534", str(public)], check=True)
        out = run_script_as(65534, 65534, [sys.executable, "-c", REPLAY_AS_USER, str(public / "state"),
                                           str(public / "w.tar.zst")], public)
        left = [str(path) for path in (public / "state" / "tmp").rglob("*")]
    finally:
        shutil.rmtree(public)
    assert left == [], left  # the rebuilt base, read-only directories and all, is gone
    # data.txt (and its directory's entry) are 1234's in the witness; the rootless replay's base is 65534's.
    assert out["owners"]["recorded"] >= 1 and out["owners"]["restored"] == 0, out["owners"]
    assert "not root" in out["owners"]["reason"]
    assert [d["exec"] for d in out["output_diffs"]] == [1], out["output_diffs"]  # stat printed another owner

"""The ``ccw`` command end to end as root: capsules survive between CLI processes; doctor here.

Each ``ccw`` invocation is its own process sharing one state dir, so the capsule made by
``create`` must still be there for ``exec``, ``diff``, ``promote``: the detached helper
started by the first command serves them all (same pid throughout) until ``helper stop``.
"""

from __future__ import annotations

import json
import os
import select
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support.cli_process import CCW, ROOT, ccw, cli_env


def test_capsule_lifecycle_across_cli_processes(cli_state: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "a.txt").write_text("hello\n")

    capsule_id = ccw(cli_state, "capsule", "create", str(workspace)).stdout.strip()
    assert capsule_id.startswith("cap_")
    helper = json.loads(ccw(cli_state, "helper", "status", "--json").stdout)
    assert helper["running"] is True and helper["mode"] == "privileged" and helper["pid"] > 1

    ran = ccw(cli_state, "capsule", "exec", capsule_id, "--",
              "sh", "-c", "echo out; echo err >&2; echo changed > a.txt; echo new > b.txt; exit 3", check=False)
    assert ran.returncode == 3, ran.stderr
    assert ran.stdout == "out\n" and "err\n" in ran.stderr
    assert (workspace / "a.txt").read_text() == "hello\n"  # the live tree is untouched

    listed = json.loads(ccw(cli_state, "capsule", "list", "--json").stdout)
    assert [c["capsule_id"] for c in listed["capsules"]] == [capsule_id]
    assert listed["capsules"][0]["execs"] == 1

    diff = ccw(cli_state, "capsule", "diff", capsule_id)  # piped: plain
    assert "\x1b[" not in diff.stdout
    assert "-hello\n+changed\n" in diff.stdout and "+new\n" in diff.stdout
    assert "1 added, 1 modified, 0 deleted" in diff.stderr

    dry = ccw(cli_state, "capsule", "promote", capsule_id, "--policy", "baseline", "--dry-run")
    assert dry.stdout.split() == ["a.txt", "b.txt"] and "would promote" in dry.stderr
    assert not (workspace / "b.txt").exists()

    witnessed = ccw(cli_state, "capsule", "witness", capsule_id)
    witness_id, witness_path = witnessed.stdout.strip(), witnessed.stderr.splitlines()[-1].split()[0]
    assert witness_id.startswith("wit_") and Path(witness_path).is_file()
    replay = ccw(cli_state, "capsule", "replay", witness_id)
    assert replay.stdout.strip() == "replay_ok"

    promoted = json.loads(ccw(cli_state, "capsule", "promote", capsule_id, "--json").stdout)
    assert promoted["promoted"] is True and promoted["applied"] == ["a.txt", "b.txt"]
    assert (workspace / "a.txt").read_text() == "changed\n" and (workspace / "b.txt").read_text() == "new\n"

    assert ccw(cli_state, "capsule", "destroy", capsule_id).stdout.strip() == f"destroyed {capsule_id}"
    assert json.loads(ccw(cli_state, "capsule", "list", "--json").stdout)["capsules"] == []
    after = json.loads(ccw(cli_state, "helper", "status", "--json").stdout)
    assert after["pid"] == helper["pid"]  # one helper served every command


def test_a_forks_witness_replays_its_parents_runs_first(cli_state: Path, tmp_path: Path) -> None:
    # Found in a trial: a fork's witness held the fork's own runs only, so its replay (from
    # the base) found the parent's files absent and the fork's reads of them different, and
    # every strict promotion of a fork whose parent had run failed require_replay_ok.
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "data.txt").write_text("v1\n")
    parent = ccw(cli_state, "capsule", "create", str(workspace)).stdout.strip()
    ccw(cli_state, "capsule", "exec", parent, "--", "sh", "-c", "echo v2 > data.txt; echo new > extra.txt")
    fork = ccw(cli_state, "capsule", "fork", parent).stdout.strip()
    ccw(cli_state, "capsule", "exec", fork, "--", "sh", "-c", "cat data.txt > copy.txt; rm extra.txt")
    grandchild = ccw(cli_state, "capsule", "fork", fork).stdout.strip()
    ccw(cli_state, "capsule", "exec", grandchild, "--", "sh", "-c", "cat copy.txt >> data.txt")
    for capsule_id in (fork, grandchild):
        witness_id = ccw(cli_state, "capsule", "witness", capsule_id).stdout.strip()
        replay = ccw(cli_state, "capsule", "replay", witness_id, "--json")
        assert json.loads(replay.stdout)["replay_ok"] is True, replay.stdout
    dry = ccw(cli_state, "capsule", "promote", grandchild, "--policy", "strict", "--dry-run")
    assert dry.stdout.split() == ["copy.txt", "data.txt"] and "policy strict passed" in dry.stderr, dry.stderr
    for capsule_id in (grandchild, fork, parent):
        ccw(cli_state, "capsule", "destroy", capsule_id)


def test_exec_prints_its_output_as_it_comes_each_stream_once(cli_state: Path, tmp_path: Path) -> None:
    """Piped, as a script or an agent runs it: the command's first line comes while it still
    runs (it waits for a file the test makes only after reading that line), stdout to stdout
    and stderr to stderr, every byte once, more than a report carries among them."""
    workspace, gate = tmp_path / "ws", tmp_path / "gate"
    workspace.mkdir()
    gate.mkdir()
    capsule_id = ccw(cli_state, "capsule", "create", "--expose", str(gate), str(workspace)).stdout.strip()
    script = (f"echo first; echo warn >&2; while [ ! -e {shlex.quote(str(gate))}/go ]; do sleep 0.1; done; "
              "seq 1 100000; echo last >&2")
    proc = subprocess.Popen([*CCW, "capsule", "exec", "--timeout-ms", "600000", capsule_id, "--", "sh", "-c", script],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=cli_env(cli_state), cwd=ROOT)
    try:
        assert proc.stdout is not None
        # The command cannot end before the gate opens: a first line printed only at its end never comes.
        ready, _, _ = select.select([proc.stdout], [], [], 60.0)  # a bound for a loaded machine, not a timing check
        assert ready, "ccw printed nothing of a command that is still running"
        first = proc.stdout.readline()
        assert first == b"first\n"
        (gate / "go").touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert first + out == b"first\n" + "".join(f"{n}\n" for n in range(1, 100_001)).encode()
    assert err.count(b"warn\n") == 1 and err.count(b"last\n") == 1


def test_of_commands_started_at_once_only_the_one_that_started_the_helper_says_so(cli_state: Path) -> None:
    procs = [subprocess.Popen([*CCW, "capsule", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=cli_env(cli_state), cwd=ROOT, text=True) for _ in range(8)]
    ended = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 8, ended
    told = [err for _, err in ended if "started a helper" in err]
    assert len(told) == 1, ended


def test_capsule_errors_are_reported_with_codes(cli_state: Path, tmp_path: Path) -> None:
    missing = ccw(cli_state, "capsule", "exec", "cap_0000000000000_00000000", "--", "true", check=False)
    assert missing.returncode == 1 and "ccw: NOT_FOUND" in missing.stderr
    bad = ccw(cli_state, "capsule", "destroy", "not-a-capsule", check=False)
    assert bad.returncode == 2 and "input schema" in bad.stderr


def test_doctor_as_root_reports_privileged_and_everything_here(root_required: None,
                                                               require: Callable[[bool, str], None]) -> None:
    done = subprocess.run([*CCW, "doctor", "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["mode"] == "privileged" and report["can_run"] is True
    assert report["modes"]["privileged"]["ok"] is True
    checks = {c["name"]: c for c in report["checks"]}
    for name in ("namespace.user", "namespace.mount", "namespace.pid", "namespace.net", "namespace.uts",
                 "namespace.ipc", "namespace.cgroup", "overlayfs", "fanotify", "seccomp", "openat2", "egress_network"):
        assert checks[name]["ok"] is True, checks[name]
    require(checks["namespace.time"]["ok"] is True, "this kernel has no time namespace")
    assert checks["cgroups"]["ok"] is True, checks["cgroups"]
    assert not [c for c in report["checks"] if c["ok"] is False]
    text = subprocess.run([*CCW, "doctor"], capture_output=True, text=True, timeout=120).stdout
    assert "capsules can run here: privileged mode" in text and "\x1b[" not in text


def _as_user_command(user: str, argv: list[str], keep_dirs: list[str]) -> list[str]:
    # The interpreter may live under a directory other users cannot search (/root/.pyenv):
    # in a private mount namespace, put a 0755 tmpfs over each such directory with just
    # the needed child bound back, then drop to the user.
    needed = [os.path.realpath(sys.executable), sys.base_prefix, sys.prefix, str(ROOT)]
    lines = ["set -e"]
    seen: set[str] = set()
    for path in needed:
        parts = Path(path).parts
        for depth in range(1, len(parts) - 1):
            directory = os.path.join(*parts[:depth])
            if os.stat(directory).st_mode & 0o001:
                continue
            if directory not in seen:
                seen.add(directory)
                keep = tempfile.mkdtemp(prefix="ccw-cli-keep-")
                keep_dirs.append(keep)  # removed by the caller once the namespace is gone
                lines += [f"mount --bind {shlex.quote(directory)} {shlex.quote(keep)}",
                          f"mount -t tmpfs -o mode=0755 ccw-cli-test {shlex.quote(directory)}"]
                child = parts[depth]
                lines.append(f"mkdir -p {shlex.quote(os.path.join(directory, child))} && mount --bind "
                             f"{shlex.quote(os.path.join(keep, child))} {shlex.quote(os.path.join(directory, child))}")
            break
    lines.append(f"exec setpriv --reuid={user} --regid={user} --init-groups -- {shlex.join(argv)}")
    return ["unshare", "--mount", "--propagation", "slave", "sh", "-c", "\n".join(lines)]


@pytest.fixture
def unprivileged_user(root_required: None, require: Callable[[bool, str], None]) -> Iterator[str]:
    """A throwaway system user (removed afterwards)."""
    require(all(shutil.which(t) for t in ("useradd", "userdel", "setpriv", "unshare")),
            "needs useradd, setpriv and unshare")
    name = f"ccwcli{uuid.uuid4().hex[:6]}"
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True)
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], check=True)


def test_doctor_as_an_unprivileged_user_reports_rootless_and_fixes(unprivileged_user: str, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    shutil.chown(home, unprivileged_user, unprivileged_user)
    os.chmod(tmp_path, 0o755)
    argv = ["env", f"HOME={home}", f"CCW_STATE_DIR={home}/state", *CCW, "doctor", "--json"]
    keep_dirs: list[str] = []
    try:
        done = subprocess.run(_as_user_command(unprivileged_user, argv, keep_dirs), capture_output=True,
                              text=True, timeout=120, cwd="/")
    finally:
        for keep in keep_dirs:
            os.rmdir(keep)
    report = json.loads(done.stdout)
    assert report["euid"] != 0 and report["user"] == unprivileged_user
    checks = {c["name"]: c for c in report["checks"]}
    assert report["modes"]["privileged"]["ok"] is False
    if checks["namespace.user"]["ok"]:
        assert report["mode"] == "rootless" and done.returncode == 0, done.stderr
        assert checks["overlayfs"]["ok"] is True and "userxattr" in checks["overlayfs"]["detail"]
        assert "inside a user namespace" in checks["namespace.net"]["detail"]
        assert checks["egress_network"]["ok"] is True and "veth" in checks["egress_network"]["detail"]
    else:  # user namespaces are off: the fix names the sysctl
        assert "sysctl" in checks["namespace.user"]["fix"] or "root" in checks["namespace.user"]["fix"]
    assert checks["fanotify"]["ok"] is False and "root" in checks["fanotify"]["fix"]
    assert checks["cgroups"]["ok"] is False and "delegat" in checks["cgroups"]["fix"]

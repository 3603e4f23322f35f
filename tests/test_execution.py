"""sandbox/execution.py without a kernel: the jail an exec request becomes.

And the checks that depend on the capsule, each made there once (the jail itself:
vm-tests/test_capsules_exec.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import egress, execution
from sandbox.errors import CcwError
from sandbox.meta import Capsule
from sandbox.ops import ExecRequest
from sandbox.spec import DEFAULT_HOME, DEFAULT_LANG, DEFAULT_PATH, CapsuleSpec, Limits


def _capsule(tmp_path: Path, **spec: object) -> Capsule:
    return Capsule("cap_1", str(tmp_path / "cap_1"), {}, CapsuleSpec(workspace="/w", **spec))  # type: ignore[arg-type]


def test_a_request_becomes_one_jail_spec(tmp_path: Path) -> None:
    capsule = _capsule(tmp_path, clock_offset_sec=30, env_whitelist=("CI",))
    request = ExecRequest("cap_1", ("sh", "-c", "x"), cwd="/w/sub", env={"CI": "1"}, stdin=b"in", timeout_ms=9,
                          output_cap=5)
    jail = execution.jail_spec(capsule, request, 1000, 1000)
    assert (jail.argv, jail.cwd, jail.stdin, jail.timeout_ms, jail.output_cap) == (
        ["sh", "-c", "x"], "/w/sub", b"in", 9, 5)
    assert jail.env == {"PATH": f"/w/.venv/bin:{DEFAULT_PATH}", "HOME": DEFAULT_HOME, "LANG": DEFAULT_LANG, "CI": "1"}
    assert (jail.uid, jail.gid, jail.clock_offset_sec, jail.workspace) == (1000, 1000, 30, "/w")
    assert jail.merged_dir == capsule.path("merged") and jail.home_dir == capsule.path("home")
    # The request's own defaults are the jail's: none is decided again here.
    bare = execution.jail_spec(capsule, ExecRequest.from_args({"capsule_id": "cap_1", "argv": ["true"]}), 0, 0)
    assert (bare.cwd, bare.timeout_ms, bare.output_cap) == ("/w", 300_000, 1 << 20)


def test_the_given_variables_override_the_defaults_and_egress_adds_its_proxies(tmp_path: Path) -> None:
    request = ExecRequest("cap_1", ("true",), env={"PATH": "/bin", "LANG": "en_US.UTF-8"})
    assert execution.jail_env(_capsule(tmp_path), request) == {"PATH": "/bin", "HOME": DEFAULT_HOME,
                                                                "LANG": "en_US.UTF-8"}
    proxied = execution.jail_env(_capsule(tmp_path, network="egress"), request)
    assert proxied == {**egress.PROXY_ENV, "PATH": "/bin", "HOME": DEFAULT_HOME, "LANG": "en_US.UTF-8"}


@pytest.mark.parametrize(("request_", "message"), [
    (ExecRequest("cap_1", ("true",), env={"SECRET": "x"}), "env variable SECRET is not in the capsule's env_whitelist"),
    (ExecRequest("cap_1", ("true",), env={"TERM": "xterm"}), "env variable TERM is not in"),
    (ExecRequest("cap_1", ("true",), cwd="/w/../etc"), "cwd '/w/../etc' is outside the workspace /w"),
    (ExecRequest("cap_1", ("true",), cwd="/elsewhere"), "is outside the workspace /w; give a path relative to it"),
])
def test_what_the_capsule_refuses_is_refused_before_anything_runs(tmp_path: Path, request_: ExecRequest,
                                                                   message: str) -> None:
    with pytest.raises(CcwError) as caught:
        execution.jail_spec(_capsule(tmp_path), request_, 0, 0)
    assert caught.value.code == "INVALID_ARGUMENT" and message in caught.value.message


def test_a_terminal_session_may_pass_its_term(tmp_path: Path) -> None:
    request = ExecRequest("cap_1", ("sh",), env={"TERM": "xterm"}, stdio="tty", tty_fd=9)
    jail = execution.jail_spec(_capsule(tmp_path), request, 0, 0)
    assert jail.env["TERM"] == "xterm" and jail.tty_fd == 9


def test_an_execs_limits_only_tighten_the_capsules(tmp_path: Path) -> None:
    capsule = _capsule(tmp_path, limits=Limits(memory_mb=256, pids_max=64, disk_mb=128))
    assert execution.exec_limits(capsule, ExecRequest("cap_1", ("true",))) == {"memory_mb": 256, "pids_max": 64}
    tighter = ExecRequest("cap_1", ("true",), limits=Limits(memory_mb=512, pids_max=8, cpu_ms=100, disk_mb=1 << 20))
    assert execution.exec_limits(capsule, tighter) == {"memory_mb": 256, "pids_max": 8, "cpu_ms": 100}

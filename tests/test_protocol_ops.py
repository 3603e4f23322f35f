"""The closed op set: every op's argument schema (types, required/optional, bounds, no unknown keys)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from sandbox.checks import MAX_ARGV, MAX_OUTPUT_CAP, MAX_PATH, MAX_STDIN
from sandbox.errors import ProtocolError
from sandbox.ops import OPS, encode_request, validate_args

GOOD: dict[str, list[dict[str, Any]]] = {
    "hello": [{"version": 1}],
    "create": [
        {"workspace": "/srv/project"},
        {
            "workspace": "/srv/project",
            "base": None,
            "clock_offset_sec": -3600,
            "env_whitelist": ["PYTHONPATH", "CI"],
            "limits": {"memory_mb": 512, "pids_max": 64, "cpu_ms": 1000},
            "network": "egress",
        },
        {"workspace": "/w", "base": "/var/lib/ccw/snap/abc", "limits": {}},
    ],
    "exec": [
        {"capsule_id": "cap_0001700000000000_1a2b", "argv": ["true"]},
        {
            "capsule_id": "cap_1",
            "argv": ["sh", "-c", "echo hi"],
            "cwd": "/srv/project/sub",
            "env": {"PATH": "/usr/bin", "LANG": "C.UTF-8"},
            "stdin_b64": base64.b64encode(b"input").decode(),
            "timeout_ms": 1000,
            "limits": {"memory_mb": 64},
            "output_cap": 0,
        },
        {"capsule_id": "cap_1", "argv": ["x"], "cwd": None, "stdin_b64": None, "output_cap": MAX_OUTPUT_CAP},
    ],
    "changes": [{"capsule_id": "cap_1"}],
    "fork": [{"capsule_id": "cap_1"}, {"capsule_id": "cap_1", "donors": []},
             {"capsule_id": "cap_1", "donors": [f"cap_{i}" for i in range(2, 10)]}],
    "open_root": [{"capsule_id": "cap_1"}],
    "net_open": [{"capsule_id": "cap_1"}],
    "run_reads": [{"capsule_id": "cap_1", "service": "web"}],
    "destroy": [{"capsule_id": "cap_1"}],
    "list": [{}],
}

BAD: list[tuple[str, dict[str, Any]]] = [
    ("hello", {}),
    ("hello", {"version": "1"}),
    ("hello", {"version": True}),
    ("hello", {"version": 1, "x": 1}),
    ("create", {}),
    ("create", {"workspace": "relative/path"}),
    ("create", {"workspace": "/a\x00b"}),
    ("create", {"workspace": "/" + "a" * MAX_PATH}),
    ("create", {"workspace": 5}),
    ("create", {"workspace": "/w", "base": "rel"}),
    ("create", {"workspace": "/w", "clock_offset_sec": 1.5}),
    ("create", {"workspace": "/w", "clock_offset_sec": 10**12}),
    ("create", {"workspace": "/w", "env_whitelist": "PATH"}),
    ("create", {"workspace": "/w", "env_whitelist": ["A=B"]}),
    ("create", {"workspace": "/w", "env_whitelist": ["1A"]}),
    ("create", {"workspace": "/w", "limits": {"memory_mb": 0}}),
    ("create", {"workspace": "/w", "limits": {"memory_mb": -1}}),
    ("create", {"workspace": "/w", "limits": {"swap_mb": 1}}),
    ("create", {"workspace": "/w", "limits": []}),
    ("create", {"workspace": "/w", "network": "host"}),
    ("create", {"workspace": "/w", "network": ["pypi.org"]}),  # the allowlist is the front end's alone
    ("net_open", {}),
    ("net_open", {"capsule_id": "cap_1", "network": "egress"}),
    ("create", {"workspace": "/w", "owner_uid": 0}),
    ("exec", {"capsule_id": "cap_1"}),
    ("exec", {"argv": ["true"]}),
    ("exec", {"capsule_id": "../etc", "argv": ["true"]}),
    ("exec", {"capsule_id": "cap_../x", "argv": ["true"]}),
    ("exec", {"capsule_id": "cap_", "argv": ["true"]}),
    ("exec", {"capsule_id": "cap_1", "argv": []}),
    ("exec", {"capsule_id": "cap_1", "argv": [""]}),
    ("exec", {"capsule_id": "cap_1", "argv": "true"}),
    ("exec", {"capsule_id": "cap_1", "argv": ["a\x00"]}),
    ("exec", {"capsule_id": "cap_1", "argv": ["echo", "\udcff"]}),  # no exec can be given a lone surrogate
    ("exec", {"capsule_id": "cap_1", "argv": ["x"] * (MAX_ARGV + 1)}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x" * (3 * 1024 * 1024)]}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "env": {"A B": "1"}}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "env": {"A": 1}}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "env": {"A": "\x00"}}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "env": {"A": "\ud800"}}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "env": ["A"]}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "stdin_b64": "!!!"}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "stdin_b64": "A" * ((MAX_STDIN + 3) // 3 * 4 + 4)}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "timeout_ms": 10**12}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "output_cap": MAX_OUTPUT_CAP + 1}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "cwd": "sub"}),
    ("exec", {"capsule_id": "cap_1", "argv": ["x"], "uid": 0}),
    ("changes", {}),
    ("changes", {"capsule_id": 1}),
    ("fork", {"capsule_id": "cap_1", "workspace": "/w"}),
    ("fork", {"capsule_id": "cap_1", "donors": "cap_2"}),
    ("fork", {"capsule_id": "cap_1", "donors": ["cap_2", "../cap_3"]}),
    ("fork", {"capsule_id": "cap_1", "donors": [None]}),
    ("fork", {"capsule_id": "cap_1", "donors": ["cap_2", "cap_2"]}),
    ("fork", {"capsule_id": "cap_1", "donors": [f"cap_{i}" for i in range(2, 11)]}),
    ("open_root", {"capsule_id": "cap_1/.."}),
    ("destroy", {"capsule_id": None}),
    ("list", {"uid": 0}),
    ("exec", {"capsule_id": "cap_1", "argv": ["true"], "service": "Web"}),
    ("exec", {"capsule_id": "cap_1", "argv": ["true"], "stream": 1}),
    ("signal", {"capsule_id": "cap_1", "service": "web", "signal": "SIGSTOP"}),
    ("freeze", {"capsule_id": "cap_1", "frozen": "yes"}),
    ("net_connect", {"capsule_id": "cap_1", "port": 0}),
    ("net_connect", {"capsule_id": "cap_1", "port": 65536}),
    ("run_reads", {"capsule_id": "cap_1"}),
    ("run_reads", {"capsule_id": "cap_1", "service": "Web"}),
    ("run_reads", {"capsule_id": "cap_1", "service": "web", "signal": "SIGTERM"}),
    ("mount", {}),
    ("HELLO", {"version": 1}),
    ("", {}),
]


def test_op_set_is_closed_and_each_op_argues_its_safety() -> None:
    assert set(OPS) == {"hello", "create", "exec", "changes", "fork", "open_root", "net_open", "signal", "freeze",
                        "net_connect", "net_forward", "run_reads", "destroy", "list"}
    for spec in OPS.values():
        assert len(spec.safety) > 40, spec.name
        assert not set(spec.required) & set(spec.optional)


@pytest.mark.parametrize(("op", "args"), [(op, a) for op, cases in GOOD.items() for a in cases])
def test_good_arguments(op: str, args: dict[str, Any]) -> None:
    assert validate_args(op, args) == args
    assert encode_request(1, op, args)


@pytest.mark.parametrize(("op", "args"), BAD)
def test_bad_arguments(op: str, args: dict[str, Any]) -> None:
    with pytest.raises(ProtocolError) as info:
        validate_args(op, args)
    assert info.value.code == "INVALID_ARGUMENT"
    # The front end refuses to send what the helper would refuse.
    with pytest.raises(ProtocolError):
        encode_request(1, op, args)


def test_no_time_limit_is_for_services_only() -> None:
    from sandbox.ops import ExecRequest

    with pytest.raises(ProtocolError) as info:
        ExecRequest.from_args({"capsule_id": "cap_1", "argv": ["x"], "timeout_ms": 0})
    assert info.value.details == {"argument": "timeout_ms"}
    request = ExecRequest.from_args({"capsule_id": "cap_1", "argv": ["x"], "timeout_ms": 0, "service": "web",
                                     "stream": True})
    assert request.service == "web" and request.stream and request.timeout_ms == 0
    assert ExecRequest.from_args(request.to_args()) == request
    assert ExecRequest.from_args({"capsule_id": "cap_1", "argv": ["x"], "stdio": "stdin"}).descriptors_wanted() == 1


def test_args_must_be_an_object() -> None:
    with pytest.raises(ProtocolError):
        validate_args("list", [])


def test_caller_identity_is_never_an_argument() -> None:
    # Owner and caller uids come from SO_PEERCRED only.
    for spec in OPS.values():
        names = set(spec.required) | set(spec.optional)
        assert not {n for n in names if "uid" in n or "gid" in n or "owner" in n}, spec.name

"""Fuzzing ccw-jail's plan parser (sandbox/jail/plan.c) under ASan and UBSan, for a bounded time.

Plans the helper really writes (sandbox/jail_launcher.encode), mutated byte by byte and
record by record (lengths at and past their bounds, records dropped, doubled, reordered,
strings grown to their bounds), go through the parser built alone with both sanitizers
(tests/support/jail_parser.py).  No input may crash it, trip a sanitizer or come out
accepted with a broken promise of jail.h (the harness aborts then).  The seed is in the
failure message, to replay a finding.
"""

from __future__ import annotations

import random
import struct
import time

import pytest

from sandbox import contain, jail_interface, jail_launcher, mounts, namespaces, seccomp
from tests.support import jail_parser

BUDGET_S = 8.0  # CI's time is short: a few thousand plans a run, a new seed each run
LIMITS = jail_interface.LIMITS
EDGES = [0, 1, 4, 7, 8, 9, 12, 36, 0x7FFFFFFF, 0xFFFFFFFF, *(LIMITS[name] + delta for name in (
    "MAX_HOSTNAME", "MAX_PATH", "MAX_STEP_NAME", "MAX_ARG", "MAX_TIMENS") for delta in (-1, 0, 1))]

pytestmark = pytest.mark.skipif(jail_parser.compiler() is None, reason="no C compiler (./dev setup installs gcc)")


def _plans() -> list[bytes]:
    """The plans of a real exec's shapes: a tree built ahead or not, sources passed, a tty, a notifying filter."""
    steps = [mounts.MountStep("private", "/"), mounts.MountStep("root", "/tmp"),
             mounts.MountStep("bind", "/ws", "/.oldroot/src", attrs=6, data="nofollow"),
             mounts.MountStep("bind", "/etc/hosts", "9", source_is_file=True, from_fd=True),
             mounts.MountStep("console", "/dev/console", "10", from_fd=True), mounts.MountStep("proc", "/proc")]
    filt = seccomp.prepare()
    plan = contain.Plan(
        ns=namespaces.NamespacePlan(hostname="box", timens_offsets=b"monotonic 5 0\n"), mount_steps=steps,
        argv=["sh", "-c", "echo é"], env={"PATH": "/bin", "A": "b=c"}, cwd="/ws", uid=1000, gid=1001,
        set_uid=True, set_gid=True, clear_groups=True, last_cap=40, keep_caps=1, seccomp_filter=filt,
        controlling_tty=True, notify_filter=seccomp.prepare(notifying=True))
    return [jail_launcher.encode(plan, jail_launcher.ROOT | jail_launcher.DIRECT, 1, notify_fd=11,
                                 notify_key=bytes(range(8))),
            jail_launcher.encode(plan, 0, 0),
            jail_launcher.encode(contain.Plan(**{**plan.__dict__, "mount_steps": steps[:3], "seccomp_filter": None,
                                                 "notify_filter": None}), jail_launcher.NET, 16)]


def _records(raw: bytes) -> list[tuple[bytes, bytes]]:
    records, offset = [], 8
    while offset + 5 <= len(raw):
        (length,) = struct.unpack_from("=I", raw, offset + 1)
        records.append((raw[offset:offset + 1], raw[offset + 5:offset + 5 + length]))
        offset += 5 + length
    return records


def _join(magic: bytes, records: list[tuple[bytes, bytes]], lengths: dict[int, int] | None = None) -> bytes:
    lengths = lengths or {}
    return magic + b"".join(tag + struct.pack("=I", lengths.get(i, len(payload))) + payload
                            for i, (tag, payload) in enumerate(records))


def _mutate(rng: random.Random, raw: bytes) -> bytes:
    records = _records(raw)
    if not records or len(raw) <= 9:  # nothing left to mutate but its length
        return raw + rng.randbytes(rng.randrange(1, 32))
    i = rng.randrange(len(records))
    tag, payload = records[i]
    kind = rng.randrange(8)
    if kind == 0:  # bytes flipped anywhere past the magic
        data = bytearray(raw)
        for _ in range(rng.randint(1, 8)):
            data[rng.randrange(8, len(data))] = rng.randrange(256)
        return bytes(data)
    if kind == 1:  # a record's length field at an edge
        return _join(raw[:8], records, {i: rng.choice(EDGES)})
    if kind == 2:  # a record dropped, doubled or moved
        moved = records.pop(i)
        if rng.random() < 0.7:
            records.insert(rng.randrange(len(records) + 1), moved)
        if rng.random() < 0.3:
            records.insert(rng.randrange(len(records) + 1), moved)
        return _join(raw[:8], records)
    if kind == 3:  # a string grown to (or past) its bound, NUL kept
        size = rng.choice(EDGES[10:])
        grown = payload[:-1] + b"x" * max(0, size - len(payload)) + b"\0" if payload.endswith(b"\0") else payload * 2
        records[i] = (tag, grown)
        return _join(raw[:8], records)
    if kind == 4:  # a payload cut, or a NUL inside it
        cut = rng.randrange(len(payload) + 1)
        records[i] = (tag, payload[:cut] + (b"\0" + payload[cut:] if rng.random() < 0.5 else b""))
        return _join(raw[:8], records)
    if kind == 5:  # a record of another tag, or random bytes, with this payload
        records[i] = (bytes([rng.choice(b"OhtfucaemrZXq\0")]),
                      payload if rng.random() < 0.7 else rng.randbytes(rng.randrange(64)))
        return _join(raw[:8], records)
    if kind == 6:  # a step's numbers (action, attrs, bits) or a descriptor source's digits changed
        if tag in (b"m", b"r") and len(payload) >= 12:
            word = struct.pack("=I", rng.choice([0, 1, 16, 17, 0xFFFFFFFF, rng.randrange(1 << 32), 7, 3]))
            at = rng.choice([0, 4, 8])
            records[i] = (tag, payload[:at] + word + payload[at + 4:])
        else:
            fd = rng.choice([b"", b"-1", b"7", b"08", b"9x", b"99999999999999999999", b" 9", b"1048"])
            records[i] = (b"m", struct.pack("=3I", 3, 0, 4) + b"/t\0" + fd + b"\0\0name\0")
        return _join(raw[:8], records)
    return raw[:rng.randrange(8, len(raw))]  # cut short


def test_no_plan_crashes_the_parser_or_breaks_its_promises(tmp_path) -> None:  # type: ignore[no-untyped-def]
    binary = jail_parser.build(str(tmp_path))
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    corpus = _plans()
    accepted, reasons, tried = 0, set(), 0
    deadline = time.monotonic() + BUDGET_S
    while time.monotonic() < deadline:
        batch = []
        for _ in range(400):
            plan = rng.choice(corpus)
            for _ in range(rng.choice([1, 1, 2, 3])):
                plan = _mutate(rng, plan)
            batch.append(plan)
        status, lines, errors = jail_parser.run(binary, batch)
        assert status == 0 and len(lines) == len(batch), f"seed {seed}: the parser failed ({status}):\n{errors[-3000:]}"
        accepted += sum(line.startswith("ok") for line in lines)
        reasons |= {line for line in lines if line.startswith("refused")}
        tried += len(batch)
    # The mutations reach past the magic and the framing: into the records' own checks.
    assert accepted > 0 and len(reasons) >= 8, f"seed {seed}: {tried} plans, {accepted} accepted, reasons {reasons}"


def test_the_real_plans_are_read_as_written(tmp_path) -> None:  # type: ignore[no-untyped-def]
    status, lines, errors = jail_parser.run(jail_parser.build(str(tmp_path)), _plans())
    assert status == 0, errors
    options = (jail_launcher.ROOT | jail_launcher.DIRECT | jail_launcher.SET_UID | jail_launcher.SET_GID
               | jail_launcher.CLEAR_GROUPS | jail_launcher.CONTROLLING_TTY)
    assert lines[0].startswith(f"ok options={options} uid=1000 gid=1001 cgroups=1 argc=3 envc=2 steps=6 root_steps=0")
    bind, fd_bind = (f"{jail_interface.ACTIONS['bind']}:6:{jail_launcher.NOFOLLOW}",
                     f"{jail_interface.ACTIONS['bind']}:0:{jail_launcher.SOURCE_FD | jail_launcher.SOURCE_IS_FILE}")
    assert lines[0].split()[9:] == ["1:0:0", "2:0:0", bind, fd_bind,
                                    f"{jail_interface.ACTIONS['console']}:0:{jail_launcher.SOURCE_FD}", "7:0:0"]
    assert f"root_steps={len(mounts.root_steps())}" in lines[1] and "cgroups=16" in lines[2]

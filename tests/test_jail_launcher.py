"""The plan as sandbox/jail_launcher.py writes it for ccw-jail (the format of sandbox/jail/jail.h), no root needed."""

from __future__ import annotations

import struct

import pytest

from sandbox import contain, jail_launcher, mounts, namespaces, seccomp


def _records(raw: bytes) -> list[tuple[bytes, bytes]]:
    assert raw[:8] == jail_launcher.MAGIC
    records, offset = [], 8
    while offset < len(raw):
        (length,) = struct.unpack_from("=I", raw, offset + 1)
        records.append((raw[offset:offset + 1], raw[offset + 5:offset + 5 + length]))
        offset += 5 + length
    assert offset == len(raw)
    return records


def _plan(**changes: object) -> contain.Plan:
    fields: dict[str, object] = dict(
        ns=namespaces.NamespacePlan(hostname="box", timens_offsets=b"monotonic 5 0\n"),
        mount_steps=[mounts.MountStep("private", "/"), mounts.MountStep("root", "/tmp"),
                     mounts.MountStep("bind", "/ws", "/.oldroot/src", attrs=6, data="nofollow")],
        argv=["sh", "-c", "echo é"], env={"PATH": "/bin", "A": "b=c"}, cwd="/ws", uid=1000, gid=1001,
        set_uid=True, set_gid=False, clear_groups=True, last_cap=40, keep_caps=(1 << 35) | 1,
        seccomp_filter=seccomp.prepare(), controlling_tty=True)
    fields.update(changes)
    return contain.Plan(**fields)  # type: ignore[arg-type]


def test_the_plan_is_magic_then_records_ending_in_z() -> None:
    records = _records(jail_launcher.encode(_plan(), jail_launcher.DIRECT | jail_launcher.ROOT, 2))
    tags = [tag for tag, _ in records]
    assert tags[0] == b"O" and tags[-1] == b"Z" and records[-1][1] == b""
    assert [p for t, p in records if t == b"a"] == [b"sh\0", b"-c\0", "echo é\0".encode()]
    assert [p for t, p in records if t == b"e"] == [b"PATH=/bin\0", b"A=b=c\0"]
    assert dict(records)[b"h"] == b"box\0" and dict(records)[b"c"] == b"/ws\0"
    assert dict(records)[b"t"] == b"monotonic 5 0\n"


def test_the_options_word_carries_credentials_and_bits() -> None:
    options = dict(_records(jail_launcher.encode(_plan(), jail_launcher.NET | jail_launcher.ROOT, 3)))[b"O"]
    flags, bits, uid, gid, last_cap, end, cgroups, low, high = struct.unpack("=9I", options)
    assert flags == namespaces.JAIL_FLAGS and (uid, gid, last_cap, cgroups) == (1000, 1001, 40, 3)
    assert bits == (jail_launcher.NET | jail_launcher.ROOT | jail_launcher.SET_UID | jail_launcher.CLEAR_GROUPS
                    | jail_launcher.CONTROLLING_TTY)
    assert end == int(contain.END_SIGNAL) and (low, high) == (1, 1 << 3)


def test_a_rootless_plan_asks_for_the_commands_own_user_namespace() -> None:
    options = dict(_records(jail_launcher.encode(_plan(own_user_namespace=True, set_uid=False), 0, 0)))[b"O"]
    _, bits, uid, gid = struct.unpack_from("=4I", options)
    assert (uid, gid) == (1000, 1001)  # the ids the namespace maps the launcher's to
    assert bits == jail_launcher.OWN_USERNS | jail_launcher.CLEAR_GROUPS | jail_launcher.CONTROLLING_TTY


def test_mount_steps_carry_action_attrs_bits_and_their_name() -> None:
    steps = [p for t, p in _records(jail_launcher.encode(_plan(), jail_launcher.ROOT, 0)) if t == b"m"]
    assert len(steps) == 3
    action, attrs, bits = struct.unpack_from("=3I", steps[2])
    assert (action, attrs, bits) == (jail_launcher.ACTIONS["bind"], 6, jail_launcher.NOFOLLOW)
    assert steps[2][12:].split(b"\0") == [b"/ws", b"/.oldroot/src", b"nofollow", b"bind /.oldroot/src -> /ws", b""]


@pytest.mark.parametrize("with_filter", [True, False])
def test_the_seccomp_program_goes_as_is_or_not_at_all(with_filter: bool) -> None:
    prepared = seccomp.prepare()
    plan = _plan(seccomp_filter=prepared if with_filter else None)
    program = dict(_records(jail_launcher.encode(plan, jail_launcher.ROOT, 0))).get(b"f")
    assert program == (prepared.buffer.raw if with_filter and prepared is not None else None)


def test_every_action_the_plan_makes_has_a_code() -> None:
    used = {step.action for step in mounts.root_steps()} | {
        "private", "root", "bind", "symlink", "mask_file", "mask_dir", "proc", "sysfs", "console",
        "detach_old_root", "seal_root"}
    assert used <= set(jail_launcher.ACTIONS) and sorted(jail_launcher.ACTIONS.values()) == list(
        range(1, len(jail_launcher.ACTIONS) + 1))


def test_without_a_tree_built_ahead_the_root_steps_go_along() -> None:
    with_tree = _records(jail_launcher.encode(_plan(), jail_launcher.ROOT, 0))
    without = _records(jail_launcher.encode(_plan(), 0, 0))
    assert not [p for t, p in with_tree if t == b"r"]
    root = [p for t, p in without if t == b"r"]
    assert len(root) == len(mounts.root_steps())
    etc = [p for p in root if struct.unpack_from("=I", p)[0] == jail_launcher.ACTIONS["etc"]]
    # the names it hides, then after a newline the hosts file its top layer holds
    assert len(etc) == 1 and etc[0][12:].split(b"\0")[2] == ("/".join(mounts.ETC_SECRETS) + "\n"
                                                              + mounts.ETC_HOSTS).encode()


def test_a_missing_launcher_says_how_to_recover(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jail_launcher, "PATH", "/nonexistent/ccw-jail")
    why = jail_launcher.missing()
    assert why is not None and "reinstall ccw" in why and "/nonexistent/ccw-jail" in why
    with pytest.raises(Exception, match="reinstall ccw"):
        jail_launcher.require()


def test_a_failed_step_carries_what_ccw_jail_said_beyond_the_errno() -> None:
    from sandbox import supervise

    plan = supervise._setup_error(b"read the jail plan\x0022\x00the plan's magic is not this launcher's: "
                                  b"it was built from another sandbox/jail_interface.py")
    assert "jail step 'read the jail plan' failed: EINVAL" in plan.message
    assert "ccw-jail says: the plan's magic is not this launcher's" in plan.message
    chdir = supervise._setup_error(b"chdir /no/dir\x002\x00chdir failed: No such file or directory")
    assert "ccw-jail says" not in chdir.message and "ENOENT" in chdir.message  # the errno says it all
    assert chdir.details["step"] == "chdir /no/dir"


def test_a_user_namespace_the_launcher_could_not_unshare_carries_its_errno(  # type: ignore[no-untyped-def]
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """``ccw-jail userns`` answers "E" and unshare's errno in one write; the helper raises it as that OSError."""
    fake = tmp_path / "ccw-jail"
    fake.write_text("#!/bin/sh\nprintf E1\n")  # EPERM, as a host that forbids user namespaces answers
    fake.chmod(0o755)
    monkeypatch.setattr(jail_launcher, "PATH", str(fake))
    with pytest.raises(OSError) as caught:
        jail_launcher.user_namespace("0 0 1", "0 0 1")
    assert caught.value.errno == 1 and "unshare(CLONE_NEWUSER)" in str(caught.value)

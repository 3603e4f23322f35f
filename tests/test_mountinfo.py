"""sandbox/mountinfo.py: the other paths a directory is mounted at (parsing is in test_cgroups_parse.py)."""

from __future__ import annotations

import os

from sandbox import mountinfo

TABLE = "\n".join([
    "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw",
    "42 27 254:0 /etc /tmp/etc-bind rw,relatime - ext4 /dev/vda rw",
    "43 27 254:0 /etc/ssh /srv/keys rw,relatime shared:1 - ext4 /dev/vda rw",
    "44 27 0:50 / /mnt/other rw - tmpfs tmpfs rw",
    "45 27 254:0 / /mnt/root-again rw - ext4 /dev/vda rw",
    "46 27 0:51 /sub /tmp/tmpfs-bind rw - tmpfs tmpfs rw",
])


def test_a_bind_mount_is_also_its_source_and_every_other_mount_of_it() -> None:
    mounts = mountinfo.parse(TABLE)
    assert [m.mount_id for m in mounts] == [27, 42, 43, 44, 45, 46]
    assert mounts[1].device == "254:0"
    assert mountinfo.paths_of(mounts, 42, "/tmp/etc-bind") == ["/etc", "/mnt/root-again/etc"]
    assert mountinfo.paths_of(mounts, 42, "/tmp/etc-bind/ssh") == ["/etc/ssh", "/mnt/root-again/etc/ssh", "/srv/keys"]
    assert mountinfo.paths_of(mounts, 43, "/srv/keys") == ["/etc/ssh", "/mnt/root-again/etc/ssh", "/tmp/etc-bind/ssh"]
    assert mountinfo.paths_of(mounts, 27, "/etc") == ["/mnt/root-again/etc", "/tmp/etc-bind"]
    # A filesystem mounted once, or a bind whose root no other mount shows: no other paths.
    assert mountinfo.paths_of(mounts, 44, "/mnt/other/x") == []
    assert mountinfo.paths_of(mounts, 46, "/tmp/tmpfs-bind") == []
    assert mountinfo.paths_of(mounts, 99, "/x") == []  # a mount the table does not hold


def test_a_descriptor_s_mount_is_the_one_mountinfo_names() -> None:
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    try:
        roots = {m.mount_id for m in mountinfo.parse(mountinfo.read()) if m.mount_point == "/"}
        assert mountinfo.mount_id(fd) in roots
        assert "/" not in mountinfo.other_paths(fd, "/")
    finally:
        os.close(fd)


def test_the_same_table_asked_again_gives_the_same_answer_and_a_list_is_never_kept() -> None:
    table = tuple(mountinfo.parse(TABLE))
    first = mountinfo.paths_of(table, 42, "/tmp/etc-bind")
    assert mountinfo.paths_of(table, 42, "/tmp/etc-bind") == first == ["/etc", "/mnt/root-again/etc"]
    # A list may change between two calls: its index is made anew each time.
    mounts = mountinfo.parse(TABLE)
    assert mountinfo.paths_of(mounts, 42, "/tmp/etc-bind") == first
    mounts[:] = [m for m in mounts if m.mount_point != "/"]  # / showed /etc
    assert mountinfo.paths_of(mounts, 42, "/tmp/etc-bind") == ["/mnt/root-again/etc"]
    assert mountinfo.paths_of(table, 7, "/tmp/etc-bind") == []  # an id the table does not hold

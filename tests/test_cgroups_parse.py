"""Pure parsers of sandbox/cgroups.py against fake /proc and cgroupfs contents."""

from __future__ import annotations

from sandbox.cgroups import (
    CgroupLayout,
    Hierarchy,
    build_layout,
    cgroup_mounts,
    parse_blkio_bytes,
    parse_flat_keyed,
    parse_io_stat,
    parse_proc_cgroups,
    parse_self_cgroup,
)

# The CI VM: v1 controllers, an empty cgroup2 at /sys/fs/cgroup/unified, and this process
# in a non-root v1 memory cgroup.
HYBRID_MOUNTINFO = """\
25 1 254:0 / / rw,relatime - ext4 /dev/vda rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_PROC_CGROUPS = """\
#subsys_name	hierarchy	num_cgroups	enabled
cpuset	3	1	1
cpu	1	1	1
cpuacct	2	1	1
blkio	7	1	1
memory	4	34	1
freezer	6	1	1
net_cls	0	1	1
pids	8	1	1
"""
HYBRID_SELF = """\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
4:memory:/process_api/abc
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
"""

# A systemd host on pure cgroup v2, the helper in a delegated service cgroup.
V2_MOUNTINFO = ("30 25 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - "
                "cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n")
V2_PROC_CGROUPS = ("#subsys_name\thierarchy\tnum_cgroups\tenabled\n"
                   "cpu\t0\t80\t1\nmemory\t0\t80\t1\npids\t0\t80\t1\nio\t0\t80\t1\n")
V2_SELF = "0::/system.slice/ccw-helper.service\n"


def test_mountinfo_finds_cgroup_mounts_and_their_controllers() -> None:
    mounts = cgroup_mounts(HYBRID_MOUNTINFO)
    assert [m.mount_point for m in mounts][:2] == ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct"]
    assert len(mounts) == 9  # tmpfs and ext4 are not cgroups
    unified = mounts[-1]
    assert unified.version == 2 and unified.mount_point == "/sys/fs/cgroup/unified"
    assert "memory" in mounts[3].options and mounts[3].version == 1


def test_mountinfo_unescapes_octal_and_skips_optional_fields() -> None:
    text = "50 25 0:40 /sub /mnt/my\\040cgroups rw shared:7 master:2 - cgroup cgroup rw,pids,memory\n"
    (mount,) = cgroup_mounts(text)
    assert mount.mount_point == "/mnt/my cgroups"
    assert mount.root == "/sub"
    assert mount.options >= {"pids", "memory"}


def test_mountinfo_ignores_garbage_lines() -> None:
    assert cgroup_mounts("nonsense\n\n1 2 3\n") == []


def test_proc_cgroups() -> None:
    table = parse_proc_cgroups(HYBRID_PROC_CGROUPS)
    assert table["memory"] == (4, True)
    assert table["net_cls"] == (0, True)
    assert "#subsys_name" not in table


def test_self_cgroup() -> None:
    own = parse_self_cgroup(HYBRID_SELF)
    assert own["memory"] == "/process_api/abc"
    assert own[""] == "/"
    assert own["name=systemd"] == "/"


def test_hybrid_layout_uses_v1_for_resources_and_the_freezer_for_kill() -> None:
    layout = build_layout(HYBRID_MOUNTINFO, HYBRID_PROC_CGROUPS, HYBRID_SELF, {"/sys/fs/cgroup/unified": ""})
    mem = layout.for_resource("memory")
    assert mem is not None and mem.version == 1
    # ccw's parent goes under our own (non-root) memory cgroup
    assert mem.base == "/sys/fs/cgroup/memory/process_api/abc"
    cpu = layout.for_resource("cpu")
    assert cpu is not None and cpu.mount_point == "/sys/fs/cgroup/cpuacct"
    io = layout.for_resource("io")
    assert io is not None and io.mount_point == "/sys/fs/cgroup/blkio"
    # The controller-less v2 would be joined for cgroup.kill alone, through the global
    # migration lock: the v1 freezer kills instead (exec_cgroup.py's essay).
    kill = layout.for_resource("kill")
    assert kill is not None and kill.mount_point == "/sys/fs/cgroup/freezer"
    without_freezer = CgroupLayout(tuple(h for h in layout.hierarchies if "freezer" not in h.controllers))
    kill = without_freezer.for_resource("kill")
    assert kill is not None and kill.version == 2 and kill.base == "/sys/fs/cgroup/unified"
    # the cpu-only hierarchy gives each exec one CPU share
    share = layout.for_resource("share")
    assert share is not None and share.mount_point == "/sys/fs/cgroup/cpu"
    # cpuset and name=systemd hierarchies are not used
    assert {h.mount_point for h in layout.hierarchies} == {
        "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/memory", "/sys/fs/cgroup/freezer",
        "/sys/fs/cgroup/blkio", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/unified",
    }


def test_v2_layout_with_controllers() -> None:
    layout = build_layout(V2_MOUNTINFO, V2_PROC_CGROUPS, V2_SELF, {"/sys/fs/cgroup": "cpu io memory pids"})
    for res in ("memory", "pids", "cpu", "io", "kill"):
        hier = layout.for_resource(res)
        assert hier is not None and hier.version == 2, res
        assert hier.base == "/sys/fs/cgroup/system.slice/ccw-helper.service"


def test_v2_helper_in_its_leaf_uses_the_cgroup_above() -> None:
    self_cgroup = "0::/system.slice/ccw-helper.service/ccw-helper\n"
    layout = build_layout(V2_MOUNTINFO, V2_PROC_CGROUPS, self_cgroup, {"/sys/fs/cgroup": "cpu io memory pids"})
    memory = layout.for_resource("memory")
    assert memory is not None and memory.base == "/sys/fs/cgroup/system.slice/ccw-helper.service"


def test_v2_without_cpu_controller_still_serves_cpu_usage() -> None:
    layout = build_layout(V2_MOUNTINFO, V2_PROC_CGROUPS, V2_SELF, {"/sys/fs/cgroup": "memory pids"})
    cpu = layout.for_resource("cpu")
    assert cpu is not None and cpu.version == 2  # cpu.stat usage_usec needs no controller
    assert layout.for_resource("io") is None


def test_disabled_v1_controller_is_not_used() -> None:
    cgroups = HYBRID_PROC_CGROUPS.replace("memory\t4\t34\t1", "memory\t4\t34\t0")
    layout = build_layout(HYBRID_MOUNTINFO, cgroups, HYBRID_SELF, {})
    assert layout.for_resource("memory") is None


def test_mount_root_is_subtracted_from_own_path() -> None:
    # Inside a cgroup namespace or a bind of a subtree: the mount shows /process_api of the tree.
    mountinfo = "35 31 0:32 /process_api /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    layout = build_layout(mountinfo, HYBRID_PROC_CGROUPS, HYBRID_SELF, {})
    mem = layout.for_resource("memory")
    assert mem is not None and mem.base == "/sys/fs/cgroup/memory/abc"


def test_own_path_outside_the_mounted_root_falls_back_to_the_mount() -> None:
    mountinfo = "35 31 0:32 /elsewhere /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
    layout = build_layout(mountinfo, HYBRID_PROC_CGROUPS, HYBRID_SELF, {})
    mem = layout.for_resource("memory")
    assert mem is not None and mem.base == "/sys/fs/cgroup/memory"


def test_no_cgroups_at_all() -> None:
    layout = build_layout("", "", "", {})
    assert layout.hierarchies == ()
    assert layout.for_resource("memory") is None and layout.for_resource("kill") is None
    assert layout.notes


def test_comounted_v1_controllers() -> None:
    mountinfo = "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct\n"
    self_cgroup = "2:cpu,cpuacct:/user.slice\n"
    layout = build_layout(mountinfo, HYBRID_PROC_CGROUPS, self_cgroup, {})
    cpu = layout.for_resource("cpu")
    assert cpu is not None and cpu.base == "/sys/fs/cgroup/cpu,cpuacct/user.slice"


def test_flat_keyed_files() -> None:
    assert parse_flat_keyed("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")["oom_kill"] == 3
    assert parse_flat_keyed("usage_usec 1500\nuser_usec 1000\n")["usage_usec"] == 1500
    assert parse_flat_keyed("max 0\n") == {"max": 0}
    assert parse_flat_keyed("broken line here\nx y\n") == {}


def test_blkio_bytes_sums_devices() -> None:
    text = ("254:0 Read 4096\n254:0 Write 8192\n254:0 Sync 0\n254:0 Async 12288\n254:0 Total 12288\n"
            "253:0 Read 1024\n253:0 Write 0\nTotal 13312\n")
    assert parse_blkio_bytes(text) == (5120, 8192)
    assert parse_blkio_bytes("Total 0\n") == (0, 0)


def test_io_stat() -> None:
    text = ("254:0 rbytes=4096 wbytes=8192 rios=1 wios=2 dbytes=0 dios=0\n"
            "253:0 rbytes=100 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n")
    assert parse_io_stat(text) == (4196, 8192)
    assert parse_io_stat("") == (0, 0)


def test_layout_is_hashable_value() -> None:
    hier = Hierarchy(2, frozenset(), "/sys/fs/cgroup", "/sys/fs/cgroup")
    assert CgroupLayout((hier,)).unified == hier
    assert {hier: 1}[Hierarchy(2, frozenset(), "/sys/fs/cgroup", "/sys/fs/cgroup")] == 1


def test_no_hierarchy_gives_null_usage_with_reasons() -> None:
    from sandbox.exec_cgroup import ExecCgroup, Limits

    cg = ExecCgroup.prepare(CgroupLayout(), "nothing", Limits())
    usage = cg.collect()
    assert (usage.cpu_ms, usage.rss_max_kb, usage.io_read_kb, usage.io_write_kb) == (None, None, None, None)
    assert set(usage.unavailable) >= {"cpu_ms", "rss_max_kb", "io_read_kb", "io_write_kb"}
    assert all(reason for reason in usage.unavailable.values())
    cg.teardown()
    cg.teardown()


def test_requested_limit_without_a_hierarchy_is_unsupported() -> None:
    import pytest

    from sandbox.errors import CcwError
    from sandbox.exec_cgroup import ExecCgroup, Limits

    for limits, what in ((Limits(memory_bytes=1 << 20), "memory_mb"), (Limits(pids_max=5), "pids_max"),
                         (Limits(cpu_ms=10), "cpu_ms")):
        with pytest.raises(CcwError) as info:
            ExecCgroup.prepare(CgroupLayout(), "limited", limits)
        assert info.value.code == "UNSUPPORTED"
        assert what in info.value.message and "omit" in info.value.message


def test_bad_names_are_refused() -> None:
    import pytest

    from sandbox.errors import CcwError
    from sandbox.exec_cgroup import ExecCgroup, Limits

    for name in ("", "a/b", "a@1", "..", "."):
        with pytest.raises(CcwError):
            ExecCgroup.prepare(CgroupLayout(), name, Limits())


def test_a_process_is_ending_once_exiting_a_zombie_or_gone() -> None:
    # v1 shows an exiting task in the root: ExecCgroup.owns trusts v1's "elsewhere" only
    # for a process that is not ending (the exiting window itself, PF_EXITING before the
    # zombie, is too short to stage; its flag is read from the same stat line).
    import os
    import subprocess

    from sandbox.exec_cgroup import is_ending

    running = subprocess.Popen(["sleep", "30"])
    try:
        assert not is_ending(running.pid)
        assert not is_ending(os.getpid())
        running.kill()
        os.waitid(os.P_PID, running.pid, os.WEXITED | os.WNOWAIT)  # exited, not yet reaped: a zombie
        assert is_ending(running.pid)
    finally:
        running.kill()
        running.wait()
    assert is_ending(running.pid)  # reaped: gone

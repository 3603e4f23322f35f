"""``python bench/run.py capsule``: the helper against its baselines, in one run.

- capsule create on a 1,000-file and a 100,000-file workspace (flat in size), beside
  ``cp -a`` and ``git worktree add`` of the same trees;
- exec of /bin/true in a full jail, beside bwrap and a bare subprocess;
- fanotify tracing of 20,000 small-file reads, beside no tracing and strace;
- capsule_create + capsule_exec of /bin/true with two auto-exposed toolchains (a pyenv
  Python, an nvm bin), beside the same with auto_expose off;
- the CPU a syscall-heavy workload uses per operation in a capsule's exec, beside the
  host, with each mechanism (overlay, jail, seccomp, cgroup, fanotify) added in turn
  (bench/parts/syscall_cost.py: where issue 36's extra CPU goes).
Needs root (the helper's privileged mode).  ``--quick`` (a smoke run): 1,000 and 3,000
files, 2,000 traced reads, 5 runs of each.
"""

from __future__ import annotations

from bench.common import Report


def run(quick: bool = False) -> Report:
    """Measure every part and collect the rows."""
    from bench.parts import create, expose, jail_exec, syscall_cost, tracing

    report = Report("capsule")
    repeat = 5 if quick else 30
    # The jail part first: fork cost grows with the forking process's memory, and the
    # create part leaves this process holding 100,000-file trees' worth of it, which the
    # helper (the real forker) never does.
    jail_rows = jail_exec.measure(repeat * 2)
    for row in create.measure(repeat, quick):
        report.add(row)
    for row in jail_rows:
        report.add(row)
    for row in tracing.measure(3, 2_000) if quick else tracing.measure(7):
        report.add(row)
    # The effect (~2 ms in ~35) is smaller than the spread of single create+execs on a
    # 2-core VM (20 to 50 ms): three times the runs keep the medians' ratio steady.
    for row in expose.measure(repeat * 3):
        report.add(row)
    for row in syscall_cost.measure(3 if quick else 11):
        report.add(row)
    report.notes.append("targets: create <= 5 ms and 100k/1k <= 1.3; jail exec <= 1.0x bwrap (issue 27; "
                        "capsule_exec over MCP <= 1.5x bwrap: the mcp suite); tracing <= 1.3x untraced; "
                        "exposed toolchains <= 1.1x none")
    return report

"""mcp_server/tools/exec_result.py: a finished exec's result says a missing cgroup's reason, the
helper's standing refusal, only by name with where it is given once, and each usage figure's
mechanism without what it measures; the journal keeps both whole.  Usage measured as a rootless
helper measures it (sandbox/exec_usage.measure and rusage.fill over no writable hierarchy)."""

from __future__ import annotations

import datetime as dt
import json

import jsonschema

from mcp_server.capsules.exec import REFUSAL_GIVEN, ExecOutcome, journal_entry
from mcp_server.tools.exec_result import EXEC_RESULT, exec_result, exec_text
from sandbox import rusage
from sandbox.cgroups import CgroupLayout
from sandbox.exec_usage import ExecDirs, measure
from sandbox.ops import ExecRequest
from sandbox.replies import ExecReply, Touched, Truncated
from sandbox.usage_words import NO_FANOTIFY_BRIEFLY, NO_FANOTIFY_ROOTLESS

MIB = 1024
STARTED = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
REFUSED = {f"/sys/fs/cgroup/{name}": f"mkdir('/sys/fs/cgroup/{name}/ccw/x@1') failed: EACCES (Permission denied); "
           "run the helper as root, or delegate a cgroup v2 subtree to it (systemd Delegate=yes)"
           for name in ("cpu", "memory", "pids")}


def _rootless(report: rusage.InitReport | None) -> ExecOutcome:
    """A rootless exec's outcome: no cgroup, its figures from the init's rusage ``report``."""
    usage = measure(ExecDirs(CgroupLayout(), {}, lambda path: ""), dict(REFUSED), cpu_limited=False,
                    rusage=report)
    rusage.fill(usage, report)
    reply = ExecReply(
        exit_code=0, signal=None, timed_out=False, oom_killed=False, duration_ms=5, stdout=b"ok\n", stderr=b"",
        stdout_bytes=3, stderr_bytes=0, truncated=Truncated(False, False), usage=usage.figures(),
        usage_unavailable=dict(usage.unavailable), usage_sources=dict(usage.sources), disk=None,
        touched=Touched((), ("f.txt",), (), ()), touched_unavailable={"read": NO_FANOTIFY_ROOTLESS},
    )
    return ExecOutcome(reply, started_generation=0, generation=1, queued_ms=0)


def test_a_rootless_exec_names_its_missing_cgroups_and_where_their_reason_is_given() -> None:
    ran = _rootless(rusage.InitReport(12, 40 * MIB, 0, 8, 18 * MIB))
    result = exec_result(ran)
    jsonschema.validate(result, EXEC_RESULT)
    assert result["usage_unavailable"] == {
        "oom_killed": f"no memory cgroup, an OOM kill cannot be told apart ({REFUSAL_GIVEN})",
        "pids_limited": f"no pids cgroup ({REFUSAL_GIVEN})",
        "rss_max_kb": f"no memory cgroup ({REFUSAL_GIVEN})",
    }
    assert result["usage_sources"] == {"cpu_ms": "wait4 rusage of the jail's init", "io_read_kb": "wait4 rusage",
                                       "io_write_kb": "wait4 rusage",
                                       "rss_max_process_kb": "wait4 rusage of the jail's init"}
    assert "EACCES" not in exec_text(result) and "Delegate=yes" not in exec_text(result)
    # Why no read is recorded, the same for every rootless exec: named, where it is given once.
    assert result["touched_unavailable"]["read"] == NO_FANOTIFY_BRIEFLY
    assert "CAP_SYS_ADMIN" not in exec_text(result)
    # The journal keeps each reason and source whole.
    entry = journal_entry(ExecRequest("cap_1", ("true",)), ran, STARTED)
    assert entry["usage"]["unavailable"] == ran.usage_unavailable and "EACCES" in json.dumps(entry["usage"])
    assert entry["usage"]["sources"]["cpu_ms"] == rusage.INIT_CPU


def test_what_is_this_exec_s_own_is_kept_whole() -> None:
    killed = exec_result(_rootless(None))  # the init was killed before it reported: no rusage figures
    jsonschema.validate(killed, EXEC_RESULT)
    cpu = killed["usage_unavailable"]["cpu_ms"]
    assert cpu == f"no readable cpu usage counter ({REFUSAL_GIVEN}); {rusage.NO_REPORT}"
    assert killed["usage_unavailable"]["rss_max_process_kb"] == rusage.NO_REPORT
    within = exec_result(_rootless(rusage.InitReport(1, 17 * MIB, 0, 0, 18 * MIB)))
    assert within["usage_sources"]["rss_max_process_kb"] == (
        f"wait4 rusage of the jail's init; no process of the jail peaked above the {18 * MIB} kB of ccw's init "
        "image that the command starts from (a peak counts the image before exec)")


def test_a_reinstalled_node_modules_is_cut_to_its_directories_in_the_answer_and_whole_in_the_journal() -> None:
    """An exec that reinstalled node_modules/ answered with every path it read and wrote (36,592 and
    18,297 as root, a 6.8 MB result); past TOUCHED_LISTED a set is cut to the deepest directories
    that fit, "dir/" standing for the paths below it."""
    import dataclasses

    written = [f"web/nm2/p{i}/{tail}" for i in range(600) for tail in ("a.js", "lib/b.js", "lib/c.js")]
    written += ["web/nm2/.package-lock.json", "web/src/a.js"]
    read = [f"web/node_modules/p{i}/lib/x{n}.js" for i in range(300) for n in range(5)]
    base = _rootless(rusage.InitReport(1, MIB, 0, 0, 18 * MIB))
    touched = Touched(tuple(read), tuple(written), ("web",), ("web/node_modules/.bin/jest",))
    ran = dataclasses.replace(base, reply=dataclasses.replace(base.reply, touched=touched))
    result = exec_result(ran)
    jsonschema.validate(result, EXEC_RESULT)
    assert result["touched"]["written"] == [*(f"web/nm2/p{i}/" for i in range(600)), "web/nm2/.package-lock.json",
                                            "web/src/a.js"]
    assert result["touched"]["read"] == [f"web/node_modules/p{i}/lib/" for i in range(300)]
    assert result["touched"]["listed"] == ["web"] and result["touched"]["executed"] == ["web/node_modules/.bin/jest"]
    entry = journal_entry(ExecRequest("cap_1", ("npm", "install")), ran, STARTED)
    assert entry["touched"]["written"] == written and entry["touched"]["read"] == read

    from mcp_server.tools.exec_result import TOUCHED_LISTED

    few = Touched(tuple(read[:TOUCHED_LISTED]), tuple(written[:TOUCHED_LISTED]), (), ())
    small = exec_result(dataclasses.replace(base, reply=dataclasses.replace(base.reply, touched=few)))["touched"]
    assert (small["read"], small["written"]) == (read[:TOUCHED_LISTED], written[:TOUCHED_LISTED])

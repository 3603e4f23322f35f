"""The words an exec's usage is reported in that both processes read: what a missing cgroup
leaves a figure lacking, a source's mechanism, an init that could not report, why reads
are not recorded.

The helper writes each null figure's reason as "HEAD: why" and each figure's source as
"MECHANISM: what it measures" (exec_usage.py, rusage.py); the front end shortens them for
an exec's result and a policy report, whose standing part (the helper's cgroup refusal,
the same for every exec) the capsule's isolation report gives once.  Both read the
forms from here, so the helper's writing and the front end's reading cannot drift.
So too the launcher's words for a script whose ``#!`` interpreter the jail does not show
(``BAD_INTERPRETER``, ``NAMED_BY``), written once in the table ccw-jail is built from.
Pure: no I/O (the front end's core imports it).
"""

from __future__ import annotations

from sandbox.jail_interface import TEXTS

BAD_INTERPRETER = TEXTS["BAD_INTERPRETER"]  # "ccw: SCRIPT: bad interpreter: PATH (named by SCRIPT's #! line): ..."
NAMED_BY = TEXTS["NAMED_BY"]

# What each figure a missing cgroup leaves null is said to lack, as "HEAD: why".  The why
# (``why_none``) is the helper's standing refusal, the same for every exec: the helper
# learns it once (exec_cgroup.py) and a capsule's isolation report gives it
# (in_force.py), so an exec's result may say only the head (``refusal_head``).
REFUSED = {
    "cpu_ms": "no readable cpu usage counter",
    "rss_max_kb": "no memory cgroup",
    "oom_killed": "no memory cgroup, an OOM kill cannot be told apart",
    "pids_limited": "no pids cgroup",
    "io_read_kb": "no io/blkio cgroup",
    "io_write_kb": "no io/blkio cgroup",
}
# Why a rootless helper records no reads: the same for every exec, so an exec's result
# names it and points at the capsule's isolation report (in_force.py), which gives it whole.
NO_FANOTIFY_ROOTLESS = (
    "fanotify needs CAP_SYS_ADMIN in the initial user namespace to watch a filesystem; "
    "this helper runs without it (rootless), so files read are not recorded. Run the helper "
    "as root for touched.read; touched.written still comes from the upper dir."
)
NO_FANOTIFY_BRIEFLY = "not recorded by a rootless helper (why: capsule_create's isolation.fanotify.reason)"
NO_REPORT = ("the jail's init was killed before it could report the rusage of the processes it reaped, "
             "and the kernel counts none of the processes it reaps then")


def refusal_head(figure: str, reason: str) -> str | None:
    """What ``reason``, why ``figure`` is null, says is missing, when its why is the helper's
    standing cgroup refusal (``REFUSED``); None for a reason of the exec's own."""
    head = REFUSED.get(figure)
    return head if head is not None and reason.startswith(f"{head}: ") else None


def mechanism(source: str) -> str:
    """A figure's source without what the mechanism measures, the same for every exec: each is
    written "MECHANISM: what it measures", and a clause about this exec follows after "; "
    (rusage.fill's inherited image)."""
    head, _, measures = source.partition(": ")
    own = measures.partition("; ")[2]
    return f"{head}; {own}" if own else head

"""cgroup v2's leaf for a helper alone in its cgroup (sandbox/cgroups.py: enter_leaf).

systemd starts a ``Delegate=yes`` service in the very cgroup it delegates, and cgroup v2
allows no controllers below a cgroup that holds a process; the helper therefore moves
into ``<own>/ccw-helper`` and makes ``ccw/`` beside it.  Tested on the host's own v2
hierarchy, with a child process placed alone in a fresh cgroup as systemd would place it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

LEAF_SCRIPT = r"""
import json, os, sys
from sandbox import cgroups
with open(os.path.join(sys.argv[1], "cgroup.procs"), "w") as f:
    f.write(str(os.getpid()))  # alone in a v2 cgroup, as systemd starts a Delegate=yes service
leaf = cgroups.enter_leaf()
again = cgroups.enter_leaf()  # already in the leaf: nothing to do
layout = cgroups.detect_layout()
with open("/proc/self/cgroup") as f:
    v2 = next(line.split("::", 1)[1].strip() for line in f if line.startswith("0::"))
print(json.dumps({"leaf": leaf, "again": again, "v2": v2, "base": layout.unified.base}))
"""


def test_a_helper_alone_in_its_v2_cgroup_moves_into_a_leaf(root_required: None,
                                                           require: Callable[[bool, str], None]) -> None:
    from sandbox import cgroups

    unified = cgroups.detect_layout().unified
    require(unified is not None, "needs a cgroup v2 hierarchy")
    assert unified is not None
    own = Path(unified.mount_point) / f"ccw-leaf-test-{os.getpid()}"
    own.mkdir()
    try:
        done = subprocess.run([sys.executable, "-c", LEAF_SCRIPT, str(own)], capture_output=True, text=True,
                              timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        assert out["leaf"] == str(own / cgroups.HELPER_LEAF) and out["again"] is None
        assert out["v2"].endswith(f"/{own.name}/{cgroups.HELPER_LEAF}")
        assert out["base"] == str(own)  # exec cgroups go beside the leaf, not below it
    finally:
        leaf = own / cgroups.HELPER_LEAF
        if leaf.exists():
            leaf.rmdir()
        own.rmdir()

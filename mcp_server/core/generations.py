"""Change generations: which changes to a capsule advance it, and which runs describe its contents.

Each capsule has a generation, 0 when it is made, that every write to its contents
advances by one: each file-tool change journaled with ``Journal.add_write`` (text and
file tools, workspace writes and patches, deltamin's apply) and each exec that wrote.
An exec's write set is exact when fanotify traced it (``touched.read`` is a list:
close-after-write events plus the upper dir's changes).  When it was not traced (a
rootless helper, an overflowed fanotify queue: ``touched.read`` is null) the written set
comes from upper-dir signatures alone, which miss a rewrite that keeps a file's size and
mtime (``tar x``, ``cp -p``), so such an exec advances the generation whether or not it
reports writes.  An exec the front end lost track of (cancelled while running, the helper
died) advances it too: its row (capsules/exec.py ``cut_entry``) has no read trace, and
no generation of its own, so it observes nothing.  The capsule's /tmp and $HOME are not its
contents: writes there advance nothing.

Each exec row keeps ``generation``, the one it started on, and ``generation_out``, the
one its own writes produced (null when it advanced nothing); each write row keeps the
generation it produced.  ``observes`` decides which runs describe the current contents.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def exec_advances(touched: Mapping[str, Any]) -> bool:
    """Whether an exec with these touched sets advances its capsule's generation.

    It does when it wrote (names that are not UTF-8 too: ``not_utf8.written``), and when its
    write set may be incomplete (no fanotify trace: ``read`` is null), see the module docstring.
    """
    return bool(touched.get("written") or (touched.get("not_utf8") or {}).get("written")) or touched.get("read") is None


def observes(entry: Mapping[str, Any], current: int) -> bool:
    """Whether a journaled exec observed the capsule's contents at generation ``current``.

    It did when it started on ``current``; and when its own writes produced ``current``
    from the generation it started on (``generation_out == generation + 1 == current``),
    because the contents it ran on differ from the current ones only by what the run
    itself wrote (test caches, build outputs).  A run on older contents, a run whose
    contents changed under it (a file tool wrote during the run), and a run without a
    recorded generation are not observations of the current contents.
    """
    started, out = entry.get("generation"), entry.get("generation_out")
    if started is None:
        return False
    if out is None:
        return bool(started == current)
    return bool(out == current and out == started + 1)

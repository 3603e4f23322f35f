"""What the dashboard shows of races (capsule_race), read from the state dir's ``races``
table (capsules/races.py keeps it as each race goes).

Reads only, like ``api``: a race's table is there while it runs (the rows ended so far
and the capsules still running), after its run is forgotten, and after the front end
that ran it restarted (a race whose front end died mid-way says ``lost``).  Every text
in it came in part from inside a capsule (the command, a policy's details): the page
renders it as text.
"""

from __future__ import annotations

from typing import Any

from mcp_server.capsules import races
from mcp_server.state import State
from mcp_server.ui.api import page_limit


def listed(state: State, limit: int | None = None, before: int | None = None) -> dict[str, Any]:
    """A page of the races, newest first: the newest ``limit`` (numbered below ``before``, a
    summary's ``seq``, if given), each with its best row so far; ``more`` when older ones exist."""
    shown, more = races.recent(state, page_limit("races", limit), before)
    return {"races": shown, "more": more}


def one(state: State, race_id: str) -> dict[str, Any]:
    """One race whole: its question, its ranked rows, its order, the capsules still running."""
    return races.get(state, race_id)

"""grep over a snapshot or a live target (``snapshot_grep``), in deterministic candidate order.

A literal in the worktree is searched by ``git grep`` (``mcp_server/fs/gitgrep.py``)
while the fingerprint is taken; otherwise the candidates are read and searched in
worker threads a chunk at a time, consumed in candidate order, so the outcome is that
of a sequential walk.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from mcp_server.core import paths as P
from mcp_server.core.grep import Matcher, is_binary
from mcp_server.fs import gitgrep
from mcp_server.substrate.views import (
    Immutable,
    Leased,
    LiveTarget,
    Stores,
    begin_live,
    leased,
    live_files,
    scoped,
)

_GREP_CHUNK = 256  # files read ahead in parallel; bounds the work wasted past max_files
_GREP_WORKERS = min(4, os.cpu_count() or 1)


@dataclass(frozen=True)
class GrepQuery:
    """What a grep looks for, and where it stops."""

    matcher: Matcher
    scopes: list[str]
    max_files: int
    max_matches: int


def grep(
    read: Callable[[str], bytes | None], candidates: list[str], matcher: Matcher, max_files: int, max_matches: int
) -> tuple[dict[str, Any], list[str]]:
    """Search candidates in order; reading and searching run in worker threads a chunk
    at a time, and the results are consumed in candidate order, so the outcome (and
    which files count as searched) is the same as a sequential walk."""

    def one(path: str) -> list[dict[str, Any]] | None:
        data = read(path)
        if data is None or is_binary(data):
            return None
        return [{"path": path, **m} for m in matcher.search(data, max_matches)]

    matches: list[dict[str, Any]] = []
    searched: list[str] = []
    truncated = False
    with ThreadPoolExecutor(_GREP_WORKERS) as pool:
        for start in range(0, len(candidates), _GREP_CHUNK):
            chunk = candidates[start:start + _GREP_CHUNK]
            for path, found in zip(chunk, pool.map(one, chunk), strict=True):
                if found is None:
                    continue
                if len(searched) >= max_files:
                    truncated = True
                    break
                searched.append(path)
                matches.extend(found[: max(0, max_matches - len(matches))])
            if truncated:
                break
    payload = {
        "matches": matches,
        "files_searched": len(searched),
        "truncated": truncated,
        "matches_truncated": len(matches) >= max_matches,
    }
    return payload, searched


def grep_snapshot(stores: Stores, snapshot_id: str, query: GrepQuery) -> Immutable:
    """Search a snapshot's files (symlinks not followed) within the query's scopes."""
    snap = stores.snapshots.load(snapshot_id)
    index = snap.by_path()
    store = stores.blobs
    candidates = scoped([e.path for e in snap.entries if e.mode != 0o120000], query.scopes)
    payload, _ = grep(lambda p: store.get(index[p].blob), candidates, query.matcher, query.max_files, query.max_matches)
    return Immutable(payload, snap.snapshot_id)


def grep_live(stores: Stores, target: LiveTarget, lease_id: str | None, query: GrepQuery) -> Leased:
    """Search a live target's files within the query's scopes, touching those searched."""
    if target.capsule_id is None and gitgrep.usable(query.matcher):
        return _git_grep(stores, target, lease_id, query)
    # git's candidate list does not depend on the fingerprint: list while it runs.
    with ThreadPoolExecutor(1) as pool:
        listing = pool.submit(live_files, target, query.scopes)
        lease_id, live = begin_live(stores, target, lease_id)
        candidates = listing.result()
    payload, searched = grep(target.view.read_regular, candidates, query.matcher, query.max_files, query.max_matches)
    stores.leases.touch(lease_id, searched)
    return leased(payload, target, lease_id, live)


def _git_grep(stores: Stores, target: LiveTarget, lease_id: str | None, query: GrepQuery) -> Leased:
    # The git greps run while the fingerprint is taken.  Between them they name every
    # text candidate (git walks what ls-files lists), so no separate listing is needed.
    assert query.matcher.literal is not None
    specs = [] if P.ROOT in query.scopes else [f":(literal){s}" for s in query.scopes]
    procs = gitgrep.start(target.git_root, query.matcher.literal, specs)
    try:
        lease_id, live = begin_live(stores, target, lease_id)
    finally:
        text, found = gitgrep.finish(procs, query.matcher, query.max_matches)
    ordered = P.sort_paths(text)
    searched = ordered[:query.max_files]
    matches: list[dict[str, Any]] = []
    for path in searched:
        for hit in found.get(path, ()):
            if len(matches) >= query.max_matches:
                break
            matches.append({"path": path, **hit})
    payload = {
        "matches": matches,
        "files_searched": len(searched),
        "truncated": len(ordered) > query.max_files,
        "matches_truncated": len(matches) >= query.max_matches,
    }
    stores.leases.touch(lease_id, searched)
    return leased(payload, target, lease_id, live)

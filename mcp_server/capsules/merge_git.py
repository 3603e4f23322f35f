"""Git directories in a merge: one input's history, every input's files (capsule_merge).

Two attempts that each committed, or each ran ``git add``, change the same files of the
workspace's git directory: the index (binary), the branch's ref, ``logs/HEAD``.  Merged
path by path those conflict, so two agents that commit as they work could never be
merged; and merged wherever they happen not to overlap, they would be worse than a
conflict: an index staging one input's blobs beside a ref naming the other's commit is
a state git never made (capsules/gitindex.py would rightly refuse to promote it).

So a git directory merges as a unit.  Where one input changed it, its change comes
along as any change does.  Where several did, the first of them, in the order the
inputs were named, keeps its git directory whole (every path in it as that input has
it, ``GIT_KEPT``), and the others' changes there are left out; their work-tree files
merge as any others do.  The merged capsule holds the first one's commits, and the
others' work as changes not yet committed, which the person (or the merged capsule's
own run) commits; the answer says so at each such path.  A git directory is found by
name as promotion finds one (core/hazards.py ``in_gitdir``: ``.git`` at any depth); the
``.git`` entry itself belongs to its directory's unit, so an input that deleted it or
put a file there is one of the inputs that changed it.
"""

from __future__ import annotations

from mcp_server.capsules.merge3 import Outcome
from mcp_server.capsules.merge_plan import Plan
from mcp_server.core import hazards

GIT_KEPT = ("in a git directory several inputs changed: the first of them keeps it whole (its commits, refs and "
            "index); the others' files merge, their commits do not")


def gitdir_of(path: str) -> str | None:
    """The git directory ``path`` belongs to (its own when it is a ``.git`` entry), or None."""
    if path.rpartition("/")[2].casefold() == ".git":
        return path
    inside = hazards.in_gitdir(path)
    return None if inside is None else inside[0]


def one_history(plan: Plan, names: list[str]) -> list[str]:
    """Keep each git directory that several of ``names`` changed as the first of them has it
    (``GIT_KEPT`` at each of its paths); the git directories so kept."""
    groups: dict[str, list[str]] = {}
    for path in plan.outcomes:
        if ".git" in path.casefold():  # most paths name no git directory: skip the walk for them
            gitdir = gitdir_of(path)
            if gitdir is not None:
                groups.setdefault(gitdir, []).append(path)
    kept = []
    for gitdir, paths in sorted(groups.items()):
        changers = [name for name in names if any(plan.sides[name][p] != plan.base[p] for p in paths)]
        if len(changers) < 2:
            continue
        first = changers[0]
        for path in paths:
            plan.outcomes[path] = Outcome(path, plan.sides[first][path], GIT_KEPT, (first,))
        kept.append(gitdir)
    if kept:
        plan.__dict__.pop("changed", None)  # a cached_property: the outcomes just changed
    return kept

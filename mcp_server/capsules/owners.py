"""Owners in witnesses: what a base entry records of its owner, and what a replay restores.

A root caller's capsule runs where files belong to other uids (a CI checkout of the
runner's uid, an sdist unpacked by root) and its jail writes there as the host's root
would (sandbox/rootcaps.py).  What the runs saw of owners can matter to them: git
refuses a repository of another uid ("dubious ownership"), tools compare ``st_uid`` with
their own.  So each base entry records ``uid`` and ``gid`` (witness_base.py), and a
replay that rebuilds the base puts them back, so that its runs see what the recorded
ones saw.

Choices:

- **Only root restores.**  chown to another uid needs CAP_CHOWN; a replayer that is not
  root cannot, and says so in its report (``owners``: recorded, restored, and why not),
  never silently.  Entries recorded as its own uid and gid count as restored: it
  creates them so.  Its rebuilt base is its own, which is also what its (rootless or
  unprivileged) jail could write anyway.
- **Never through a link.**  The chown is ``fchownat(AT_SYMLINK_NOFOLLOW)`` on a name in
  a parent reached through RootView (RESOLVE_BENEATH, no symlinks), like every other
  write of the rebuild: a witness cannot make the replayer chown a host file.
- **Bounded ids.**  The manifest's schema takes 0..2**32-2 (``(uid_t)-1`` means "leave
  it" to chown, so it is no owner).  Any id in range is honoured: it is what a root
  ``tar`` would do with an archive's owners, and the files stay in the replay's
  private scratch directory, which no other user can reach.
- **chown clears set-id bits**, so a file whose recorded mode has them gets its mode
  again after the chown.
- **The top too.**  The workspace directory itself is no base entry (entries are repo
  paths below it), yet the jail shows its owner and mode (the helper gives the capsule's
  upper dir those of the base's top), and git refuses a work tree whose top belongs to
  another uid.  So the manifest records them apart (``base.top``), and ``entries`` gives
  them to the restore and the report as one more entry, ``"."``: chowned like the others
  (through the rebuilt base's own descriptor, which is no link), its mode set last of all.
  A witness made before has no ``base.top``: its top is the replayer's, as it always was.
- **A live base** (a witness without blobs, replayed over the replayer's directory) is
  not rebuilt: its owners are its own, and the report says nothing was restored.
- **Writes** (file-tool changes between execs) are made by the server both times, so
  their owner is the server's uid in the run and in the replay; they record none.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

from mcp_server.fs.view import RootView
from sandbox.errors import from_oserror

REPORT_SCHEMA = {
    "type": "object", "required": ["recorded", "restored", "reason"], "additionalProperties": False,
    "properties": {"recorded": {"type": "integer"}, "restored": {"type": "integer"},
                   "reason": {"type": ["string", "null"], "description": "Why recorded owners were not restored."}},
    "description": "Owners the witness's base recorded, and how many the rebuilt base got back "
                   "(only a root replayer can).",
}


def of(st: os.stat_result) -> dict[str, int]:
    """The owner fields of a base entry."""
    return {"uid": st.st_uid, "gid": st.st_gid}


def entries(base: dict[str, Any]) -> list[dict[str, Any]]:
    """The manifest ``base``'s entries that may record an owner: its files, then its top as the
    entry ``"."`` when the witness recorded one (``base.top``)."""
    top = base.get("top")
    return [*base["files"], *([{"path": ".", "type": "dir", **top}] if top is not None else [])]


def can_restore() -> bool:
    """Whether this process may give files to other uids (root)."""
    return os.geteuid() == 0


def restore(view: RootView, entries: Iterable[dict[str, Any]]) -> int:
    """chown every entry that records an owner, never following a link; the number restored."""
    restored = 0
    for item in entries:
        if "uid" not in item and "gid" not in item:
            continue
        path = item["path"]
        head, _, name = path.rpartition("/")  # the top, ".", is named in itself
        parent = view.open_fd(head or ".", os.O_RDONLY | os.O_DIRECTORY, write=True, what="chown")
        try:
            os.chown(name, item.get("uid", -1), item.get("gid", -1), dir_fd=parent, follow_symlinks=False)
        except OSError as exc:
            raise from_oserror(exc, "restoring the owner of a base file of the witness", path,
                               "the replay's scratch directory refused it: replay on a local filesystem") from exc
        finally:
            os.close(parent)
        if item["type"] == "file" and item["mode"] & 0o6000:
            view.chmod(path, item["mode"])  # chown cleared them
        restored += 1
    return restored


def report(entries: list[dict[str, Any]], rebuilt: bool) -> dict[str, Any]:
    """The replay report's ``owners``: how many base entries recorded one, how many the rebuilt base has
    (all of them when this process is root, ``restore`` raising otherwise; else those recorded as this
    process's own, which it creates them as), and why not the rest."""
    recorded = [item for item in entries if "uid" in item or "gid" in item]
    if not rebuilt:
        restored = 0
    elif can_restore():
        restored = len(recorded)
    else:
        me = {"uid": os.geteuid(), "gid": os.getegid()}
        restored = sum(1 for item in recorded if all(item.get(k, me[k]) == me[k] for k in me))
    reason = None
    if restored < len(recorded):
        reason = ("the base was the replayer's live directory, whose owners are its own" if not rebuilt else
                  f"the replayer runs as uid {os.geteuid()}, not root, and cannot give files to other uids: "
                  "the rebuilt base is its own, so a run that depends on owners may differ; replay as root")
    return {"recorded": len(recorded), "restored": restored, "reason": reason}

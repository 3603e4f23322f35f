"""capsule_promote ``as_branch``: a capsule's change as a commit on a new branch (issue 39).

For people who review with git: the change lands on ``refs/heads/NAME`` of the host
repository, parented on the commit the capsule's base was taken from
(capsules/branch_base.py), and they use ``git diff``, ``git merge`` and their forge as
usual.  The work tree and the index are never touched.

What is checked, in order, and why:

1. **The target**, before any test runs: the workspace must be a git worktree's top
   level, NAME a name ``git check-ref-format --branch`` takes as it is (not ``@{-1}``,
   which it would expand), the branch new, the base commit recorded and present.  Each
   refusal says which.
2. **The change**, exactly as capsule_promote judges it (capsules/promote.py ``judge``):
   the scope, the hazards, the policies and their tests.  A change promotion would
   refuse is refused here too, with the same report, and no branch is made.  One check
   is left out: the live workspace's edits since the capsule was made (REPO_CHANGED for
   promotion) overwrite nothing on a branch of the base commit; ``git merge`` shows them.
3. **The commit**, with git's plumbing on a temporary index (``GIT_INDEX_FILE``): the
   base commit's tree is read into it, the capsule's paths are hashed in
   (``hash-object -w --no-filters``, from the capsule's view, never through a link) and
   the index edits applied (capsules/branch_tree.py: git's rules for modes, symlinks,
   deletions, ``.git`` paths), then ``write-tree``, ``commit-tree --no-gpg-sign`` and
   ``update-ref NEW 0000…``: the ref is created only if it still does not exist, so an
   existing branch, even one made meanwhile, is never overwritten (CONFLICT).  Until that
   last step only unreferenced objects were written.  Git runs as gitpromote's ``_git``
   runs it: hooks and fsmonitor off, no inherited ``GIT_*``.

The commit's author is the capsule (``ccw capsule CAP``); its committer the host git's
``user.name``/``user.email``, or the capsule too when they are not set.  Its message
lists the runs the policies judged (each capsule of the lineage, in order, then those of
the capsules merged into it) and the policies' verdicts.

Carried as ``git add`` of each changed path would record the capsule's file: a file the
workspace had edited but not committed when the capsule was made lands with those edits
if the capsule changed it.  The capsule's own commits and refs are not carried (``git``
lists them; promote the capsule to carry them).
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import unicodedata
from dataclasses import dataclass
from typing import Any

import trio

from mcp_server.capsules import branch_tree, gitowner, promote
from mcp_server.capsules.branch_base import recorded_commit
from mcp_server.capsules.gitpromote import _git
from mcp_server.capsules.service import CapsuleService
from mcp_server.fs import changeset
from mcp_server.fs.promote import Op
from mcp_server.fs.view import DirFds, RootView
from mcp_server.journal_records import CapsuleRecord
from sandbox.errors import CcwError

MAX_RUNS_LISTED = 50
SUBJECT_MAX = 72  # git's subject convention: a first line that fits a log line and an email subject
RUN_MAX = 160  # one run's line in the message body
_ZERO = {40: "0" * 40, 64: "0" * 64}


@dataclass(frozen=True)
class Target:
    """Where the commit goes: the branch's ref, and the commit it is parented on."""

    name: str
    ref: str
    base: str


def target(workspace: str, name: str, base_fingerprint: dict[str, Any] | None) -> Target:
    """The branch NAME of the workspace's repository, checked (step 1 of the module docstring)."""
    top = _git(workspace, "rev-parse", "--show-toplevel", check=False)
    shown = os.path.realpath(top.stdout.decode("utf-8", "surrogateescape").strip())
    if top.returncode != 0 and b"detected dubious ownership" in top.stderr:  # root's git, a user's checkout
        raise CcwError("PERMISSION_DENIED", f"git does not trust the repository at {workspace!r}, which another "
                       "uid owns; no branch was made. Make the branch as its owner, or trust it as git says "
                       "(see details.git) and ask again (objects and the branch are then written as you)",
                       {"workspace": workspace, "git": top.stderr.decode(errors="replace").strip()})
    if top.returncode != 0 or shown != os.path.realpath(workspace):
        reason = top.stderr.decode(errors="replace").strip() or "it is inside another worktree"
        raise CcwError("UNSUPPORTED", f"the workspace {workspace!r} is not the top of a git repository ({reason}); "
                       "no branch was made. Promote the capsule instead", {"workspace": workspace})
    checked = _git(workspace, "check-ref-format", "--branch", name, check=False)
    if checked.returncode != 0 or checked.stdout.decode("utf-8", "surrogateescape").strip() != name:
        raise CcwError("INVALID_ARGUMENT", f"git refuses {name!r} as a branch name (git check-ref-format --branch); "
                       "no branch was made. Choose another name, like ccw/fix-1", {"as_branch": name})
    base = recorded_commit(base_fingerprint)
    if base is None:
        raise CcwError("UNSUPPORTED", "the commit this capsule's base was taken from is unknown (it was made before "
                       "ccw recorded it, or over a repository with no commit); no branch was made. Promote it, or "
                       "make a new capsule and redo the change", {"as_branch": name})
    if _git(workspace, "cat-file", "-e", f"{base}^{{commit}}", check=False).returncode != 0:
        raise CcwError("UNSUPPORTED", f"the capsule's base commit {base} is no longer in the repository; no branch "
                       "was made", {"base": base})
    ref = f"refs/heads/{name}"
    clash = _clash(workspace, ref)
    if clash is not None:
        raise _exists(name, clash)
    return Target(name, ref, base)


def _clash(workspace: str, ref: str) -> str | None:
    """The ref that keeps ``ref`` from being made: itself, a ref where one of its directories would
    be (``a`` for ``a/b``), or one under it (``a/b`` for ``a``); None if there is none."""
    parts = ref.split("/")
    for i in range(3, len(parts) + 1):
        if _git(workspace, "rev-parse", "--verify", "-q", "/".join(parts[:i]), check=False).returncode == 0:
            return "/".join(parts[:i])
    under = _git(workspace, "for-each-ref", "--count=1", "--format=%(refname)", f"{ref}/").stdout.decode(
        "utf-8", "surrogateescape").strip()
    return under or None


def _exists(name: str, clash: str) -> CcwError:
    what = "exists" if clash == f"refs/heads/{name}" else f"cannot be made beside {clash}"
    return CcwError("CONFLICT", f"the branch {name!r} {what}; it was left as it is and no branch was made. "
                    "Choose another name, or delete it first (git branch -D)", {"as_branch": name, "ref": clash})


async def branch(service: CapsuleService, request: promote.Request, name: str) -> dict[str, Any]:
    """Commit the capsule's change onto the new branch ``name`` if promotion's checks pass."""
    record = service.live_record(request.capsule_id)
    found = await trio.to_thread.run_sync(target, record.workspace, name, record.base_fingerprint)

    async def body(service: CapsuleService, request: promote.Request, record: CapsuleRecord) -> dict[str, Any]:
        return await _branch_frozen(service, request, record, found)

    async with service.turn(request.capsule_id, promote.PROMOTE):
        return await promote.in_turn(service, request, body)


async def _branch_frozen(service: CapsuleService, request: promote.Request, record: CapsuleRecord,
                         found: Target) -> dict[str, Any]:
    judged = await promote.judge(service, request, record, conflicts=False)
    report = judged.report
    about = {"name": found.name, "ref": found.ref, "parent": found.base}
    listed = {entry.path for entry in judged.plan.entries} | {one["path"] for one in judged.scoped["skipped"]}
    caught = await trio.to_thread.run_sync(_caught_up, service, record, await service.open_root(record.capsule_id),
                                           request, listed)
    if not report["passed"] or request.dry_run:
        would = sorted({*judged.would_apply, *(op.path for op in caught)}, key=os.fsencode)
        return {"promoted": False, "dry_run": request.dry_run,
                "applied": would if request.dry_run else [], "policy_report": report,
                **judged.scoped, "branch": about}
    kinds = {entry.path: entry.new.kind for entry in judged.plan.entries if entry.new is not None}
    targets = {entry.path: entry.new.target for entry in judged.plan.entries
               if entry.new is not None and entry.new.kind == "symlink"}
    message = commit_message(service, record, report, found)
    root_fd = await service.open_root(record.capsule_id)
    ops = [*judged.ops, *caught]
    kinds.update({op.path: "symlink" if op.action == "symlink" else "file" for op in caught if op.action != "delete"})
    targets.update({op.path: op.target for op in caught if op.action == "symlink"})
    made = await trio.to_thread.run_sync(_commit, record, found, root_fd, ops, kinds, targets, message)
    skipped = judged.scoped["skipped"] + [{"path": path, "reason": branch_tree.GIT_DIR} for path in made.left_out]
    return {"promoted": True, "dry_run": False, "applied": made.paths, "policy_report": report,
            **judged.scoped, "skipped": skipped, "branch": {**about, "commit": made.commit}}


def _caught_up(service: CapsuleService, record: CapsuleRecord, root_fd: int, request: promote.Request,
               listed: set[str]) -> list[Op]:
    """The capsule's changes the workspace has since been brought to (the capsule, or a merge of
    it, promoted; the same edit made by hand): they differ from the base no longer, so the
    change list, read against the live workspace, leaves them out, yet the base commit the
    branch is cut from lacks them.  A path counts when the workspace no longer holds what the
    capsule found there (its recorded state) and the capsule does not hold that either; what
    is committed is the capsule's, which is also what the workspace holds now (promotion's
    hazard checks saw it when it was promoted; a hand edit is the user's own)."""
    recorded = {path: state for path, state in promote._recorded_states(service.journal, record).items()
                if changeset.keyed_path(path) == path and path not in listed}
    live = promote._live_states(record.workspace, sorted(recorded))
    moved, _, _ = request.scope.split(record.workspace, [path for path in sorted(recorded)
                                                         if live[path] != recorded[path]])
    ops = []
    with RootView.from_fd(root_fd) as capsule, DirFds(capsule) as dirs:
        for path in moved:
            if changeset.base_state(capsule, path, dirs) == recorded[path]:
                continue  # changed and changed back in the capsule: the workspace's edit is not its
            side = dirs.lstat(path)
            if side is None:
                ops.append(Op("delete", path))
            elif side.kind == "symlink":
                ops.append(Op("symlink", path, target=side.target))
            elif side.kind == "file":
                ops.append(Op("write", path, side.mode))
    return ops


@dataclass(frozen=True)
class _Made:
    commit: str
    paths: list[str]  # recorded or removed, in byte order
    left_out: list[str]


def _commit(record: CapsuleRecord, found: Target, root_fd: int, ops: list[Op], kinds: dict[str, str],
            targets: dict[str, str | None], message: str) -> _Made:
    """Step 3 of the module docstring, in a thread."""
    workspace = record.workspace
    scratch = tempfile.mkdtemp(prefix="ccw-branch-")
    was = gitowner.before(workspace)
    try:
        env = {"GIT_INDEX_FILE": os.path.join(scratch, "index")}
        _git(workspace, "read-tree", found.base, env=env)
        base = branch_tree.parse_ls_tree(_git(workspace, "ls-tree", "-r", "-z", "--full-tree", found.base).stdout)
        edits = branch_tree.edits(base, ops, kinds)
        oids = _hash_blobs(workspace, scratch, root_fd, edits.add, targets)
        zero = _ZERO[len(found.base)]
        _git(workspace, "update-index", "-z", "--index-info", stdin=branch_tree.index_info(edits, oids, zero), env=env)
        tree = _git(workspace, "write-tree", env=env).stdout.decode().strip()
        if tree == _git(workspace, "rev-parse", f"{found.base}^{{tree}}").stdout.decode().strip():
            raise CcwError("INVALID_ARGUMENT", "the capsule's change is nothing git records (empty directories, "
                           "git dir contents or mode bits git keeps no track of); no branch was made",
                           {"left_out": edits.left_out})
        commit = _git(workspace, "commit-tree", "--no-gpg-sign", tree, "-p", found.base, "-F", "-",
                      stdin=message.encode("utf-8", "surrogateescape"), env=_identity(workspace, record.capsule_id))
        oid = commit.stdout.decode().strip()
        moved = _git(workspace, "update-ref", "-m", f"ccw: branch of capsule {record.capsule_id}", found.ref, oid,
                     zero, check=False)
        if moved.returncode != 0:  # made meanwhile: the compare-and-swap on "absent" failed
            clash = _clash(workspace, found.ref)
            if clash is not None:
                raise _exists(found.name, clash)
            raise CcwError("INTERNAL", f"git update-ref failed in {workspace!r}: "
                           f"{moved.stderr.decode(errors='replace').strip()}; no branch was made")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        gitowner.give_back(was, (found.ref, f"logs/{found.ref}"))
    paths = sorted({*edits.remove, *(path for path, _ in edits.add)},
                   key=lambda p: p.encode("utf-8", "surrogateescape"))
    return _Made(oid, paths, edits.left_out)


def _hash_blobs(workspace: str, scratch: str, root_fd: int, add: list[tuple[str, str]],
                targets: dict[str, str | None]) -> dict[str, str]:
    """Each recorded path's blob, written into the repository: the capsule's file (read through its
    view, no link followed) or a symlink's target, staged in ``scratch`` for one ``hash-object``."""
    if not add:
        return {}
    staged = []
    with RootView.from_fd(root_fd) as capsule, DirFds(capsule) as dirs:
        for i, (path, mode) in enumerate(add):
            if mode == branch_tree.SYMLINK:
                data = os.fsencode(targets.get(path) or "")
            else:
                read = dirs.read_regular(path, missing_ok=False)
                assert read is not None
                data = read
            staged.append(os.path.join(scratch, f"blob{i}"))
            with open(staged[-1], "wb") as out:
                out.write(data)
    listed = "".join(f"{name}\n" for name in staged).encode()
    oids = _git(workspace, "hash-object", "-w", "--no-filters", "--stdin-paths", stdin=listed).stdout.decode().split()
    return {path: oid for (path, _), oid in zip(add, oids, strict=True)}


def _identity(workspace: str, capsule_id: str) -> dict[str, str]:
    """The capsule as the author; the host git's user as the committer, or the capsule when unset."""
    me = {"GIT_AUTHOR_NAME": f"ccw capsule {capsule_id}", "GIT_AUTHOR_EMAIL": "ccw@localhost"}
    name = _git(workspace, "config", "user.name", check=False).stdout.decode(errors="replace").strip()
    email = _git(workspace, "config", "user.email", check=False).stdout.decode(errors="replace").strip()
    if name and email:
        return {**me, "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email}
    return {**me, "GIT_COMMITTER_NAME": me["GIT_AUTHOR_NAME"], "GIT_COMMITTER_EMAIL": me["GIT_AUTHOR_EMAIL"]}


def commit_message(service: CapsuleService, record: CapsuleRecord, report: dict[str, Any], found: Target) -> str:
    """The subject, the runs the policies judged (the capsule's, its ancestors' and those of the
    capsules merged into it), and the policies' verdicts."""
    runs = []
    for capsule in promote.judged_capsules(service.journal, record):
        for ex in service.journal.execs(capsule.capsule_id):
            runs.append(run_line(capsule.capsule_id, ex))
    lines = [shortened(f"ccw: the change of capsule {record.capsule_id}", SUBJECT_MAX), "",
             f"Made in capsule {record.capsule_id} over {record.workspace}, from {found.base}.", "",
             f"Runs ({len(runs)}):"]
    lines += [f"  {line}" for line in runs[:MAX_RUNS_LISTED]]
    if len(runs) > MAX_RUNS_LISTED:
        lines.append(f"  … and {len(runs) - MAX_RUNS_LISTED} more (ccw log {record.capsule_id})")
    return "\n".join([*lines, "", *verdict_lines(report)]) + "\n"


def run_line(capsule_id: str, ex: dict[str, Any]) -> str:
    """One journaled exec: its number, capsule, how it ended and its command on one line (control
    characters escaped, as the capsule chose them), its command ``shortened`` to ``RUN_MAX`` characters."""
    ended = ("timed out" if ex.get("timed_out") else "killed (memory)" if ex.get("oom_killed")
             else f"signal {ex['signal']}" if ex.get("signal") else f"exit {ex.get('exit_code')}")
    argv = "".join(c if c.isprintable() else repr(c)[1:-1] for c in shlex.join(ex["argv"]))
    return f"#{ex['seq']} {capsule_id}: {ended}: {shortened(argv, RUN_MAX)}"


def shortened(text: str, limit: int) -> str:
    """``text`` if it has at most ``limit`` characters, else cut at the last space that leaves room
    for "…" and that ellipsis put on.  Cut by characters, so never inside a UTF-8 sequence; a first
    word longer than the limit is cut within itself, but never between a letter and its combining
    marks (a reader would see another letter)."""
    if len(text) <= limit:
        return text
    room = limit - 1
    cut = text.rfind(" ", 0, room + 1)  # a space at ``room`` ends the word before it exactly there
    if cut <= 0 or not text[:cut].strip():
        cut = room
        while cut > 0 and unicodedata.combining(text[cut]):
            cut -= 1
    return text[:cut].rstrip() + "…"


def verdict_lines(report: dict[str, Any]) -> list[str]:
    """The policies' verdict, each check's, and the hazards allowed."""
    names = ", ".join(report.get("policies") or ["baseline"])
    lines = [f"Policies ({names}): {'passed' if report['passed'] else 'failed'}"]
    checks = [key for key in ("tests_ok", "paths_ok", "resource_ok", "network_ok", "hazards_ok", "replay_ok",
                              "output_identical") if key in report]
    lines.append("  " + ", ".join(f"{key}: {_json_word(report[key])}" for key in checks))
    lines += [f"  hazard allowed: {h['kind']} {h['path']}" for h in report.get("hazards") or () if h.get("allowed")]
    if report.get("details"):
        lines.append(f"  {report['details']}")
    return lines


def _json_word(value: Any) -> str:
    return "null" if value is None else "true" if value is True else "false" if value is False else str(value)

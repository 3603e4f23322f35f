"""Replaying a witness: re-run it in a fresh capsule and compare (seed 003 §5).

The base is rebuilt from the witness's blobs into a scratch directory (files with their
modes and mtimes, directories and the top with their modes, symlinks as links; a root
replayer gives each entry and the top its recorded owner, capsules/owners.py) and mounted
at the recorded workspace path, or, for a witness made without blobs, taken from a directory
the replayer names (``workspace``) if every named base entry there still matches.  So a
witness replays on a fresh state dir after the workspace has moved away.  Execs are
re-run with the recorded argv, cwd, stdin and clock offset (the capsule's shift from the
real clock, usually none); file-tool writes recorded between them are redone in sequence.

A witness is untrusted input (issue 24): anyone can write one, and a replay runs its
commands.  So a replay takes nothing from the replaying process because a witness asks:

- **Environment.** Values only from what the replayer passes (``ReplayOptions.env``);
  a name the witness's capsule whitelisted but the replayer did not pass is absent, and
  the report lists it (``env_missing``).  Never the server's own environment.
- **Network.** Only what the replayer allows (``network``, default none), under the
  same egress rules as any capsule.  A witness names the rules each exec ran under (they
  may change while a capsule lives: capsules/netlive.py); with a network allowed, each
  exec runs under its recorded rules, and a recorded rule outside what the replayer
  allows refuses the replay, naming it, before anything runs.  A policy's replay of its
  own capsule's signed witness (``of_capsule``) is allowed the rules it recorded.
- **Files.** With blobs, only the witness's own bytes (and what every jail sees).  A
  witness without blobs needs the replayer to name its live base, a directory the
  replaying user can read: never the path the witness names.  That path is still
  where the jail shows the base, a mount point inside the jail and nothing on the host.
- **Trust.** A witness signed by this state dir's key, or by a key it trusts (``ccw
  witness trust``, fs/witness_trust.py), replays; one unsigned, signed by a key not
  trusted here, or changed since it was signed, only with ``allow_untrusted``
  (PERMISSION_DENIED otherwise, before any blob is read).  Its report says which
  (``signature``) and whose (``signed_by``).  Trust waives that refusal and nothing
  else: a trusted key's witness gets the environment, network and workspace above,
  as any other; only this state dir's own gets its recorded network rules back
  (``network_recorded``, for a policy's replay).

The recorded execs are re-run by replay_steps.py, beside the services they ran beside
(started from their specs in the replay capsule); a service's own run is not re-run.

Internal callers replay witnesses this state dir just made (promotion's
``require_replay_ok``): they are signed, and ``ReplayOptions.of_capsule`` gives them the
values and network the capsule's own runs had.  ccw-bot replays its clients' witnesses
with ``allow_untrusted`` (its key is its own) and only the values its client sent.

What is compared, and what ``replay_ok`` and ``output_identical`` mean, is in
core/replaydiff.py.  Each mismatch names the exec and field, or the path.  A mismatch in a
file the witness's base ignores (its git rules, carried in the witness: capsules/
witness_ignore.py) is one promotion would never carry, so it is set apart
(``ignored_differences``) and fails nothing, unless the replayer asks ``strict_outputs``.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import trio

from mcp_server.capsules import capsecrets, exposure, netlive, owners, replay_secrets, witness_ignore
from mcp_server.capsules.replay_steps import (
    change_mismatches,
    rerun,
    service_env_names,
    services_named,
    services_of,
    set_aside,
)
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.witness import verify_file, witness_key
from mcp_server.core import hostpaths, paths
from mcp_server.core.netrules import NetworkSpec, network_json
from mcp_server.fs import changeset
from mcp_server.fs import witness as wfmt
from mcp_server.fs.promote import make_symlink
from mcp_server.fs.view import RootView
from mcp_server.fs.witness_key import Verdict
from mcp_server.journal_records import CapsuleRecord
from sandbox.errors import CcwError, from_oserror
from sandbox.homes import login_homes
from sandbox.hostdirs import check_capsule_dir
from sandbox.replies import Change
from sandbox.spec import CapsuleSpec, Limits


def _rebuild_base(manifest: dict[str, Any], blobs: dict[str, bytes], into: str) -> None:
    """Lay out the witness's base entries under ``into``, never writing through a link.

    The paths come from an archive, so every write resolves beneath ``into`` without
    symlinks (RootView) and creates files exclusively.
    """
    dirs: list[tuple[str, int]] = []
    with RootView.open(into) as view:
        for item in manifest["base"]["files"]:
            path = item["path"]
            head = path.rpartition("/")[0]
            if head:
                view.makedirs(head)
            if item["type"] == "dir":
                view.makedirs(path)
                dirs.append((path, item["mode"]))
            elif item["type"] == "symlink":
                make_symlink(view, item["target"], path)
            else:
                _create_file(view, path, blobs[item["blob"]], item["mode"], item.get("mtime_ns"))
        if owners.can_restore():
            owners.restore(view, owners.entries(manifest["base"]))
        for path, mode in reversed(dirs):  # deepest first: a read-only parent still lets children be set
            view.chmod(path, mode)
        top = manifest["base"].get("top")
        if top is not None:  # last: a read-only top would refuse what comes before ("." is the view's own, no link)
            view.chmod(".", top["mode"])


def _remove_scratch(scratch: Path) -> None:
    """Remove a replay's scratch directory.  Its rebuilt base has the witness's modes, read-only
    directories among them (its top's too), which a replayer that is not root could not empty:
    each directory is first made writable by us, through its parent, never following a link
    (what lies there came from an archive).  Nothing runs in the scratch any more."""
    if os.geteuid() != 0:
        pending = [""]
        with RootView.open(str(scratch)) as view:
            while pending:
                rel = pending.pop()
                try:
                    parent = view.open_fd(rel or ".", os.O_RDONLY | os.O_DIRECTORY, what="clean up")
                except CcwError:
                    continue  # unreadable even to its owner: rmtree below says nothing either way
                try:
                    for entry in os.scandir(parent):
                        if entry.is_dir(follow_symlinks=False):
                            os.chmod(entry.name, 0o700, dir_fd=parent)  # a directory, just seen without following
                            pending.append(f"{rel}/{entry.name}".lstrip("/"))
                except OSError:
                    pass
                finally:
                    os.close(parent)
    shutil.rmtree(scratch, ignore_errors=True)


def _create_file(view: RootView, path: str, data: bytes, mode: int, mtime_ns: int | None) -> None:
    head, _, name = path.rpartition("/")
    parent = view.open_fd(head or ".", os.O_RDONLY | os.O_DIRECTORY, write=True, what="rebuild")
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=parent)
    except OSError as exc:
        raise from_oserror(exc, "creating a base file of the witness", path,
                           "the witness names this path twice or below a non-directory: make it again") from exc
    finally:
        os.close(parent)
    try:
        _write_all(fd, data)
        os.fchmod(fd, mode)
        if mtime_ns is not None:
            os.utime(fd, ns=(mtime_ns, mtime_ns))  # .pyc files check their source's mtime
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    rest = memoryview(data)
    while rest:
        rest = rest[os.write(fd, rest):]


def _live_base_mismatches(manifest: dict[str, Any], live: str) -> list[dict[str, Any]]:
    """The witness's base entries that the replayer's live directory no longer matches."""
    problems = []
    with RootView.open(live) as view:
        for item in manifest["base"]["files"]:
            side = changeset.lstat(view, item["path"])
            if side is None:
                problems.append({"path": item["path"], "problem": "missing"})
            elif item["type"] == "symlink":
                if side.target != item["target"]:
                    problems.append({"path": item["path"], "problem": "link target differs"})
            elif item["type"] == "dir":
                if side.kind != "dir":
                    problems.append({"path": item["path"], "problem": "no longer a directory"})
            elif side.kind != "file" or wfmt.blob_hash(view.read_bytes(item["path"])) != item["blob"]:
                problems.append({"path": item["path"], "problem": "content differs"})
    return problems


def _live_dir(workspace: str) -> str:
    """The replayer's live base: an absolute directory that the replaying user may read, and
    that capsule_create would take (sandbox.hostdirs.check_capsule_dir: no system directory,
    home or key store).

    The front end runs as its caller, so its own access is the caller's (the helper checks
    both again with the caller's uid when it mounts the capsule).
    """
    paths.encoded(workspace, "workspace")
    hostpaths.absolute(workspace, "workspace")
    if not os.path.isdir(workspace):
        raise CcwError("NOT_FOUND", f"workspace {workspace!r} is not a directory; name your copy of the witness's "
                                    "workspace", {"workspace": workspace})
    if not os.access(workspace, os.R_OK | os.X_OK):
        raise CcwError("PERMISSION_DENIED", f"you may not read {workspace!r}; name a directory you can read",
                       {"workspace": workspace})
    real = hostpaths.utf8(os.path.realpath(workspace), "workspace")
    check_capsule_dir("workspace", real, os.getuid(), login_homes(), given=workspace)
    return real


def _replay_changes(changes: Sequence[Change], base_dir: str, root_fd: int) -> list[dict[str, Any]]:
    with RootView.from_fd(root_fd) as capsule, RootView.open(base_dir) as base:
        entries = changeset.expand(changes, base, capsule)
        out = []
        for entry in entries:
            new = entry.new
            out.append({
                "path": entry.path,
                "status": "added" if entry.old is None else "deleted" if new is None else "modified",
                "type": new.kind if new else None,
                "mode": new.mode if new else None,
                "target": new.target if new and new.kind == "symlink" else None,
                "blob": wfmt.blob_hash(capsule.read_bytes(entry.path)) if new and new.kind == "file" else None,
            })
        return out


@dataclass(frozen=True)
class ReplayOptions:
    """What a replayer lets a witness have; by default nothing of the replaying process's own."""

    env: Mapping[str, str] = field(default_factory=dict)  # values for the commands (HOME is the capsule's own)
    network: NetworkSpec | None = None  # the allowlist the replay may use; None: network none
    workspace: str | None = None  # the live base of a witness made without blobs
    allow_untrusted: bool = False  # replay a witness signed by neither this state dir nor a key it trusts
    volatile: tuple[str, ...] = ()  # globs of paths left out of the comparison, with the witness's own
    # Whether the witness's own volatile globs count.  Not for a policy's replay: the globs are
    # the agent's declaration, and ``volatile: ["**"]`` would blind require_replay_ok to every
    # file a replay wrote differently.
    witness_volatile: bool = True
    # Compare the files the witness's base ignores too (by default their differences are set apart:
    # capsules/witness_ignore.py).
    strict_outputs: bool = False
    # The network is the witness's own recorded rules (capsules/netlive.py ``replay_rules``), for a
    # witness this state dir signed: a policy's replay of its capsule's runs as they ran.
    network_recorded: bool = False
    # Show the host directories the witness's capsule exposed, as this replayer's checks allow
    # (capsules/exposure.py ``replayable``).  Not for ccw-bot: there the witness and the report
    # are a REAPI client's, so a recorded ``/srv/app`` would let a command print the bot host's
    # files into the report's output diffs.
    expose_recorded: bool = True

    @classmethod
    def of_capsule(cls, record: CapsuleRecord, secrets: Collection[str] = ()) -> ReplayOptions:
        """Replay a capsule's own witness as its runs ran, for a policy: its whitelisted variables'
        values (this server's, as runs.whitelisted gave its runs) and its network, but none of its
        volatile globs (the capsule may not decide what its own policy check ignores).  Not the
        variables of its ``secrets`` (capsules/capsecrets.py): its runs had placeholders there, and
        this server's own value of such a name may be the very credential the capsule was kept
        from; the replay gets placeholders of its own for them (capsules/replay_secrets.py)."""
        env = {name: os.environ[name] for name in record.spec.env_whitelist
               if name in os.environ and name not in secrets}
        return cls(env=env, network=record.network_spec, witness_volatile=False, network_recorded=True)


_UNTRUSTED = {
    "unsigned": "it bears no signature (made by another tool, or by a ccw from before witnesses were signed)",
    "unknown key": "it was signed with a key this state dir does not trust",
    "invalid": "its signature does not match it: the witness or its signature was changed after signing",
}


def admit(manifest: dict[str, Any], signature: Verdict, options: ReplayOptions) -> None:
    """Refuse what the replayer has not allowed; run once the manifest and signature are read, before any blob."""
    if signature.state != "valid" and not options.allow_untrusted:
        trust = (f"; if you trust whoever holds key {signature.key}, `ccw witness trust {signature.key} --name NAME` "
                 "lets its witnesses replay here" if signature.state == "unknown key" and signature.key else "")
        raise CcwError(
            "PERMISSION_DENIED",
            f"signature: {signature.state}: {_UNTRUSTED[signature.state]}{trust}. A replay runs its commands, "
            "so a witness signed by neither this state dir nor a key it trusts replays only when you say so: pass "
            "allow_untrusted: true (ccw capsule replay --allow-untrusted) if you trust where it came from; its "
            "commands then get only the env, network and workspace you pass",
            signature.report(),
        )
    if manifest["include_blobs"] and options.workspace is not None:
        raise CcwError("INVALID_ARGUMENT", "the witness carries its base (made with include_blobs): replay it "
                                           "without workspace, which names the base of a witness without blobs")
    if not manifest["include_blobs"] and options.workspace is None:
        raise CcwError(
            "INVALID_ARGUMENT",
            "the witness carries no blobs (made with include_blobs: false), so its base is a live directory you "
            f"name: pass workspace (ccw capsule replay --workspace DIR) with your copy of {manifest['workspace']!r}, "
            "or make the witness again with include_blobs: true",
            {"recorded_workspace": manifest["workspace"]},
        )


async def replay(service: CapsuleService, path: Path, expected_root: str | None,
                 options: ReplayOptions | None = None) -> dict[str, Any]:
    """Verify, check what the replayer allows, rebuild the base, re-run the execs in a fresh capsule and compare."""
    options = options or ReplayOptions()
    report = await _verified(service, path, expected_root, options)
    manifest, blobs = report["manifest"], report["blobs"]
    # The rules each exec ran under, within what the replayer allows (or PERMISSION_DENIED naming them).
    network, rules = netlive.replay_rules(manifest, options.network,
                                          options.network_recorded and report["verdict"].own)
    options = replace(options, network=network)
    if services_named(manifest):
        services_of(service)  # UNSUPPORTED here, before any capsule is made, when none can start
    given = await replay_secrets.given(service.state.root, manifest, report["verdict"].state == "valid")
    options = replace(options, env={**options.env, **replay_secrets.env(given)})
    scratch = Path(tempfile.mkdtemp(prefix="replay-", dir=service.state.tmp_dir))
    try:
        base_dir = await _base_dir(manifest, blobs, scratch, options.workspace)
        capsule_spec = _capsule_spec(manifest, base_dir, options)
        used, dropped = _exposed(manifest["capsule"].get("expose", []), options.expose_recorded, report["verdict"])
        capsule_spec = replace(capsule_spec, expose=capsecrets.shown(tuple(used), given))
        async with service.scratch(capsule_spec, quiet=True, network=options.network) as capsule_id, \
                replay_secrets.held(service.state.root, service.networks, capsule_id, given):
            tally = await rerun(service, capsule_id, capsule_spec, manifest, blobs, options.network, options.env, rules)
            changes = await service.changes(capsule_id)
            root_fd = await service.open_root(capsule_id)
            actual_changes = await trio.to_thread.run_sync(_replay_changes, changes, base_dir, root_fd)
            ignored = await trio.to_thread.run_sync(_ignored, manifest, blobs, actual_changes, scratch, options)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_remove_scratch, scratch)
    declared = manifest["capsule"].get("volatile", ()) if options.witness_volatile else ()
    globs = sorted(set(declared) | set(options.volatile))
    changed, apart = change_mismatches(manifest, tally, actual_changes, globs)
    changed, ignored_differences = set_aside(changed, ignored)
    mismatches = tally.mismatches + changed
    mismatches.sort(key=lambda m: (m["kind"] != "exec", m.get("exec", 0), m.get("path", "")))
    recorded = manifest["capsule"]
    return {
        "replay_ok": not mismatches,
        "output_identical": not tally.output_diffs,
        "root_hash": report["root_hash"],
        "execs": len(tally.touched),  # re-run and compared (a service's own runs are not)
        "mismatches": mismatches,
        "output_diffs": tally.output_diffs,
        "metrics": {"cpu_ms": tally.cpu_ms, "rss_max_kb": tally.rss_max_kb},
        **report["verdict"].report(),
        "env_missing": sorted((set(recorded["env_whitelist"]) | service_env_names(manifest)) - set(options.env)
                              - {"HOME"}),
        "network": {"recorded": recorded.get("network", "none"), "used": network_json(options.network)},
        "volatile": {"globs": globs, "paths": apart},
        # Only for a witness that carries its base's ignore rules, replayed without strict_outputs.
        **({"ignored_differences": ignored_differences} if ignored is not None else {}),
        "owners": owners.report(owners.entries(manifest["base"]), manifest["include_blobs"]),
        # Only for a witness whose capsule exposed directories: what this replayer showed of them.
        **({"expose": {"used": used, "dropped": dropped}} if "expose" in recorded else {}),
        **({"gitdirs": {"not_shown": recorded["gitdirs"], "reason": GITDIRS_NOT_CARRIED}}
           if "gitdirs" in recorded else {}),
        # Only for a witness with services: those started beside which execs, and their own runs not re-run.
        **({"services": tally.services_report()} if tally.started or tally.not_compared else {}),
    }


def _ignored(manifest: dict[str, Any], blobs: Mapping[str, bytes], actual_changes: list[dict[str, Any]],
             scratch: Path, options: ReplayOptions) -> frozenset[str] | None:
    """The paths either run changed that promotion would leave behind (capsules/witness_ignore.py): those
    the witness's base ignores, judged by the rules it carries in a repository under ``scratch``, and
    those in a cache directory its capsule made.  None: every path is compared."""
    rules = manifest["base"].get("ignore")
    if rules is None or options.strict_outputs:
        return None
    both = manifest["changes"] + actual_changes
    paths = sorted({c["path"] for c in both})
    repo = scratch / "ignore"
    os.mkdir(repo, 0o700)
    judged = witness_ignore.judge(rules, str(repo), paths, {c["path"] for c in both if c["type"] == "dir"})
    return judged | witness_ignore.within(paths, witness_ignore.made_caches(manifest["changes"], blobs))


NO_HOST_DIRS = "this replayer shows a witness no host directory (its witnesses are a remote client's)"


def _exposed(recorded: list[str], shown: bool, verdict: Verdict) -> tuple[list[str], list[dict[str, str]]]:
    """The recorded exposures this replay shows, and those it drops with why (``expose`` of its report);
    a witness's not of this state dir (``verdict.own``) only at toolchains' known places (exposure.replayable)."""
    if shown:
        return exposure.replayable(recorded, os.getuid(), login_homes(), not verdict.own)
    return [], [{"path": path, "reason": NO_HOST_DIRS} for path in recorded]


GITDIRS_NOT_CARRIED = ("a witness does not carry a git dir outside its workspace (a worktree's or a submodule's): "
                       "git in the replay finds no repository, so its commands fail there")


async def _verified(service: CapsuleService, path: Path, expected_root: str | None,
                    options: ReplayOptions) -> dict[str, Any]:
    """The witness read and verified, refused early if the replayer does not allow it, its blobs kept."""
    key = await trio.to_thread.run_sync(witness_key, service.state)
    check = functools.partial(verify_file, path, expected_root, key, True,
                              lambda manifest, signature: admit(manifest, signature, options))
    report: dict[str, Any] = await trio.to_thread.run_sync(check)
    if not report["ok"]:
        raise CcwError(
            "CONFLICT",
            "the witness failed verification, so it cannot be replayed; see details.problems "
            "(a tampered or truncated file): make the witness again from its capsule",
            {"problems": report["problems"]},
        )
    return report


def _capsule_spec(manifest: dict[str, Any], base_dir: str, options: ReplayOptions) -> CapsuleSpec:
    """The replay capsule: the base shown at the recorded workspace path, the recorded limits and clock
    offset, and for variables only those the replayer passed."""
    # The capsule's own offset from the real clock, not "the time the capsule was
    # made": that would shift every replay's clock into the past, and libfaketime
    # (the wall-clock shift) breaks Python's time.sleep under any shift (0.9.10:
    # clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) gets EINVAL when monotonic is
    # not faked, and lock timeouts hang when it is).  Nothing a replay compares
    # depends on the wall clock's value.
    recorded = manifest["capsule"]
    workspace = manifest["workspace"]
    return CapsuleSpec(
        workspace=workspace, given_base=base_dir if base_dir != workspace else None,
        clock_offset_sec=int(recorded.get("clock_offset_sec") or 0),
        env_whitelist=tuple(sorted(set(options.env) - {"HOME"})), limits=Limits.from_json(recorded["limits"]),
    )


async def _base_dir(manifest: dict[str, Any], blobs: dict[str, bytes], scratch: Path, live: str | None) -> str:
    """The base to replay over: rebuilt from the blobs under ``scratch``, else the replayer's ``live`` directory."""
    if manifest["include_blobs"]:
        base_dir = str(scratch / "base")
        os.mkdir(base_dir, 0o755)
        await trio.to_thread.run_sync(_rebuild_base, manifest, blobs, base_dir)
        return base_dir
    assert live is not None  # admit refused a witness without blobs that names no live base
    live = _live_dir(live)
    problems = await trio.to_thread.run_sync(_live_base_mismatches, manifest, live)
    if problems:
        raise CcwError(
            "NOT_FOUND",
            f"the witness carries no blobs and {live!r} does not match its base "
            f"({len(problems)} file(s), first {problems[0]['path']}: {problems[0]['problem']}); "
            "name the directory the witness was made from, or make it with include_blobs: true to replay it anywhere",
            {"files": problems},
        )
    return live

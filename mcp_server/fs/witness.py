"""Witness archives: a capsule's runs and changes, packaged so anyone can check and replay them.

Format (``ccw-witness/1``): a tar (optionally zstd-compressed) whose first member is
``manifest.json`` — canonical JSON naming the base, the capsule's settings, every exec
from the journal, every change a file tool made between execs (``writes``, sharing the
execs' sequence numbers), and the change set — followed by ``blobs/<blake3 hex>`` for each blob
the manifest names, in hash order.  ``base.files`` lists what a replay rebuilds the
base from: files (blob, mode, ``mtime_ns``), directories (mode) and symlinks (target),
chosen as mcp_server/capsules/witness_base.py says.  Each exec's ``output`` names the blobs of its
stdout and stderr as kept (``kept_bytes``, and the ``cap`` in force); fields added since
the first witnesses are optional, so older witnesses still verify and replay.  ``root_hash``
is ``blake3:`` + blake3 of the canonical manifest bytes; since the manifest names every blob by its blake3, the root
hash covers every byte of the witness.  The archive is deterministic: fixed member
metadata (mtime 0, uid/gid 0, mode 0644, no user names), fixed order, fixed zstd level
with no timestamps or content-size-dependent framing choices, so the same capsule gives
the same bytes.  It is readable with plain ``tar --zstd -xf``.

Nothing in it depends on the machine that made it except the recorded workspace path,
which is where replays bind the rebuilt base.

A witness made by a state dir carries ``signature.json`` right after the manifest: that
state dir's signature of the root hash (fs/witness_key.py).  It is outside what the root
hash covers, so the root hash is the same however (and whether) a witness is signed.

Reading is for untrusted archives (fs/tarstream.py): the manifest first, bounded; then
the signature; a manifest this state dir did not sign (a trusted key's included: trust
lets a witness run, it does not make another ccw's writer ours) is checked against its schema
(core/witness_manifest.py) before any field is used, and the caller may refuse the
witness there, before any blob is read; then each blob, hashed as it streams and kept
only if it matches its name.  The limits are below, each with its reason.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any, NamedTuple

import blake3
import zstandard

from mcp_server.core import witness_manifest
from mcp_server.core.canonical import canonical_json
from mcp_server.fs.tarstream import Limits, Member, TarStream
from mcp_server.fs.witness_key import UNSIGNED, Verdict, WitnessKey
from sandbox.errors import CcwError

FORMAT = witness_manifest.FORMAT
ZSTD_LEVEL = 3
MANIFEST_MEMBER = "manifest.json"
SIGNATURE_MEMBER = "signature.json"
BLOB_DIR = "blobs/"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def blob_hash(data: bytes) -> str:
    """``blake3:<hex>`` of some bytes."""
    return "blake3:" + blake3.blake3(data, max_threads=blake3.blake3.AUTO).hexdigest()


def root_hash(manifest: dict[str, Any]) -> str:
    """The witness's root hash: blake3 over the canonical manifest."""
    return "blake3:" + blake3.blake3(canonical_json(manifest)).hexdigest()


def manifest_blobs(manifest: dict[str, Any]) -> list[str]:
    """Every blob hash the manifest names (sorted, deduplicated)."""
    names: set[str] = set()
    for entry in manifest.get("base", {}).get("files", []):
        if entry.get("blob") and manifest.get("include_blobs"):
            names.add(entry["blob"])
    for change in manifest.get("changes", []):
        if change.get("blob"):
            names.add(change["blob"])
    for ex in manifest.get("execs", []):
        if ex.get("stdin_blob"):
            names.add(ex["stdin_blob"])
        for kept in (ex.get("output") or {}).values():
            names.add(kept["blob"])
    for write in manifest.get("writes", []):
        if write.get("blob"):
            names.add(write["blob"])
    return sorted(names)


def _member(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


@dataclass(frozen=True)
class Written:
    """What ``write_archive`` produced."""

    root_hash: str
    size_bytes: int
    blobs: int


class _CountingWriter(io.RawIOBase):
    def __init__(self, sink: IO[bytes]) -> None:
        self.sink = sink
        self.count = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        n = self.sink.write(data)
        self.count += len(data)
        return n if n is not None else len(data)


def write_archive(
    manifest: dict[str, Any],
    read_blob: Callable[[str], bytes],
    out: IO[bytes],
    compress: str = "zstd",
    key: WitnessKey | None = None,
) -> Written:
    """Write the witness for ``manifest`` to ``out``; ``read_blob(hash)`` supplies blob bytes.

    Each blob is re-hashed as it is written: a source that changed since the manifest
    was made is an error, not a witness that lies.  With ``key``, the root hash is
    signed (``signature.json``, after the manifest).
    """
    if compress not in ("zstd", "none"):
        raise CcwError("INVALID_ARGUMENT", f"compress must be 'zstd' or 'none', not {compress!r}")
    counter = _CountingWriter(out)
    stream: IO[bytes]
    compressor = None
    if compress == "zstd":
        params = zstandard.ZstdCompressionParameters.from_level(ZSTD_LEVEL, threads=-1, write_checksum=True)
        compressor = zstandard.ZstdCompressor(compression_params=params)
        stream = compressor.stream_writer(counter, closefd=False)  # type: ignore[arg-type]
    else:
        stream = counter  # type: ignore[assignment]
    manifest_bytes = canonical_json(manifest)
    names = manifest_blobs(manifest)
    with tarfile.open(fileobj=stream, mode="w|", format=tarfile.USTAR_FORMAT) as tar:
        tar.addfile(_member(MANIFEST_MEMBER, len(manifest_bytes)), io.BytesIO(manifest_bytes))
        if key is not None:
            signature = canonical_json(key.sign(root_hash(manifest)))
            tar.addfile(_member(SIGNATURE_MEMBER, len(signature)), io.BytesIO(signature))
        for name in names:
            data = read_blob(name)
            if blob_hash(data) != name:
                raise CcwError(
                    "CONFLICT",
                    f"a file changed while the witness was being written (blob {name} no longer matches); "
                    "make the witness again",
                    {"blob": name},
                )
            tar.addfile(_member(BLOB_DIR + name.split(":", 1)[1], len(data)), io.BytesIO(data))
    if compressor is not None:
        stream.close()
    return Written(root_hash(manifest), counter.count, len(names))


# What reading a witness may cost (fs/tarstream.py does the counting).  The replay keeps
# every blob in memory, so these are about memory first.
MAX_MANIFEST_BYTES = 32 << 20  # json.loads holds ~5-10x this as objects; a 100,000-entry base is ~20 MB
MAX_SIGNATURE_BYTES = 4 << 10  # one small object (witness_key.py)
MAX_MEMBER_BYTES = 4 << 30  # one blob: a carried or changed file (max_base_mb defaults to 1 GiB in all)
MAX_TOTAL_BYTES = 8 << 30  # all of it, held in memory by a replay: past this no replay here would finish
# Expanded / compressed, for a witness this state dir did not sign.  Source trees and
# build outputs compress 3-10x, logs 10-50x; runs of one byte reach zstd's 32768:1.
# Our own witnesses are not held to it (a capsule may well write a GiB of zeros).
MAX_UNTRUSTED_RATIO = 250


class Archive(NamedTuple):
    """What a witness archive holds, as read and checked."""

    manifest: dict[str, Any]
    blobs: dict[str, bytes]  # by ``blake3:<hex>``, each checked against its name (empty unless kept)
    problems: list[dict[str, Any]]
    signature: Verdict  # valid | unknown key | invalid | unsigned, and whose (witness_key.py)


def _parse_json(content: bytes, member: str) -> Any:
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(content, parse_constant=constant)
    except (ValueError, RecursionError) as exc:
        raise CcwError("INVALID_ARGUMENT", f"{member} in the witness is not JSON ({str(exc)[:200]}); "
                       "it is not a ccw witness, or it was damaged: make it again", {"member": member}) from None


def _read_manifest(tar: TarStream) -> tuple[dict[str, Any], str, list[dict[str, Any]]]:
    """The first member, manifest.json, bounded and parsed; its root hash and problems."""
    member = tar.next()
    if member is None or member.name != MANIFEST_MEMBER or not member.regular:
        found = "nothing" if member is None else repr(member.name)
        raise CcwError("INVALID_ARGUMENT", f"the archive's first member is {found}, not {MANIFEST_MEMBER}: "
                       "it is not a ccw witness", {"member": None if member is None else member.name})
    content = tar.whole(member, MAX_MANIFEST_BYTES, "MAX_MANIFEST_BYTES")
    manifest = _parse_json(content, MANIFEST_MEMBER)
    try:
        canonical = canonical_json(manifest)
    except (ValueError, UnicodeEncodeError) as exc:  # a lone surrogate has no UTF-8 form
        raise CcwError("INVALID_ARGUMENT", f"{MANIFEST_MEMBER} holds text that has no canonical form ({exc}); "
                       "it is not a ccw witness", {"member": MANIFEST_MEMBER}) from None
    problems = [] if canonical == content else [{"kind": "manifest_not_canonical", "member": MANIFEST_MEMBER}]
    return manifest, "blake3:" + blake3.blake3(canonical).hexdigest(), problems


def _read_head(tar: TarStream, key: WitnessKey | None) -> tuple[dict[str, Any], list[dict[str, Any]], Verdict,
                                                                  Member | None]:
    """The manifest, its problems, the signature's state and the first member after them.

    A manifest this state dir signed was written by ccw's own writer (the signature
    covers its canonical form, so it is that very manifest); any other is checked
    against the schema here, before any of its fields is used.  Checking costs about
    0.1 ms an entry, seconds for a large base: ordinary replays of one's own
    witnesses (promotion's) do not pay it.
    """
    manifest, root, problems = _read_manifest(tar)
    member = tar.next()
    state = UNSIGNED
    if member is not None and member.name == SIGNATURE_MEMBER and member.regular:
        try:
            signature = _parse_json(tar.whole(member, MAX_SIGNATURE_BYTES, "MAX_SIGNATURE_BYTES"), SIGNATURE_MEMBER)
        except CcwError:
            signature = None  # an unreadable signature is "invalid", as a wrong one is
        state = key.check(signature, root) if key is not None else Verdict("unknown key")
        member = tar.next()
    if not state.own:
        witness_manifest.check(manifest)
    return manifest, problems, state, member


def _limits(trusted: bool) -> Limits:
    return Limits(MAX_MEMBER_BYTES, MAX_TOTAL_BYTES, None if trusted else MAX_UNTRUSTED_RATIO)


def _unreadable(exc: Exception) -> CcwError:
    return CcwError("INVALID_ARGUMENT", f"not a readable witness archive ({exc}); check the path, or make the "
                                        "witness again")


def read_signature(data: IO[bytes], key: WitnessKey | None) -> tuple[dict[str, Any], str, Verdict]:
    """(manifest, root hash, signature verdict) from the head of an archive; its blobs are not read."""
    try:
        manifest, _, state, _ = _read_head(TarStream(data, _limits(False)), key)
    except (zstandard.ZstdError, OSError) as exc:
        raise _unreadable(exc) from exc
    return manifest, root_hash(manifest), state


def read_archive(data: IO[bytes], key: WitnessKey | None = None, keep_blobs: bool = True,
                 admit: Callable[[dict[str, Any], Verdict], None] | None = None) -> Archive:
    """A witness archive read within the limits above, every blob hashed as it streams.

    ``admit(manifest, signature)`` runs once the manifest and signature are read,
    before any blob: it may refuse (raise).  Blobs are kept only when ``keep_blobs``
    and only once their bytes match their name.  Problems (odd, extra, missing or
    tampered members) are returned, not raised, so ``verify`` can list them all.
    """
    try:
        tar = TarStream(data, _limits(False))
        manifest, problems, state, member = _read_head(tar, key)
        if admit is not None:
            admit(manifest, state)
        tar.limits = _limits(state.own)
        named = set(manifest_blobs(manifest))
        blobs: dict[str, bytes] = {}
        seen: set[str] = set()
        while member is not None:
            _take(tar, member, named, seen, blobs if keep_blobs else None, problems)
            member = tar.next()
    except (zstandard.ZstdError, OSError) as exc:
        raise _unreadable(exc) from exc
    problems += [{"kind": "blob_missing", "blob": name} for name in sorted(named - seen)]
    for problem in problems:
        if problem["kind"] in ("blob_missing", "blob_tampered"):
            problem["fields"] = _fields_naming(manifest, problem["blob"])  # what a bad blob affects
    return Archive(manifest, blobs, problems, state)


def _take(tar: TarStream, member: Member, named: set[str], seen: set[str], keep: dict[str, bytes] | None,
          problems: list[dict[str, Any]]) -> None:
    """Read one member after the head: a named blob is hashed as it streams and kept if it matches."""
    hex_name = member.name.removeprefix(BLOB_DIR)
    name = "blake3:" + hex_name
    if not member.regular or not member.name.startswith(BLOB_DIR) or not _HEX64.fullmatch(hex_name):
        kind = "duplicate_member" if member.name in (MANIFEST_MEMBER, SIGNATURE_MEMBER) else "unexpected_member"
        problems.append({"kind": kind, "member": member.name})
        tar.skip(member)
    elif name in seen:
        problems.append({"kind": "duplicate_member", "member": member.name})
        tar.skip(member)
    elif name not in named:
        problems.append({"kind": "blob_unreferenced", "blob": name})
        tar.skip(member)
    else:
        seen.add(name)
        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
        buffer = io.BytesIO() if keep is not None else None
        for chunk in tar.chunks(member):
            hasher.update(chunk)
            if buffer is not None:
                buffer.write(chunk)
        actual = "blake3:" + hasher.hexdigest()
        if actual != name:
            problems.append({"kind": "blob_tampered", "blob": name, "actual": actual})
        elif buffer is not None and keep is not None:
            keep[name] = buffer.getvalue()  # the buffer's own bytes, not a copy


def verify(data: IO[bytes], expected_root: str | None = None, key: WitnessKey | None = None,
           keep_blobs: bool = False, admit: Callable[[dict[str, Any], Verdict], None] | None = None) -> dict[str, Any]:
    """Recompute every hash; say precisely what does not match, and whose signature it bears."""
    manifest, blobs, problems, signature = read_archive(data, key, keep_blobs, admit)
    actual_root = root_hash(manifest)
    if expected_root is not None and actual_root != expected_root:
        problems.append({"kind": "root_hash", "field": "root_hash", "expected": expected_root, "actual": actual_root})
    problems.sort(key=lambda p: (p["kind"], p.get("blob", ""), p.get("member", ""), p.get("field", "")))
    return {"ok": not problems, "root_hash": actual_root, "problems": problems, **signature.report(),
            "verdict": signature, "manifest": manifest, "blobs": blobs}


def _fields_naming(manifest: dict[str, Any], name: str) -> list[str]:
    """JSON pointers of the manifest fields that name a blob (to say what a bad blob affects)."""
    out = []
    for i, entry in enumerate(manifest.get("base", {}).get("files", [])):
        if entry.get("blob") == name:
            out.append(f"/base/files/{i}/blob")
    for i, change in enumerate(manifest.get("changes", [])):
        if change.get("blob") == name:
            out.append(f"/changes/{i}/blob")
    for i, ex in enumerate(manifest.get("execs", [])):
        if ex.get("stdin_blob") == name:
            out.append(f"/execs/{i}/stdin_blob")
        for stream, kept in sorted((ex.get("output") or {}).items()):
            if kept["blob"] == name:
                out.append(f"/execs/{i}/output/{stream}/blob")
    for i, write in enumerate(manifest.get("writes", [])):
        if write.get("blob") == name:
            out.append(f"/writes/{i}/blob")
    return out

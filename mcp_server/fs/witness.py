"""Witness archives: a capsule's runs and changes, packaged so anyone can check and replay them.

Format (``ccw-witness/1``): a tar (optionally zstd-compressed) whose first member is
``manifest.json`` — canonical JSON naming the base, the capsule's settings, every exec
from the journal, every change a file tool made between execs (``writes``, sharing the
execs' sequence numbers), and the change set — followed by ``blobs/<blake3 hex>`` for each blob
the manifest names, in hash order.  ``base.files`` lists what a replay rebuilds the
base from: files (blob, mode, ``mtime_ns``), directories (mode) and symlinks (target),
chosen as mcp_server/capsules/witness_base.py says.  Each exec's ``output`` names the blobs of its
stdout and stderr as kept (``kept_bytes``, and the ``cap`` in force); fields added since
the first witnesses are optional, so older witnesses still verify and replay.  ``root_hash`` is ``blake3:`` + blake3 of the
canonical manifest bytes; since the manifest names every blob by its blake3, the root
hash covers every byte of the witness.  The archive is deterministic: fixed member
metadata (mtime 0, uid/gid 0, mode 0644, no user names), fixed order, fixed zstd level
with no timestamps or content-size-dependent framing choices, so the same capsule gives
the same bytes.  It is readable with plain ``tar --zstd -xf``.

Nothing in it depends on the machine that made it except the recorded workspace path,
which is where replays bind the rebuilt base.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO, Any

import blake3
import zstandard

from mcp_server.core.canonical import canonical_json
from sandbox.errors import CcwError

FORMAT = "ccw-witness/1"
ZSTD_LEVEL = 3


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
) -> Written:
    """Write the witness for ``manifest`` to ``out``; ``read_blob(hash)`` supplies blob bytes.

    Each blob is re-hashed as it is written: a source that changed since the manifest
    was made is an error, not a witness that lies.
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
        tar.addfile(_member("manifest.json", len(manifest_bytes)), io.BytesIO(manifest_bytes))
        for name in names:
            data = read_blob(name)
            if blob_hash(data) != name:
                raise CcwError(
                    "CONFLICT",
                    f"a file changed while the witness was being written (blob {name} no longer matches); "
                    "make the witness again",
                    {"blob": name},
                )
            tar.addfile(_member("blobs/" + name.split(":", 1)[1], len(data)), io.BytesIO(data))
    if compressor is not None:
        stream.close()
    return Written(root_hash(manifest), counter.count, len(names))


def _open_tar(data: IO[bytes]) -> Iterator[tarfile.TarFile]:
    head = data.read(4)
    data.seek(0)
    if head == b"\x28\xb5\x2f\xfd":
        reader = zstandard.ZstdDecompressor().stream_reader(data, closefd=False)
        with tarfile.open(fileobj=reader, mode="r|") as tar:
            yield tar
    else:
        with tarfile.open(fileobj=data, mode="r|") as tar:
            yield tar


def read_archive(data: IO[bytes]) -> tuple[dict[str, Any], dict[str, bytes], list[dict[str, Any]]]:
    """(manifest, blobs by ``blake3:<hex>`` name, problems) from a witness archive.

    Problems found while reading (extra or odd members) are returned, not raised, so
    ``verify`` can list everything wrong at once.
    """
    manifest: dict[str, Any] | None = None
    blobs: dict[str, bytes] = {}
    problems: list[dict[str, Any]] = []
    try:
        for tar in _open_tar(data):
            for member in tar:
                if not member.isfile():
                    problems.append({"kind": "unexpected_member", "member": member.name})
                    continue
                handle = tar.extractfile(member)
                content = handle.read() if handle else b""
                if member.name == "manifest.json":
                    try:
                        manifest = json.loads(content)
                    except ValueError as exc:
                        problems.append({"kind": "manifest_unparsable", "member": member.name, "detail": str(exc)})
                        continue
                    if canonical_json(manifest) != content:
                        problems.append({"kind": "manifest_not_canonical", "member": member.name})
                elif member.name.startswith("blobs/"):
                    blobs["blake3:" + member.name[len("blobs/"):]] = content
                else:
                    problems.append({"kind": "unexpected_member", "member": member.name})
    except (tarfile.TarError, zstandard.ZstdError, EOFError, OSError) as exc:
        raise CcwError(
            "INVALID_ARGUMENT",
            f"not a readable witness archive ({exc}); check the path, or make the witness again",
        ) from exc
    if manifest is None or not isinstance(manifest, dict):
        raise CcwError("INVALID_ARGUMENT", "the archive has no manifest.json; it is not a ccw witness")
    return manifest, blobs, problems


def verify(data: IO[bytes], expected_root: str | None = None) -> dict[str, Any]:
    """Recompute every hash; say precisely what does not match."""
    manifest, blobs, problems = read_archive(data)
    actual_root = root_hash(manifest)
    if manifest.get("format") != FORMAT:
        problems.append({"kind": "format", "field": "format", "expected": FORMAT, "actual": manifest.get("format")})
    if expected_root is not None and actual_root != expected_root:
        problems.append({"kind": "root_hash", "field": "root_hash", "expected": expected_root, "actual": actual_root})
    named = manifest_blobs(manifest)
    for name in named:
        if name not in blobs:
            problems.append({"kind": "blob_missing", "blob": name, "fields": _fields_naming(manifest, name)})
            continue
        actual = blob_hash(blobs[name])
        if actual != name:
            problems.append({"kind": "blob_tampered", "blob": name, "actual": actual, "fields": _fields_naming(manifest, name)})
    for name in sorted(set(blobs) - set(named)):
        problems.append({"kind": "blob_unreferenced", "blob": name})
    problems.sort(key=lambda p: (p["kind"], p.get("blob", ""), p.get("member", ""), p.get("field", "")))
    return {"ok": not problems, "root_hash": actual_root, "problems": problems, "manifest": manifest, "blobs": blobs}


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

"""Content-addressed blob store: ``sha256:<hex>`` → zstd-compressed file under objects/.

- Layout: ``objects/sha256/<2 hex>/<62 hex>.zst``.  A blob is written once (temp file
  in the same directory, then ``rename``) and never modified, so snapshots, witnesses
  and materialised trees can hard-link or share it freely.
- Each zstd frame carries its content checksum, so a blob truncated by a crash fails
  to decompress instead of returning wrong bytes; ``get(verify=True)`` also re-checks
  the sha256.  Blobs are not fsynced one by one (a snapshot of ten thousand files
  would pay ten thousand fsyncs); a lost blob after a crash is reported as NOT_FOUND.
- Garbage collection deletes every blob not named in a caller-supplied live set and
  older than a grace period, so a blob written by a snapshot still being recorded is
  never collected under it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import zstandard

from mcp_server.core.blobid import PREFIX, blob_id_of, check_blob_id
from sandbox.errors import CcwError, wrap_oserror

_LEVEL = 3


class BlobStore:
    """Immutable zstd blobs addressed by sha256."""

    def __init__(self, objects_dir: str | Path) -> None:
        self.root = Path(objects_dir) / "sha256"
        with wrap_oserror("create blob store", str(self.root)):
            self.root.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()

    def _cctx(self) -> zstandard.ZstdCompressor:
        # Compressor objects are not thread-safe; one per thread.
        cctx = getattr(self._local, "cctx", None)
        if cctx is None:
            cctx = self._local.cctx = zstandard.ZstdCompressor(level=_LEVEL, write_checksum=True)
        return cctx

    def _dctx(self) -> zstandard.ZstdDecompressor:
        dctx = getattr(self._local, "dctx", None)
        if dctx is None:
            dctx = self._local.dctx = zstandard.ZstdDecompressor()
        return dctx

    def path(self, blob_id: str) -> Path:
        """Where the blob lives on disk (compressed)."""
        hexpart = check_blob_id(blob_id)
        return self.root / hexpart[:2] / (hexpart[2:] + ".zst")

    def has(self, blob_id: str) -> bool:
        """True when the blob is stored."""
        return self.path(blob_id).exists()

    def put(self, data: bytes, blob_id: str | None = None) -> str:
        """Store ``data`` (idempotent) and return its id; ``blob_id`` skips re-hashing."""
        blob_id = blob_id or blob_id_of(data)
        target = self.path(blob_id)
        if target.exists():
            return blob_id
        compressed = self._cctx().compress(data)
        with wrap_oserror("store blob", str(target), "check free space in CCW_STATE_DIR"):
            target.parent.mkdir(exist_ok=True)
            tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
            with open(tmp, "wb") as handle:
                handle.write(compressed)
            os.chmod(tmp, 0o444)
            os.replace(tmp, target)
        return blob_id

    def get(self, blob_id: str, verify: bool = False) -> bytes:
        """The blob's content; NOT_FOUND when it is not stored."""
        target = self.path(blob_id)
        try:
            with open(target, "rb") as handle:
                compressed = handle.read()
        except FileNotFoundError:
            raise CcwError("NOT_FOUND", f"blob {blob_id} is not in the store; recreate the snapshot",
                           {"blob": blob_id}) from None
        except OSError as exc:
            raise CcwError("INTERNAL", f"reading blob {blob_id} failed: {exc}", {"blob": blob_id}) from exc
        try:
            data = self._dctx().decompress(compressed)
        except zstandard.ZstdError as exc:
            raise CcwError("INTERNAL", f"blob {blob_id} is corrupt ({exc}); recreate the snapshot",
                           {"blob": blob_id}) from exc
        if verify and blob_id_of(data) != blob_id:
            raise CcwError("INTERNAL", f"blob {blob_id} does not match its hash; recreate the snapshot",
                           {"blob": blob_id})
        return data

    def ids(self) -> Iterator[str]:
        """Every stored blob id (unordered)."""
        for sub in self.root.iterdir():
            if not sub.is_dir():
                continue
            for entry in sub.iterdir():
                if entry.name.endswith(".zst") and not entry.name.startswith("."):
                    yield PREFIX + sub.name + entry.name[:-4]

    def gc(self, live: Iterable[str], grace_seconds: float = 3600.0) -> list[str]:
        """Delete blobs not in ``live`` and older than the grace period; return their ids."""
        keep = set(live)
        cutoff = time.time() - grace_seconds
        removed = []
        for blob_id in sorted(self.ids()):
            if blob_id in keep:
                continue
            target = self.path(blob_id)
            try:
                if target.stat().st_mtime > cutoff:
                    continue
                target.unlink()
            except FileNotFoundError:
                continue
            removed.append(blob_id)
        # Stale temp files from interrupted writes.
        for sub in self.root.iterdir():
            if sub.is_dir():
                for entry in sub.glob(".*.tmp"):
                    with contextlib.suppress(FileNotFoundError):
                        if entry.stat().st_mtime <= cutoff:
                            entry.unlink()
        return removed


"""Witnesses written by hand, as someone other than ccw would: for the format and attack tests.

``manifest`` gives a schema-valid ``ccw-witness/1`` manifest whose execs, base files and
changes are what the caller says; ``blobs_for`` the bytes it names; ``archive`` writes it
with fs/witness.py's writer (signed when given a key).  Tests then break what they want.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from mcp_server.fs.witness import FORMAT, blob_hash, write_archive
from mcp_server.fs.witness_key import WitnessKey


def exec_entry(seq: int, argv: list[str], stdout: bytes = b"", stderr: bytes = b"", exit_code: int = 0,
               cwd: str | None = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    """One recorded exec that printed ``stdout``/``stderr``, and the blobs of its kept output."""
    blobs = {blob_hash(stdout): stdout, blob_hash(stderr): stderr}
    entry = {
        "seq": seq, "argv": argv, "cwd": cwd, "env_keys": ["LANG", "PATH"], "exit_code": exit_code, "signal": None,
        "timed_out": False, "oom_killed": False, "stdout_blake3": blob_hash(stdout), "stderr_blake3": blob_hash(stderr),
        "stdout_bytes": len(stdout), "stderr_bytes": len(stderr), "duration_ms": 1, "usage": {}, "timeout_ms": 60_000,
        "stdin_blob": None, "touched": {"read": [], "written": [], "listed": [], "executed": []},
        "output": {"stdout": {"blob": blob_hash(stdout), "kept_bytes": len(stdout), "cap": 1 << 20},
                   "stderr": {"blob": blob_hash(stderr), "kept_bytes": len(stderr), "cap": 1 << 20}},
        "written_mtimes": None,
    }
    return entry, blobs


def manifest(workspace: str, execs: list[dict[str, Any]], files: dict[str, bytes] | None = None,
             include_blobs: bool = True, env_whitelist: list[str] | None = None,
             network: Any = "none") -> dict[str, Any]:
    """A manifest over a base of ``files`` (path -> bytes) that ran ``execs`` and changed nothing."""
    base = [{"path": path, "type": "file", "mode": 0o644, "blob": blob_hash(data), "mtime_ns": 0}
            for path, data in sorted((files or {}).items())]
    return {
        "format": FORMAT, "workspace": workspace, "include_blobs": include_blobs,
        "base": {"fingerprint": None, "read_sets_complete": True, "carried": "used", "files": base},
        "capsule": {"clock": None, "clock_offset_sec": 0, "env_whitelist": env_whitelist or [], "limits": {},
                    "network": network},
        "execs": execs, "writes": [], "changes": [],
    }


def archive(manifest_: dict[str, Any], blobs: dict[str, bytes], key: WitnessKey | None = None,
            compress: str = "zstd") -> bytes:
    """The witness archive's bytes."""
    out = io.BytesIO()
    write_archive(manifest_, blobs.__getitem__, out, compress, key)
    return out.getvalue()


def write(path: Path, manifest_: dict[str, Any], blobs: dict[str, bytes], key: WitnessKey | None = None) -> Path:
    """Write the archive to ``path``."""
    path.write_bytes(archive(manifest_, blobs, key))
    return path


def raw_archive(manifest_bytes: bytes, blobs: dict[str, bytes], extra: list[tuple[str, bytes]] | None = None) -> bytes:
    """A tar.zst of ``manifest_bytes`` as manifest.json (any bytes: hostile manifests are not
    canonical JSON, or not JSON at all), then ``extra`` members, then ``blobs``."""
    import tarfile

    import zstandard

    members = [("manifest.json", manifest_bytes), *(extra or []),
               *((f"blobs/{name.split(':', 1)[1]}", data) for name, data in sorted(blobs.items()))]
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return zstandard.ZstdCompressor().compress(plain.getvalue())

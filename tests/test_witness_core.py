"""Witness archives: deterministic bytes, readable by tar, and every tampering detected."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest
import zstandard

from mcp_server.core.canonical import canonical_json
from mcp_server.fs.witness import (
    blob_hash,
    read_archive,
    root_hash,
    verify,
    write_archive,
)
from mcp_server.fs.witness_key import Verdict, WitnessKey
from sandbox.errors import CcwError
from tests.support.witness_craft import exec_entry, manifest

BLOBS = {blob_hash(data): data for data in (b"base file\n", b"changed file\n", b"stdin text", bytes(range(256)) * 64)}
NAMES = sorted(BLOBS)


def _manifest() -> dict[str, object]:
    entry, _ = exec_entry(1, ["cat"])
    entry["stdin_blob"] = blob_hash(b"stdin text")
    entry["output"] = None  # made before outputs were kept: only the four blobs below are named
    made = manifest("/home/u/project", [entry], {"a.txt": b"base file\n"})
    made["changes"] = [
        {"path": "b.bin", "status": "added", "type": "file", "mode": 0o644, "target": None,
         "blob": blob_hash(bytes(range(256)) * 64)},
        {"path": "c.txt", "status": "modified", "type": "file", "mode": 0o644, "target": None,
         "blob": blob_hash(b"changed file\n")},
        {"path": "d.txt", "status": "deleted", "type": None, "mode": None, "target": None, "blob": None},
    ]
    return made


def _archive(compress: str = "zstd") -> tuple[bytes, str]:
    out = io.BytesIO()
    written = write_archive(_manifest(), BLOBS.__getitem__, out, compress)
    assert written.size_bytes == len(out.getvalue()) and written.blobs == 4
    return out.getvalue(), written.root_hash


def test_same_input_same_bytes_and_root_hash_covers_the_canonical_manifest() -> None:
    first, root = _archive()
    second, _ = _archive()
    assert first == second
    assert root == root_hash(_manifest())
    assert root.startswith("blake3:") and len(root) == len("blake3:") + 64


@pytest.mark.parametrize("compress", ["zstd", "none"])
def test_plain_tar_reads_it(tmp_path: Path, compress: str) -> None:
    data, _ = _archive(compress)
    path = tmp_path / ("w.tar.zst" if compress == "zstd" else "w.tar")
    path.write_bytes(data)
    flags = ["--zstd"] if compress == "zstd" else []
    listing = subprocess.run(["tar", *flags, "-tf", str(path)], capture_output=True, text=True,
                             check=True).stdout.split()
    assert listing == ["manifest.json", *("blobs/" + n.split(":")[1] for n in NAMES)]
    subprocess.run(["tar", *flags, "-xf", str(path), "-C", str(tmp_path)], check=True)
    assert (tmp_path / "manifest.json").read_bytes() == canonical_json(_manifest())


def test_clean_witness_verifies() -> None:
    data, root = _archive()
    report = verify(io.BytesIO(data), root)
    assert report["ok"] and report["problems"] == [] and report["root_hash"] == root


def _rewrite(data: bytes, mutate: object) -> bytes:
    members = []
    with tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)), mode="r|") as tar:
        for m in tar:
            f = tar.extractfile(m)
            members.append((m, f.read() if f else b""))
    members = mutate(members)  # type: ignore[operator]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for m, content in members:
            m.size = len(content)
            tar.addfile(m, io.BytesIO(content))
    return out.getvalue()


def _flip(index: int, at: int) -> object:
    def mutate(members: list[tuple[tarfile.TarInfo, bytes]]) -> list[tuple[tarfile.TarInfo, bytes]]:
        m, content = members[index]
        changed = bytearray(content)
        changed[at % len(changed)] ^= 0x01
        members[index] = (m, bytes(changed))
        return members

    return mutate


@pytest.mark.parametrize("blob_index", range(1, 5))
def test_a_flipped_byte_in_any_blob_is_named(blob_index: int) -> None:
    data, root = _archive()
    bad = _rewrite(data, _flip(blob_index, 7))
    report = verify(io.BytesIO(bad), root)
    assert not report["ok"]
    tampered = [p for p in report["problems"] if p["kind"] == "blob_tampered"]
    assert len(tampered) == 1 and tampered[0]["blob"] == NAMES[blob_index - 1]
    assert tampered[0]["fields"]  # which manifest field names the bad blob


def test_a_flipped_byte_in_the_manifest_changes_the_root_hash() -> None:
    data, root = _archive()
    # Flip a byte inside the workspace string: still valid JSON, different content.
    def mutate(members: list[tuple[tarfile.TarInfo, bytes]]) -> list[tuple[tarfile.TarInfo, bytes]]:
        m, content = members[0]
        members[0] = (m, content.replace(b"/home/u/project", b"/home/u/projecu"))
        return members

    report = verify(io.BytesIO(_rewrite(data, mutate)), root)
    assert [p["kind"] for p in report["problems"]] == ["root_hash"]
    assert report["problems"][0]["expected"] == root


def test_missing_and_extra_blobs_are_reported() -> None:
    data, root = _archive()
    def mutate(members: list[tuple[tarfile.TarInfo, bytes]]) -> list[tuple[tarfile.TarInfo, bytes]]:
        extra = tarfile.TarInfo("blobs/" + "0" * 64)
        return [*members[:-1], (extra, b"junk")]

    kinds = sorted(p["kind"] for p in verify(io.BytesIO(_rewrite(data, mutate)), root)["problems"])
    assert kinds == ["blob_missing", "blob_unreferenced"]


def test_garbage_is_a_clear_error() -> None:
    with pytest.raises(CcwError) as info:
        read_archive(io.BytesIO(b"\x28\xb5\x2f\xfdnot really zstd"))
    assert info.value.code == "INVALID_ARGUMENT"


def test_a_source_that_changed_while_writing_is_refused() -> None:
    with pytest.raises(CcwError) as info:
        write_archive(_manifest(), lambda name: b"different", io.BytesIO())
    assert info.value.code == "CONFLICT"


def test_a_signed_witness_is_valid_under_its_key_only_and_stays_plain_tar(tmp_path: Path) -> None:
    key, other = WitnessKey(b"k" * 32), WitnessKey(b"o" * 32)
    out = io.BytesIO()
    written = write_archive(_manifest(), BLOBS.__getitem__, out, "zstd", key)
    signed = out.getvalue()
    assert written.root_hash == root_hash(_manifest())  # the signature is outside what the root hash covers
    assert verify(io.BytesIO(signed), written.root_hash, key)["signature"] == "valid"
    assert verify(io.BytesIO(signed), None, other)["signature"] == "unknown key"
    assert verify(io.BytesIO(_archive()[0]), None, key)["signature"] == "unsigned"
    (tmp_path / "w.tar.zst").write_bytes(signed)
    listing = subprocess.run(["tar", "--zstd", "-tf", str(tmp_path / "w.tar.zst")], capture_output=True, text=True,
                             check=True).stdout.split()
    assert listing[:2] == ["manifest.json", "signature.json"] and len(listing) == 2 + len(NAMES)


def test_a_signature_moved_onto_another_manifest_is_invalid() -> None:
    key = WitnessKey(b"k" * 32)
    out = io.BytesIO()
    write_archive(_manifest(), BLOBS.__getitem__, out, "zstd", key)

    def mutate(members: list[tuple[tarfile.TarInfo, bytes]]) -> list[tuple[tarfile.TarInfo, bytes]]:
        m, content = members[0]
        members[0] = (m, content.replace(b"/home/u/project", b"/home/u/projecu"))
        return members

    report = verify(io.BytesIO(_rewrite(out.getvalue(), mutate)), None, key)
    assert report["signature"] == "invalid" and report["ok"] is True  # intact, but not what was signed


def test_admit_refuses_before_any_blob_is_read_and_tampered_blobs_are_never_kept() -> None:
    data, _ = _archive()
    seen: list[str] = []

    def admit(manifest: dict[str, object], signature: Verdict) -> None:
        seen.append(signature.state)
        raise CcwError("PERMISSION_DENIED", "not this one")

    with pytest.raises(CcwError, match="not this one"):
        read_archive(io.BytesIO(data), admit=admit)
    assert seen == ["unsigned"]
    archive = read_archive(io.BytesIO(_rewrite(data, _flip(1, 3))))
    assert NAMES[0] not in archive.blobs and set(archive.blobs) == set(NAMES[1:])
    assert [p["kind"] for p in archive.problems] == ["blob_tampered"]


def test_a_second_manifest_or_a_member_that_is_not_a_blob_is_a_problem() -> None:
    data, root = _archive()

    def mutate(members: list[tuple[tarfile.TarInfo, bytes]]) -> list[tuple[tarfile.TarInfo, bytes]]:
        return [*members, (tarfile.TarInfo("manifest.json"), b"{}"), (tarfile.TarInfo("../evil"), b"x")]

    kinds = sorted(p["kind"] for p in verify(io.BytesIO(_rewrite(data, mutate)), root)["problems"])
    assert kinds == ["duplicate_member", "unexpected_member"]

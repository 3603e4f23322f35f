"""fs/tarstream: headers parsed by hand, every limit refused by name, and only CcwErrors out of any input."""

from __future__ import annotations

import io
import random
import tarfile

import pytest
import zstandard

from mcp_server.fs import tarstream
from mcp_server.fs.tarstream import Limits, TarStream, parse_header
from mcp_server.fs.witness import read_archive
from sandbox.errors import CcwError
from tests.support import witness_craft as craft

ROOMY = Limits(max_member=1 << 30, max_total=1 << 32)


def _tar(*members: tuple[str, bytes], fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _members(data: bytes, limits: Limits = ROOMY) -> list[tuple[str, bool, bytes]]:
    tar = TarStream(io.BytesIO(data), limits)
    out = []
    while (member := tar.next()) is not None:
        out.append((member.name, member.regular, b"".join(tar.chunks(member))))
    return out


def test_members_come_back_as_tarfile_wrote_them_plain_or_zstd() -> None:
    long_name = "blobs/" + "d" * 60 + "/" + "f" * 60  # past 100 bytes: ustar's prefix field
    plain = _tar(("manifest.json", b"{}"), (long_name, b"x" * 5000), ("empty", b""))
    expected = [("manifest.json", True, b"{}"), (long_name, True, b"x" * 5000), ("empty", True, b"")]
    assert _members(plain) == expected
    assert _members(zstandard.ZstdCompressor().compress(plain)) == expected


def test_other_member_kinds_are_named_not_followed() -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, kind in (("dir", tarfile.DIRTYPE), ("link", tarfile.SYMTYPE)):
            info = tarfile.TarInfo(name)
            info.type = kind
            info.linkname = "/etc/shadow"
            tar.addfile(info)
    assert [(name, regular) for name, regular, _ in _members(out.getvalue())] == [("dir/", False), ("link", False)]


def test_a_bad_checksum_a_non_octal_size_and_truncation_are_invalid() -> None:
    block = bytearray(_tar(("a", b"data"))[:512])
    block[0] ^= 1
    with pytest.raises(CcwError, match="checksum") as bad:
        parse_header(bytes(block))
    assert bad.value.code == "INVALID_ARGUMENT"
    block = bytearray(_tar(("a", b"data"))[:512])
    block[124:136] = b"\x80" + bytes(11)  # base-256, as GNU tar writes sizes past 8 GiB
    block[148:156] = b"        "
    block[148:155] = f"{sum(block):06o}\0".encode()
    with pytest.raises(CcwError, match="not octal"):
        parse_header(bytes(block))
    with pytest.raises(CcwError, match="truncated"):
        _members(_tar(("a", b"x" * 2000))[:1000])


def test_a_member_declaring_more_than_its_limit_is_refused_before_it_is_read() -> None:
    data = _tar(("small", b"x" * 10), ("big", b"y" * 4096))
    with pytest.raises(CcwError, match="'big' declares 4096 bytes") as refused:
        _members(data, Limits(max_member=1000, max_total=1 << 20))
    assert refused.value.code == "INVALID_ARGUMENT" and refused.value.details == {"member": "big", "limit": 1000}


def test_the_total_and_the_ratio_are_counted_as_bytes_come_out(monkeypatch: pytest.MonkeyPatch) -> None:
    data = _tar(("a", bytes(300_000)), ("b", bytes(300_000)))
    with pytest.raises(CcwError, match="MAX_TOTAL_BYTES 400000") as total:
        _members(data, Limits(max_member=1 << 20, max_total=400_000))
    assert total.value.details["member"] == "b"
    monkeypatch.setattr(tarstream, "RATIO_FLOOR", 100_000)
    packed = zstandard.ZstdCompressor().compress(data)
    assert _members(packed, Limits(1 << 20, 1 << 30, max_ratio=None))[1][2] == bytes(300_000)
    with pytest.raises(CcwError, match="expand at most 10:1"):
        _members(packed, Limits(1 << 20, 1 << 30, max_ratio=10))


def test_a_zstd_frame_asking_for_a_huge_window_is_refused() -> None:
    # zstd --long: a 128 MiB window, which the decoder would have to allocate.
    params = zstandard.ZstdCompressionParameters(window_log=27, enable_ldm=True, write_content_size=False)
    packed = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(packed, closefd=False) as writer:
        writer.write(_tar(("manifest.json", b"{}")))
    with pytest.raises(CcwError, match="too much memory") as refused:
        read_archive(io.BytesIO(packed.getvalue()))
    assert refused.value.code == "INVALID_ARGUMENT"


def test_any_damage_to_a_witness_ends_as_a_ccw_error() -> None:
    # As h11's fuzz tests do: whole inputs, cut and flipped, and only our own error escapes.
    entry, blobs = craft.exec_entry(1, ["echo", "hi"], stdout=b"hi\n")
    good = craft.archive(craft.manifest("/w", [entry], {"a.txt": b"base\n"}),
                         {**blobs, craft.blob_hash(b"base\n"): b"base\n"}, compress="none")
    rng = random.Random(24)
    inputs = [good[:cut] for cut in range(0, len(good), 97)]
    for _ in range(300):
        damaged = bytearray(good)
        for _ in range(rng.randint(1, 8)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        inputs.append(bytes(damaged))
    inputs += [rng.randbytes(rng.randint(0, 4096)) for _ in range(100)]
    for data in inputs:
        try:
            read_archive(io.BytesIO(data))
        except CcwError as exc:
            assert exc.code != "INTERNAL", exc

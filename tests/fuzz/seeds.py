"""The starting corpus: real frames, patches, paths and edits, one small file per input.

``python -m tests.fuzz.seeds`` rewrites tests/fuzz/corpus/ from this list;
tests/test_fuzz_atheris.py checks that the checked-in files match it.  Targets that read
a choice byte first (see targets.py) get one here, then the real input.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import struct
from pathlib import Path

from mcp_server.core.unidiff import FileChange, render_all
from sandbox.errors import CcwError
from sandbox.ops import encode_request
from sandbox.protocol import encode_error, encode_progress, encode_reply

CORPUS = Path(__file__).resolve().parent / "corpus"


def _ndjson() -> list[bytes]:
    frames = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": "a", "method": "tools/call",
         "params": {"name": "ccw_info", "arguments": {"echo": "é"}}},
        {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": "a"}},
        {"jsonrpc": "2.0", "id": 2, "result": {"roots": [{"uri": "file:///w"}]}},
        {"jsonrpc": "2.0", "id": 3, "method": "ccw_info", "params": {"delay_ms": 1.5e-5}},
    ]
    stream = b"".join(json.dumps(frame, ensure_ascii=False).encode() + b"\n" for frame in frames)
    return [b"\x00" + stream, b"\x07" + stream.replace(b"\n", b"\r\n"),
            b"\xff" + b'{"id":9,"method":"x","params":"' + b"y" * 300 + b'"}\n']


def _ipc() -> list[bytes]:
    requests = (
        encode_request(1, "hello", {"version": 1})
        + encode_request(2, "create", {"workspace": "/w", "limits": {"memory_mb": 5, "disk_mb": 64}, "network": "none"})
        + encode_request(3, "exec", {"capsule_id": "cap_9", "argv": ["sh", "-c", "x"], "env": {"A": "b"},
                                     "stdin_b64": "aGk=", "progress_ms": 500})
        + encode_request(4, "list", {})
    )
    replies = (
        encode_progress(3, {"stdout_bytes": 10})
        + encode_reply(3, {"exit_code": 0, "stdout_b64": "aGk="})
        + encode_error(4, CcwError("NOT_FOUND", "no such capsule", {"capsule_id": "cap_1"}))
        + encode_reply(None, {})
    )
    raw = struct.pack(">I", 11) + b'{"a":[1.5]}'
    return [b"\x00" + requests, b"\x01" + replies, b"\x02" + raw, b"\x0f" + requests[:40]]


def _patch() -> list[bytes]:
    text = render_all([
        FileChange("src/a.py", b"one\ntwo\nthree\n", b"one\nTWO\nthree\n"),
        FileChange("new.txt", None, b"x\ny"),
        FileChange("old", b"o\n", None),
        FileChange("q\xe9", b"a\n", b"b\n", 0o100644, 0o100755),
        FileChange("bin", b"\x00\x01\x02\n", b"\x00\x03\n"),
    ])
    rename = b"diff --git a/old b/new\nsimilarity index 90%\nrename from old\nrename to new\n"
    plain = b"--- a/src/a.py\t2024-01-01\n+++ b/src/a.py\n@@ -1,3 +1,3 @@\n one\n-two\n+2\n three\n"
    return [b"\x00" + text, b"\x00" + rename + plain]


def _paths() -> list[bytes]:
    ascii_paths = ["src/a.py", "./src//b/", "a/../b", "/etc/passwd", "~root/x", "C:\\x", "b~/c", "."]
    # 0x01: ConsumeUnicode reads ASCII; 0x02: UTF-16 (for the non-ASCII ones).
    return [b"\x01" + p.encode() for p in ascii_paths] + [b"\x02" + "/dé/ü/../ø".encode("utf-16-le")]


def _canonical() -> list[bytes]:
    values = ['{"b":1,"a":{"d":[1,{"z":0,"y":1}],"c":null}}', '[1e-7,-0.0,1e300,12345678901234567890,"é\\u2028"]',
              '{"a":NaN}', '"\\ud800"', '{"a":1,"a":2}']
    return [b"\x00" + value.encode() for value in values]


def seeds() -> dict[str, list[bytes]]:
    """Target name -> its seed inputs.  hashline and unidiff build their input from any
    bytes (FuzzedDataProvider picks lines, anchors, contents), so plain bytes do."""
    structured = [bytes(range(256)), b"\x00" * 64, b"\xff" * 64, hashlib.sha256(b"ccw").digest() * 8]
    return {"ndjson": _ndjson(), "ipc": _ipc(), "patch": _patch(), "paths": _paths(), "canonical": _canonical(),
            "hashline": structured, "unidiff": structured}


def write(root: Path = CORPUS) -> None:
    """Replace ``root`` with one directory per target, one file per seed."""
    shutil.rmtree(root, ignore_errors=True)
    for target, inputs in seeds().items():
        (root / target).mkdir(parents=True)
        for number, data in enumerate(inputs):
            (root / target / f"seed-{number:02d}").write_bytes(data)


if __name__ == "__main__":
    write()

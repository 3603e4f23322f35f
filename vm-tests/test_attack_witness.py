"""Witnesses from someone else, replayed and verified here (issue 24): a witness is hostile input.

The attacker writes the witness archive (tests/support/witness_craft.py, or tar and zstd by
hand) and gets a replayer to run ``capsule_replay`` on it, even with
``allow_untrusted``.  What must hold, one test per attack class:

(a) the replayer's environment never reaches the commands, whatever the witness's
    env whitelist names (a canary in this process's environment, which is the front
    end's: the ``tools`` fixture runs it in-process);
(b) no network unless the replayer passes one: a witness asking for an allowlist to a
    listener on this host's loopback gets none (the same replay with the replayer's
    own ``network`` reaches it, so the listener and the command do work);
(c) a witness without blobs never picks its live base: one naming a directory that
    holds a secret, or /etc with ``cat shadow``, is refused; /etc or /root named by the
    replayer is refused as capsule_create refuses it; and one replayed over a directory
    the replayer names sees that directory, not the one it names;
(d) a zstd bomb (34 KB that expand to 1 GiB of zeros) is refused quickly, the replay's
    process growing by far less than the GiB (measured in a ``ccw capsule replay``
    subprocess and a witness_verify one);
(e) an unsigned, forged (another key) or tampered (signed, then changed) witness is
    refused without allow_untrusted and replays with it, its report saying which;
(f) hostile manifests (wrong types, missing fields, paths with .., absolute paths,
    huge numbers, not JSON, deep nesting) end as CcwErrors that are not INTERNAL.
"""

from __future__ import annotations

import io
import json
import os
import secrets
import socket
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
import zstandard

from mcp_server.core.canonical import canonical_json
from mcp_server.fs.witness import blob_hash
from mcp_server.fs.witness_key import WitnessKey
from sandbox.errors import CcwError
from tests.support import witness_craft as craft

ROOT = Path(__file__).resolve().parent.parent
CANARY_NAME = "CCW_ATTACK_WITNESS_TOKEN"


async def _attempt(t: Any, name: str, args: dict[str, Any]) -> tuple[str, Any]:
    """('error', code) or ('ok', result); a CcwError that is INTERNAL, or any other exception, fails."""
    try:
        return "ok", await t.call(name, args)
    except CcwError as exc:
        assert exc.code != "INTERNAL", (name, args, exc)
        return "error", exc.code


def _replay(tools: Any, path: Path, **args: Any) -> tuple[str, Any]:
    return tools.run(lambda t: _attempt(t, "capsule_replay", {"path": str(path), **args}))  # type: ignore[no-any-return]


# --- (a) the replayer's environment -------------------------------------------------------


def test_a_witness_never_gets_the_replayers_environment(tools: Any, tmp_path: Path, monkeypatch: Any,
                                                       record_property: Any) -> None:
    canary = "canary-" + secrets.token_hex(12)
    monkeypatch.setenv(CANARY_NAME, canary)
    leak = ["sh", "-c", f'echo "token=${{{CANARY_NAME}}}"; env']
    entry, blobs = craft.exec_entry(1, leak, stdout=b"token=\n")
    made = craft.manifest(str(tmp_path / "ws"), [entry], env_whitelist=[CANARY_NAME, "PATH", "HOME"])
    path = craft.write(tmp_path / "leak.tar.zst", made, blobs)
    kind, out = _replay(tools, path, allow_untrusted=True)
    assert kind == "ok", out
    assert canary not in json.dumps(out), out
    assert out["env_missing"] == [CANARY_NAME, "PATH"] and out["signature"] == "unsigned"
    # What the replayer passes, the commands get: and only that.
    kind, given = _replay(tools, path, allow_untrusted=True, env={CANARY_NAME: "given"})
    assert kind == "ok" and "+token=given" in given["output_diffs"][0]["lines"], given
    assert canary not in json.dumps(given) and given["env_missing"] == ["PATH"]
    record_property("escapes_tried", 2)


# --- (b) network --------------------------------------------------------------------------


@pytest.fixture
def listener() -> Iterator[tuple[int, list[bytes]]]:
    """An HTTP listener on this host's loopback; what each connection sent."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    heard: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                heard.append(conn.recv(4096))
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 8\r\n\r\nreached\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield server.getsockname()[1], heard
    stop.set()
    thread.join()
    server.close()


def test_a_witness_gets_no_network_unless_the_replayer_passes_it(tools: Any, tmp_path: Path, require: Any,
                                                                listener: tuple[int, list[bytes]],
                                                                record_property: Any) -> None:
    import shutil

    require(shutil.which("curl") is not None, "needs curl")
    port, heard = listener
    rule = f"127.0.0.1:{port}"
    # Through the proxy when there is one (the jail's NO_PROXY names 127.0.0.1, its own loopback).
    fetch = ["sh", "-c", f'curl -sS --max-time 10 -x "$HTTP_PROXY" --noproxy "" http://{rule}/exfiltrate; true']
    entry, blobs = craft.exec_entry(1, fetch, stdout=b"reached\n")
    made = craft.manifest(str(tmp_path / "ws"), [entry], network={"allow": [rule], "max_bytes": 1 << 30,
                                                                   "max_connections": 512})
    path = craft.write(tmp_path / "net.tar.zst", made, blobs)
    kind, out = _replay(tools, path, allow_untrusted=True)
    assert kind == "ok", out
    assert heard == [], heard
    assert out["network"]["used"] == "none" and out["network"]["recorded"]["allow"] == [rule], out
    kind, allowed = _replay(tools, path, allow_untrusted=True, network=[rule])
    assert kind == "ok" and allowed["output_identical"] is True, allowed
    assert len(heard) == 1 and b"/exfiltrate" in heard[0], heard  # the control: the replayer's own network works
    record_property("escapes_tried", 1)


# --- (c) the live base of a witness without blobs -----------------------------------------


def test_a_witness_without_blobs_never_chooses_its_live_base(tools: Any, tmp_path: Path,
                                                            record_property: Any) -> None:
    secret = "secret-" + secrets.token_hex(12)
    private = tmp_path / "private"
    private.mkdir()
    (private / "secret.txt").write_text(secret + "\n")
    shadow = Path("/etc/shadow").read_text()
    attempts = [
        (str(private), ["cat", "secret.txt"]),
        (str(private), ["sh", "-c", "cat *; ls -la"]),
        ("/etc", ["cat", "shadow"]),
        ("/etc", ["cat", "/etc/shadow"]),
        ("/root", ["sh", "-c", "cat .ssh/* .bash_history 2>&1"]),
    ]
    outcomes = []
    for workspace, argv in attempts:
        entry, blobs = craft.exec_entry(1, argv)
        made = craft.manifest(workspace, [entry], include_blobs=False)
        path = craft.write(tmp_path / "live.tar.zst", made, blobs)
        kind, out = _replay(tools, path, allow_untrusted=True)
        outcomes.append((kind, out))
        assert (kind, out) == ("error", "INVALID_ARGUMENT"), (workspace, argv, out)
        if workspace != str(private):  # named by the replayer, a system directory or a home is refused all the same
            kind, out = _replay(tools, path, allow_untrusted=True, workspace=workspace)
            outcomes.append((kind, out))
            assert (kind, out) == ("error", "PERMISSION_DENIED"), (workspace, argv, out)
    # Replayed over a directory the replayer names: the commands see that one, not the witness's.
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "secret.txt").write_text("the replayer's own copy\n")
    entry, blobs = craft.exec_entry(1, ["cat", "secret.txt"], stdout=b"the replayer's own copy\n")
    path = craft.write(tmp_path / "named.tar.zst", craft.manifest(str(private), [entry], include_blobs=False), blobs)
    kind, out = _replay(tools, path, allow_untrusted=True, workspace=str(mine))
    assert kind == "ok" and out["replay_ok"] is True and out["output_identical"] is True, out
    outcomes.append((kind, out))
    for _, out in outcomes:
        text = json.dumps(out)
        assert secret not in text and shadow not in text
        assert not any(line and line in text for line in shadow.splitlines()), out
    record_property("escapes_tried", len(outcomes))


# --- (d) a zstd bomb ----------------------------------------------------------------------

BOMB_BYTES = 1 << 30
GROWTH_LIMIT_KB = 300 * 1024
MEASURED = """
import json, resource, sys, time
import mcp_server.cli.capsule, mcp_server.server, mcp_server.capsules.replay  # imported before the baseline
def peak_kb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
before, start = peak_kb(), time.monotonic()
{body}
print(json.dumps({{"growth_kb": peak_kb() - before, "seconds": time.monotonic() - start, "outcome": outcome}}))
"""
CLI_BODY = """
from mcp_server.cli import main
outcome = main(sys.argv[1:])
"""
VERIFY_BODY = """
import trio
from mcp_server.config import TOOLSETS, Config
from mcp_server.context import CallContext, Runtime
from mcp_server.state import State
from mcp_server.tools.registry import Registry
from sandbox.errors import CcwError
async def verify(state, path):
    runtime = Runtime(Config.from_env({"CCW_STATE_DIR": state}), State(state))
    try:
        return await Registry.load(TOOLSETS).lookup("witness_verify").handler(CallContext(runtime), {"path": path})
    finally:
        await runtime.aclose()
try:
    outcome = trio.run(verify, sys.argv[1], sys.argv[2])
except CcwError as exc:
    outcome = [exc.code, exc.message]
"""


class _Zeros:
    """``size`` zero bytes, read in pieces (what tarfile copies into the archive)."""

    def __init__(self, size: int) -> None:
        self.left = size

    def read(self, size: int = -1) -> bytes:
        size = self.left if size < 0 else min(size, self.left)
        self.left -= size
        return bytes(size)


def _bomb(path: Path) -> None:
    """A witness whose one base file is BOMB_BYTES of zeros: about 34 KB on disk."""
    hasher = blake3.blake3()
    chunk = bytes(1 << 20)
    for _ in range(BOMB_BYTES // len(chunk)):
        hasher.update(chunk)
    name = "blake3:" + hasher.hexdigest()
    made = craft.manifest("/nonexistent/ccw-bomb", [])
    made["base"]["files"] = [{"path": "zeros", "type": "file", "mode": 0o644, "blob": name, "mtime_ns": 0}]
    manifest = canonical_json(made)
    with open(path, "wb") as out, zstandard.ZstdCompressor(level=3).stream_writer(out) as packed, \
            tarfile.open(fileobj=packed, mode="w|", format=tarfile.USTAR_FORMAT) as tar:  # fmt: skip
        info = tarfile.TarInfo("manifest.json")
        info.size = len(manifest)
        tar.addfile(info, io.BytesIO(manifest))
        info = tarfile.TarInfo("blobs/" + name.split(":", 1)[1])
        info.size = BOMB_BYTES
        tar.addfile(info, _Zeros(BOMB_BYTES))  # type: ignore[arg-type]


def _measured(body: str, *argv: str, state: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_")) or k == "CCW_MUST_WORK"}
    env["CCW_STATE_DIR"] = str(state)
    done = subprocess.run([sys.executable, "-c", MEASURED.format(body=body), *argv], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    report["stderr"] = done.stderr
    return report


def test_a_zstd_bomb_is_refused_quickly_in_bounded_memory(tmp_path: Path, root_required: None,
                                                         record_property: Any) -> None:
    bomb = tmp_path / "bomb.tar.zst"
    _bomb(bomb)
    assert bomb.stat().st_size < 100_000
    state = tmp_path / "state"
    try:
        refused = _measured(CLI_BODY, "capsule", "replay", str(bomb), state=state)
        untrusted = _measured(CLI_BODY, "capsule", "replay", str(bomb), "--allow-untrusted", state=state)
        verified = _measured(VERIFY_BODY, str(state), str(bomb), state=state)
    finally:
        stop = subprocess.run([sys.executable, "-c", "import sys; from mcp_server.cli import main; sys.exit(main())",
                               "helper", "stop", "--state-dir", str(state)], capture_output=True, cwd=ROOT, timeout=60)
        assert stop.returncode == 0, stop.stderr
    assert refused["outcome"] == 1 and "PERMISSION_DENIED" in refused["stderr"], refused
    assert untrusted["outcome"] == 1 and "INVALID_ARGUMENT" in untrusted["stderr"], untrusted
    assert "blobs/" in untrusted["stderr"] and "250:1" in untrusted["stderr"], untrusted["stderr"]
    assert verified["outcome"][0] == "INVALID_ARGUMENT" and "250:1" in verified["outcome"][1], verified
    for report in (refused, untrusted, verified):
        assert report["growth_kb"] < GROWTH_LIMIT_KB and report["seconds"] < 60, report
    record_property("escapes_tried", 3)


# --- (e) unsigned, forged and tampered witnesses -------------------------------------------


def _retarred(data: bytes, change: Any) -> bytes:
    """The archive with each (name, bytes) member passed through ``change``, recompressed."""
    members = []
    with tarfile.open(fileobj=zstandard.ZstdDecompressor().stream_reader(data), mode="r|") as tar:
        for member in tar:
            handle = tar.extractfile(member)
            members.append(change(member.name, handle.read() if handle else b""))
    manifest = members[0][1]
    return craft.raw_archive(manifest,
                             {"blake3:" + n.removeprefix("blobs/"): d for n, d in members if n.startswith("blobs/")},
                             [m for m in members[1:] if not m[0].startswith("blobs/")])


def test_unsigned_forged_and_tampered_witnesses_replay_only_when_allowed(tools: Any, tmp_path: Path,
                                                                         record_property: Any) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("one\n")

    async def made_here(t: Any) -> dict[str, Any]:
        cap = (await t.call("capsule_create", {"workspace": str(ws)}))["capsule_id"]
        await t.call("capsule_exec", {"capsule_id": cap, "cmd": ["cat", "a.txt"]})
        return await t.call("capsule_witness", {"capsule_id": cap})  # type: ignore[no-any-return]

    own = Path(tools.run(made_here)["path"])
    entry, blobs = craft.exec_entry(1, ["echo", "hi"], stdout=b"hi\n")
    made = craft.manifest(str(tmp_path / "elsewhere"), [entry])
    tampered = _retarred(own.read_bytes(), lambda name, data: (
        name, data.replace(b'"cat"', b'"tac"') if name == "manifest.json" else data))
    witnesses = {
        "unsigned": craft.write(tmp_path / "unsigned.tar.zst", made, blobs),
        "forged": craft.write(tmp_path / "forged.tar.zst", made, blobs, WitnessKey(secrets.token_bytes(32))),
        "tampered": tmp_path / "tampered.tar.zst",
    }
    witnesses["tampered"].write_bytes(tampered)
    verified = {name: tools.run(lambda t, p=path: t.call("witness_verify", {"path": str(p)}))
                for name, path in witnesses.items()}
    assert tools.run(lambda t: t.call("witness_verify", {"path": str(own)}))["signature"] == "valid"
    assert {name: v["signature"] for name, v in verified.items()} == {
        "unsigned": "unsigned", "forged": "unknown key", "tampered": "invalid"}
    for name, path in witnesses.items():
        assert _replay(tools, path) == ("error", "PERMISSION_DENIED"), name
        kind, out = _replay(tools, path, allow_untrusted=True)
        assert kind == "ok" and out["signature"] == verified[name]["signature"], (name, out)
    assert _replay(tools, own)[1]["signature"] == "valid"
    record_property("escapes_tried", 2 * len(witnesses))


# --- (f) hostile manifests ----------------------------------------------------------------


def _hostile_manifests(base: dict[str, Any]) -> list[bytes]:
    def changed(path: str, value: Any) -> bytes:
        copy = json.loads(json.dumps(base))
        *parents, last = path.split("/")
        where = copy
        for part in parents:
            where = where[int(part)] if isinstance(where, list) else where[part]
        if value is KeyError:
            del where[int(last) if isinstance(where, list) else last]
        elif isinstance(where, list):
            where[int(last)] = value
        else:
            where[last] = value
        return canonical_json(copy)

    huge = 10 ** 30
    return [
        changed("execs", "x"), changed("execs/0/argv", 5), changed("execs/0/argv", []), changed("execs/0/seq", "1"),
        changed("execs/0/touched", KeyError), changed("execs/0/touched/written", None), changed("execs/0/cwd", 7),
        changed("execs/0/output", {"evil": {"blob": "x", "kept_bytes": 1, "cap": 1}}),
        changed("execs/0/timeout_ms", huge), changed("execs/0/seq", huge), changed("execs/0/stdout_bytes", -1),
        changed("execs/0/written_mtimes", {"../../etc/passwd": 0}), changed("execs/0/written_mtimes", {"a": huge}),
        changed("base/files/0/path", "../escape"), changed("base/files/0/path", "/etc/passwd"),
        changed("base/files/0/path", "a/../../b"), changed("base/files/0/mode", 420.0),
        changed("base/files/0/mode", huge), changed("base/files/0/mtime_ns", huge),
        changed("base/files/0/type", KeyError),
        changed("base/files/0/blob", KeyError), changed("base/files", {}), changed("base", KeyError),
        changed("capsule/limits", {"memory_mb": "x"}), changed("capsule/limits", {"bogus": 1}),
        changed("capsule/limits", {"memory_mb": huge}), changed("capsule/env_whitelist", ["NOT A NAME"]),
        changed("capsule/clock_offset_sec", huge), changed("capsule/network", 5), changed("capsule", KeyError),
        changed("workspace", "relative/ws"), changed("workspace", "/a/../etc"), changed("workspace", 3),
        changed("include_blobs", "yes"), changed("format", "ccw-witness/99"),
        changed("changes", [{"path": "/abs", "status": "added", "type": "file", "mode": 1, "target": None,
                             "blob": None}]),
        changed("writes", [{"seq": 2, "path": "x", "action": "write", "blob": None}]),
        changed("writes", [{"seq": 2, "path": "../x", "action": "delete"}]),
        b"[]", b'"manifest"', b"null", b"{\"format\": NaN}", b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe",
        b'{"workspace": "\\ud800"}', b"9" * 5000, b'{"a": 1e999}',
    ]


def test_hostile_manifests_end_as_errors_that_are_not_internal(tools: Any, tmp_path: Path,
                                                              record_property: Any) -> None:
    entry, blobs = craft.exec_entry(1, ["cat", "a.txt"], stdout=b"base\n")
    base = craft.manifest(str(tmp_path / "ws"), [entry], {"a.txt": b"base\n"})
    blobs[blob_hash(b"base\n")] = b"base\n"
    hostile = _hostile_manifests(base)

    async def scenario(t: Any) -> int:
        for index, manifest in enumerate(hostile):
            path = tmp_path / f"hostile-{index}.tar.zst"
            path.write_bytes(craft.raw_archive(manifest, blobs))
            for name, args in (("witness_verify", {}), ("capsule_replay", {"allow_untrusted": True})):
                kind, out = await _attempt(t, name, {"path": str(path), **args})
                assert kind == "error" and out == "INVALID_ARGUMENT", (index, manifest[:200], name, out)
        return 2 * len(hostile)

    started = time.monotonic()
    record_property("escapes_tried", tools.run(scenario))
    assert time.monotonic() - started < 120

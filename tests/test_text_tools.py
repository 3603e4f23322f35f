"""The text/file tool handlers, called directly with a small ToolContext; every result is
validated against its tool's output schema and every argument set against its input schema."""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any, cast

import jsonschema
import pytest
import trio

from mcp_server.capsules.run import OwnedRuns, Run
from mcp_server.capsules.service import CapsuleService
from mcp_server.capsules.turns import Ticket
from mcp_server.config import Config
from mcp_server.core.hashline import line_tag
from mcp_server.state import State
from mcp_server.substrate import hashline as hashline_service
from mcp_server.tools import hashline as hashline_tools
from mcp_server.tools import rootspace as rootspace_tools
from mcp_server.tools.registry import Registry, ToolContext, ToolSpec
from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.spec import CapsuleSpec

REGISTRY = Registry.load(["text", "file"], ["mcp_server.tools.hashline", "mcp_server.tools.rootspace"])


class FakeContext:
    """A ToolContext for the text and file tools: a config, a state dir, the client's roots.
    What these tools never use (the helper, the capsule service, turns, runs) fails the
    test if they start to."""

    def __init__(self, config: Config, state: State, declared_roots: list[str] | None = None) -> None:
        self.config = config
        self.state = state
        self.declared_roots = declared_roots

    async def helper(self) -> HelperClient:
        raise AssertionError("no helper in these tests")

    async def roots(self) -> list[str] | None:
        return self.declared_roots

    @property
    def workspace(self) -> str:
        return self.config.workspace

    @property
    def caller_env(self) -> Mapping[str, str]:
        raise AssertionError("the text and file tools use nothing a caller lends")

    @property
    def caller_lent(self) -> bool:
        raise AssertionError("the text and file tools use nothing a caller lends")

    @property
    def terminal(self) -> int | None:
        raise AssertionError("the text and file tools use nothing a caller lends")

    async def progress(self, progress: float, total: float | None = None, message: str | None = None,
                       output: Any = None) -> None:
        return None

    def log(self, message: str) -> None:
        return None

    @property
    def capsules(self) -> CapsuleService:
        raise AssertionError("the text and file tools do not call the capsule service")

    def capsule_turn(self, capsule_id: str, label: str) -> AbstractAsyncContextManager[Ticket]:
        raise AssertionError("the text and file tools take no capsule turn")

    @property
    def runs(self) -> OwnedRuns:
        raise AssertionError("the text and file tools start no background run")

    def for_run(self, run: Run) -> ToolContext:
        raise AssertionError("the text and file tools start no background run")


def call(ctx: FakeContext, name: str, **args: Any) -> dict[str, Any]:
    """Call a tool by name or alias, as the server would: schema in, schema out."""
    spec: ToolSpec | None = REGISTRY.lookup(name)
    assert spec is not None, name
    jsonschema.Draft202012Validator(spec.input_schema).validate(args)
    result = trio.run(spec.handler, ctx, args)
    jsonschema.Draft202012Validator(spec.output_schema).validate(result)
    json.dumps(result)
    return result


def fails(ctx: FakeContext, name: str, **args: Any) -> CcwError:
    with pytest.raises(CcwError) as info:
        call(ctx, name, **args)
    json.dumps(info.value.to_dict())
    return info.value


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    return root.resolve()


@pytest.fixture
def state(tmp_path: Path) -> Iterator[State]:
    opened = State(tmp_path / "state")
    yield opened
    opened.close()


@pytest.fixture
def ctx(ws: Path, state: State) -> FakeContext:
    return FakeContext(Config(workspace=str(ws)), state)


def test_registry_names_aliases_scopes() -> None:
    names = {t.name: t for t in REGISTRY.tools}
    assert set(names) == {
        "read_text_file", "edit_text_file", "file_create", "file_remove",
        "text_read", "text_replace", "text_insert", "text_append",
    }
    for alias in ("file.create", "file.remove", "text.read", "text.replace", "text.insert", "text.append"):
        assert REGISTRY.lookup(alias) is names[alias.replace(".", "_")]
    assert {t.name for t in REGISTRY.tools if t.scope == "read"} == {"read_text_file", "text_read"}
    assert names["file_create"].family == "file" and names["text_read"].family == "text"
    for spec in REGISTRY.tools:
        jsonschema.Draft202012Validator.check_schema(spec.input_schema)
        jsonschema.Draft202012Validator.check_schema(spec.output_schema)
    assert [r.uri_template for r in REGISTRY.resources] == ["list://{+path}"]


# --- hashline ------------------------------------------------------------------------


def _anchors(read: dict[str, Any]) -> dict[str, str]:
    """content line → 'n:hh'."""
    out: dict[str, str] = {}
    for row in read["content"].split("\n"):
        tag, _, text = row.partition("|")
        out.setdefault(text, tag)
    return out


@pytest.mark.parametrize("data", [b"a\nb\nc\n", b"a\r\nb\r\nc\r\n", b"a\nb\nc"], ids=["lf", "crlf", "no_final_newline"])
def test_read_edit_reread(ctx: FakeContext, ws: Path, data: bytes) -> None:
    (ws / "f.txt").write_bytes(data)
    read = call(ctx, "read_text_file", path=str(ws / "f.txt"))
    assert read["file_hash"] == hashlib.sha256(data).hexdigest()
    assert read["total_lines"] == 3
    assert read["content"] == f"1:{line_tag('a')}|a\n2:{line_tag('b')}|b\n3:{line_tag('c')}|c"
    a = _anchors(read)
    out = call(ctx, "edit_text_file", path="f.txt", file_hash=read["file_hash"], ops=[
        {"op": "replace", "anchor": a["b"], "content": "B"},
        {"op": "insert_after", "anchor": a["c"], "content": "d"},
    ])
    nl = "\r\n" if b"\r\n" in data else "\n"
    want = nl.join(["a", "B", "c", "d"]) + (nl if data.endswith(b"\n") else "")
    assert (ws / "f.txt").read_bytes() == want.encode()
    assert out["file_hash"] == hashlib.sha256(want.encode()).hexdigest()
    assert out["context"] == [f"1:{line_tag('a')}|a", f"2:{line_tag('B')}|B", f"3:{line_tag('c')}|c",
                              f"4:{line_tag('d')}|d"]
    again = call(ctx, "read_text_file", path=str(ws / "f.txt"))  # tags spliced by the edit
    assert again["file_hash"] == out["file_hash"]
    assert again["content"].split("\n") == [f"{n}:{line_tag(t)}|{t}" for n, t in enumerate(["a", "B", "c", "d"], 1)]


def test_read_offset_limit_and_empty_file(ctx: FakeContext, ws: Path) -> None:
    (ws / "n.txt").write_text("".join(f"{i}\n" for i in range(1, 11)))
    page = call(ctx, "read_text_file", path="n.txt", offset=4, limit=3)
    assert page["content"].split("\n") == [f"{n}:{line_tag(str(n))}|{n}" for n in (4, 5, 6)]
    assert (page["start_line"], page["end_line"], page["next_offset"]) == (4, 6, 7)
    assert "offset" in fails(ctx, "read_text_file", path="n.txt", offset=11).message
    (ws / "e.txt").write_bytes(b"")
    empty = call(ctx, "read_text_file", path="e.txt")
    assert (empty["content"], empty["total_lines"], empty["end_line"]) == ("", 0, 0)
    call(ctx, "edit_text_file", path="e.txt", file_hash=empty["file_hash"], ops=["insert_after 0 'hello'"])
    assert (ws / "e.txt").read_bytes() == b"hello\n"


def test_hundred_thousand_line_file_through_the_tools(ctx: FakeContext, ws: Path) -> None:
    (ws / "big.txt").write_text("".join(f"line {i}\n" for i in range(100_000)))
    read = call(ctx, "read_text_file", path="big.txt")
    assert read["total_lines"] == 100_000 and read["end_line"] == 100_000
    last = read["content"].rsplit("\n", 1)[1]
    out = call(ctx, "edit_text_file", path="big.txt", file_hash=read["file_hash"], ops=[
        {"op": "replace", "anchor": last.split("|")[0], "content": "the end"},
    ])
    assert out["total_lines"] == 100_000
    assert (ws / "big.txt").read_text().endswith("line 99998\nthe end\n")


def test_stale_hash_after_concurrent_writer_is_rejected_not_clobbered(ctx: FakeContext, ws: Path) -> None:
    path = ws / "c.py"
    path.write_text("x = 1\ny = 2\n")
    read = call(ctx, "read_text_file", path=str(path))
    path.write_text("x = 1\ninserted = 0\ny = 2\n")  # another writer, between read and edit
    err = fails(ctx, "edit_text_file", path=str(path), file_hash=read["file_hash"], ops=[
        {"op": "replace", "anchor": _anchors(read)["y = 2"], "content": "y = 3"},
    ])
    assert err.code == "CONFLICT" and err.details["reason"] == "stale_file_hash"
    assert path.read_text() == "x = 1\ninserted = 0\ny = 2\n"
    fresh = err.details["context"][_anchors(read)["y = 2"]]["around"]
    assert f"3:{line_tag('y = 2')}|y = 2" in fresh
    # The corrected edit, from the error alone.
    call(ctx, "edit_text_file", path=str(path), file_hash=err.details["file_hash"], ops=[
        {"op": "replace", "anchor": f"3:{line_tag('y = 2')}", "content": "y = 3"},
    ])
    assert path.read_text() == "x = 1\ninserted = 0\ny = 3\n"


def test_writer_during_the_edit_is_detected(ctx: FakeContext, ws: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = ws / "race.txt"
    path.write_text("a\nb\n")
    read = call(ctx, "read_text_file", path="race.txt")
    real_edit = hashline_tools.hashline.edit

    def edit_then_someone_writes(*args: Any, **kwargs: Any) -> Any:
        result = real_edit(*args, **kwargs)
        path.write_text("someone else\n")  # lands after our read, before our rename
        return result

    monkeypatch.setattr(hashline_tools.hashline, "edit", edit_then_someone_writes)
    err = fails(ctx, "edit_text_file", path="race.txt", file_hash=read["file_hash"], ops=[
        {"op": "delete", "anchor": _anchors(read)["a"]},
    ])
    assert err.details["reason"] == "concurrent_write"
    assert path.read_text() == "someone else\n"


def test_moved_and_ambiguous_anchors_through_the_tool(ctx: FakeContext, ws: Path) -> None:
    (ws / "m.txt").write_text("one\ntwo\nthree\ntwo\n")
    read = call(ctx, "read_text_file", path="m.txt")
    tag3 = line_tag("three")
    out = call(ctx, "edit_text_file", path="m.txt", file_hash=read["file_hash"], ops=[
        {"op": "replace", "anchor": f"1:{tag3}", "content": "THREE"},
    ])
    assert out["moved"] == [{"op_index": 0, "from": 1, "to": 3}]
    err = fails(ctx, "edit_text_file", path="m.txt", file_hash=out["file_hash"], ops=[
        {"op": "delete", "anchor": f"1:{line_tag('two')}"},
    ])
    assert err.details["reason"] == "anchor_ambiguous"
    assert (ws / "m.txt").read_text() == "one\ntwo\nTHREE\ntwo\n"


def test_roots_limit_hashline_paths(ws: Path, tmp_path: Path, state: State) -> None:
    evil = tmp_path / "ws_evil"
    evil.mkdir()
    (evil / "s").write_text("secret\n")
    (ws / "ok").write_text("fine\n")
    os.symlink(evil / "s", ws / "link")
    ctx = FakeContext(Config(workspace=str(tmp_path)), state, declared_roots=[str(ws)])
    assert call(ctx, "read_text_file", path=str(ws / "ok"))["total_lines"] == 1
    assert call(ctx, "read_text_file", path="ok")["total_lines"] == 1  # relative to the first root
    for bad in (str(evil / "s"), str(ws / "link"), "../ws_evil/s"):
        assert fails(ctx, "read_text_file", path=bad).code == "PERMISSION_DENIED"


def test_hashline_errors_are_instructional(ctx: FakeContext, ws: Path) -> None:
    err = fails(ctx, "read_text_file", path="missing.txt")
    assert err.code == "NOT_FOUND" and "does not exist" in err.message
    (ws / "bin").write_bytes(b"\x89PNG\r\n\x1a\n\xff")
    assert "base64" in fails(ctx, "read_text_file", path="bin").message
    (ws / "d").mkdir()
    assert "file" in fails(ctx, "read_text_file", path="d").message
    assert "file_create" in fails(ctx, "edit_text_file", path="nope", file_hash="0" * 64, ops=["delete 1:00"]).message


# --- rootspace -----------------------------------------------------------------------


def test_rootspace_lifecycle(ctx: FakeContext, ws: Path) -> None:
    made = call(ctx, "file.create", path="/src//pkg/./mod.py", content="def f():\n    return 1\n")
    assert made == {"path": "/src/pkg/mod.py", "hash": hashlib.sha256(b"def f():\n    return 1\n").hexdigest(),
                    "size": 22}
    assert fails(ctx, "file_create", path="src/pkg/mod.py", content="x").code == "CONFLICT"
    assert (ws / "src/pkg/mod.py").stat().st_mode & 0o777 == 0o644
    read = call(ctx, "text.read", path="/src/pkg/mod.py")
    assert read["hash"] == made["hash"] and read["total_lines"] == 2 and read["encoding"] == "utf-8"
    r = call(ctx, "text.replace", path="/src/pkg/mod.py", hash=read["hash"], lines=[2, 0], old="    return 1",
             new="    return 2")
    assert (ws / "src/pkg/mod.py").read_text() == "def f():\n    return 2\n"
    i = call(ctx, "text.insert", path="src/pkg/mod.py", hash=r["hash"], line=1, anchor="def f():", content="# doc")
    a = call(ctx, "text.append", path="src/pkg/mod.py", hash=i["hash"], content="f()")
    assert a["total_lines"] == 4
    assert (ws / "src/pkg/mod.py").read_text() == "# doc\ndef f():\n    return 2\nf()\n"
    assert call(ctx, "text_read", path="/src/pkg/mod.py", lines=[-2, 0])["content"] == "    return 2\nf()\n"
    stale = fails(ctx, "file.remove", path="/src/pkg/mod.py", hash=read["hash"])
    assert stale.code == "CONFLICT" and "text_read" in stale.message
    assert call(ctx, "file.remove", path="/src/pkg/mod.py", hash=a["hash"]) == {"path": "/src/pkg/mod.py",
                                                                                "removed": True}
    assert not (ws / "src/pkg/mod.py").exists()


def test_rootspace_stale_hash_does_not_write(ctx: FakeContext, ws: Path) -> None:
    (ws / "t.txt").write_text("a\n")
    read = call(ctx, "text_read", path="t.txt")
    (ws / "t.txt").write_text("a\nb\n")
    for name, extra in (
        ("text_append", {"content": "c"}),
        ("text_replace", {"lines": [0, 0], "old": "a", "new": "z"}),
        ("text_insert", {"line": 1, "anchor": "a", "content": "z"}),
    ):
        err = fails(ctx, name, path="t.txt", hash=read["hash"], **extra)
        assert err.code == "CONFLICT" and err.details["hash"] == hashlib.sha256(b"a\nb\n").hexdigest()
    assert (ws / "t.txt").read_text() == "a\nb\n"


def test_rootspace_paths_stay_in_the_root(ctx: FakeContext, ws: Path) -> None:
    (ws / "in.txt").write_text("in\n")
    assert call(ctx, "text_read", path="/a/../in.txt")["content"] == "in\n"
    assert fails(ctx, "text_read", path="/../etc/passwd").code == "PERMISSION_DENIED"
    assert fails(ctx, "text_read", path="C:\\Windows\\win.ini").code == "INVALID_ARGUMENT"
    # A leading '/' is the root, not the host's '/': this is <root>/etc/hostname.
    assert fails(ctx, "text_read", path="/etc/hostname").code == "NOT_FOUND"
    os.symlink("/etc/hostname", ws / "out")
    assert fails(ctx, "text_read", path="/out").code == "PERMISSION_DENIED"
    (ws / "real").mkdir()
    os.symlink("real", ws / "via")
    assert fails(ctx, "file_create", path="/via/x.txt", content="x").code == "PERMISSION_DENIED"
    assert not (ws / "real" / "x.txt").exists()


def test_rootspace_base64(ctx: FakeContext, ws: Path) -> None:
    blob = bytes(range(256))
    made = call(ctx, "file_create", path="/b.bin", content=base64.b64encode(blob).decode(), encoding="base64")
    assert made["hash"] == hashlib.sha256(blob).hexdigest()  # MCP-031: hash of the decoded bytes
    err = fails(ctx, "text_read", path="/b.bin")
    assert "base64" in err.message
    back = call(ctx, "text_read", path="/b.bin", encoding="base64")
    assert base64.b64decode(back["content"]) == blob and back["hash"] == made["hash"]


def test_rootspace_uses_first_declared_root(ws: Path, tmp_path: Path, state: State) -> None:
    other = tmp_path / "other"
    other.mkdir()
    ctx = FakeContext(Config(workspace=str(other)), state, declared_roots=[str(ws)])
    call(ctx, "file_create", path="/x.txt", content="x\n")
    assert (ws / "x.txt").read_text() == "x\n" and not (other / "x.txt").exists()


def test_list_resource(ctx: FakeContext, ws: Path) -> None:
    (ws / "b").mkdir()
    (ws / "b" / "inner").write_text("")
    (ws / ".hidden").write_text("")
    (ws / "a.txt").write_text("")
    os.symlink("a.txt", ws / "ln")
    mime, text = trio.run(rootspace_tools.list_resource, ctx, "list:///")
    assert mime == "application/json"
    assert json.loads(text) == {"path": "/", "entries": [
        {"name": ".hidden", "kind": "file"}, {"name": "a.txt", "kind": "file"},
        {"name": "b", "kind": "dir"}, {"name": "ln", "kind": "symlink"},
    ]}
    assert json.loads(trio.run(rootspace_tools.list_resource, ctx, "list://b")[1])["entries"] == [
        {"name": "inner", "kind": "file"}]
    assert json.loads(trio.run(rootspace_tools.list_resource, ctx, "list://")[1])["path"] == "/"
    with pytest.raises(CcwError) as info:
        trio.run(rootspace_tools.list_resource, ctx, "list://nope/deeper")
    assert info.value.code == "NOT_FOUND"
    with pytest.raises(CcwError):
        trio.run(rootspace_tools.list_resource, ctx, "list://../")


def test_huge_read_is_paged_not_refused(ctx: FakeContext, ws: Path) -> None:
    line = "x" * 999
    (ws / "huge.txt").write_text((line + "\n") * 3000)  # 3 MB: over one answer's cap
    first = call(ctx, "read_text_file", path="huge.txt")
    assert 0 < first["end_line"] < 3000 and first["next_offset"] == first["end_line"] + 1
    assert len(first["content"]) <= hashline_service.MAX_READ_CHARS
    rest = call(ctx, "read_text_file", path="huge.txt", offset=first["next_offset"])
    assert rest["start_line"] == first["end_line"] + 1


class FakeHelper:
    """Stands in for the helper's open_root: an O_PATH descriptor of a 'merged view' dir."""

    def __init__(self, views: dict[str, Path]) -> None:
        self.views = views

    async def open_root(self, capsule_id: str) -> int:
        if capsule_id not in self.views:
            raise CcwError("NOT_FOUND", f"capsule {capsule_id} not found")
        return os.open(self.views[capsule_id], os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)


class CapsuleContext(FakeContext):
    """A FakeContext whose helper serves capsule views (open_root, all these tools ask of it)."""

    def __init__(self, config: Config, state: State, fake_helper: FakeHelper) -> None:
        super().__init__(config, state)
        self.fake_helper = fake_helper

    async def helper(self) -> HelperClient:
        return cast(HelperClient, self.fake_helper)


def test_capsule_id_acts_on_the_capsule_view(ws: Path, tmp_path: Path) -> None:
    from mcp_server.journal import Journal
    from mcp_server.journal_records import CapsuleRecord

    merged = tmp_path / "merged"  # what the capsule sees: a different copy of the workspace
    merged.mkdir()
    (merged / "f.txt").write_text("in capsule\n")
    (ws / "f.txt").write_text("live\n")
    state = State(tmp_path / "state")
    try:
        Journal(state).add_capsule(CapsuleRecord(
            capsule_id="cap1", spec=CapsuleSpec(workspace=str(ws)), parent=None, created_at="", clock="",
            isolation={}, mount=str(merged),
            base_fingerprint=None, destroyed_at=None,
        ))
        ctx = CapsuleContext(Config(workspace=str(ws)), state=state, fake_helper=FakeHelper({"cap1": merged}))
        read = call(ctx, "read_text_file", path=str(ws / "f.txt"), capsule_id="cap1")
        assert read["content"].endswith("|in capsule")
        call(ctx, "edit_text_file", path="f.txt", capsule_id="cap1", file_hash=read["file_hash"],
             ops=[{"op": "replace", "anchor": read["content"].split("|")[0], "content": "changed in capsule"}])
        assert (merged / "f.txt").read_text() == "changed in capsule\n"
        assert (ws / "f.txt").read_text() == "live\n"  # the live tree is untouched
        assert fails(ctx, "read_text_file", path=str(tmp_path / "elsewhere"),
                     capsule_id="cap1").code == "PERMISSION_DENIED"
        assert fails(ctx, "read_text_file", path="f.txt", capsule_id="nope").code == "NOT_FOUND"
        made = call(ctx, "file_create", path="/new.txt", content="n\n", capsule_id="cap1")
        assert (merged / "new.txt").read_text() == "n\n" and not (ws / "new.txt").exists()
        got = call(ctx, "text_read", path="/new.txt", capsule_id="cap1")
        assert got["hash"] == made["hash"]
        call(ctx, "file_remove", path="/new.txt", hash=made["hash"], capsule_id="cap1")
        assert not (merged / "new.txt").exists()
        # Every change is journaled for the capsule's witness, in order, with its bytes.
        writes = Journal(state).writes("cap1")
        assert [(w["path"], w["action"]) for w in writes] == [("f.txt", "write"), ("new.txt", "write"),
                                                              ("new.txt", "delete")]
        assert base64.b64decode(writes[0]["content_b64"]) == b"changed in capsule\n"
        # Each advanced the capsule's change generation (deltamin trusts only runs of the last).
        assert [w["generation"] for w in writes] == [1, 2, 3] and Journal(state).generation("cap1") == 3
    finally:
        state.close()


def test_every_anchored_op_on_an_empty_file_is_rejected_with_an_empty_context(ctx: FakeContext, ws: Path) -> None:
    (ws / "empty").write_bytes(b"")
    read = call(ctx, "read_text_file", path="empty")
    for op in ("replace", "replace_range", "insert_after", "insert_before", "delete", "delete_range"):
        anchor = "1:00..1:00" if op.endswith("_range") else "1:00"
        raw: dict[str, Any] = {"op": op, "anchor": anchor}
        if not op.startswith("delete"):
            raw["content"] = "x"
        err = fails(ctx, "edit_text_file", path="empty", file_hash=read["file_hash"], ops=[raw])
        assert err.details["reason"] == "anchor_not_found"
        assert err.details["context"]["1:00"] == {"around": [], "lines_with_hash": []}
    assert (ws / "empty").read_bytes() == b""
    state = call(ctx, "text_read", path="/empty")
    assert (state["content"], state["total_lines"]) == ("", 0)
    assert fails(ctx, "text_insert", path="/empty", hash=state["hash"], line=1, anchor="",
                 content="x").code == "INVALID_ARGUMENT"
    assert fails(ctx, "text_replace", path="/empty", hash=state["hash"], lines=[0, 0], old="x",
                 new="y").code == "INVALID_ARGUMENT"
    call(ctx, "text_append", path="/empty", hash=state["hash"], content="first\n")
    assert (ws / "empty").read_bytes() == b"first\n"


def test_file_create_never_replaces_a_file_that_appears_meanwhile(ctx: FakeContext, ws: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from mcp_server.fs.view import RootView

    real_exists = RootView.exists

    def exists_then_someone_creates(self: RootView, rel: str) -> bool:
        answer = real_exists(self, rel)
        (ws / "late.txt").write_text("theirs\n")  # after our check, before our create
        return answer

    monkeypatch.setattr(RootView, "exists", exists_then_someone_creates)
    err = fails(ctx, "file_create", path="/late.txt", content="ours\n")
    assert err.code == "CONFLICT"
    assert (ws / "late.txt").read_text() == "theirs\n"
    assert sorted(p.name for p in ws.iterdir()) == ["late.txt"]  # no temp file left behind


def test_text_read_of_too_much_says_to_read_in_parts(ctx: FakeContext, ws: Path) -> None:
    (ws / "huge.txt").write_text(("y" * 999 + "\n") * 3000)
    err = fails(ctx, "text_read", path="/huge.txt")
    assert err.code == "TOO_LARGE" and "lines=[start, end]" in err.message and err.details["total_lines"] == 3000
    part = call(ctx, "text_read", path="/huge.txt", lines=[1, 1001])
    assert part["total_lines"] == 3000 and part["content"].count("\n") == 1000


def test_tags_stay_right_across_cached_reads(ctx: FakeContext, ws: Path) -> None:
    path = ws / "c.txt"
    for text in ("a\nb\nc\n", "x\ny\nz\n", "a\nb\nc\n"):
        path.write_text(text)
        whole = call(ctx, "read_text_file", path="c.txt")
        lines = text.split("\n")[:-1]
        assert whole["content"].split("\n") == [f"{n}:{line_tag(t)}|{t}" for n, t in enumerate(lines, 1)]
        page = call(ctx, "read_text_file", path="c.txt", offset=2, limit=1)  # served from the cached list
        assert page["content"] == f"2:{line_tag(lines[1])}|{lines[1]}"


@pytest.mark.parametrize(("first", "count"), [
    (1, 0), (1, 1), (1, 300), (7, 40),
    (hashline_service.ROW_PREFIX_LINES - 5, 20),  # crosses the end of the shared prefixes
    (hashline_service.ROW_PREFIX_LINES + 3, 5),  # wholly past it
])
def test_rendered_rows_are_the_tagged_lines(first: int, count: int) -> None:
    lines = [f"line {n} = {'x' * (n % 7)}" for n in range(count)]
    tags = [line_tag(line) for line in lines]
    expected = "\n".join(f"{first + i}:{tag}|{line}" for i, (tag, line) in enumerate(zip(tags, lines, strict=True)))
    assert hashline_service.render_rows(lines, tags, first) == expected


def test_rows_rendered_in_many_threads_at_once_are_right() -> None:
    # Handlers run in worker threads; the shared prefixes grow under a lock.
    import threading

    lines = ["same"] * 3000
    tags = [line_tag("same")] * 3000
    failures: list[int] = []

    def render(first: int) -> None:
        got = hashline_service.render_rows(lines, tags, first).split("\n")
        if got != [f"{first + i}:{tags[0]}|same" for i in range(3000)]:
            failures.append(first)

    threads = [threading.Thread(target=render, args=(1 + 2000 * k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []

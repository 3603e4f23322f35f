"""An agent's session with the text tools over a real MCP client and ``ccw-mcp`` on stdio:
read, edit by anchors, re-read, a stale edit rejected with the fresh tags, the corrected
edit; RootSpace through its seed aliases and ``list://``; roots declared by the client."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import mcp_types as types
import pytest
import trio
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.shared.exceptions import MCPDeprecationWarning, MCPError

from tests.support.mcp_process import CCW_MCP, server_env


def _ok(schemas: dict[str, Any], name: str, result: Any) -> dict[str, Any]:
    assert result.is_error is not True, result
    jsonschema.Draft202012Validator(schemas[name]).validate(result.structured_content)
    text = result.content[0].text
    if name in ("read_text_file", "text_read", "text.read"):
        # The document as text after one JSON line of the other fields (what a model reads).
        header, _, document = text.partition("\n")
        assert {**json.loads(header), "content": document} == result.structured_content
    else:
        assert json.loads(text) == result.structured_content
    return result.structured_content


def _error(result: Any) -> dict[str, Any]:
    assert result.is_error is True, result
    return result.structured_content["error"]


def _tag_of(read: dict[str, Any], text: str) -> str:
    for row in read["content"].split("\n"):
        tag, _, content = row.partition("|")
        if content == text:
            return tag
    raise AssertionError(f"{text!r} not in {read['content']!r}")


def test_agent_session_over_stdio(tmp_path: Path) -> None:
    ws = (tmp_path / "ws").resolve()
    ws.mkdir()
    outside = tmp_path / "ws_evil"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret\n")
    app = ws / "app.py"
    app.write_bytes(b"import os\r\n\r\ndef main():\r\n    print('hi')\r\n")
    roots = [ws]

    async def list_roots(context: Any) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri=r.as_uri()) for r in roots])

    params = StdioServerParameters(
        command=str(CCW_MCP), env=server_env(tmp_path, CCW_TOOLSETS="text,file", CCW_WORKSPACE=str(tmp_path))
    )

    async def session() -> None:
        async with Client(params, mode="legacy", list_roots_callback=list_roots) as client:
            listed = await client.list_tools()
            schemas = {t.name: t.output_schema for t in listed.tools}
            assert {"read_text_file", "edit_text_file", "text_read", "file_create"} <= set(schemas)

            # 1. read, 2. edit by anchors, 3. re-read.
            read = _ok(schemas, "read_text_file", await client.call_tool("read_text_file", {"path": str(app)}))
            assert read["total_lines"] == 4
            edit = _ok(schemas, "edit_text_file", await client.call_tool("edit_text_file", {
                "path": str(app),
                "file_hash": read["file_hash"],
                "ops": [
                    {"op": "replace", "anchor": _tag_of(read, "    print('hi')"), "content": "    print('hello')"},
                    f"insert_before {_tag_of(read, 'import os')} '#!/usr/bin/env python3'",
                ],
            }))
            assert app.read_bytes() == (b"#!/usr/bin/env python3\r\nimport os\r\n\r\n"
                                        b"def main():\r\n    print('hello')\r\n")
            reread = _ok(schemas, "read_text_file", await client.call_tool("read_text_file", {"path": "app.py"}))
            assert reread["file_hash"] == edit["file_hash"] and reread["total_lines"] == 5

            # 4. someone else edits; the agent's next edit is stale and gets the fresh tags.
            app.write_bytes(app.read_bytes() + b"\r\nmain()\r\n")
            stale = _error(await client.call_tool("edit_text_file", {
                "path": str(app),
                "file_hash": reread["file_hash"],
                "ops": [{"op": "insert_after", "anchor": _tag_of(reread, "    print('hello')"),
                         "content": "    return 0"}],
            }))
            assert stale["code"] == "CONFLICT" and "read_text_file" in stale["message"]
            around = stale["details"]["context"][_tag_of(reread, "    print('hello')")]["around"]
            fresh_anchor = next(row.split("|")[0] for row in around if row.endswith("|    print('hello')"))

            # 5. the corrected edit, from the error's details alone.
            _ok(schemas, "edit_text_file", await client.call_tool("edit_text_file", {
                "path": str(app),
                "file_hash": stale["details"]["file_hash"],
                "ops": [{"op": "insert_after", "anchor": fresh_anchor, "content": "    return 0"}],
            }))
            assert app.read_bytes().endswith(b"    print('hello')\r\n    return 0\r\n\r\nmain()\r\n")

            # Roots: outside the declared root is refused, the workspace fallback does not apply.
            denied = _error(await client.call_tool("read_text_file", {"path": str(outside / "secret.txt")}))
            assert denied["code"] == "PERMISSION_DENIED" and str(ws) in denied["message"]

            # RootSpace through the seed's aliases; '/' is the first root.
            made = _ok(schemas, "file_create",
                       await client.call_tool("file.create", {"path": "/notes/todo.md", "content": "- a\n"}))
            got = _ok(schemas, "text_read", await client.call_tool("text.read", {"path": "/notes/todo.md"}))
            assert got["hash"] == made["hash"]
            _ok(schemas, "text_append", await client.call_tool("text.append", {"path": "/notes/todo.md",
                                                                               "hash": got["hash"], "content": "- b"}))
            assert (ws / "notes" / "todo.md").read_text() == "- a\n- b\n"
            escape = _error(await client.call_tool("text.read", {"path": "/../ws_evil/secret.txt"}))
            assert escape["code"] == "PERMISSION_DENIED"

            listing = await client.read_resource("list:///")
            body = json.loads(listing.contents[0].text)
            assert body["entries"] == [{"name": "app.py", "kind": "file"}, {"name": "notes", "kind": "dir"}]
            with pytest.raises(MCPError) as missing:
                await client.read_resource("list:///missing")
            assert missing.value.error.code == -32002  # MCP's resource-not-found

            # The client changes its roots and says so: the next call sees the new ones.
            roots[:] = [outside]
            with pytest.warns(MCPDeprecationWarning):  # roots are deprecated in the 2026-07-28 era
                await client.send_roots_list_changed()
            # The server handles a notification in a task of its own; a round trip after it
            # lets that task run before the next call asks for roots.
            await client.call_tool("text_read", {"path": "/"})  # (its outcome does not matter)
            moved = _ok(schemas, "read_text_file",
                        await client.call_tool("read_text_file", {"path": str(outside / "secret.txt")}))
            assert moved["total_lines"] == 1
            assert _error(await client.call_tool("read_text_file", {"path": str(app)}))["code"] == "PERMISSION_DENIED"

    trio.run(session)

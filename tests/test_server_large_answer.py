"""Answers larger than the 1 MiB request guard reach a client over the unix socket."""

from __future__ import annotations

from pathlib import Path

import trio
from mcp import Client

from mcp_server.transports.unix import connect
from tests.support.mcp_process import ServerProcess, server_env


def test_a_two_megabyte_answer_arrives_whole(tmp_path: Path) -> None:
    big = tmp_path / "big.txt"
    big.write_text("".join(f"line {i} {'x' * 190}\n" for i in range(10_000)))  # ~2 MB of text
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="socket", CCW_TOOLSETS="text",
                                      CCW_WORKSPACE=str(tmp_path)))
    path = server.wait_ready()

    async def main() -> tuple[int, int, str]:
        async with Client(connect(path), mode="legacy") as client:
            result = await client.call_tool("read_text_file", {"path": str(big)})
            out = result.structured_content
            return out["total_lines"], out["end_line"], out["content"]

    async def bounded() -> tuple[int, int, str]:
        with trio.fail_after(60):  # the bug this guards against was a silent hang
            return await main()

    try:
        total, end, content = trio.run(bounded)
    finally:
        server.stop()
    assert total == 10_000 and len(content) > 1_800_000  # one page of the read, well over 1 MiB
    assert content.splitlines()[-1].startswith(f"{end}:") and content.splitlines()[-1].endswith("x" * 190)

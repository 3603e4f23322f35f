"""completion/complete of capsule ids over stdio with the SDK's client: the live capsules
capsule_list shows, by prefix (capsules need the privileged helper)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from mcp_types import PromptReference

from tests.support.mcp_process import stdio_client


def test_a_capsule_id_prefix_completes_to_the_live_capsules(tmp_path: Path, root_required: None) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()

    async def session() -> tuple[list[str], Any, Any, Any]:
        async with stdio_client(tmp_path, CCW_TOOLSETS="capsule") as client:
            ids = []
            for _ in range(2):
                created = await client.call_tool("capsule_create", {"workspace": str(workspace)})
                ids.append(created.structured_content["capsule_id"])
            exec_ref = PromptReference(name="capsule_exec")
            by_prefix = await client.complete(exec_ref, {"name": "capsule_id", "value": ids[0][:4]})
            every = await client.complete(PromptReference(name="capsule_destroy"), {"name": "capsule_id", "value": ""})
            await client.call_tool("capsule_destroy", {"capsule_id": ids[1]})
            after = await client.complete(exec_ref, {"name": "capsule_id", "value": ""})
            return ids, by_prefix, every, after

    ids, by_prefix, every, after = trio.run(session)
    assert ids[0] in by_prefix.completion.values
    assert all(value.startswith(ids[0][:4]) for value in by_prefix.completion.values)
    assert every.completion.values == sorted(ids)
    assert after.completion.values == [ids[0]]  # a destroyed capsule is no longer offered

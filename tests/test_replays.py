"""capsules/replay: what a replayer must allow before a witness runs (the rest needs a helper: vm-tests)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from mcp_server.capsules.replay import ReplayOptions, admit
from mcp_server.core.netrules import parse_network
from mcp_server.fs.witness_key import Verdict
from sandbox.errors import CcwError
from tests.support import witness_craft as craft


def _manifest(include_blobs: bool = True) -> dict[str, Any]:
    entry, _ = craft.exec_entry(1, ["true"])
    return craft.manifest("/home/u/project", [entry], include_blobs=include_blobs)


KEY = "ccw-ed25519:" + "A" * 43 + "="
VALID = Verdict("valid", True, "this state dir", KEY)


@pytest.mark.parametrize("signature", [Verdict("unsigned"), Verdict("unknown key", key=KEY), Verdict("invalid")])
def test_a_witness_signed_neither_here_nor_by_a_trusted_key_needs_allow_untrusted(signature: Verdict) -> None:
    with pytest.raises(CcwError, match="allow_untrusted") as refused:
        admit(_manifest(), signature, ReplayOptions())
    assert refused.value.code == "PERMISSION_DENIED" and refused.value.details == signature.report()
    assert ("ccw witness trust " + KEY in refused.value.message) == (signature.state == "unknown key")
    # The state is said as the replay's own report says it ("signature: unknown key"), not as
    # "the witness is unknown key", and the sentences are one space apart like the others.
    assert refused.value.message.startswith(f"signature: {signature.state}: ") and "  " not in refused.value.message
    admit(_manifest(), signature, ReplayOptions(allow_untrusted=True))
    admit(_manifest(), VALID, ReplayOptions())
    admit(_manifest(), Verdict("valid", False, "laptop", KEY), ReplayOptions())  # a trusted key's


def test_a_witness_without_blobs_needs_the_replayer_to_name_its_base() -> None:
    with pytest.raises(CcwError, match=r"pass workspace .* or make the witness again with include_blobs") as refused:
        admit(_manifest(include_blobs=False), VALID, ReplayOptions())
    assert refused.value.code == "INVALID_ARGUMENT"
    assert refused.value.details == {"recorded_workspace": "/home/u/project"}
    admit(_manifest(include_blobs=False), VALID, ReplayOptions(workspace="/srv/copy"))
    with pytest.raises(CcwError, match="carries its base"):
        admit(_manifest(), VALID, ReplayOptions(workspace="/srv/copy"))


def test_a_capsules_own_witness_replays_with_its_own_values_and_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CCW_TEST_TOKEN", "the capsule had it")
    monkeypatch.delenv("CCW_TEST_UNSET", raising=False)
    network = parse_network(["pypi.org:443"])
    record: Any = types.SimpleNamespace(spec=types.SimpleNamespace(env_whitelist=("CCW_TEST_TOKEN", "CCW_TEST_UNSET")),
                                        network_spec=network)
    options = ReplayOptions.of_capsule(record)
    assert options.env == {"CCW_TEST_TOKEN": "the capsule had it"} and options.network == network
    assert options.allow_untrusted is False and options.workspace is None
    assert ReplayOptions().env == {} and ReplayOptions().network is None  # by default, nothing of this process's


def test_a_witness_with_services_is_refused_where_none_can_start(tmp_path: Path) -> None:
    import trio

    from mcp_server.capsules.replay import replay
    from mcp_server.state import State

    entry, blobs = craft.exec_entry(1, ["python3", "test_app.py"])
    entry["services"] = [{"name": "web", "argv": ["python3", "server.py"], "ready": {"port": 8765}}]
    path = craft.write(tmp_path / "w.tar.zst", craft.manifest("/home/u/project", [entry]), blobs)
    # A process without services (a ccw-bot's): refused before any capsule is made (the fake has no scratch).
    service: Any = types.SimpleNamespace(state=State(tmp_path / "state"), services=None)
    with pytest.raises(CcwError) as refused:
        trio.run(replay, service, path, None, ReplayOptions(allow_untrusted=True))
    assert refused.value.code == "UNSUPPORTED" and "locally" in refused.value.message

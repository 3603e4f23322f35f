"""A policy's replay of a capsule with secrets (capsules/replay.py ``ReplayOptions.of_capsule``,
called by promotion with capsules/capsecrets.py's kept names): this server's own value of a
secret's name never reaches the replay, which names the variable as missing instead."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from mcp_server.capsules import capsecrets
from mcp_server.capsules.replay import ReplayOptions


def test_a_secrets_name_is_not_given_this_servers_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GITHUB_TOKEN", "the server's own real token")
    monkeypatch.setenv("CCW_TEST_LANG", "C.UTF-8")
    record: Any = types.SimpleNamespace(spec=types.SimpleNamespace(env_whitelist=("CCW_TEST_LANG", "GITHUB_TOKEN")),
                                        network_spec=None, capsule_id="cap_1")
    capsecrets.remember(tmp_path, "cap_1", ["GITHUB_TOKEN"])  # what capsule_create keeps: the names only
    options = ReplayOptions.of_capsule(record, capsecrets.recall(tmp_path, "cap_1"))
    assert options.env == {"CCW_TEST_LANG": "C.UTF-8"}
    # Without secrets the whitelist is passed as before.
    assert ReplayOptions.of_capsule(record).env == {"CCW_TEST_LANG": "C.UTF-8",
                                                    "GITHUB_TOKEN": "the server's own real token"}

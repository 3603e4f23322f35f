"""Every console script answers ``--version`` and ``--help`` without starting anything; the
front end's diagnostics go through ``logging`` (level, JSON lines, the SDK's records)."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

import mcp_server
from mcp_server import logs
from mcp_server.config import Config
from sandbox.errors import CcwError
from tests.support.mcp_process import ROOT, ServerProcess, server_env

BIN = ROOT / ".venv" / "bin"
SCRIPTS = sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


@pytest.fixture
def open_stdin() -> Iterator[int]:
    """A stdin that never reaches EOF: a script that started serving would wait on it."""
    read_end, write_end = os.pipe()
    yield read_end
    os.close(read_end)
    os.close(write_end)


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.parametrize("flag", ["--version", "--help"])
def test_script_answers_and_exits_without_serving(script: str, flag: str, tmp_path: Path, open_stdin: int) -> None:
    env = server_env(tmp_path)
    done = subprocess.run([str(BIN / script), flag], stdin=open_stdin, capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    if flag == "--version":
        assert done.stdout == f"{script} {mcp_server.__version__}\n"
    else:
        assert done.stdout.startswith(f"usage: {script}") and "--version" in done.stdout
    assert done.stderr == ""
    assert not (tmp_path / "mcp.ready").exists() and not (tmp_path / "state").exists()


def test_ccw_mcp_help_lists_every_setting(tmp_path: Path, open_stdin: int) -> None:
    shown = subprocess.run([str(BIN / "ccw-mcp"), "--help"], stdin=open_stdin, capture_output=True, text=True,
                           env=server_env(tmp_path), timeout=120).stdout
    for env_name, _default, _meaning in Config.describe():
        assert env_name in shown


def test_an_unknown_argument_is_a_usage_error(tmp_path: Path, open_stdin: int) -> None:
    done = subprocess.run([str(BIN / "ccw-mcp"), "--no-such-flag"], stdin=open_stdin, capture_output=True,
                          text=True, env=server_env(tmp_path), timeout=120)
    assert done.returncode == 2 and "unrecognized arguments: --no-such-flag" in done.stderr


def test_one_version_everywhere() -> None:
    import sandbox

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sandbox.__version__"}
    assert mcp_server.__version__ == sandbox.__version__


# --- logging ----------------------------------------------------------------------------


def test_log_settings_are_checked() -> None:
    assert Config.from_env({"CCW_LOG_LEVEL": "WARNING", "CCW_LOG_FORMAT": "json"}).log_level == "warning"
    with pytest.raises(CcwError, match="CCW_LOG_LEVEL='loud': use one of debug, info, warning, error"):
        Config.from_env({"CCW_LOG_LEVEL": "loud"})
    with pytest.raises(CcwError, match="CCW_LOG_FORMAT='xml'"):
        Config.from_env({"CCW_LOG_FORMAT": "xml"})


def test_a_bad_log_level_stops_the_server_with_a_reason(tmp_path: Path) -> None:
    done = subprocess.run([str(BIN / "ccw-mcp")], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          env=server_env(tmp_path, CCW_LOG_LEVEL="loud"), timeout=120)
    assert done.returncode == 2
    assert done.stderr == "mcp:error CCW_LOG_LEVEL='loud': use one of debug, info, warning, error\n"


def _http_server(tmp_path: Path, *argv: str, **env: str) -> ServerProcess:
    server = ServerProcess(server_env(tmp_path, MCP_ENDPOINT="http", **env), argv=list(argv))
    server.wait_for_line("mcp:ready mode=http", timeout=60)  # a search: text or JSON lines
    assert server.stop() == 0
    return server


def test_text_log_keeps_the_seed_lines_and_names_the_sdk_records(tmp_path: Path) -> None:
    server = _http_server(tmp_path)
    assert server.lines[-1].startswith("mcp:shutdown mode=http ts=")
    assert any(line.startswith("mcp:ready mode=http path=http://127.0.0.1:") for line in server.lines)
    # The SDK's own record, which print-based logging used to lose.
    assert "INFO mcp.server.streamable_http_manager: StreamableHTTP session manager started" in server.lines


def test_json_log_lines_include_the_sdk_and_lifecycle_records(tmp_path: Path) -> None:
    server = _http_server(tmp_path, "--log-format", "json")
    entries = [json.loads(line) for line in server.lines]  # every line is one JSON object
    assert all(set(entry) == {"ts", "level", "logger", "message"} for entry in entries)
    by_logger = {(e["logger"], e["message"].split(" ", 1)[0]) for e in entries}
    assert ("ccw.mcp.lifecycle", "mcp:ready") in by_logger and ("ccw.mcp.lifecycle", "mcp:shutdown") in by_logger
    assert ("mcp.server.streamable_http_manager", "StreamableHTTP") in by_logger


def test_a_quiet_level_keeps_only_lifecycle_lines_and_warnings(tmp_path: Path) -> None:
    server = _http_server(tmp_path, CCW_LOG_LEVEL="info")
    assert any(line.startswith("mcp:http listening") for line in server.lines)
    quiet = _http_server(tmp_path / "quiet", "--log-level", "warning", CCW_LOG_LEVEL="debug")  # the flag wins
    assert [line.split(" ", 1)[0] for line in quiet.lines] == ["mcp:ready", "mcp:draining", "mcp:shutdown"]


def test_configure_replaces_its_handler() -> None:
    import io
    import logging

    first, second = io.StringIO(), io.StringIO()
    level = logging.getLogger().level
    try:
        logs.configure("info", "text", first)
        logs.configure("info", "json", second)
        logs.LOGGER.info("mcp:test one line")
        logging.getLogger("mcp.server").warning("from the sdk")
    finally:
        for handler in list(logging.getLogger().handlers):
            if handler.get_name() == "ccw-stderr":
                logging.getLogger().removeHandler(handler)
        logging.getLogger().setLevel(level)
    assert first.getvalue() == ""
    lines = [json.loads(line) for line in second.getvalue().splitlines()]
    assert [(e["logger"], e["level"], e["message"]) for e in lines] == [
        ("ccw.mcp", "info", "mcp:test one line"), ("mcp.server", "warning", "from the sdk")]

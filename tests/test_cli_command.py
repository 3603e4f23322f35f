"""The ``ccw`` command without root: parsing, tool arguments, client configs, colour, doctor's shape."""

from __future__ import annotations

import argparse
import io
import json
import os
import socket
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.cli import clients, helperctl, main, parse_args, serve_env
from mcp_server.cli.capsule import tool_call
from mcp_server.cli.output import Progress, color_diff, exec_status, pointed_details, run_with_progress, use_color
from mcp_server.cli.policy_report import policy_lines
from mcp_server.doctor import render
from sandbox.errors import CcwError

CCW = [sys.executable, "-c", "import sys; from mcp_server.cli import main; sys.exit(main())"]


def parse(*argv: str) -> argparse.Namespace:
    return parse_args(argv)


def test_json_flag_before_or_after_the_command() -> None:
    assert parse("--json", "doctor").json is True
    assert parse("doctor", "--json").json is True
    assert parse("doctor").json is False
    assert parse("capsule", "list", "--json").json is True


def test_exec_takes_the_command_after_double_dash() -> None:
    args = parse("capsule", "exec", "cap_1", "--timeout-ms", "500", "--", "pytest", "-q", "--json")
    name, call, label = tool_call(args)
    assert name == "capsule_exec"
    assert call == {"capsule_id": "cap_1", "cmd": ["pytest", "-q", "--json"], "timeout_ms": 500}
    assert label is not None and "pytest" in label


def test_exec_without_a_command_is_a_usage_error() -> None:
    args = parse("capsule", "exec", "cap_1")
    with pytest.raises(SystemExit):
        tool_call(args)
    with pytest.raises(SystemExit):
        parse("doctor", "--", "true")  # '--' belongs to exec and deltamin only
    assert tool_call(parse("capsule", "exec", "cap_1", "true"))[1]["cmd"] == ["true"]


def test_create_maps_limits_env_and_absolute_workspace(tmp_path: Path) -> None:
    args = parse("capsule", "create", str(tmp_path), "--memory-mb", "256", "--pids-max", "64",
                 "--env", "PATH", "--env", "HOME", "--env", "PATH", "--clock-offset-sec", "-60")
    name, call, _ = tool_call(args)
    assert name == "capsule_create"
    assert call == {"workspace": str(tmp_path), "limits": {"memory_mb": 256, "pids_max": 64},
                    "env_whitelist": ["HOME", "PATH"], "clock_offset_sec": -60}
    _, default_call, _ = tool_call(parse("capsule", "create"))
    assert default_call["workspace"] == os.getcwd()


def test_promote_witness_replay_diff_destroy_arguments(tmp_path: Path) -> None:
    _, call, _ = tool_call(parse("capsule", "promote", "cap_1", "--policy", "strict", "--dry-run"))
    assert call == {"capsule_id": "cap_1", "dry_run": True, "policies": ["strict"]}
    _, call, _ = tool_call(parse("capsule", "promote", "cap_1", "--allow-hazard", "setuid", "--allow-hazard",
                                 "autorun", "--allow-hazard", "setuid"))
    assert call == {"capsule_id": "cap_1", "dry_run": False, "allow_hazards": ["autorun", "setuid"]}
    with pytest.raises(SystemExit):
        parse("capsule", "promote", "cap_1", "--allow-hazard", "everything")
    _, call, _ = tool_call(parse("capsule", "witness", "cap_1", "--no-blobs"))
    assert call == {"capsule_id": "cap_1", "include_blobs": False, "compress": "zstd", "carry": "used"}
    _, call, _ = tool_call(parse("capsule", "witness", "cap_1", "--all", "--max-base-mb", "64"))
    assert (call["carry"], call["max_base_mb"]) == ("all", 64)
    _, call, _ = tool_call(parse("capsule", "replay", "wit_0123456789abcdef"))
    assert call == {"witness_id": "wit_0123456789abcdef"}
    witness_file = tmp_path / "w.tar.zst"
    witness_file.write_bytes(b"")
    _, call, _ = tool_call(parse("capsule", "replay", str(witness_file)))
    assert call == {"path": str(witness_file)}
    assert tool_call(parse("capsule", "diff", "cap_1", "--stat"))[1] == {"capsule_id": "cap_1", "format": "stat",
                                                                  "ignored": False, "max_chars": None}
    assert tool_call(parse("capsule", "destroy", "cap_1"))[:2] == ("capsule_destroy", {"capsule_id": "cap_1"})
    assert tool_call(parse("capsule", "fork", "cap_1"))[:2] == ("capsule_fork", {"capsule_id": "cap_1"})
    assert tool_call(parse("capsule", "list"))[:2] == ("capsule_list", {})


def test_replay_takes_env_network_workspace_and_trust_only_from_its_flags(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKEN", "from-this-shell")
    monkeypatch.chdir(tmp_path)
    _, call, _ = tool_call(parse("capsule", "replay", "wit_0123456789abcdef", "--env", "TOKEN=given",
                                 "--env", "EMPTY=", "--env", "EQ=a=b", "--network", "pypi.org:443",
                                 "--net-max-connections", "3", "--workspace", "ws", "--allow-untrusted"))
    assert call == {"witness_id": "wit_0123456789abcdef", "env": {"TOKEN": "given", "EMPTY": "", "EQ": "a=b"},
                    "network": {"allow": ["pypi.org:443"], "max_connections": 3},
                    "workspace": str(tmp_path / "ws"), "allow_untrusted": True}
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        tool_call(parse("capsule", "replay", "wit_0123456789abcdef", "--env", "TOKEN"))


def test_tool_arguments_match_the_tool_input_schemas(tmp_path: Path) -> None:
    import jsonschema

    from mcp_server.config import TOOLSETS
    from mcp_server.tools.registry import Registry

    registry = Registry.load(TOOLSETS)
    commands = [
        ("capsule", "create", str(tmp_path), "--memory-mb", "1", "--cpu-ms", "5", "--env", "LANG"),
        ("capsule", "exec", "cap_1", "--cwd", "sub", "--", "true"),
        ("capsule", "diff", "cap_1"),
        ("capsule", "promote", "cap_1", "--policy", "baseline"),
        ("capsule", "witness", "cap_1", "--no-compress"),
        ("capsule", "replay", "wit_0123456789abcdef"),
        ("capsule", "replay", "wit_0123456789abcdef", "--env", "A=1", "--network", "pypi.org:443",
         "--net-max-bytes", "1000", "--workspace", str(tmp_path), "--allow-untrusted"),
        ("capsule", "list"),
        ("capsule", "destroy", "cap_1"),
        ("capsule", "fork", "cap_1"),
        ("capsule", "deltamin", "cap_1", "--budget-ms", "5000", "--", "make", "test"),
    ]
    for argv in commands:
        name, call, _ = tool_call(parse(*argv))
        spec = registry.lookup(name)
        assert spec is not None, name
        jsonschema.Draft202012Validator(spec.input_schema).validate(call)


def test_exec_status_follows_timeout_and_signal_conventions() -> None:
    assert exec_status({"exit_code": 3}) == 3
    assert exec_status({"exit_code": None, "signal": "SIGKILL"}) == 137
    assert exec_status({"exit_code": None, "timed_out": True, "signal": "SIGKILL"}) == 124
    assert exec_status({"exit_code": None, "signal": None}) == 1


def test_serve_flags_map_onto_env_vars(tmp_path: Path) -> None:
    args = parse("serve", "--socket", str(tmp_path / "m.sock"), "--toolsets", "capsule,text")
    assert serve_env(args) == {"MCP_ENDPOINT": "socket", "MCP_SOCKET_PATH": str(tmp_path / "m.sock"),
                               "CCW_TOOLSETS": "capsule,text"}
    assert serve_env(parse("serve", "--http", "127.0.0.1:9999")) == {
        "MCP_ENDPOINT": "http", "CCW_HTTP_ADDR": "127.0.0.1:9999"}
    assert serve_env(parse("serve")) == {}
    with pytest.raises(SystemExit):
        parse("serve", "--endpoint", "carrier-pigeon")


@pytest.mark.parametrize("client", clients.CLIENTS)
def test_client_config_json_names_the_installed_server(client: str, state_dir: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--state-dir", str(state_dir), "client-config", client, "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["client"] == client and document["file"]
    key = {"codex": "mcp_servers", "vscode": "servers"}.get(client, "mcpServers")
    server = document["config"][key]["ccw"]
    assert os.path.isabs(server["command"]) and server["command"].endswith("ccw-mcp")
    assert server["env"]["CCW_STATE_DIR"] == str(state_dir)
    if client == "vscode":
        assert server["type"] == "stdio"


def test_client_config_text_forms_parse(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--state-dir", str(state_dir), "client-config", "codex"])
    codex = tomllib.loads(capsys.readouterr().out)
    assert codex["mcp_servers"]["ccw"]["env"]["CCW_STATE_DIR"] == str(state_dir)
    assert codex["mcp_servers"]["ccw"]["args"] == []
    main(["--state-dir", str(state_dir), "client-config", "cursor"])
    captured = capsys.readouterr()
    assert json.loads(captured.out)["mcpServers"]["ccw"]["command"].endswith("ccw-mcp")
    assert "cursor/mcp.json" in captured.err  # where it goes: on stderr, so stdout can be redirected


def test_client_config_passes_a_configured_helper_socket(state_dir: Path) -> None:
    from mcp_server.config import Config

    config = Config.from_env({"CCW_STATE_DIR": str(state_dir), "CCW_HELPER_SOCKET": "/run/x/helper.sock"})
    assert clients.server_env(config)["CCW_HELPER_SOCKET"] == "/run/x/helper.sock"


def test_colour_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert use_color(io.StringIO()) is False
    leader, follower = os.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            assert use_color(tty) is True
            assert use_color(tty, no_color=True) is False
            monkeypatch.setenv("NO_COLOR", "")
            assert use_color(tty) is False
    finally:
        os.close(leader)
        os.close(follower)


def test_diff_colours_added_and_removed_lines() -> None:
    diff = "--- a/x\n+++ b/x\n@@ -1 +1 @@\n-old\n+new\n same\n"
    assert color_diff(diff, False) == diff
    coloured = color_diff(diff, True)
    assert "\x1b[31m-old\x1b[0m\n" in coloured and "\x1b[32m+new\x1b[0m\n" in coloured
    assert "\x1b[36m@@ -1 +1 @@\x1b[0m" in coloured and " same\n" in coloured
    assert coloured.replace("\x1b[1m", "").replace("\x1b[31m", "").replace("\x1b[32m", "") \
        .replace("\x1b[36m", "").replace("\x1b[0m", "") == diff


def test_progress_line_only_for_a_terminal() -> None:
    stream = io.StringIO()
    progress = Progress("replay", stream)
    assert progress.enabled is False
    progress.update(1, 4, "exec 1 of 4")
    line = progress.line(0)
    assert "replay" in line and " 25%" in line and "exec 1 of 4" in line
    progress.draw(0)
    assert stream.getvalue() == ""


def test_a_runs_output_on_the_progress_line_is_one_line_of_text() -> None:
    progress = Progress("exec sh", io.StringIO())
    progress.update(2000, 60000, "running 2 s; stdout 40 B, stderr 0 B\nline1\n\x1b]0;TITLE\x07x\x9b2J\n")
    line = progress.line(0)
    assert line.endswith("running 2 s; stdout 40 B, stderr 0 B · \\x1b]0;TITLE\\x07x\\x9b2J"), line
    assert not [c for c in line if ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0], line


def test_doctor_render_puts_the_fix_under_what_is_missing() -> None:
    report = {
        "kernel": "6.1", "arch": "x86_64", "euid": 1000, "user": "dev", "mode": "rootless", "can_run": True,
        "checks": [
            {"name": "overlayfs", "ok": True, "detail": "mounted", "fix": None, "required_for": "both"},
            {"name": "fanotify", "ok": False, "detail": "needs CAP_SYS_ADMIN", "fix": "run as root",
             "required_for": ""},
        ],
        "modes": {"privileged": {"ok": False, "detail": "needs root"},
                  "rootless": {"ok": True, "detail": "user namespace"},
                  "service": {"ok": None, "detail": "no socket"}},
    }
    text = render(report, color=False)
    lines = text.splitlines()
    miss = next(i for i, line in enumerate(lines) if "fanotify" in line)
    assert "MISS" in lines[miss] and lines[miss + 1].strip() == "fix: run as root"
    assert "capsules can run here: rootless mode" in text and "\x1b" not in text
    assert "\x1b[31m" in render(report, color=True)


def test_doctor_json_on_this_machine(state_dir: Path) -> None:
    done = subprocess.run([*CCW, "doctor", "--json", "--state-dir", str(state_dir)],
                          capture_output=True, text=True, timeout=120)
    report = json.loads(done.stdout)
    assert done.returncode == (0 if report["can_run"] else 1), done.stderr
    assert set(report) == {"kernel", "arch", "euid", "user", "checks", "modes", "mode", "can_run"}
    assert report["euid"] == os.geteuid()
    names = [c["name"] for c in report["checks"]]
    for expected in ("namespace.user", "namespace.mount", "namespace.pid", "namespace.net", "namespace.uts",
                     "namespace.ipc", "namespace.cgroup", "namespace.time", "overlayfs", "cgroups",
                     "fanotify", "seccomp", "egress_network", "landlock", "openat2", "libfaketime", "bubblewrap",
                     "helper_service"):
        assert expected in names
    for check in report["checks"]:
        assert set(check) == {"name", "ok", "detail", "fix", "required_for"}
        assert check["ok"] in (True, False, None) and check["detail"]
        if check["ok"] is False:
            assert check["fix"], check  # every missing feature says how to fix it
    assert set(report["modes"]) == {"privileged", "rootless", "service"}
    assert report["mode"] in ("privileged", "rootless", "service", None)
    assert report["can_run"] == (report["mode"] is not None)
    assert os.listdir(state_dir) == []  # the probes' scratch dirs are gone


def test_helper_status_without_a_helper(state_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--state-dir", str(state_dir), "helper", "status", "--json"]) == 1
    status = json.loads(capsys.readouterr().out)
    assert status["running"] is False and status["socket"] == str(state_dir / "helper" / "helper.sock")


def test_capsule_command_without_a_helper_and_no_autostart(state_dir: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--state-dir", str(state_dir), "--no-autostart", "capsule", "create", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "UNAVAILABLE" in err and "ccw helper start" in err


def test_serve_runs_the_mcp_server_on_stdio(state_dir: Path, tmp_path: Path) -> None:
    request = json.dumps({"jsonrpc": "2.0", "id": 7, "method": "policy_list", "params": {}}) + "\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CCW_", "MCP_"))}
    done = subprocess.run([*CCW, "--state-dir", str(state_dir), "serve", "--endpoint", "stdio",
                           "--ready-file", str(tmp_path / "ready")],
                          input=request, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout.splitlines()[0])
    assert reply["id"] == 7 and "policies" in reply["result"]
    assert f"state_dir={state_dir}" in done.stderr and "mcp:ready mode=stdio" in done.stderr


def test_a_reader_that_goes_away_ends_ccw_quietly() -> None:
    """``ccw capsule diff | head``: a closed pipe ends ccw with 141 and no traceback."""
    script = (
        "import sys\n"
        "from mcp_server import cli\n"
        "def flood(args):\n"
        "    for n in range(200_000):\n"
        "        print(f'line {n} of a long diff')\n"
        "    return 0\n"
        "cli._dispatch = flood\n"
        "sys.exit(cli.main(['doctor']))\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.read(20)  # one line, as head would take
    proc.stdout.close()
    with proc.stderr:
        stderr = proc.stderr.read().decode()
    assert proc.wait(60) == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr


def test_promote_report_lines_name_each_hazard_and_the_flag_that_allows_it() -> None:
    hazard = {"kind": "git_control", "path": ".git/hooks/pre-commit", "action": "write", "reason": "a git hook",
              "allowed": False}
    allowed = {**hazard, "kind": "setuid", "path": "s", "reason": "mode 6755", "allowed": True}
    report = {"hazards": [hazard, allowed], "test_failures": [], "resource_violations": [], "details": ""}
    assert policy_lines(report) == [
        "hazard git_control: .git/hooks/pre-commit (write): a git hook",
        "note: allowed hazard setuid: s (write): mode 6755",
        "fix: undo them in the capsule, or, once reviewed (ccw capsule diff), promote them anyway with "
        "--allow-hazard git_control",
    ]
    many = {**report, "hazards": [{**hazard, "path": f"h{i}"} for i in range(20)]}
    assert policy_lines(many)[12] == "… and 8 more hazard(s) (--json lists each)"


def test_a_tools_refusal_on_a_terminal_leaves_as_itself_not_a_traceback() -> None:
    """With the progress line drawn (stderr a terminal), the call runs beside its ticker:
    its CcwError must reach ccw's handler as itself, not inside an ExceptionGroup."""
    progress = Progress("exec true", io.StringIO())
    progress.enabled = True  # as on a terminal

    async def refused() -> None:
        await trio.sleep(0.05)
        raise CcwError("NOT_FOUND", "capsule cap_nope not found")

    with pytest.raises(CcwError) as raised:
        trio.run(run_with_progress, progress, refused)
    assert raised.value.code == "NOT_FOUND"

    async def answered() -> str:
        await trio.sleep(0.05)
        return "done"

    assert trio.run(run_with_progress, progress, answered) == "done"


def _parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("ccw",)) -> Any:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_option_says_what_it_does_in_words_an_installed_ccw_can_follow() -> None:
    import re

    from mcp_server.cli import build_parser

    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if action.option_strings:
                assert action.help, f"{' '.join(path)} {action.option_strings[0]} has no help"
        text = parser.format_help()
        # No source paths: an installed wheel has no bench/, and a module's path means nothing to its user.
        assert not re.search(r"\w+/\w+\.py|bench/", text), f"{' '.join(path)} --help names a source path"
    exec_help = build_parser().parse_args(["capsule", "exec", "cap_1"])
    assert exec_help.timeout_ms is None
    from mcp_server.cli.exec_report import TIMEOUT_HELP

    assert "300000" in TIMEOUT_HELP and "86400000" in TIMEOUT_HELP


def test_service_start_takes_env_values() -> None:
    from mcp_server.cli.services import tool_call as service_call

    name, call = service_call(parse_args(["capsule", "service", "start", "cap_1", "web", "--env", "PORT=8000",
                                          "--env", "OPTS=a=b", "--", "serve"]))
    assert name == "capsule_service_start" and call["env"] == {"PORT": "8000", "OPTS": "a=b"}
    assert "env" not in service_call(parse_args(["capsule", "service", "start", "cap_1", "web", "--", "serve"]))[1]
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        service_call(parse_args(["capsule", "service", "start", "cap_1", "web", "--env", "PORT", "--", "serve"]))


def _answered_by(call_tool: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``ccw`` command's tool calls answered by ``call_tool``, with no helper or front end asked."""
    monkeypatch.setenv("CCW_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr("mcp_server.cli.frontclient.call_tool", call_tool)
    monkeypatch.setattr("mcp_server.cli.helperctl.ensure", lambda *args, **kwargs: None)


TAMPERED = CcwError(
    "CONFLICT", "the witness failed verification, so it cannot be replayed; see details.problems (a tampered or "
    "truncated file): make the witness again from its capsule",
    {"problems": [{"kind": "blob_tampered", "blob": "ab\x1b]0;owned\x07", "actual": "cd"},
                  {"kind": "blob_missing", "blob": "ef"}], "path": "/w.tar.zst"})


@pytest.mark.parametrize("as_json", [False, True])
def test_an_error_shows_the_details_its_message_points_at(as_json: bool, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # A tampered witness: "see details.problems", which a person at ccw could not see before.
    async def call_tool(*args: Any, **options: Any) -> dict[str, Any]:
        raise TAMPERED

    _answered_by(call_tool, tmp_path, monkeypatch)
    assert main(["capsule", "replay", str(tmp_path / "w.tar.zst"), *(["--json"] if as_json else [])]) == 1
    out, err = capsys.readouterr()
    head = f"ccw: CONFLICT: {TAMPERED.message}"
    if as_json:  # the whole error, as the tool answers it, on stdout
        assert json.loads(out) == {"error": TAMPERED.to_dict()} and err == head + "\n"
    else:  # the problems a line each, the maker's names unable to drive the terminal; details.path not pointed at
        assert out == "" and err.splitlines() == [
            head, "details.problems:", "  kind: blob_tampered, blob: ab\\x1b]0;owned\\x07, actual: cd",
            "  kind: blob_missing, blob: ef"]


def test_an_error_shows_at_most_twenty_entries_of_a_detail_and_a_mapping_a_key_a_line() -> None:
    many = pointed_details("see details.problems and details.context; details.gone",
                           {"problems": list(range(25)), "context": {"line": 3, "tags": ["a", "b"]}})
    assert many[:3] == ["details.problems:", "  0", "  1"] and many[20] == "  19"
    assert many[21:] == ["  ... and 5 more (--json shows them all)", "details.context:", "  line: 3",
                         '  tags: ["a", "b"]']


@pytest.mark.parametrize(("verb", "result", "status"), [
    ("replay", {"replay_ok": False}, 1), ("replay", {"replay_ok": True}, 0),
    ("promote", {"promoted": False, "dry_run": False, "policy_report": {"passed": False}}, 1),
    ("promote", {"promoted": False, "dry_run": True, "policy_report": {"passed": True}}, 0),
])
def test_json_output_exits_as_the_human_form_does(verb: str, result: dict[str, Any], status: int, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    # A script that asks for --json still reads a failed replay or a refused promotion from the exit status.
    async def call_tool(*args: Any, **options: Any) -> dict[str, Any]:
        return result

    _answered_by(call_tool, tmp_path, monkeypatch)
    target = str(tmp_path / "w.tar.zst") if verb == "replay" else "cap_0000000000000_00000000"
    assert main(["capsule", verb, target, "--json"]) == status
    assert json.loads(capsys.readouterr().out) == result


def test_helper_commands_print_sentences() -> None:
    running = {"running": True, "mode": "rootless", "pid": 7, "socket": "/s/helper.sock", "frontend_running": True,
               "frontend_pid": 9, "frontend_daemon": False}
    assert helperctl.describe("status", running) == [
        "helper: running, rootless mode, pid 7 (/s/helper.sock)", "front end: running (pid 9, an agent's ccw-mcp)"]
    assert helperctl.describe("stop", {**running, "stopped": True, "forced": True}) == [
        "helper stopped (pid 7, killed: it did not end in time)",
        "front end: running (pid 9, an agent's ccw-mcp); left running: it starts a helper again when it needs one"]
    assert helperctl.describe("stop", {"stopped": False, "reason": "no helper answers there",
                                       "frontend_stopped": True, "frontend_pid": 9, "frontend_daemon": True}) == [
        "no helper was running (no helper answers there)", "front end stopped (pid 9, the ccw command's daemon)"]
    assert helperctl.describe("start", {**running, "started": False}) == [
        "helper already running: rootless mode, pid 7 (/s/helper.sock)"]
    assert helperctl.describe("status", {"running": False}) == ["helper: not running (none answers)",
                                                              "front end: not running"]


def _helper_command_beside_a_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hello: dict[str, Any],
                                     action: str) -> int:
    """``ccw helper ACTION``'s exit status with CCW_HELPER_SOCKET set to a socket this process listens
    on, whose helper answers ``hello`` (the state dir's own answers nothing)."""
    service = str(tmp_path / "service.sock")
    monkeypatch.setattr("mcp_server.launcher.answering", lambda path: hello if path == service else None)
    monkeypatch.setattr(helperctl, "answering", lambda path: hello if path == service else None)
    monkeypatch.setenv("CCW_HELPER_SOCKET", service)
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(service)
        listening.listen()
        return main(["--state-dir", str(tmp_path / "state"), "helper", action])


def test_helper_status_names_the_helper_socket_the_commands_use(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Found in the README trial: with the system service in and CCW_HELPER_SOCKET exported,
    # as README says, ccw helper status said "not running" and exited 1 (it asked the state
    # dir's own socket only), while every command ran under the service.
    service = str(tmp_path / "service.sock")
    assert _helper_command_beside_a_service(tmp_path, monkeypatch, {"mode": "privileged", "version": 1},
                                            "status") == 0
    assert capsys.readouterr().out.splitlines()[0] == (
        f"helper: running, privileged mode, pid {os.getpid()} ({service}, CCW_HELPER_SOCKET)")


def test_helper_stop_names_the_helper_socket_it_leaves_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Found in an upgrade trial: a helper of the earlier install served CCW_HELPER_SOCKET; every
    # command's refusal said to stop it with ccw helper stop, which said "no helper was running"
    # and exited 0 while that helper went on answering.
    service = str(tmp_path / "service.sock")
    assert _helper_command_beside_a_service(tmp_path, monkeypatch, {"other_install": "older"}, "stop") == 1
    assert capsys.readouterr().out.splitlines() == [
        f"helper left running: the helper the commands use is CCW_HELPER_SOCKET's, {service} (pid {os.getpid()}), "
        "and ccw helper stop stops only the state dir's own: restart that one as it was started (systemctl restart "
        "ccw-helper.service for the system service), or unset CCW_HELPER_SOCKET"]


def test_service_list_shows_each_ports_path_and_connections_accepted_and_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Found in a new-user trial: the person checking that another uid was kept out of a
    # forwarded port saw only "listening"; the counts were in --json alone.  The path (the
    # kernel's NAT or the relay) was in --json alone too (forwarded-ports trial).
    listed = {"capsule_id": "cap_1", "services": [], "ports": [
        {"capsule_id": "cap_1", "port": 8000, "host_port": 40733, "url": "http://127.0.0.1:40733/", "open": True,
         "listening": True, "accepted": 1, "refused": 2, "path": "kernel"}]}

    async def call_tool(*args: Any, **options: Any) -> dict[str, Any]:
        return listed

    _answered_by(call_tool, tmp_path, monkeypatch)
    assert main(["capsule", "service", "list", "cap_1"]) == 0
    assert capsys.readouterr().out == "port 8000\t127.0.0.1:40733\tlistening\tkernel\t1 accepted, 2 refused\n"


def test_service_list_says_why_a_service_is_lost_and_how_to_bring_it_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Found in a developer's trial: after the front end was killed, the list said "web lost" and
    # nothing more; why, and that a start brings it back, were in --json alone.
    listed = {"capsule_id": "cap_1", "ports": [], "services": [
        {"name": "web", "state": "lost", "since": "t", "argv": ["node", "app.js"], "restart": "no", "restarts": 0,
         "reason": "the front end or helper that ran it stopped; start it again (capsule_service_start), "
                   "or stop it to forget it"},
        {"name": "db", "state": "ready", "since": "t", "argv": ["postgres"], "restart": "no", "restarts": 0}]}

    async def call_tool(*args: Any, **options: Any) -> dict[str, Any]:
        return listed

    _answered_by(call_tool, tmp_path, monkeypatch)
    assert main(["capsule", "service", "list", "cap_1"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "web\tlost\tnode app.js",
        "  the front end or helper that ran it stopped; start it again (ccw capsule service start), "
        "or stop it to forget it",
        "db\tready\tpostgres"]


def test_resume_of_a_capsule_held_frozen_says_by_what(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    # Found in an upgrade trial: ccw capsule resume of a fork's parent printed "paused (idle)" and
    # nothing more; what holds it frozen, and until when, were in --json alone.
    resumed = {"capsule_id": "cap_1", "paused": True, "runs": [], "held_by": ["cap_2"],
               "note": "it stays frozen while cap_2 stand(s) on its layer (forks, merges of it); "
                       "it thaws when they are destroyed"}

    async def call_tool(*args: Any, **options: Any) -> dict[str, Any]:
        return resumed

    _answered_by(call_tool, tmp_path, monkeypatch)
    assert main(["capsule", "resume", "cap_1"]) == 0
    shown = capsys.readouterr()
    assert shown.out == "cap_1: paused (idle)\n"
    assert shown.err == f"ccw: {resumed['note']}\n"


def test_witness_prints_the_id_replay_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    # Found in a new-user trial: W=$(ccw capsule witness CAP) held "ID PATH", which
    # ccw capsule replay "$W" refused as no witness id (and $W unquoted as two arguments).
    made = {"witness_id": "wit_0123456789abcdef", "path": "/s/witnesses/wit_0123456789abcdef.tar.zst",
            "root_hash": "blake3:ab", "size_bytes": 3011}

    async def call_tool(*args: Any, **options: Any) -> dict[str, Any]:
        return made

    _answered_by(call_tool, tmp_path, monkeypatch)
    assert main(["capsule", "witness", "cap_1"]) == 0
    out, err = capsys.readouterr()
    assert out == "wit_0123456789abcdef\n"
    assert err == "/s/witnesses/wit_0123456789abcdef.tar.zst (root_hash blake3:ab, 3011 bytes)\n"

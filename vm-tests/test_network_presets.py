"""Network presets end to end (issue 37): a capsule made with ``preset:NAME`` reaches, through
its proxy, the hosts the preset names and is refused the rest; a user preset of the state
dir's is used the same way; a bad one is refused with its file and field named.

No packet leaves for the real registries.  Their names (pypi.org, registry.npmjs.org …)
resolve here, as the host's DNS would answer, to 198.18.0.2: the far end of a namespace of
the test's (``netfixtures.lab_namespace``), in benchmarking space that egress leaves
open, where a server on port 443 answers ``far:443``.  The names resolve through a trio
hostname resolver the test installs in the front end (``tests/support/lab_names.py``, as
vm-tests/test_attack_egress.py does); the host's end of the veth (198.18.0.1) is the address that file uses too, so both
are in conftest.py's SHARED group.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server.fs.netpresets import shipped, user_dir
from sandbox.errors import CcwError
from tests.support import netfixtures as nf
from tests.support.cli_process import ccw
from tests.support.lab_names import THROUGH_PROXY, LabResolver

HOST_END, FAR = "198.18.0.1", "198.18.0.2"
NAMES = {name: [FAR] for name in (b"pypi.org", b"files.pythonhosted.org", b"registry.npmjs.org", b"crates.io",
                                  b"mirror.presets.test")}


@pytest.fixture
def lab(root_required: None) -> Iterator[None]:
    """The lab namespace with a server on 443 that answers ``far:443``."""
    with nf.lab_namespace(host=(f"{HOST_END}/24",), far=(f"{FAR}/24",)) as made, \
            nf.banner_servers("far", [443], made.namespace):
        yield


async def _attempts(t: Any, workspace: Path, network: Any, targets: list[str]) -> tuple[dict[str, Any], Any, Any]:
    """A capsule with ``network`` tries each target in one exec: (the capsule, the jail's answers, the records)."""
    cap = await t.call("capsule_create", {"workspace": str(workspace), "network": network})
    attempts = [["http", target] for target in targets]
    ran = await t.call("capsule_exec", {"capsule_id": cap["capsule_id"], "timeout_ms": 60000,
                                        "cmd": ["/usr/bin/python3", "-c", THROUGH_PROXY, json.dumps(attempts)]})
    assert ran["exit_code"] == 0, ran["stderr"]
    return cap, json.loads(ran["stdout"]), ran["touched"]["network"]


def _verdicts(answers: list[list[str]]) -> dict[str, tuple[bool, str]]:
    return {target: (said.endswith(" 200 Connection established"), banner) for _, target, said, banner in answers}


def test_a_preset_capsule_reaches_the_presets_hosts_and_no_other(tools: Any, lab: None, tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    targets = ["pypi.org:443", "files.pythonhosted.org:443", "registry.npmjs.org:443", "pypi.org:80", "crates.io:443"]

    async def scenario(t: Any) -> Any:
        trio.socket.set_custom_hostname_resolver(LabResolver(NAMES))
        return await _attempts(t, workspace, ["preset:pypi"], targets)

    cap, answers, records = tools.run(scenario)
    # The capsule keeps the rules themselves, not the preset's name.
    assert cap["network"]["allow"] == sorted(shipped()["pypi"].texts())
    assert _verdicts(answers) == {
        "pypi.org:443": (True, "far:443"),
        "files.pythonhosted.org:443": (True, "far:443"),
        "registry.npmjs.org:443": (False, ""),  # not in the preset
        "pypi.org:80": (False, ""),  # the preset says 443
        "crates.io:443": (False, ""),
    }
    by_place = {(r["host"], r["port"]): r for r in records}
    assert by_place[("pypi.org", 443)]["allowed"] and by_place[("pypi.org", 443)]["rule"] == "pypi.org:443"
    assert by_place[("files.pythonhosted.org", 443)]["rule"] == "files.pythonhosted.org:443"
    for place in (("registry.npmjs.org", 443), ("pypi.org", 80), ("crates.io", 443)):
        assert (not by_place[place]["allowed"]
                and by_place[place]["reason"].startswith("no rule allows")), by_place[place]


def test_a_user_preset_is_used_beside_a_shipped_one_and_a_bad_one_is_refused(
        tools: Any, lab: None, tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    presets = user_dir(tools.config.state_dir)
    presets.mkdir(parents=True)
    (presets / "lab-mirror.json").write_text(json.dumps({
        "description": "the lab's package mirror",
        "rules": [{"rule": "mirror.presets.test:443", "why": "the index and its files"}]}))
    (presets / "broken.json").write_text(json.dumps({
        "description": "a typo", "rules": [{"rule": "mirror.presets.test:4430000", "why": "x"}]}))
    targets = ["mirror.presets.test:443", "registry.npmjs.org:443", "pypi.org:443"]

    async def scenario(t: Any) -> Any:
        trio.socket.set_custom_hostname_resolver(LabResolver(NAMES))
        used = await _attempts(t, workspace, {"allow": ["preset:lab-mirror", "preset:npm"], "max_connections": 8},
                               targets)
        try:
            await t.call("capsule_create", {"workspace": str(workspace), "network": ["preset:broken"]})
        except CcwError as exc:
            refused = exc
        listed = await t.call("capsule_list", {})
        return used, refused, listed

    (cap, answers, _), refused, listed = tools.run(scenario)
    assert cap["network"] == {"allow": sorted(["mirror.presets.test:443", *shipped()["npm"].texts()]),
                              "max_bytes": 1 << 30, "max_connections": 8}
    assert _verdicts(answers) == {"mirror.presets.test:443": (True, "far:443"),
                                  "registry.npmjs.org:443": (True, "far:443"),
                                  "pypi.org:443": (False, "")}
    assert refused.code == "INVALID_ARGUMENT"
    assert refused.message.startswith(f"network preset {presets / 'broken.json'}: /rules/0/rule: "), refused.message
    assert refused.details == {"path": str(presets / "broken.json"), "field": "/rules/0/rule"}
    assert [c["capsule_id"] for c in listed["capsules"]] == [cap["capsule_id"]]  # the refused create made nothing


def test_the_cli_creates_with_a_preset_and_says_why_one_is_refused(cli_state: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "project"
    workspace.mkdir()
    made = json.loads(ccw(cli_state, "capsule", "create", str(workspace), "--network", "preset:github",
                          "--network", "example.org:8080", "--json").stdout)
    assert made["network"]["allow"] == sorted([*shipped()["github"].texts(), "example.org:8080"])
    user_dir(cli_state).mkdir(parents=True)
    mine = user_dir(cli_state) / "pypi.json"
    mine.write_text(json.dumps({"description": "d", "rules": [{"rule": "mirror.presets.test:443", "why": "w"}]}))
    shadowed = ccw(cli_state, "capsule", "create", str(workspace), "--network", "preset:pypi", check=False)
    assert shadowed.returncode == 1
    assert f"CONFLICT: network preset {mine} has the name of a preset ccw ships" in shadowed.stderr, shadowed.stderr
    missing = ccw(cli_state, "capsule", "create", str(workspace), "--network", "preset:pipy", check=False)
    assert missing.returncode == 1 and "NOT_FOUND: no network preset 'pipy'" in missing.stderr, missing.stderr

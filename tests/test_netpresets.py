"""Network presets (fs/netpresets.py, cli/net.py): the shipped rule sets, ``preset:NAME`` expanded
into rules, the state dir's own presets and every way a user file is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from mcp_server.cli import main
from mcp_server.cli.net import render
from mcp_server.config import TOOLSETS
from mcp_server.core.netrules import decide, parse_network, parse_rule
from mcp_server.fs.netpresets import (
    MAX_FILE,
    SCHEMA,
    catalogue,
    expand_network,
    expand_rules,
    shipped,
    user_dir,
)
from mcp_server.tools.registry import Registry
from sandbox.errors import CcwError

ROOT = Path(__file__).resolve().parent.parent
# What each shipped preset must let its clients reach (the hosts the brief and the clients' docs name).
NEEDED = {
    "pypi": {"pypi.org:443", "files.pythonhosted.org:443"},
    "npm": {"registry.npmjs.org:443"},
    "debian": {"deb.debian.org:80", "deb.debian.org:443", "security.debian.org:80", "security.debian.org:443"},
    "crates": {"crates.io:443", "index.crates.io:443", "static.crates.io:443"},
    "go": {"proxy.golang.org:443", "sum.golang.org:443"},
    "github": {"github.com:443", "api.github.com:443", "raw.githubusercontent.com:443", "codeload.github.com:443",
               "objects.githubusercontent.com:443"},
}


def _write(state: Path, name: str, doc: Any, mode: int = 0o644) -> Path:
    where = user_dir(state)
    where.mkdir(parents=True, exist_ok=True)
    path = where / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    path.chmod(mode)
    return path


MINE = {"description": "my mirror", "rules": [{"rule": "Mirror.Example.org:8443", "why": "our index"}]}


def test_the_shipped_presets_name_their_clients_hosts_each_with_a_port_and_a_why() -> None:
    presets = shipped()
    assert set(presets) == set(NEEDED)
    for name, preset in presets.items():
        texts = set(preset.texts())
        assert NEEDED[name] <= texts, name
        assert preset.origin == "shipped" and Path(preset.path).name == f"{name}.json"
        for rule in preset.rules:
            parsed = parse_rule(rule.rule)
            assert parsed.kind == "name" and parsed.port is not None, rule  # a host by name, its port said
            assert parsed.port == 443 or (name == "debian" and parsed.port == 80), rule  # 80 only for apt's http://
            assert rule.why
        assert preset.sources  # where the hosts are documented
    # Read from package data: the files at the top of the tree.
    assert {p.stem for p in (ROOT / "policies" / "network").glob("*.json") if p.name != SCHEMA} == set(NEEDED)
    # capsule_create's schema names them to the agent: every one, and no other.
    create = Registry.load(TOOLSETS).lookup("capsule_create")
    assert create is not None
    described = create.input_schema["properties"]["network"]["description"]
    named = described.split("preset:NAME is a named set (", 1)[1].split(")", 1)[0]
    assert sorted(named.split(", ")) == sorted(presets)


def test_a_preset_in_a_rule_list_stands_for_its_rules(tmp_path: Path) -> None:
    spec = parse_network(expand_network({"allow": ["preset:pypi", " Preset:NPM ", "example.org:8080"],
                                         "max_connections": 9}, tmp_path))
    assert spec is not None and spec.max_connections == 9
    assert [rule.text for rule in spec.allow] == sorted(
        ["example.org:8080", *shipped()["pypi"].texts(), *shipped()["npm"].texts()])
    assert decide(spec, "files.pythonhosted.org", 443).rule == "files.pythonhosted.org:443"
    assert not decide(spec, "files.pythonhosted.org", 80).allowed  # the preset said 443
    assert not decide(spec, "crates.io", 443).allowed
    # A list form, duplicates merged by the rule parser; nothing named: returned as given.
    assert parse_network(expand_network(["preset:go", "proxy.golang.org:443"], tmp_path)) == parse_network(
        list(shipped()["go"].texts()))
    assert expand_rules(["a.org", 7], tmp_path) == ["a.org", 7]
    assert expand_network("none", tmp_path) == "none"


def test_an_unknown_or_malformed_preset_name_says_which_exist(tmp_path: Path) -> None:
    with pytest.raises(CcwError) as missing:
        expand_rules(["preset:pipy"], tmp_path)
    assert missing.value.code == "NOT_FOUND"
    assert "'pipy'" in missing.value.message and "pypi" in missing.value.message
    assert str(user_dir(tmp_path) / "pipy.json") in missing.value.message
    with pytest.raises(CcwError) as bad:
        expand_rules(["preset:../pypi"], tmp_path)
    assert bad.value.code == "INVALID_ARGUMENT" and "ccw net presets" in bad.value.message


def test_a_user_preset_is_used_from_the_state_dir(tmp_path: Path) -> None:
    _write(tmp_path, "mine.json", MINE)
    assert expand_rules(["preset:mine", "preset:npm"], tmp_path) == ["mirror.example.org:8443",
                                                                     *shipped()["npm"].texts()]
    (preset,) = [p for p in catalogue(tmp_path).listing()["presets"] if p["name"] == "mine"]
    assert preset["origin"] == "user" and preset["rules"] == [{"rule": "mirror.example.org:8443", "why": "our index"}]
    # Read at each expansion: an edit counts at once.
    _write(tmp_path, "mine.json", {**MINE, "rules": [{"rule": "other.example.org:443", "why": "moved"}]})
    assert expand_rules(["preset:mine"], tmp_path) == ["other.example.org:443"]


BAD = [
    ("{not json", "file", "not UTF-8 JSON"),
    (json.dumps(["pypi.org"]), "/", "a preset is a JSON object"),
    (json.dumps({**MINE, "name": "mine"}), "/", "unknown fields ['name']"),
    (json.dumps({"rules": MINE["rules"]}), "/description", "missing"),
    (json.dumps({**MINE, "rules": []}), "/rules", "1 to 64 rules"),
    (json.dumps({**MINE, "rules": ["pypi.org:443"]}), "/rules/0", '{"rule": "host:port", "why"'),
    (json.dumps({**MINE, "rules": [{"rule": "pypi.org:0", "why": "x"}]}), "/rules/0/rule", "port '0' is not 1-65535"),
    (json.dumps({**MINE, "rules": [{"rule": "preset:pypi", "why": "x"}]}), "/rules/0/rule", "names a preset"),
    (json.dumps({**MINE, "rules": [{"rule": "a.org:1", "why": "x"}, {"rule": "A.org:1", "why": "y"}]}),
     "/rules/1/rule", "already /rules/0"),
    (json.dumps({**MINE, "rules": [{"rule": "a.org:1", "why": ""}]}), "/rules/0/why", "non-empty string"),
    (json.dumps({**MINE, "sources": "https://x"}), "/sources", "list of at most 16"),
    (" " * (MAX_FILE + 1), "file", f"larger than {MAX_FILE} bytes"),
]


def test_the_preset_schema_takes_the_shipped_presets_and_refuses_what_the_reader_refuses() -> None:
    validator = Draft202012Validator(
        json.loads((ROOT / "policies" / "network" / "network-preset.schema.json").read_text()))
    for preset in shipped().values():
        validator.validate(json.loads(Path(preset.path).read_text()))
    grammar_only = ("port '0' is not 1-65535", "already /rules/0")  # the rule parser's, not a schema's
    for text, _where, says in BAD:
        try:
            doc = json.loads(text)
        except ValueError:
            continue
        assert validator.is_valid(doc) == (says in grammar_only), says


@pytest.mark.parametrize(("text", "where", "says"), BAD, ids=[f"{w}:{s[:20]}" for _, w, s in BAD])
def test_a_bad_user_preset_is_refused_naming_the_file_and_the_field(tmp_path: Path, text: str, where: str,
                                                                   says: str) -> None:
    path = _write(tmp_path, "mine.json", text)
    with pytest.raises(CcwError) as refused:
        expand_rules(["preset:mine"], tmp_path)
    error = refused.value
    assert error.code == "INVALID_ARGUMENT"
    assert error.message.startswith(f"network preset {path}: {where}: "), error.message
    assert says in error.message and error.details == {"path": str(path), "field": where}
    # It spoils only its own name: the shipped presets still expand beside it.
    assert expand_rules(["preset:pypi"], tmp_path) == list(shipped()["pypi"].texts())


def test_a_bad_file_name_is_listed_and_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, "My_Mirror.json", MINE)
    _write(tmp_path, ".hidden.json", "junk")  # editors' and tools' dot files are not presets
    (user_dir(tmp_path) / "notes.txt").write_text("anything")
    listing = catalogue(tmp_path).listing()
    assert [(p["name"], p["path"]) for p in listing["problems"]] == [("My_Mirror", str(path))]
    assert "its file's name" in listing["problems"][0]["message"]


def test_a_user_preset_never_shadows_a_shipped_one(tmp_path: Path) -> None:
    path = _write(tmp_path, "pypi.json", MINE)
    with pytest.raises(CcwError) as shadowed:
        expand_rules(["preset:pypi"], tmp_path)
    assert shadowed.value.code == "CONFLICT"
    assert str(path) in shadowed.value.message and "pypi-local.json" in shadowed.value.message
    listing = catalogue(tmp_path).listing()
    (pypi,) = [p for p in listing["presets"] if p["name"] == "pypi"]
    assert pypi["origin"] == "shipped"  # the listing shows what the name means, and the refused file beside it
    assert [(p["name"], p["code"]) for p in listing["problems"]] == [("pypi", "CONFLICT")]
    assert expand_rules(["preset:npm"], tmp_path) == list(shipped()["npm"].texts())


def test_symlinks_are_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps(MINE))
    user_dir(tmp_path).mkdir(parents=True)
    (user_dir(tmp_path) / "mine.json").symlink_to(elsewhere)
    with pytest.raises(CcwError) as linked:
        expand_rules(["preset:mine"], tmp_path)
    assert "ELOOP" in linked.value.message and "not a symlink" in linked.value.message
    # A linked directory: every expansion that names a preset says so (its files could shadow anything).
    other = tmp_path / "other"
    other.mkdir()
    (user_dir(tmp_path) / "mine.json").unlink()
    user_dir(tmp_path).rmdir()
    user_dir(tmp_path).symlink_to(other)
    with pytest.raises(CcwError) as dir_linked:
        expand_rules(["preset:pypi"], tmp_path)
    assert "real directory" in dir_linked.value.message and str(user_dir(tmp_path)) in dir_linked.value.message
    assert expand_rules(["pypi.org:443"], tmp_path) == ["pypi.org:443"]  # no preset named: nothing read


@pytest.mark.parametrize("target", ["file", "directory"])
def test_what_others_could_write_is_refused(tmp_path: Path, target: str) -> None:
    path = _write(tmp_path, "mine.json", MINE)
    (path if target == "file" else path.parent).chmod(0o664 if target == "file" else 0o777)
    with pytest.raises(CcwError) as refused:
        expand_rules(["preset:mine"], tmp_path)
    assert refused.value.code == "PERMISSION_DENIED"
    assert f"network preset {target}" in refused.value.message and "chmod go-w" in refused.value.message


def test_a_fifo_is_not_read(tmp_path: Path) -> None:
    user_dir(tmp_path).mkdir(parents=True)
    os.mkfifo(user_dir(tmp_path) / "mine.json", 0o644)  # O_NONBLOCK: the open does not wait for a writer
    with pytest.raises(CcwError) as refused:
        expand_rules(["preset:mine"], tmp_path)
    assert "not a regular file" in refused.value.message


def test_ccw_net_presets_lists_them_and_fails_on_a_refused_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("CCW_STATE_DIR", str(tmp_path))  # main sets it; monkeypatch puts it back
    _write(tmp_path, "mine.json", MINE)
    assert main(["--state-dir", str(tmp_path), "net", "presets", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["syntax"] == "preset:NAME" and listing["problems"] == []
    assert {p["name"] for p in listing["presets"]} == {*NEEDED, "mine"}
    assert main(["net", "presets", "github", "--state-dir", str(tmp_path)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("github (shipped): ") and "    api.github.com:443" in text and "preset:NAME" in text
    assert text == render({**listing, "presets": [p for p in listing["presets"] if p["name"] == "github"]}, detail=True)
    _write(tmp_path, "broken.json", "{")
    assert main(["--state-dir", str(tmp_path), "net", "presets"]) == 1
    out = capsys.readouterr()
    assert "pypi (shipped)" in out.out and "mine (user)" in out.out
    assert f"INVALID_ARGUMENT: network preset {user_dir(tmp_path) / 'broken.json'}: file: " in out.err
    assert main(["--state-dir", str(tmp_path), "net", "presets", "nope"]) == 1
    assert "NOT_FOUND: no network preset 'nope'" in capsys.readouterr().err


"""fs/secretstore with core/secretbind: secrets kept 0600 in the state dir, bound to exact hosts, values
from a command run when needed, and no value in any repr, listing or error."""

from __future__ import annotations

import os
import re
import stat
import threading
from pathlib import Path

import pytest

from mcp_server.core.secretbind import binding_from_json, make_binding, parse_host
from mcp_server.fs.secretstore import STORE_NAME, SecretStore, check_value, run_command
from sandbox.errors import CcwError

VALUE = b"CANARY-s3cr3t-VALUE-0123456789"


def test_bindings_read_as_rules_with_443_by_default() -> None:
    binding = make_binding("GH_TOKEN", ["API.GitHub.com", "git.example:8443", "[::1]:9000", "10.1.2.3"])
    assert binding.hosts == (("10.1.2.3", 443), ("::1", 9000), ("api.github.com", 443), ("git.example", 8443))
    assert binding.header == "authorization" and binding.format == "Bearer {}"
    assert binding.host_texts()[1] == "[::1]:9000" and binding.binds("api.github.com", 443)
    assert not binding.binds("api.github.com", 80)
    assert make_binding("K", ["h.example"], header="X-Api-Key").format == "{}"
    assert make_binding("Q", ["h.example"], fmt="query:api_key").header is None
    assert binding_from_json(binding.to_json()) == binding


@pytest.mark.parametrize(("args", "says"), [
    (("1BAD", ["h.example"]), "cannot name a secret"),
    (("N", []), "at least one --host"),
    (("N", ["*.example.com"]), "exact hosts"),
    (("N", ["10.0.0.0/8"]), "exact hosts"),
    (("N", ["http://h.example"]), "https:// is the only scheme"),
    (("N", ["https://h.example/path"]), "not a URL: give --host https://h.example (no user"),
    (("N", ["h.example:99999"]), "port"),
    (("N", ["h.example"], "Host"), "cannot carry a secret"),
    (("N", ["h.example"], "X Bad"), "cannot carry a secret"),
    (("N", ["h.example"], "X-Key", "basic-user"), "drop --header"),
    (("N", ["h.example"], "X-Key", "query:k"), "drop --header"),
    (("N", ["h.example"], None, "Bearer"), "exactly one {}"),
    (("N", ["h.example"], None, "{} {}"), "exactly one {}"),
    (("N", ["h.example"], None, "query:a&b"), "parameter"),
    (("N", ["https://h.example:8443/"]), "not a URL: give --host https://h.example:8443 (no user"),
    (("N", ["https://__token__@h.example:8443/simple/"]), "give --host https://h.example:8443 (no user"),
    (("N", ["h.example/simple"]), "give --host h.example (no user"),
])
def test_bad_bindings_say_what_to_change(args: tuple, says: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(CcwError, match=re.escape(says)) as caught:
        make_binding(*args)
    assert caught.value.code == "INVALID_ARGUMENT"
    assert parse_host("h.example:80") == ("h.example", 80, False)
    assert parse_host("HTTPS://h.example") == ("h.example", 443, True)


def test_set_list_get_remove_and_the_file_is_private(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    store.put(make_binding("GH_TOKEN", ["api.github.com"]), "stdin", VALUE + b"\n")
    store.put(make_binding("API", ["models.test:8443"], header="X-Api-Key"), "file", b"other-value")
    info = os.stat(tmp_path / STORE_NAME)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert [s.binding.name for s in store.secrets()] == ["API", "GH_TOKEN"]
    assert store.value("GH_TOKEN").reveal() == VALUE  # one trailing newline off
    store.put(make_binding("GH_TOKEN", ["api.github.com", "uploads.github.com"]), "prompt", b"new-value")
    assert store.get("GH_TOKEN").binding.hosts[1] == ("uploads.github.com", 443)
    assert store.value("GH_TOKEN").reveal() == b"new-value"
    assert store.hosts_needing_tls() == [("api.github.com", 443), ("models.test", 8443), ("uploads.github.com", 443)]
    assert store.remove("GH_TOKEN").binding.name == "GH_TOKEN"
    with pytest.raises(CcwError, match="ccw secret set GH_TOKEN") as caught:
        store.get("GH_TOKEN")
    assert caught.value.code == "NOT_FOUND"
    store.remove("API")
    assert store.secrets() == [] and not (tmp_path / STORE_NAME).exists()


def test_a_command_runs_each_time_the_value_is_needed(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    store = SecretStore(tmp_path / "state")
    command = f"echo x >> {counter}; printf 'tok-%s\\n' $(wc -l < {counter})"
    store.put(make_binding("GH_TOKEN", ["api.github.com"]), "command", command=command)
    assert counter.read_text().count("x") == 1  # run once at set, to find a typo then
    assert store.value("GH_TOKEN").reveal() == b"tok-2"
    assert store.value("GH_TOKEN").reveal() == b"tok-3"
    assert "value_b64" not in (tmp_path / "state" / STORE_NAME).read_text()  # only the command is kept


@pytest.mark.parametrize(("command", "code", "says"), [
    ("echo 'bad token' >&2; exit 4", "UNAVAILABLE", "status 4: bad token"),
    ("true", "UNAVAILABLE", "empty"),
    ("printf 'a\\nb\\n'", "UNAVAILABLE", "control character"),
    ("sleep 60 & sleep 60", "TIMEOUT", "did not finish in 0.3 s"),
])
def test_a_failing_command_is_a_clear_error(command: str, code: str, says: str) -> None:
    with pytest.raises(CcwError) as caught:
        run_command("GH_TOKEN", command, 0.3 if code == "TIMEOUT" else 10)
    assert caught.value.code == code and says in caught.value.message and "GH_TOKEN" in caught.value.message


def test_values_are_one_line_and_errors_never_show_them() -> None:
    for bad, says in ((b"", "empty"), (VALUE + b"\r\nX-Injected: 1", "control character"),
                      (VALUE + b"\0", "control character"), (VALUE * 1000, "at most")):
        with pytest.raises(CcwError, match=says) as caught:
            check_value("GH_TOKEN", bad)
        assert VALUE.decode() not in str(caught.value) + repr(caught.value) + str(caught.value.details)
    assert check_value("N", VALUE + b"\r\n") == VALUE


def test_no_repr_shows_a_value(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    secret = store.put(make_binding("GH_TOKEN", ["api.github.com"]), "stdin", VALUE)
    shown = repr(secret) + str(secret) + repr(store.value("GH_TOKEN")) + str(store.value("GH_TOKEN")) \
        + repr(store.secrets()) + str(secret.listing())
    assert VALUE.decode() not in shown and "GH_TOKEN" in shown


def test_the_store_file_must_be_private_and_not_a_symlink(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    store.put(make_binding("GH_TOKEN", ["api.github.com"]), "stdin", VALUE)
    os.chmod(tmp_path / STORE_NAME, 0o640)
    with pytest.raises(CcwError, match="mode 0640") as caught:
        store.secrets()
    assert caught.value.code == "PERMISSION_DENIED"
    os.rename(tmp_path / STORE_NAME, tmp_path / "moved.json")
    os.chmod(tmp_path / "moved.json", 0o600)
    os.symlink(tmp_path / "moved.json", tmp_path / STORE_NAME)
    with pytest.raises(CcwError, match="symlink"):
        store.value("GH_TOKEN")
    os.unlink(tmp_path / STORE_NAME)
    fd = os.open(tmp_path / STORE_NAME, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, b'{"format": "something else"}')
    os.close(fd)
    with pytest.raises(CcwError, match="move it away") as caught:
        store.secrets()
    assert caught.value.code == "CONFLICT"


def test_concurrent_sets_all_land(tmp_path: Path) -> None:
    store = SecretStore(tmp_path)
    threads = [threading.Thread(target=store.put, args=(make_binding(f"S{i}", ["h.example"]), "stdin", b"v"))
               for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(s.binding.name for s in store.secrets()) == sorted(f"S{i}" for i in range(8))

"""sandbox/opsurface.py: a helper and a front end of different installs find out at hello.

The digest follows the op table and the wire classes themselves (an argument or a reply
key added changes it), and the front end's client refuses, at its first hello, a helper
that serves another surface, none (one older than the digest) or another protocol
version, naming the way out, instead of failing later at whichever call first differs;
the ccw command sees such a helper as there (to stop) and not usable."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from mcp_server import doctor, launcher
from mcp_server.cli import helperctl
from sandbox import checks, opsurface, replies, server, spec
from sandbox.client import HelperClient
from sandbox.errors import CcwError
from sandbox.ops import OPS
from sandbox.protocol import PROTOCOL_VERSION
from sandbox.server import Dispatcher, HelperServer


class _NoManager:
    """hello asks the manager nothing."""


@pytest.fixture
def helper_socket(tmp_path: Path) -> Iterator[str]:
    path = str(tmp_path / "helper.sock")
    server = HelperServer(path, Dispatcher(_NoManager(), "privileged", {}))  # type: ignore[arg-type]
    server.listen()
    thread = threading.Thread(target=server.serve_forever)
    thread.start()
    try:
        yield path
    finally:
        server.shutdown()
        thread.join(10)


def _hello(path: str) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        client = HelperClient(path)
        try:
            return await client.hello()
        finally:
            await client.aclose()

    return trio.run(main)


def test_a_helper_of_the_same_install_is_taken(helper_socket: str) -> None:
    assert _hello(helper_socket)["surface"] == opsurface.SURFACE


@pytest.mark.parametrize("theirs", ["0123456789abcdef", None])
def test_a_helper_of_another_install_is_refused_at_hello(helper_socket: str, theirs: str | None,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # what an older or newer helper sends: another digest, or (older than the digest) none
    real = replies.HelloReply.to_args
    monkeypatch.setattr(replies.HelloReply, "to_args",
                        lambda self: {key: value for key, value in real(self).items() if key != "surface"}
                        if theirs is None else {**real(self), "surface": theirs})
    with pytest.raises(CcwError) as info:
        _hello(helper_socket)
    assert info.value.code == "UNSUPPORTED"
    assert "ccw helper stop" in info.value.message and helper_socket in info.value.message
    assert info.value.details == {"socket": helper_socket, "helper_surface": theirs, "surface": opsurface.SURFACE}
    assert ("older" in info.value.message) == (theirs is None)
    # the ccw command: it is there (to stop, not to start another beside), shown, and not used
    assert launcher.answering(helper_socket) == {"other_install": info.value.message}
    assert launcher.status_of(helper_socket)["other_install"] == info.value.message
    with pytest.raises(CcwError) as used:
        helperctl._usable(helper_socket)
    assert used.value.code == "UNSUPPORTED" and used.value.message == info.value.message
    # ccw doctor, of a system service: not a working helper, and how to match it
    probed = doctor.probe_service(helper_socket)
    assert probed.ok is False and info.value.message in probed.detail and "restart" in (probed.fix or "")


def test_a_helper_of_another_protocol_version_is_refused_in_the_same_words(helper_socket: str,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "PROTOCOL_VERSION", PROTOCOL_VERSION - 1)  # a helper from before the digest
    with pytest.raises(CcwError) as info:
        _hello(helper_socket)
    assert info.value.code == "UNSUPPORTED" and "refused this front end's hello" in info.value.message
    assert "ccw helper stop" in info.value.message
    assert launcher.answering(helper_socket) == {"other_install": info.value.message}


def test_the_digest_follows_the_ops_arguments_and_the_wire_classes() -> None:
    classes = [*opsurface._defined(replies), *opsurface._defined(spec)]
    assert opsurface.digest(OPS, classes) == opsurface.SURFACE
    fork = OPS["fork"]
    more = {**OPS, "fork": dataclasses.replace(fork, optional={**fork.optional, "later": checks.boolean})}
    assert opsurface.digest(more, classes) != opsurface.SURFACE

    @dataclasses.dataclass(frozen=True)
    class CapsuleSummary(replies.CapsuleSummary):  # the same class with one key more
        later: str | None = None

    CapsuleSummary.__qualname__ = replies.CapsuleSummary.__qualname__
    grown = [CapsuleSummary if one is replies.CapsuleSummary else one for one in classes]
    assert opsurface.digest(OPS, grown) != opsurface.SURFACE
    # only what a module defines counts, not what it imports or what else is loaded
    assert replies.OpReply not in classes and all(one.__module__ in (replies.__name__, spec.__name__)
                                                  for one in classes)

"""The host-space reader on the real kernel: it follows addresses added and removed at once.

The reader runs in a network namespace the test makes (``ip netns exec``), so the
addresses the test adds and removes belong to that namespace and nothing else; each
line the test writes to the reader's stdin asks it for ``current()`` again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

READER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from mcp_server.egress.hostspace import HostSpaceReader
    reader = HostSpaceReader()
    for _line in sys.stdin:
        space = reader.current()
        print(json.dumps({"addresses": sorted(map(str, space.addresses)),
                          "broadcasts": sorted(map(str, space.broadcasts))}), flush=True)
""")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def namespace(root_required: None) -> Iterator[str]:
    name = f"ccwhs{os.getpid()}"
    _ip("netns", "add", name)
    try:
        # A veth pair inside the namespace (this kernel may have no dummy driver).
        _ip("-n", name, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        _ip("-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True, check=False)


def test_the_reader_follows_address_changes(namespace: str) -> None:
    reader = subprocess.Popen(["ip", "netns", "exec", namespace, sys.executable, "-c", READER, str(ROOT)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert reader.stdin is not None and reader.stdout is not None

    def current() -> dict[str, list[str]]:
        assert reader.stdin is not None and reader.stdout is not None
        reader.stdin.write("\n")
        reader.stdin.flush()
        seen: dict[str, list[str]] = json.loads(reader.stdout.readline())
        return seen

    try:
        assert current() == {"addresses": ["127.0.0.1", "::1"], "broadcasts": []}
        _ip("-n", namespace, "addr", "add", "198.18.7.1/24", "broadcast", "198.18.7.255", "dev", "d0")
        _ip("-n", namespace, "addr", "add", "2001:2::7/64", "dev", "d0", "nodad")
        assert current() == {"addresses": ["127.0.0.1", "198.18.7.1", "2001:2::7", "::1"],
                             "broadcasts": ["198.18.7.255"]}
        _ip("-n", namespace, "addr", "del", "198.18.7.1/24", "dev", "d0")
        assert current()["addresses"] == ["127.0.0.1", "2001:2::7", "::1"]
        _ip("-n", namespace, "link", "del", "d0")
        assert current() == {"addresses": ["127.0.0.1", "::1"], "broadcasts": []}
    finally:
        reader.stdin.close()
        reader.wait(timeout=10)
        reader.stdout.close()

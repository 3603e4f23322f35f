"""sandbox/access.py's pure parts: the caller's uid on the host."""

from __future__ import annotations

import pytest

from sandbox import access


def test_a_rootless_helper_s_caller_is_its_user_on_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    # A rootless helper maps its one user to 0: the rule on capsule directories must see
    # alice (1000), whose own home holds her projects, not root, for whom it is another's.
    monkeypatch.setattr(access.namespaces, "read_id_maps", lambda: ([(0, 1000, 1)], [(0, 1000, 1)]))
    assert access.host_uid(0) == 1000
    assert access.host_uid(65534) == 65534  # unmapped: the overflow uid, which the server refuses anyway
    monkeypatch.setattr(access.namespaces, "read_id_maps", lambda: ([(0, 0, 4294967295)], [(0, 0, 4294967295)]))
    assert access.host_uid(0) == 0 and access.host_uid(1000) == 1000

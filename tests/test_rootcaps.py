"""Which jails keep the file-ownership capabilities (sandbox/rootcaps.py): root's, where its host trees are idmapped."""

from __future__ import annotations

from sandbox import rootcaps

INITIAL = [(0, 0, 4294967295)]
ROOTLESS = [(0, 1000, 1)]  # a rootless helper: the caller's own uid mapped to 0


def test_the_mask_is_chown_dac_override_fowner_fsetid() -> None:
    assert rootcaps.FILE_OWNER_MASK == 0x1B
    assert [rootcaps.NAMES[c] for c in rootcaps.FILE_OWNER_CAPS] == [
        "CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID"]
    # Never CAP_DAC_READ_SEARCH (2: open_by_handle_at), CAP_SETUID (7) or CAP_SYS_ADMIN (21).
    assert not rootcaps.FILE_OWNER_MASK & (1 << 2 | 1 << 7 | 1 << 21)


def test_only_root_of_the_initial_user_namespace_keeps_them() -> None:
    assert rootcaps.kept_for(0, INITIAL, True) == rootcaps.FILE_OWNER_MASK
    assert rootcaps.kept_for(1000, INITIAL, True) == 0
    assert rootcaps.kept_for(65534, INITIAL, True) == 0
    # Rootless: the caller is uid 0 of the helper's namespace, but not root on the host.
    assert rootcaps.kept_for(0, ROOTLESS, True) == 0
    assert rootcaps.kept_for(0, [(0, 0, 1)], True) == 0  # a rootless helper started by root


def test_no_capability_where_the_host_trees_are_shown_as_they_are() -> None:
    # They would pass every other user's mode bits there (issue 35): root is then plain uid 0.
    assert rootcaps.kept_for(0, INITIAL, False) == 0

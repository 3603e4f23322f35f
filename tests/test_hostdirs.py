"""The host-directory rule (sandbox/hostdirs.py): where a capsule may be made, for every
caller, and what its refusal says."""

from __future__ import annotations

import pytest

from sandbox.errors import CcwError
from sandbox.homes import Home
from sandbox.hostdirs import check_capsule_dir

HOMES = (Home("root", 0, "/root"), Home("alice", 1000, "/home/alice"), Home("ci", 1001, "/work/ci"))
SYSTEM = ["/", "//", "/etc", "/etc/ssh", "/usr", "/usr/local/src/x", "/bin", "/lib64", "/boot", "/proc", "/proc/1",
          "/sys", "/sys/kernel", "/dev", "/dev/shm", "/run", "/run/user/1000", "/var", "/var/log/x", "/var/backups",
          "/var/spool/cron", "/var/mail", "/home", "/tmp", "/var/tmp", "/var/lib", "/opt", "/srv", "/mnt", "/media"]
PROJECTS = ["/tmp/x", "/var/tmp/ccw-1", "/var/lib/ccw/snapshots/s1", "/srv/app", "/opt/x", "/work/main", "/etcetera",
            "/usrx/y", "/mnt/data/proj", "/var/www/site"]


def _refused(path: str, uid: int, shown_only: bool = False) -> str | None:
    try:
        check_capsule_dir("workspace", path, uid, HOMES, shown_only=shown_only)
    except CcwError as error:
        assert error.code == "PERMISSION_DENIED" and error.details["path"] == path.replace("//", "/")
        assert "make a capsule of a project directory instead" in error.message, error.message
        return error.message
    return None


@pytest.mark.parametrize("uid", [0, 1000, 4242])
def test_system_directories_their_ancestors_and_shared_dirs_are_refused_for_everyone(uid: int) -> None:
    for path in SYSTEM:
        assert _refused(path, uid), path
        assert _refused(path, uid, shown_only=True), path
    for path in PROJECTS:
        assert _refused(path, uid) is None, path
    assert "lies in /etc, the host's configuration" in (_refused("/etc/ssh", uid) or "")
    assert "contains /etc" in (_refused("/", uid) or "")


def test_homes_themselves_and_their_key_stores_are_refused_projects_inside_them_are_not() -> None:
    # A home itself (yours too) holds ~/.ssh; its key stores are refused inside it too.
    assert "is your home (/root)" in (_refused("/root", 0) or "")
    assert "is the home of alice" in (_refused("/home/alice", 0) or "")
    assert "is your home" in (_refused("/home/alice", 1000) or "")
    assert "contains the home of ci" in (_refused("/work", 1000) or "")
    for secret in ("/root/.ssh", "/root/.gnupg/private-keys-v1.d", "/home/alice/.aws", "/home/alice/.config/gcloud",
                   "/home/alice/.config", "/home/alice/.local/share"):
        assert "keys and credentials are kept" in (_refused(secret, 0) or ""), secret
        assert _refused(secret, 1000), secret
    assert "contains /home/alice/.config/gcloud" in (_refused("/home/alice/.config", 1000) or "")
    assert _refused("/home/alice/.config/nvim", 1000) is None
    # A project inside a home is a project, whoever asks (a root CI job on its runner's checkout).
    assert _refused("/home/alice/proj", 0) is None
    assert _refused("/home/alice/proj", 1000) is None and _refused("/home/alice/proj", 1001) is None
    assert _refused("/root/project", 0) is None and _refused("/root/.local/state/ccw/x", 0) is None
    # Only where a base is shown: nothing is read from the host there, so homes are places like any other.
    assert _refused("/home/alice/proj", 0, shown_only=True) is None
    assert _refused("/root", 0, shown_only=True) is None
    assert _refused("/root/.ssh", 0, shown_only=True) is None


def test_the_refusal_names_what_was_given_and_what_it_is() -> None:
    with pytest.raises(CcwError) as info:
        check_capsule_dir("base", "/etc", 0, HOMES, given="/tmp/link-to-etc")
    assert info.value.message.startswith("base '/tmp/link-to-etc' (the directory /etc) lies in /etc")
    assert info.value.details == {"argument": "base", "path": "/etc"}

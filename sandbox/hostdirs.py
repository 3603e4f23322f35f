"""Where a capsule may be made, and which host directories a capsule may show.

A capsule over a system directory would show the host's secrets: the jail hides
/etc/shadow by name in *its own* /etc, but a workspace that is /etc is bound over that,
and the front end reads a capsule's files through open_root with its own rights (root,
for the service), where no jail mask applies.  Masking secrets inside the capsule's
view instead would mean knowing every secret's name in every directory a workspace
might hold, in a tree the agent writes to, for the jail and for every front-end read
alike.  No project is a system directory, so the rule refuses at the door instead,
in both processes (the helper on the path as resolved and on every other path the
same directory is mounted at), and the message says what to make a capsule of.

Refused, for every caller: a directory that is, contains or lies inside one of
SYSTEM_TREES (so / and /var too); one of SHARED_DIRS itself (each holds many owners'
files: a project is a directory inside it); a login user's home itself or anything
containing one (~ holds ~/.ssh; /home holds every home); and anything inside or
holding one of HOME_SECRETS of a home (~/.ssh, ~/.config/gcloud), the caller's own
included.  A project *inside* a home stays allowed, another user's too, for root as
for anyone: a CI job runs as root on a checkout in its runner's home, and a capsule
over ~alice/proj shows that project and nothing beside it (the jail binds only the
workspace, so ../.ssh is not there; the front end reads with RESOLVE_BENEATH), while
what a home keeps secret sits at its top (its key stores, refused above).  A non-root
caller's jail runs as that caller, whom the kernel keeps out of what it may not read.
So a project under /root for root, under ~ for anyone, under /srv, /opt, /tmp,
/var/tmp, /var/lib or /work stays allowed.

With a base, the workspace is only where the jail shows the view (and where promotion
writes): nothing is read from the host there, so only the system part applies, and a
replay still works where the recorded workspace lies in a home that is another user's
on this host.  Login users are root and uids UID_MIN..UID_MAX of /etc/login.defs; a
service account's "home" (/var/www, /nonexistent, /) is not a home here.

The rule is a function of strings alone: its caller resolves the path and reads the
login homes (``sandbox.homes.login_homes``), so the front end, which answers early and
clearly, and the helper, which asks again on what the path really is, apply one rule.
"""

from __future__ import annotations

import functools
import os
import pwd

from sandbox.errors import CcwError
from sandbox.homes import Home

SYSTEM_TREES: dict[str, str] = {
    "/etc": "the host's configuration and secrets (password hashes, ssh host keys)",
    "/boot": "the kernels and their boot secrets",
    "/proc": "the kernel's view of every process",
    "/sys": "the kernel's devices and settings",
    "/dev": "the host's devices",
    "/run": "the host's runtime state (service sockets, other users' sessions)",
    "/usr": "the system's programs",
    "/bin": "the system's programs",
    "/sbin": "the system's programs",
    "/lib": "the system's libraries",
    "/lib32": "the system's libraries",
    "/lib64": "the system's libraries",
    "/libx32": "the system's libraries",
    "/var/backups": "backups of system files (shadow.bak)",
    "/var/log": "the system's logs",
    "/var/mail": "every user's mail",
    "/var/spool": "every user's queued jobs and crontabs",
}
SHARED_DIRS = ("/home", "/tmp", "/var/tmp", "/var/lib", "/var/cache", "/opt", "/srv", "/mnt", "/media")
HOME_SECRETS = (".ssh", ".gnupg", ".aws", ".azure", ".kube", ".docker", ".password-store", ".pki",
                ".config/gcloud", ".config/gh", ".local/share/keyrings")
_INSTEAD = "make a capsule of a project directory instead (one inside your home, /srv or /tmp)"


def inside(path: str, root: str) -> bool:
    """``path`` is ``root`` or lies below it (both absolute and normalised)."""
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/")


def _refusal(path: str, caller_uid: int, homes: tuple[Home, ...], shown_only: bool) -> str | None:
    """Why ``path`` (absolute, normalised) may not be a capsule directory; None if it may."""
    for tree, what in SYSTEM_TREES.items():
        if inside(path, tree):
            return f"lies in {tree}, {what}"
        if inside(tree, path):
            return f"contains {tree}, {what}"
    if path in SHARED_DIRS:
        return "holds many owners' files; a capsule shows everything under its directory"
    if shown_only:
        return None
    for home in homes:
        whose = "your home" if home.uid == caller_uid else f"the home of {home.user}"
        if inside(home.path, path):
            return (f"{'is' if home.path == path else 'contains'} {whose} ({home.path}), "
                    "which holds keys and credentials")
        if not inside(path, home.path):
            continue  # a store lies in its home: a path neither in nor above the home is in or above none
        for secret in HOME_SECRETS:
            store = f"{home.path}/{secret}"
            if inside(path, store) or inside(store, path):
                where = "lies in" if inside(path, store) else "contains"
                return f"{where} {store}, where {home.user}'s keys and credentials are kept"
    return None


# Exposing a toolchain shows a directory read-only in the jail beside the workspace
# (issue 25): ~/.pyenv/versions/3.12.1, ~/.nvm/versions/node/v20.1.0.  The rule is the
# capsule directories' one (no system tree, no home itself or what holds one, nothing
# in or holding a key store) plus the stores that matter only when shown read-only:
# files of credentials at a home's top (held by the home, refused already, named here
# so the message says what they are), registries' tokens inside a tool's own dir (so
# ~/.cargo is refused while ~/.cargo/bin is not), and browser and mail profiles.
EXPOSE_SECRETS = (".netrc", ".git-credentials", ".pypirc", ".npmrc", ".yarnrc", ".vault-token",
                  ".cargo/credentials", ".cargo/credentials.toml", ".config/hub", ".config/op",
                  ".terraform.d", ".mozilla", ".thunderbird", ".config/google-chrome",
                  ".config/chromium", ".config/BraveSoftware", ".config/microsoft-edge",
                  ".local/share/password-store")


def check_expose_dir(name: str, path: str, caller_uid: int, homes: tuple[Home, ...]) -> None:
    """Refuse (PERMISSION_DENIED) a directory to expose that would show secrets.

    ``path`` is absolute and resolved.  Refused: whatever ``check_capsule_dir`` refuses,
    and a directory that is, contains or lies in one of EXPOSE_SECRETS of a home; asking
    for it explicitly changes nothing.
    """
    path = os.path.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    why = _expose_refusal(path, caller_uid, homes)
    if why is not None:
        raise CcwError("PERMISSION_DENIED", f"{name} {path!r} {why}; expose a toolchain's own "
                       "directory instead (~/.pyenv/versions/3.12.1, ~/.nvm/versions/node/v20.1.0)",
                       {"argument": name, "path": path})


@functools.lru_cache(maxsize=1024)
def _expose_refusal(path: str, caller_uid: int, homes: tuple[Home, ...]) -> str | None:
    """Why ``path`` (absolute, normalised) may not be exposed; None if it may.

    A function of its strings alone (no filesystem access), so kept: the helper asks
    again for every exposed directory at every exec, and the front end at every create.
    """
    why = _refusal(path, caller_uid, homes, shown_only=False)
    for home in homes:
        if why is not None or not (inside(path, home.path) or inside(home.path, path)):
            continue  # a store lies in its home: a path neither in nor above it is in or above none
        for secret in EXPOSE_SECRETS:
            store = f"{home.path}/{secret}"
            if why is None and (inside(path, store) or inside(store, path)):
                where = "lies in" if inside(path, store) else "contains"
                why = f"{where} {store}, where {home.user}'s credentials or profiles are kept"
    return why


def check_capsule_dir(name: str, path: str, caller_uid: int, homes: tuple[Home, ...], *,
                      shown_only: bool = False, given: str | None = None) -> None:
    """Refuse (PERMISSION_DENIED) a capsule directory that would show the host's secrets.

    ``path`` is absolute and resolved (symlinks followed); ``given`` is what the caller
    named, when it differs (another path of the same directory).  ``caller_uid`` is the
    caller's uid on the host, ``homes`` come from ``login_homes``; ``shown_only``: a
    workspace that is only where a base is shown.  The rule and its reasons open this module.
    """
    path = os.path.normpath(path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    why = _refusal(path, caller_uid, homes, shown_only)
    if why is not None:
        seen = f"{given!r} (the directory {path})" if given and given != path else repr(path)
        raise CcwError("PERMISSION_DENIED", f"{name} {seen} {why}; {_INSTEAD}",
                       {"argument": name, "path": path})


# Both processes refuse a directory the caller may not use with these words: the helper
# (access.py) and the front end, which runs as the caller and so can name an owner a
# rootless helper's namespace does not show (capsules/create.py).
def refusal(path: str, caller: int, owner: int | None, verb: str) -> CcwError:
    """PERMISSION_DENIED for host uid ``caller``, who may not ``verb`` ("write" or "read") the directory
    ``path`` of host uid ``owner`` (None: a user a rootless helper does not see): who, whose, what to do."""
    whose = named(owner) if owner is not None else "a user outside the rootless helper's user namespace"
    if owner == caller:
        way = f"make it {'writable' if verb == 'write' else 'readable'} (its mode or a read-only mount refuses you)"
    elif verb == "write":
        way = ("clone or copy it to a directory you own (git clone, cp -a) and create the capsule there, or have "
               "its owner give you write access (chown, or a group of yours with write permission)")
    else:
        way = "have its owner give you read access, or name a directory you can read"
    return CcwError("PERMISSION_DENIED", f"{named(caller)} may not {verb} {path!r}, owned by {whose}; a capsule "
                    f"may only be created over a directory you can {verb}: {way}", {"path": path})


def named(uid: int) -> str:
    """``uid 1001 (alice)``, or ``uid 1001`` for a uid no account names."""
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"

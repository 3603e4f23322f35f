"""``ccw-helper``: start the helper on a unix socket.

    ccw-helper --socket PATH --state-dir DIR [--rootless|--privileged|--auto]
               [--ready-fd N] [--socket-mode 0600] [--socket-group NAME] [--die-with-parent]
               [--capsule-disk-mb N]

Some facts about running rootless that this entry point follows from:

- An unprivileged process can ``unshare(CLONE_NEWUSER|CLONE_NEWNS)`` and map its own
  uid/gid to 0 in the new user namespace (one line each in ``uid_map``/``gid_map``,
  after writing "deny" to ``setgroups``).  Inside, it holds every capability over
  mounts it creates: overlayfs (with ``userxattr``), tmpfs and bind mounts work; its
  files on disk still belong to the real user.
- ``unshare(CLONE_NEWUSER)`` refuses a multi-threaded process, so it happens first,
  before the server (or anything else) starts a thread.
- The helper's mounts live in a mount namespace of its own (slave of the host's), in
  both modes: capsule overlays never clutter the host's mount table, and when the
  helper dies, even by kill -9, the kernel unmounts them with the namespace.  Capsule
  data is on disk under the state dir and is mounted again on first use.  The front
  end never needs the mount paths: it works through ``open_root`` descriptors.
- Capabilities in a user namespace do not reach the initial one: fanotify filesystem
  marks and cgroup writes outside a delegated subtree stay impossible, and the modules
  that own them say so in ``hello``'s mechanisms rather than pretending.

The mode is chosen with ``--auto`` (the default: privileged when euid is 0, else
rootless) or forced.  ``--ready-fd`` receives one byte once the socket listens and is
then closed (the embedded default waits on it).  ``--die-with-parent`` stops the
helper when the process that started it dies (bubblewrap's option of that name), so an
embedded helper never outlives its front end.  Logs go to stderr only.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import logging
import os
import signal
import socket
import sys
from collections.abc import Mapping
from types import FrameType

from sandbox import __version__, disk, in_force, jail_launcher, syscalls
from sandbox.errors import CcwError
from sandbox.server import Dispatcher, HelperServer

log = logging.getLogger("ccw.helper")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="ccw-helper", description="ccw's privileged helper")
    parser.add_argument("--version", action="version", version=f"ccw-helper {__version__}")
    parser.add_argument("--socket", required=True, help="unix socket path to listen on")
    parser.add_argument("--state-dir", required=True, help="capsule upper/work dirs and registry")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--rootless", dest="mode", action="store_const", const="rootless")
    mode.add_argument("--privileged", dest="mode", action="store_const", const="privileged")
    mode.add_argument("--auto", dest="mode", action="store_const", const="auto")
    parser.set_defaults(mode="auto")
    parser.add_argument("--ready-fd", type=int, default=None, help="write one byte here when listening")
    parser.add_argument("--socket-mode", type=lambda s: int(s, 8), default=None,
                        help="octal socket mode (default 0600, or 0660 with --socket-group)")
    parser.add_argument("--socket-group", default=None, help="group that may connect (service)")
    parser.add_argument("--die-with-parent", action="store_true", help="exit when the parent dies")
    parser.add_argument("--verbose", action="store_true", help="debug logging")
    parser.add_argument("--capsule-disk-mb", type=int, default=None,
                        help="size limit of each capsule's own disk in MiB (default $CCW_CAPSULE_DISK_MB, "
                        f"else {disk.DEFAULT_MB}); 0: no disks, capsules write to the state dir's filesystem")
    return parser.parse_args(argv)


def capsule_disk_mb(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> int:
    """--capsule-disk-mb, else CCW_CAPSULE_DISK_MB, else the default; checked."""
    value: object = args.capsule_disk_mb
    if value is None:
        text = (os.environ if env is None else env).get("CCW_CAPSULE_DISK_MB", "").strip()
        try:
            value = int(text) if text else disk.DEFAULT_MB
        except ValueError:
            raise CcwError(
                "INVALID_ARGUMENT", f"CCW_CAPSULE_DISK_MB must be a whole number of MiB, not {text!r:.40}"
            ) from None
    if value != 0:
        disk.check_size("--capsule-disk-mb (CCW_CAPSULE_DISK_MB)", value)
    assert isinstance(value, int)
    return value


def choose_mode(requested: str, euid: int) -> str:
    """privileged or rootless; --privileged without root is an error that says what to do."""
    if requested == "auto":
        return "privileged" if euid == 0 else "rootless"
    if requested == "privileged" and euid != 0:
        raise CcwError(
            "PERMISSION_DENIED",
            "--privileged needs root; run the helper as root (the ccw-helper service) "
            "or use --rootless",
        )
    return requested


def enter_user_namespace() -> None:
    """Become root of a new user + mount namespace mapping our own uid/gid to 0."""
    uid, gid = os.getuid(), os.getgid()
    try:
        syscalls.unshare(syscalls.CLONE_NEWUSER | syscalls.CLONE_NEWNS)
    except OSError as exc:
        raise CcwError(
            "UNSUPPORTED",
            f"rootless mode needs unprivileged user namespaces: {exc}; enable "
            "kernel.unprivileged_userns_clone (or user.max_user_namespaces) or run as root",
        ) from exc
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open(f"/proc/self/{name}", "w") as f:
            f.write(text)
    _one_way_propagation()


def enter_mount_namespace() -> None:
    """A mount namespace of the helper's own, so its overlays die with it (privileged mode)."""
    try:
        syscalls.unshare(syscalls.CLONE_NEWNS)
    except OSError as exc:
        raise CcwError("PERMISSION_DENIED", f"cannot create the helper's mount namespace: {exc}") from exc
    _one_way_propagation()


def _one_way_propagation() -> None:
    # Slave, not private: mounts the host makes later (a new workspace volume) still
    # appear here, while the capsules' overlays never appear on the host.
    syscalls.mount(None, "/", None, syscalls.MS_REC | syscalls.MS_SLAVE)


def _die_with_parent(expected_parent: int) -> None:
    import prctl

    prctl.set_pdeathsig(signal.SIGTERM)
    if os.getppid() != expected_parent:  # the parent died before the line above
        raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """Run the helper until SIGTERM/SIGINT; returns the exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        stream=sys.stderr,
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="ccw-helper[%(process)d] %(levelname)s %(message)s",
    )
    parent = os.getppid()
    try:
        if args.die_with_parent:
            _die_with_parent(parent)
        mode = choose_mode(args.mode, os.geteuid())
        jail_launcher.require()  # no jail without it: say so now, not at the first exec
        if mode == "rootless":
            enter_user_namespace()
        else:
            enter_mount_namespace()
            from sandbox import cgroups

            cgroups.enter_leaf()  # a systemd service's own v2 cgroup may not hold it (cgroups.py)
        server = build_server(args, mode)
        activated = systemd_listener()
        if activated is not None:
            server.adopt(activated)
        else:
            server.listen()
    except CcwError as exc:
        log.error("%s", exc.message)
        return 1
    _install_signal_handlers(server)
    if args.ready_fd is not None:
        with contextlib.suppress(OSError):
            os.write(args.ready_fd, b"1")
        with contextlib.suppress(OSError):
            os.close(args.ready_fd)
    log.info("ready (%s mode, state %s)", mode, args.state_dir)
    try:
        server.serve_forever()
    finally:
        server.dispatcher.manager.close()  # the capsules' egress kits (sandbox/egress.py)
    return 0


def build_server(args: argparse.Namespace, mode: str) -> HelperServer:
    """The CapsuleManager (recovered from disk), its dispatcher and the socket server."""
    from sandbox.manager import CapsuleManager

    os.makedirs(args.state_dir, mode=0o700, exist_ok=True)
    manager = CapsuleManager(args.state_dir, rootless=mode == "rootless", disk_mb=capsule_disk_mb(args))
    manager.recover()
    # A rootless helper sees every other uid as the overflow uid; only its own user may
    # talk to it (the socket's 0600 mode says the same, this says it again).
    allowed = frozenset({os.getuid()}) if mode == "rootless" else None
    mechanisms = in_force.mechanisms(mode == "rootless", manager.disks, manager.disk_reason)
    dispatcher = Dispatcher(manager, mode, mechanisms, allowed_uids=allowed)
    group = None
    if args.socket_group is not None:
        try:
            group = grp.getgrnam(args.socket_group).gr_gid
        except KeyError:
            raise CcwError("NOT_FOUND", f"no group {args.socket_group!r}; create it or drop --socket-group") from None
    socket_mode = args.socket_mode if args.socket_mode is not None else (0o660 if group is not None else 0o600)
    return HelperServer(args.socket, dispatcher, mode=socket_mode, group=group)


SD_LISTEN_FDS_START = 3


def systemd_listener(env: dict[str, str] | None = None) -> socket.socket | None:
    """The listening socket systemd passed (LISTEN_FDS/LISTEN_PID, fd 3), or None.

    Socket activation (deploy/ccw-helper.socket): systemd owns the socket file, its mode
    and group; the helper only accepts on it, and leaves the file in place on exit so
    that the next connection starts the service again.
    """
    environ = os.environ if env is None else env
    if environ.get("LISTEN_PID") != str(os.getpid()) or int(environ.get("LISTEN_FDS", "0") or 0) < 1:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for the processes the helper starts
    listener = socket.socket(fileno=SD_LISTEN_FDS_START)
    if listener.family != socket.AF_UNIX or listener.type != socket.SOCK_STREAM:
        raise CcwError("INVALID_ARGUMENT", "the socket systemd passed is not a unix stream socket; "
                       "use ListenStream=/run/ccw/helper.sock in ccw-helper.socket")
    return listener


def _install_signal_handlers(server: HelperServer) -> None:
    calls = {"count": 0}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        calls["count"] += 1
        if calls["count"] > 1:
            # A second signal: stop waiting for in-flight requests.
            os._exit(128 + signum)
        log.info("%s: finishing in-flight requests", signal.Signals(signum).name)
        server.shutdown()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server.wake_on_signals()


if __name__ == "__main__":
    sys.exit(main())

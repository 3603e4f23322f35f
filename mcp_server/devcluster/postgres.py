"""A private, throw-away PostgreSQL for BuildGrid's scheduler (the local cluster of issue 17).

Some facts about running a private PostgreSQL, as the cluster does:

- Debian puts the server binaries (``initdb``, ``pg_ctl``, ``postgres``) in
  ``/usr/lib/postgresql/<major>/bin``, off ``PATH``; only the client tools are on it.
  Installing the ``postgresql`` package also makes and (where services run) starts a
  system cluster on port 5432; ours is another cluster, on its own loopback port, and
  never touches that one.
- The server refuses to run as root ("root execution of the PostgreSQL server is not
  permitted").  Run by root, the cluster runs it as the ``postgres`` user the Debian
  package creates, so the data directory must be that user's and every directory
  above it must let that user through (pytest's and ``mkdtemp``'s 0700 directories do
  not: the caller picks a state dir that does, such as one made with mode 0711).
- ``initdb --auth=trust`` lets any local connection in as any user: safe only because
  the server listens on 127.0.0.1 alone and has no Unix socket
  (``unix_socket_directories=''``).  ``fsync=off`` (and ``--no-sync`` at initdb) trade
  crash safety, which a throw-away test database does not need, for speed.
- ``pg_ctl start -w`` returns once the server accepts connections; ``stop -m
  immediate`` ends it at once without a checkpoint, which is what a torn-down test
  cluster wants.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sandbox.errors import CcwError

# Debian's layout; the highest major version found wins.
DEBIAN_PG_ROOT = Path("/usr/lib/postgresql")
DB_USER = "bgd"
DB_NAME = "bgd"
START_TIMEOUT_S = 60


def find_bin_dir() -> Path | None:
    """The directory of the newest ``initdb``/``pg_ctl`` on this machine, or None."""
    candidates: list[tuple[int, Path]] = []
    if DEBIAN_PG_ROOT.is_dir():
        for version_dir in DEBIAN_PG_ROOT.iterdir():
            if version_dir.name.isdigit() and (version_dir / "bin" / "initdb").exists():
                candidates.append((int(version_dir.name), version_dir / "bin"))
    if candidates:
        return max(candidates)[1]
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path and shutil.which("pg_ctl") else None


def ensure_installed() -> Path:
    """The PostgreSQL server's bin directory, installing Debian's ``postgresql`` if it is missing."""
    found = find_bin_dir()
    if found is not None:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise CcwError(
            "UNAVAILABLE",
            "PostgreSQL's server is not installed (no initdb under /usr/lib/postgresql/*/bin "
            "or on PATH); install it as root: apt-get install postgresql",
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "postgresql"],
        env=env, check=True, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    found = find_bin_dir()
    if found is None:
        raise CcwError("UNAVAILABLE", "apt-get installed postgresql but no initdb was found")
    return found


def server_user() -> pwd.struct_passwd | None:
    """The user the server runs as: ``postgres`` when we are root, else None (ourselves)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam("postgres")
    except KeyError:
        raise CcwError(
            "UNAVAILABLE",
            "running as root, but there is no 'postgres' user to run PostgreSQL as "
            "(Debian's postgresql package creates it)",
        ) from None


def check_reachable(path: Path, user: pwd.struct_passwd) -> None:
    """Fail unless ``user`` may pass through every directory above ``path``."""
    for parent in path.resolve().parents:
        info = parent.stat()
        if info.st_uid != user.pw_uid and not info.st_mode & 0o001:
            raise CcwError(
                "PERMISSION_DENIED",
                f"PostgreSQL runs as {user.pw_name!r}, which cannot enter {parent} "
                f"(mode {info.st_mode & 0o777:o}): pick a state dir whose parents are "
                "world-searchable (e.g. under /var/lib or /tmp, mode 0711)",
                {"path": str(parent)},
            )


@dataclass
class PrivatePostgres:
    """One private cluster: ``data_dir`` on ``port`` at 127.0.0.1, trust auth, no fsync."""

    bin_dir: Path
    data_dir: Path
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        """The SQLAlchemy URL BuildGrid connects with (psycopg 3, which BuildGrid installs)."""
        return f"postgresql+psycopg://{DB_USER}@127.0.0.1:{self.port}/{DB_NAME}"

    def _run(self, tool: str, *args: str) -> None:
        user = server_user()
        done = subprocess.run(
            [str(self.bin_dir / tool), *args], capture_output=True, text=True, check=False, cwd="/",
            user=None if user is None else user.pw_uid, group=None if user is None else user.pw_gid,
            extra_groups=None if user is None else [],
        )  # fmt: skip
        if done.returncode != 0:
            raise CcwError(
                "UNAVAILABLE",
                f"{tool} {' '.join(args)} failed with {done.returncode}: {done.stderr.strip()[-2000:]}"
                f" (server log: {self.log_path})",
            )

    def create(self) -> None:
        """initdb the data directory (owned by the server's user) and write its settings."""
        user = server_user()
        self.data_dir.mkdir(mode=0o700, parents=True)
        self.log_path.touch()
        if user is not None:
            check_reachable(self.data_dir, user)
            os.chown(self.data_dir, user.pw_uid, user.pw_gid)
            os.chown(self.log_path, user.pw_uid, user.pw_gid)
        self._run("initdb", "-D", str(self.data_dir), "-U", DB_USER, "--auth=trust",
                  "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")  # fmt: skip
        settings = (
            "listen_addresses = '127.0.0.1'\n"
            f"port = {self.port}\n"
            "unix_socket_directories = ''\n"
            "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
            "max_connections = 200\n"  # BuildGrid pools per service and per bot session
        )
        with open(self.data_dir / "postgresql.conf", "a", encoding="utf-8") as conf:
            conf.write("\n# ccw's private cluster (mcp_server/devcluster/postgres.py)\n" + settings)

    def start(self) -> None:
        """Start the server, wait until it accepts connections, and create BuildGrid's database."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_path), "-w",
                  "-t", str(START_TIMEOUT_S), "start")  # fmt: skip
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", DB_USER, DB_NAME)

    def stop(self) -> None:
        """Stop the server at once (no checkpoint: the data is thrown away)."""
        if (self.data_dir / "postmaster.pid").exists():
            self._run("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop")

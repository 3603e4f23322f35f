"""A worker's side of the CAS: lay an input root out on disk, and upload a run's outputs.

Some facts about fetching an input root:

- ``GetTree`` streams every Directory under a root in pages, so one call replaces a
  read per directory; the files are then read by digest, each distinct blob once
  (``BatchReadBlobs`` for many small ones at a time, ByteStream for a large one), and
  with a cache only the blobs the host has not seen before.
- Names in a Directory come from the client: a worker must refuse ``..``, ``/`` and
  empty names, or an input root could write outside its directory.  Symlinks are made
  as given; what they point at is resolved by the command at run time, inside the
  worker's jail.
- Only the executable bit travels; files are written 0644 or 0755.
- ``output_paths`` are relative to the working directory; an output that the run did
  not make is simply absent from the ActionResult (REAPI's rule), not an error.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from mcp_server.reapi.client import ReapiClient
from mcp_server.reapi.merkle import digest_bytes, digest_file, key
from mcp_server.reapi.protos import re_pb2
from sandbox.errors import CcwError


def _safe_name(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise CcwError("INVALID_ARGUMENT", f"input root holds an unsafe name {name!r}")
    return name


def fetch_directories(client: ReapiClient, root: re_pb2.Digest) -> dict[tuple[str, int], re_pb2.Directory]:
    """Every Directory under ``root`` (root included), by digest."""
    if root.size_bytes == 0:
        return {key(root): re_pb2.Directory()}
    found = {}
    for directory in client.get_tree(root):
        found[key(digest_bytes(directory.SerializeToString(deterministic=True)))] = directory
    return found


def _cached(cache: Path, digest: re_pb2.Digest, executable: bool) -> Path:
    return cache / f"{digest.hash}-{digest.size_bytes}-{'x' if executable else 'r'}"


def _store(cache: Path, digest: re_pb2.Digest, executable: bool, data: bytes) -> None:
    """Put a blob in the cache as a file of its own mode (written aside, then renamed: leases share it)."""
    final = _cached(cache, digest, executable)
    if final.exists():
        return
    fd, temporary = tempfile.mkstemp(dir=cache, prefix=".part-")
    with open(fd, "wb") as sink:
        sink.write(data)
    os.chmod(temporary, 0o755 if executable else 0o644)
    os.replace(temporary, final)


def _place(source: Path, path: Path) -> None:
    """A hard link to the cached file, or a copy where links cannot go (another filesystem, link limit)."""
    try:
        os.link(source, path)
    except OSError:
        shutil.copy2(source, path)


def fetch_input_root(client: ReapiClient, root: re_pb2.Digest, dest: Path, cache: Path | None = None) -> int:
    """Write the tree ``root`` names into the empty directory ``dest``; the number of files written.

    The blobs come many per ``BatchReadBlobs``.  With ``cache`` (a directory on the same
    filesystem as ``dest``) every file is a hard link to a cached copy keyed by digest
    and executable bit, and only blobs not cached yet are read: trials over one base
    fetch only what their subset changed.  The links are safe to share because a
    capsule never writes its lower directory (overlayfs copies up first).
    """
    directories = fetch_directories(client, root)
    nodes = {(key(n.digest), n.is_executable): n.digest for d in directories.values() for n in d.files}
    data: dict[tuple[str, int], bytes] = {}
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        wanted = {key(d): d for (k, x), d in nodes.items() if not _cached(cache, d, x).exists()}
    else:
        wanted = {k: d for (k, _), d in nodes.items()}
    for digest, blob in client.read_blobs(wanted.values()):
        if cache is None:
            data[key(digest)] = blob
            continue
        for executable in (False, True):
            if (key(digest), executable) in nodes:
                _store(cache, digest, executable, blob)
    written = 0

    def lay_out(digest: re_pb2.Digest, here: Path) -> None:
        nonlocal written
        directory = directories.get(key(digest))
        if directory is None:
            raise CcwError("NOT_FOUND", f"GetTree did not return Directory {digest.hash}/{digest.size_bytes}")
        for node in directory.files:
            path = here / _safe_name(node.name)
            if cache is not None:
                _place(_cached(cache, node.digest, node.is_executable), path)
            else:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                             0o755 if node.is_executable else 0o644)  # fmt: skip
                with open(fd, "wb") as sink:
                    sink.write(data[key(node.digest)])
            written += 1
        for link in directory.symlinks:
            os.symlink(link.target, here / _safe_name(link.name))
        for child in directory.directories:
            sub = here / _safe_name(child.name)
            sub.mkdir()
            lay_out(child.digest, sub)

    lay_out(root, dest)
    return written


def upload_outputs(client: ReapiClient, workdir: Path, command: re_pb2.Command) -> list[re_pb2.OutputFile]:
    """Upload the regular files among the command's outputs; their OutputFile entries.

    Output directories (a ``Tree`` each) are not sent yet: ccw's trials and replays
    name files.
    """
    outputs: list[re_pb2.OutputFile] = []
    for relative in [*command.output_paths, *command.output_files]:
        path = workdir / relative
        if not path.is_file() or path.is_symlink():
            continue
        digest = digest_file(path)
        client.upload({key(digest): path})
        outputs.append(re_pb2.OutputFile(path=relative, digest=digest,
                                         is_executable=os.access(path, os.X_OK)))  # fmt: skip
    return outputs

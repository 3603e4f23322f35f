"""Real projects from the package registries, prepared once and copied per test.

Each project is a published release, pinned, fetched with the registry's own client
(``pip download``, ``npm pack``), unpacked, given what its own tests need (a ``.venv/``
with pytest, ``node_modules/`` from ``npm install``) and committed to a fresh git repo
(one initial commit; ``.venv/`` and ``node_modules/`` are excluded through
``.git/info/exclude``, so the published files stay as published).  The prepared tree is
cached under ``.cache/realprojects/`` in the repo root (gitignored) and every test gets
its own ``cp -a`` copy, so the registries are asked once per machine, not once per run.

Each project also names the agent's edits the scenarios make: two harmless ones and one
that breaks the selected tests; each is one line, replaced, so a read of the file gives
its hashline tag and ``git diff`` after promotion shows exactly the harmless ones.
The interpreters are the system's (``/usr/bin/python3``, ``/usr/bin/node``): the venv's
``bin/python`` links there, where an unprivileged user can reach it too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "realprojects"
SYSTEM_PYTHON = "/usr/bin/python3"

# What the Python project's .venv gets: pytest and its dependencies, every version pinned.
PYTEST_PINS = ["pytest==8.3.4", "iniconfig==2.0.0", "packaging==24.2", "pluggy==1.5.0"]

GIT_ENV = {
    "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "ccw test", "GIT_AUTHOR_EMAIL": "ccw@example.invalid",
    "GIT_COMMITTER_NAME": "ccw test", "GIT_COMMITTER_EMAIL": "ccw@example.invalid",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}


@dataclass(frozen=True)
class Edit:
    """Replace the one line of ``path`` that reads ``old`` with ``new``."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Project:
    """A pinned release, how to prepare it, how to test it, and the edits an agent makes."""

    name: str
    ecosystem: str
    version: str
    prepare: Callable[[Path, Path], None]  # (downloads dir, workspace to fill)
    test_cmd: tuple[str, ...]  # a fast subset of its own suite
    full_cmd: tuple[str, ...]  # its whole suite (as far as it passes here)
    harmless: tuple[Edit, Edit]
    breaking: Edit
    ignored: tuple[str, ...] = ()  # excluded from git: what preparation added

    @property
    def key(self) -> str:
        """Directory name of its cache entry."""
        return f"{self.name}-{self.version}"


def run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run a preparation step; its stdout, or AssertionError with its output."""
    done = subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=600, check=False)
    assert done.returncode == 0, f"{argv} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


def git(ws: Path, *args: str) -> str:
    """``git`` in ``ws`` with no user or system config, a fixed identity and date; its stdout."""
    return run(["git", "-c", "safe.directory=*", *args], cwd=ws, env=GIT_ENV)


def _pip(*args: str) -> list[str]:
    return ["--cache-dir", str(CACHE / "pip"), "--disable-pip-version-check", "--no-input", *args]


def _unpack(archive: Path, into: Path, under: str = "") -> None:
    """Unpack a release tarball with its single top directory stripped (and only what lies
    ``under`` a directory of it, that directory stripped too)."""
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        for member in members:
            _top, _, rest = member.name.partition("/")
            member.name = rest[len(under):] if rest.startswith(under) else ""
        tar.extractall(into, members=[m for m in members if m.name], filter="data")


def _sdist(downloads: Path, name: str, version: str) -> Path:
    run([SYSTEM_PYTHON, "-m", "pip", "download", *_pip("--no-deps", "--no-binary", ":all:", "-d", str(downloads),
                                                       f"{name}=={version}")])
    found = sorted(downloads.glob(f"{name.replace('-', '?')}-{version}.tar.gz"))
    assert found, f"pip download of {name}=={version} left no sdist in {downloads}"
    return found[0]


def _prepare_more_itertools(downloads: Path, ws: Path) -> None:
    _unpack(_sdist(downloads, "more-itertools", "10.5.0"), ws)
    run([SYSTEM_PYTHON, "-m", "venv", str(ws / ".venv")])
    run([str(ws / ".venv" / "bin" / "pip"), "install", *_pip("--only-binary", ":all:", *PYTEST_PINS)])


def _prepare_idna(downloads: Path, ws: Path) -> None:
    _unpack(_sdist(downloads, "idna", "3.10"), ws)


# The Flask tutorial's app (flaskr) ships in Flask's own sdist, with its tests; its .venv gets
# Flask and its dependencies and pytest, every version pinned.
FLASK_PINS = ["Flask==3.0.3", "Werkzeug==3.0.3", "Jinja2==3.1.4", "MarkupSafe==2.1.5", "itsdangerous==2.2.0",
              "click==8.1.7", "blinker==1.8.2"]


def _prepare_flaskr(downloads: Path, ws: Path) -> None:
    _unpack(_sdist(downloads, "flask", "3.0.3"), ws, under="examples/tutorial/")
    run([SYSTEM_PYTHON, "-m", "venv", str(ws / ".venv")])
    run([str(ws / ".venv" / "bin" / "pip"), "install", *_pip("--only-binary", ":all:", *FLASK_PINS, *PYTEST_PINS)])


NPM_FLAGS = ("--cache", str(CACHE / "npm"), "--no-audit", "--no-fund", "--no-update-notifier")


def npm_install(ws: Path, *packages: str) -> None:
    """``npm install --no-save`` of ``packages`` into the workspace's node_modules (cached)."""
    run(["npm", "install", "--no-save", "--no-package-lock", *NPM_FLAGS, *packages], cwd=ws)


def _prepare_json_stable_stringify(downloads: Path, ws: Path) -> None:
    spec = "json-stable-stringify-without-jsonify@1.0.1"
    npm = list(NPM_FLAGS)
    run(["npm", "pack", spec, "--pack-destination", str(downloads), *npm], cwd=downloads)
    _unpack(downloads / "json-stable-stringify-without-jsonify-1.0.1.tgz", ws)
    run(["npm", "install", "--no-package-lock", *npm], cwd=ws)


# PYTHONDONTWRITEBYTECODE's switch (-B) and no cache provider: the runs leave no
# __pycache__ or .pytest_cache behind, so the promoted change is the agent's edits only.
PYTEST = (".venv/bin/python", "-B", "-m", "pytest", "-p", "no:cacheprovider")

MORE_ITERTOOLS = Project(
    name="more-itertools", ecosystem="PyPI", version="10.5.0", prepare=_prepare_more_itertools,
    test_cmd=(*PYTEST, "-q", "tests/test_more.py", "-k", "Chunked or Ichunked or Sliced"),
    full_cmd=(*PYTEST, "-q", "tests"),
    harmless=(
        Edit("more_itertools/more.py",
             '    """Return the first item of *iterable*, or *default* if *iterable* is',
             '    """Return the first item of *iterable*, or *default* when *iterable* is'),
        Edit("README.rst",
             "Python's ``itertools`` library is a gem - you can compose elegant solutions",
             "Python's ``itertools`` library is a gem: you can compose elegant solutions"),
    ),
    breaking=Edit("more_itertools/more.py", "                if len(chunk) != n:",
                  "                if len(chunk) == n:"),
    ignored=(".venv/",),
)

JSON_STABLE_STRINGIFY = Project(
    name="json-stable-stringify-without-jsonify", ecosystem="npm", version="1.0.1",
    prepare=_prepare_json_stable_stringify,
    test_cmd=("npm", "test"), full_cmd=("npm", "test"),
    harmless=(
        Edit("index.js", "var isArray = Array.isArray || function (x) {",
             "var isArray = Array.isArray || function isArray(x) {"),
        Edit("readme.markdown", "# json-stable-stringify", "# json-stable-stringify-without-jsonify"),
    ),
    breaking=Edit("index.js", "            var keys = objectKeys(node).sort(cmp && cmp(node));",
                  "            var keys = objectKeys(node);"),
    ignored=("node_modules/",),
)

IDNA = Project(
    name="idna", ecosystem="PyPI", version="3.10", prepare=_prepare_idna,
    test_cmd=(SYSTEM_PYTHON, "-B", "-m", "unittest", "tests.test_intranges", "tests.test_idna"),
    full_cmd=(SYSTEM_PYTHON, "-B", "-m", "unittest", "tests.test_intranges", "tests.test_idna"),
    harmless=(
        Edit("idna/intranges.py", "of consecutive integers, compute a representation of the form",
             "of consecutive integers, computes a representation of the form"),
        Edit("README.rst", "Internationalized Domain Names in Applications (IDNA)",
             "Internationalised Domain Names in Applications (IDNA)"),
    ),
    breaking=Edit("idna/intranges.py", "    return (start << 32) | end", "    return (start << 31) | end"),
)

# A web app: ``.venv/bin/python -m flask --app flaskr init-db``, then ``... run`` serves it
# (through ``-m``: the venv's own scripts name the interpreter of the directory it was built in).
FLASKR = Project(
    name="flaskr", ecosystem="PyPI", version="3.0.3", prepare=_prepare_flaskr,
    test_cmd=(*PYTEST, "-q", "tests"), full_cmd=(*PYTEST, "-q", "tests"),
    harmless=(
        Edit("flaskr/templates/base.html", """  <h1><a href="{{ url_for('index') }}">Flaskr</a></h1>""",
             """  <h1><a href="{{ url_for('index') }}">Flaskr, served from a capsule</a></h1>"""),
        Edit("README.rst", "The basic blog app built in the Flask `tutorial`_.",
             "The basic blog app built in Flask's `tutorial`_."),
    ),
    breaking=Edit("flaskr/auth.py", '            error = "Incorrect password."', "            pass"),
    ignored=(".venv/",),
)

PROJECTS = {p.name: p for p in (MORE_ITERTOOLS, JSON_STABLE_STRINGIFY, IDNA, FLASKR)}


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def prepared(project: Project) -> Path:
    """The cached, prepared workspace of ``project`` (made on first use; never modify it)."""
    ready = CACHE / project.key / "ws"
    if ready.is_dir():
        return ready
    with _locked():
        if ready.is_dir():
            return ready
        building = CACHE / project.key / "building"
        shutil.rmtree(building, ignore_errors=True)
        downloads = CACHE / "downloads"
        downloads.mkdir(parents=True, exist_ok=True)
        building.mkdir(parents=True)
        project.prepare(downloads, building)
        git(building, "init", "-q", "-b", "main")
        with open(building / ".git" / "info" / "exclude", "a") as exclude:
            exclude.writelines(f"{pattern}\n" for pattern in project.ignored)
        git(building, "add", "-A")
        git(building, "commit", "-q", "-m", f"{project.name} {project.version} as published")
        building.rename(ready)
    return ready


def pristine(project: Project, dest: Path) -> Path:
    """A fresh copy of the prepared workspace at ``dest`` (which must not exist)."""
    source = prepared(project)
    run(["cp", "-a", str(source), str(dest)])
    return dest

"""Coverage-guided fuzzing in CI: every atheris target in tests/fuzz/targets.py, briefly.

Each target runs in its own process (atheris takes the process over and leaves with
``os._exit``), all at once, for ``CCW_FUZZ_SECONDS`` of wall time each (20 by default,
so the whole module stays well under a minute even on a two-core runner), starting from
the checked-in corpus in tests/fuzz/corpus/.  A target that crashes fails its test with
the input that did it and the command that replays it.  Longer runs: set
``CCW_FUZZ_SECONDS`` (and ``CCW_FUZZ_SEED`` for another mutation sequence), or run a
target by hand as targets.py's docstring shows.

Without atheris (no wheel for this Python or machine) the module skips, except under
``CCW_MUST_WORK=1`` where pyproject.toml says atheris is installable here: then it fails.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.fuzz import seeds

ROOT = Path(__file__).resolve().parent.parent
# Read at import: the autouse fixture in conftest.py hides CCW_* variables from tests.
SECONDS = int(os.environ.get("CCW_FUZZ_SECONDS", "20"))
SEED = int(os.environ.get("CCW_FUZZ_SEED", "1"))
MUST_WORK = os.environ.get("CCW_MUST_WORK") == "1"
TARGETS = sorted(seeds.seeds())


def _atheris_installable() -> bool:
    """Whether pyproject.toml's test extras install atheris on this Python and machine."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    for line in extras:
        requirement = Requirement(line)
        if requirement.name == "atheris":
            return requirement.marker is None or requirement.marker.evaluate()
    return False


@dataclass
class FuzzRun:
    """One target's fuzzing process and where it writes."""

    name: str
    process: subprocess.Popen[bytes]
    workdir: Path
    command: list[str]

    @property
    def log(self) -> str:
        return (self.workdir / "log").read_text(errors="replace")

    def crash_input(self) -> bytes | None:
        """The input that crashed the target: ours first (always written), then libFuzzer's."""
        ours = self.workdir / "crash-input"
        if ours.exists():
            return ours.read_bytes()
        for artifact in sorted(self.workdir.glob("artifact-*")):
            return artifact.read_bytes()
        return None


def _start(name: str, workdir: Path) -> FuzzRun:
    corpus = workdir / "corpus"  # new inputs go here, not into the checked-in seeds
    corpus.mkdir(parents=True)
    command = [
        sys.executable, "-m", "tests.fuzz.targets", name,
        f"-max_total_time={SECONDS}",
        f"-seed={SEED}",
        "-timeout=30",  # one input taking this long is a hang, reported like a crash
        "-rss_limit_mb=1024",
        "-print_final_stats=1",
        f"-artifact_prefix={workdir}/artifact-",
        str(corpus),
        str(seeds.CORPUS / name),
    ]
    env = {**os.environ, "CCW_FUZZ_CRASH_FILE": str(workdir / "crash-input")}
    with (workdir / "log").open("wb") as log:  # a file, not a pipe: libFuzzer writes a lot
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return FuzzRun(name, process, workdir, command)


@pytest.fixture(scope="module")
def fuzz_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, FuzzRun]]:
    """Every target started at once; each test waits for its own."""
    if importlib.util.find_spec("atheris") is None:
        if MUST_WORK and _atheris_installable():
            pytest.fail("atheris is not importable but CCW_MUST_WORK=1 and pyproject.toml installs it on this "
                        "Python and machine: run ./dev setup (or .venv/bin/pip install -e '.[test]')")
        pytest.skip("atheris is not installed (no wheel for this Python or machine); "
                    "the hypothesis fuzz tests still run")
    runs = {name: _start(name, tmp_path_factory.mktemp(f"fuzz-{name}")) for name in TARGETS}
    yield runs
    for run in runs.values():
        if run.process.poll() is None:
            run.process.kill()
            run.process.wait()


def _executions(log: str) -> int:
    match = re.search(r"stat::number_of_executed_units: (\d+)", log)
    return int(match.group(1)) if match else 0


@pytest.mark.parametrize("name", TARGETS)
def test_target_survives_its_budget(fuzz_runs: dict[str, FuzzRun], name: str) -> None:
    run = fuzz_runs[name]
    started = time.monotonic()
    try:
        code = run.process.wait(timeout=SECONDS + 90)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: still running {SECONDS + 90} s after a {SECONDS} s budget\n{run.log[-3000:]}")
    log = run.log
    if code != 0:
        crash = run.crash_input()
        replay = " ".join([*run.command[:4], "<the input saved to a file>"])
        pytest.fail(
            f"atheris target {name!r} crashed (exit {code}) on input {crash!r}\n"
            f"replay: {replay}\n--- end of its output ---\n{log[-6000:]}"
        )
    executions = _executions(log)
    assert executions > 0, f"{name}: no inputs were run\n{log[-3000:]}"
    print(f"{name}: {executions} executions (waited {time.monotonic() - started:.1f} s)")


def test_checked_in_corpus_matches_seeds() -> None:
    """tests/fuzz/corpus/ is what seeds.py writes (python -m tests.fuzz.seeds)."""
    on_disk = {
        path.parent.name: sorted(p.read_bytes() for p in path.parent.iterdir())
        for path in seeds.CORPUS.glob("*/seed-00")
    }
    assert on_disk == {name: sorted(inputs) for name, inputs in seeds.seeds().items()}

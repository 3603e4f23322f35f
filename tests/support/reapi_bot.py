"""A test bot: the Remote Workers API session of mcp_server.reapi.worker with a plain-subprocess runner.

It runs actions on the host, with no jail: it exists so that the REAPI client's Execute
path can be tested end to end before ccw-bot (which runs each action in a capsule)
exists.  Never point it at a cluster that others submit to.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from mcp_server.reapi.client import ReapiClient
from mcp_server.reapi.inputs import fetch_input_root, upload_outputs
from mcp_server.reapi.merkle import digest_bytes, key
from mcp_server.reapi.protos import code_pb2, re_pb2
from mcp_server.reapi.worker import BotConfig, BotSession, LeaseOutcome

NO_TIMEOUT_S = 3600.0


def _wait(process: subprocess.Popen[bytes], deadline: float, cancelled: threading.Event) -> tuple[bytes, bytes, str]:
    """stdout, stderr and why it was stopped ("", "timeout", "cancelled")."""
    while True:
        try:
            out, err = process.communicate(timeout=0.05)
            return out, err, ""
        except subprocess.TimeoutExpired:
            why = "cancelled" if cancelled.is_set() else "timeout" if time.monotonic() > deadline else ""
            if why:
                os.killpg(process.pid, signal.SIGKILL)
                out, err = process.communicate()
                return out, err, why


def run_plainly(client: ReapiClient, action: re_pb2.Action, cancelled: threading.Event) -> LeaseOutcome:
    """Fetch the input root into a temporary directory, run the Command there, upload what it left."""
    command = re_pb2.Command.FromString(client.read_blob(action.command_digest))
    timeout_s = action.timeout.ToNanoseconds() / 1e9 if action.HasField("timeout") else NO_TIMEOUT_S
    with tempfile.TemporaryDirectory(prefix="reapi-bot-") as work:
        fetch_input_root(client, action.input_root_digest, Path(work))
        cwd = Path(work) / command.working_directory
        env = {variable.name: variable.value for variable in command.environment_variables}
        with subprocess.Popen(list(command.arguments), cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True) as process:  # fmt: skip
            stdout, stderr, why = _wait(process, time.monotonic() + timeout_s, cancelled)
        result = re_pb2.ActionResult(exit_code=process.returncode,
                                     stdout_digest=digest_bytes(stdout),
                                     stderr_digest=digest_bytes(stderr))  # fmt: skip
        client.upload({key(result.stdout_digest): stdout, key(result.stderr_digest): stderr})
        result.output_files.extend(upload_outputs(client, cwd, command))
    if why == "timeout":
        return LeaseOutcome(result, code_pb2.DEADLINE_EXCEEDED, f"timed out after {timeout_s} s")
    if why == "cancelled":
        return LeaseOutcome(result, code_pb2.CANCELLED, "lease withdrawn")
    return LeaseOutcome(result)


@contextlib.contextmanager
def running_bot(url: str, bot_id: str, capacity: int = 1) -> Iterator[BotSession]:
    """A bot serving ``url`` in a thread until the block ends."""
    stop = threading.Event()
    with ReapiClient(url) as client:
        bot = BotSession(client, BotConfig(bot_id=bot_id, capacity=capacity), run_plainly)
        errors: list[BaseException] = []

        def serve() -> None:
            try:
                bot.serve(stop)
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=serve, name=f"bot-{bot_id}")
        thread.start()
        try:
            yield bot
        finally:
            stop.set()
            thread.join(30)
        assert not thread.is_alive(), "the bot did not stop"
        if errors:
            raise errors[0]

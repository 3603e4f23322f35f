"""Turns taken on arrival, handed to the call (capsules/turns.py, CcwServer.arrive): a tool
whose spec declares a turn gets, on its CallContext, the place the transport took when it
read the request, so pipelined calls on one capsule run in the order they were read
whatever order their handlers start in; a call that never claims its place gives it back."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path
from typing import Any

import trio
import trio.lowlevel
import trio.testing

from mcp_server.capsules import service
from mcp_server.capsules.turns import TakesTurn
from mcp_server.config import Config
from mcp_server.journal import Journal
from mcp_server.server import CcwServer
from mcp_server.state import State
from mcp_server.tools.registry import Registry, ToolSpec
from mcp_server.transports.ndjson import NdjsonConnection
from sandbox.errors import CcwError
from tests.support.journal_rows import capsule_record

ARGS = {"type": "object", "required": ["capsule_id", "n"], "additionalProperties": False,
        "properties": {"capsule_id": {"type": "string"}, "n": {"type": "integer"}}}
RESULT = {"type": "object", "required": ["n", "ticket"], "additionalProperties": False,
          "properties": {"n": {"type": "integer"}, "ticket": {"type": "integer"}}}
TAKES = TakesTurn("step")



def _server(tmp_path: Path, *specs: ToolSpec) -> CcwServer:
    """A server of the "server" toolset offering ``specs`` alone, on a state dir of its own."""
    config = dataclasses.replace(
        Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state"), "CCW_TOOLSETS": "server"}), debug=True)
    registry = Registry()
    for spec in specs:
        registry.add(spec)
    return CcwServer(config, State(config.state_dir), registry)

def make_server(tmp_path: Path, ran: list[tuple[int, int, str]]) -> CcwServer:
    """A server with one tool, ``step``, that takes its capsule's turn and notes who ran when."""

    async def step(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        await trio.lowlevel.checkpoint()  # let the other handlers start: only the places keep the order
        async with ctx.capsule_turn(args["capsule_id"], TAKES.label) as ticket:
            ran.append((args["n"], ticket.number, ticket.label))
            await trio.lowlevel.checkpoint()
        return {"n": args["n"], "ticket": ticket.number}

    return _server(tmp_path, ToolSpec("step", "server", "takes a turn", ARGS, RESULT, step, turn=TAKES))


def serve(server: CcwServer, frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Send ``frames`` in one write on one NDJSON connection; the answers, by id."""

    async def main() -> list[dict[str, Any]]:
        to_server, server_in = trio.testing.memory_stream_one_way_pair()
        server_out, from_server = trio.testing.memory_stream_one_way_pair()
        connection = NdjsonConnection(server, server_in, server_out, trio.Event())
        data = bytearray()

        async def run() -> None:
            await connection.run()
            await server_out.aclose()

        with trio.fail_after(30):  # a place never given back would stall the line for good
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                await to_server.send_all(b"".join(json.dumps(f).encode() + b"\n" for f in frames))
                await to_server.aclose()
                while chunk := await from_server.receive_some():
                    data += chunk
        return [json.loads(line) for line in data.splitlines()]

    return trio.run(main)


def call(request_id: int, capsule_id: str, n: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
            "params": {"name": "step", "arguments": {"capsule_id": capsule_id, "n": n}}}


HANDSHAKE = [
    {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}},
    {"jsonrpc": "2.0", "method": "notifications/initialized"},
]


def test_pipelined_mcp_calls_claim_the_places_taken_as_they_were_read(tmp_path: Path) -> None:
    ran: list[tuple[int, int, str]] = []
    server = make_server(tmp_path, ran)
    # Call 3 has bad arguments: its place is given back, so the calls after it still run.
    frames = [*HANDSHAKE, *(call(n, "cap", n if n != 3 else "three") for n in range(1, 9))]
    answers = {a["id"]: a for a in serve(server, frames)}
    assert answers[3]["result"]["structuredContent"]["error"]["code"] == "INVALID_ARGUMENT"  # a 2025-11-25 session
    good = [n for n in range(1, 9) if n != 3]
    # Each ran in its arrival place (ticket n: read n-th), in the order read.
    assert ran == [(n, n, "step") for n in good]
    assert [answers[n]["result"]["structuredContent"] for n in good] == [{"n": n, "ticket": n} for n in good]
    assert server.runtime.capsule_queue.line("cap") == []


def test_direct_methods_take_their_place_as_they_are_read_too(tmp_path: Path) -> None:
    ran: list[tuple[int, int, str]] = []
    server = make_server(tmp_path, ran)
    frames = [{"jsonrpc": "2.0", "id": n, "method": "step", "params": {"capsule_id": "cap", "n": n}}
              for n in range(1, 5)]
    frames.insert(2, {"jsonrpc": "2.0", "id": 99, "method": "step", "params": {"capsule_id": "cap"}})
    answers = {a["id"]: a for a in serve(server, frames)}
    assert answers[99]["error"]["code"] == -32602  # took place 3 and gave it back unclaimed
    assert ran == [(1, 1, "step"), (2, 2, "step"), (3, 4, "step"), (4, 5, "step")]
    assert server.runtime.capsule_queue.line("cap") == []


def test_a_tool_without_a_turn_or_a_call_naming_no_capsule_takes_no_place(tmp_path: Path) -> None:
    server = make_server(tmp_path, [])
    assert server.arrive("tools/call", {"name": "step", "arguments": {"n": 1}}) is None
    assert server.arrive("tools/call", {"name": "nope", "arguments": {"capsule_id": "cap"}}) is None
    assert server.arrive("tools/list", {}) is None
    ticket = server.arrive("step", {"capsule_id": "cap", "n": 1})
    assert ticket is not None and ticket.capsule_id == "cap" and ticket.label == "step"
    second = server.arrive("tools/call", {"name": "step", "arguments": {"capsule_id": "cap", "n": 2}})
    assert server.runtime.capsule_queue.line("cap") == [ticket, second]
    for taken in (ticket, second, None):
        server.runtime.capsule_queue.give_back(taken)
    assert server.runtime.capsule_queue.line("cap") == []


def test_the_capsule_tools_declare_their_turns() -> None:
    registry = Registry.load(["capsule", "promote", "deltamin", "witness"])
    turns = {spec.name: spec.turn.label_of({"cmd": ["make", "-j2"]}) for spec in registry.tools if spec.turn}
    assert turns == {"capsule_exec": "exec `make -j2`", "capsule_fork": "fork", "capsule_destroy": "destroy",
                     "capsule_promote": "promote", "capsule_deltamin": "deltamin (reading the change)",
                     "capsule_witness": "witness", "capsule_service_start": "service start `make -j2`",
                     "capsule_service_stop": "service stop", "capsule_service_logs": "service logs",
                     "capsule_race": "exec `make -j2`", "capsule_merge": "merge", "capsule_port": "port"}
    several = {spec.name: spec.turn.capsules_of({"capsule_ids": ["a", "b", "a"]})
               for spec in registry.tools if spec.turn and spec.turn.capsules_arg}
    assert several == {"capsule_race": ["a", "b"], "capsule_merge": ["a", "b"]}
    for name in ("capsule_service_stop", "capsule_service_logs"):  # logs: found pipelined after a start, NOT_FOUND
        spec = registry.lookup(name)
        assert spec is not None and spec.turn is not None and spec.turn.follows == "service start", name


def test_a_call_over_several_capsules_keeps_its_place_in_each_line_from_arrival(tmp_path: Path) -> None:
    # Found in a trial: a race of F1 and F2, then an exec in F1, pipelined: the exec ran first
    # (the race took its places only when its handler asked) and the race saw the exec's write.
    ran: list[tuple[int, int, str]] = []
    server = make_server(tmp_path, ran)
    schema = {"type": "object", "required": ["capsule_ids", "n"], "additionalProperties": False,
              "properties": {"capsule_ids": {"type": "array", "items": {"type": "string"}}, "n": {"type": "integer"}}}

    async def several(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        for _ in range(5):  # the calls read after it start their handlers first
            await trio.lowlevel.checkpoint()
        for capsule_id in args["capsule_ids"][:2]:  # the third is never claimed: given back with the answer
            async with ctx.capsule_turn(capsule_id, "several") as ticket:
                ran.append((args["n"], ticket.number, capsule_id))
        return {"n": args["n"], "ticket": 0}

    server.tools.registry.add(ToolSpec("several", "server", "takes several turns", schema, RESULT, several,
                                       turn=TakesTurn("several", capsules_arg="capsule_ids")))
    frames = [*HANDSHAKE, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "several", "arguments": {"capsule_ids": ["b", "a", "c"], "n": 1}}},
              call(2, "a", 2), call(3, "b", 3), call(4, "c", 4)]
    answers = {a["id"]: a for a in serve(server, frames)}
    assert sorted(answers) == [0, 1, 2, 3, 4]
    # Places 1-3 are the race's (b, a, c, as named), 4-6 the steps'.
    assert sorted((n, number, name) for n, number, name in ran) == [
        (1, 1, "b"), (1, 2, "a"), (2, 4, "step"), (3, 5, "step"), (4, 6, "step")]
    assert ran.index((1, 2, "a")) < ran.index((2, 4, "step")) and ran.index((1, 1, "b")) < ran.index((3, 5, "step"))
    assert [server.runtime.capsule_queue.line(one) for one in "abc"] == [[], [], []]


NAMED = {"type": "object", "required": ["capsule_id", "name"], "additionalProperties": False,
         "properties": {"capsule_id": {"type": "string"}, "name": {"type": "string"}}}
START = TakesTurn("start", subject_arg="name")
STOP = TakesTurn("stop", subject_arg="name", follows=START.label)


def test_a_stop_follows_the_start_of_its_service_sent_before_it_and_nothing_else(tmp_path: Path) -> None:
    # Found in a developer's trial: start w1 (queued behind another start), an exec against it,
    # then stop w1, pipelined: the stop, taking no turn, ran first and said w1 was unknown; w1
    # kept running.  Following only the start, it stopped w1 under the exec.
    ran: list[str] = []
    stops_ran = trio.Event()

    async def hold(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        async with ctx.capsule_turn(args["capsule_id"], "hold"):
            with trio.fail_after(5):  # the stops of other services, and of one not yet started, need no turn
                await stops_ran.wait()
            ran.append("hold")
        return {"n": 0, "ticket": 0}

    async def start(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        async with ctx.capsule_turn(args["capsule_id"], START.label) as ticket:
            ran.append(f"start {args['name']}")
            await trio.sleep(0.05)  # a run that takes a while: a stop that does not wait comes in between
            ran.append(f"end {args['name']}")
        return {"n": 0, "ticket": ticket.number}

    async def stop(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        await ctx.follow()
        ran.append(f"stop {args['name']}")
        if {"stop b", "stop c"} <= set(ran):
            stops_ran.set()
        return {"n": 0, "ticket": 0}

    server = _server(
        tmp_path,
        ToolSpec("hold", "server", "holds the turn", NAMED, RESULT, hold, turn=TakesTurn("hold")),
        ToolSpec("start", "server", "a service's start", NAMED, RESULT, start, turn=START),
        ToolSpec("stop", "server", "a service's stop", NAMED, RESULT, stop, turn=STOP))

    def named(request_id: int, tool: str, name: str) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call",
                "params": {"name": tool, "arguments": {"capsule_id": "cap", "name": name}}}

    # 3: a test run against a, sent between its start and its stop: the stop waits for it too.
    frames = [*HANDSHAKE, named(1, "hold", "-"), named(2, "start", "a"), named(3, "start", "tests"),
              named(4, "stop", "a"), named(5, "stop", "b"), named(6, "stop", "c"), named(7, "start", "c")]
    answers = {a["id"]: a for a in serve(server, frames)}
    assert all("error" not in answers[n] and not answers[n]["result"].get("isError") for n in range(1, 8)), answers
    assert set(ran[:2]) == {"stop b", "stop c"}  # c's start came after its stop: not waited for
    assert ran[2:] == ["hold", "start a", "end a", "start tests", "end tests", "stop a", "start c", "end c"]
    assert server.runtime.capsule_queue.line("cap") == []


def test_a_log_read_follows_the_start_of_its_service_sent_before_it_but_no_run_after_that(tmp_path: Path) -> None:
    # Found in a trial: start web then logs web, pipelined: the logs, taking no turn, were read
    # before the start had made the service, and answered NOT_FOUND.  Waiting for the calls
    # between the two as a stop does would hold a log read behind a test run.
    ran: list[str] = []
    read = trio.Event()

    async def start(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        async with ctx.capsule_turn(args["capsule_id"], START.label):
            ran.append(f"start {args['name']}")
            if args["name"] == "tests":  # a run against the service that ends only once the log was read
                with trio.fail_after(5):
                    await read.wait()
            await trio.sleep(0.05)
            ran.append(f"end {args['name']}")
        return {"n": 0, "ticket": 0}

    async def logs(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        await ctx.follow(through=False)
        ran.append(f"logs {args['name']}")
        read.set()
        return {"n": 0, "ticket": 0}

    server = _server(
        tmp_path,
        ToolSpec("start", "server", "a service's start", NAMED, RESULT, start, turn=START),
        ToolSpec("logs", "server", "a service's logs", NAMED, RESULT, logs,
                 turn=TakesTurn("logs", subject_arg="name", follows=START.label)))
    sent = [("start", "web"), ("start", "tests"), ("logs", "web")]
    frames = [*HANDSHAKE, *({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                             "params": {"name": tool, "arguments": {"capsule_id": "cap", "name": name}}}
                            for n, (tool, name) in enumerate(sent, 1))]
    answers = {a["id"]: a for a in serve(server, frames)}
    assert all(not answers[n]["result"].get("isError") for n in range(1, 4)), answers
    # Once web's start has answered, the log read and the test run go on together.
    assert ran[:2] == ["start web", "end web"] and ran[-1] == "end tests"
    assert sorted(ran[2:4]) == ["logs web", "start tests"]
    assert server.runtime.capsule_queue.line("cap") == []


def test_a_forks_destroy_holds_its_parents_line_until_it_has_answered(tmp_path: Path) -> None:
    # Found in a trial: destroy F then destroy P (F's parent), pipelined: P's destroy, in a line
    # of its own, reached the helper while F's destroy was still stopping F's services, and was
    # refused "has forks".
    ran: list[str] = []
    destroy = TakesTurn("destroy", parent_too=True)
    assert Registry.load(["capsule"]).lookup("capsule_destroy").turn == service.DESTROY == destroy

    async def destroy_tool(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        async with ctx.capsule_turn(args["capsule_id"], destroy.label) as ticket:
            if args["capsule_id"] == "P" and "F" not in ran:
                raise CcwError("CONFLICT", "capsule P has forks ['F']; destroy them first")
            await trio.sleep(0.05)  # its services stopping
            ran.append(args["capsule_id"])
        return {"n": args["n"], "ticket": ticket.number}

    server = _server(
        tmp_path,
        ToolSpec("destroy", "server", "a capsule's destroy", ARGS, RESULT, destroy_tool, turn=destroy))
    journal = Journal(server.state)
    journal.add_capsule(capsule_record("P"))
    journal.add_capsule(dataclasses.replace(capsule_record("F"), parent="P"))
    frames = [*HANDSHAKE, *({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                             "params": {"name": "destroy", "arguments": {"capsule_id": one, "n": n}}}
                            for n, one in enumerate("FP", 1))]
    answers = {a["id"]: a for a in serve(server, frames)}
    assert all(not answers[n]["result"].get("isError") for n in (1, 2)), answers
    assert ran == ["F", "P"]
    assert server.runtime.capsule_queue.line("P") == server.runtime.capsule_queue.line("F") == []


def test_a_merged_capsules_destroy_holds_each_inputs_line_until_it_has_answered(tmp_path: Path) -> None:
    # A merged capsule stacks its inputs' layers, which freezes them all: an exec sent to the
    # second input after the merged capsule's destroy must wait for that destroy, not be
    # refused "has forks or merged capsules stacked on it".
    ran: list[str] = []
    destroy = service.DESTROY

    async def tool(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        label = destroy.label if args["capsule_id"] == "M" else "exec"
        async with ctx.capsule_turn(args["capsule_id"], label) as ticket:
            if args["capsule_id"] == "B" and "M" not in ran:
                raise CcwError("CONFLICT", "capsule B has forks or merged capsules stacked on it ['M']")
            await trio.sleep(0.05)
            ran.append(args["capsule_id"])
        return {"n": args["n"], "ticket": ticket.number}

    server = _server(
        tmp_path,
        ToolSpec("destroy", "server", "a capsule's destroy", ARGS, RESULT, tool, turn=destroy),
        ToolSpec("exec", "server", "a capsule's exec", ARGS, RESULT, tool, turn=TakesTurn("exec")))
    journal = Journal(server.state)
    for one in "PAB":
        journal.add_capsule(dataclasses.replace(capsule_record(one), parent="P" if one != "P" else None))
    journal.add_capsule(dataclasses.replace(capsule_record("M"), parent="A"))
    journal.add_writes("M", [("x.txt", "write", b"x", None, 0o644, None)], merged_from=["A", "B"])
    frames = [*HANDSHAKE, *({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                             "params": {"name": name, "arguments": {"capsule_id": one, "n": n}}}
                            for n, (name, one) in enumerate((("destroy", "M"), ("exec", "B")), 1))]
    answers = {a["id"]: a for a in serve(server, frames)}
    assert all(not answers[n]["result"].get("isError") for n in (1, 2)), answers
    assert ran == ["M", "B"]


def test_a_run_answered_running_keeps_its_unclaimed_places_until_it_ends(tmp_path: Path) -> None:
    # Found in a trial: a race of 3 capsules on 2 cores answered "running" after wait_ms, and the
    # transport gave back its place in the third capsule's line (not claimed yet: waiting for a
    # core), so an exec sent there after the answer ran first and the race saw its write.
    ran: list[tuple[int, int, str]] = []
    ended = trio.Event()
    server = make_server(tmp_path, ran)
    schema = {"type": "object", "required": ["capsule_ids"], "additionalProperties": False,
              "properties": {"capsule_ids": {"type": "array", "items": {"type": "string"}}}}

    async def racing(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        async def body(run: Any) -> dict[str, Any]:
            in_run = ctx.for_run(run)
            for capsule_id in args["capsule_ids"]:  # one core: each capsule's turn claimed when the last ended
                async with in_run.capsule_turn(capsule_id, "race"):
                    await trio.sleep(0.2)
                    ran.append((1, 0, f"race {capsule_id}"))
            ended.set()
            return {"n": 0, "ticket": 0}

        return await ctx.runs.call("racing", None, body, 0, ctx.progress)

    server.tools.registry.add(ToolSpec("racing", "server", "a run over several capsules", schema,
                                       {"type": "object"}, racing,
                                       turn=TakesTurn("race", capsules_arg="capsule_ids")))

    async def main() -> dict[str, Any]:
        to_server, server_in = trio.testing.memory_stream_one_way_pair()
        server_out, from_server = trio.testing.memory_stream_one_way_pair()
        connection = NdjsonConnection(server, server_in, server_out, trio.Event())
        answers: dict[int, dict[str, Any]] = {}
        got = trio.lowlevel.ParkingLot()

        async def run() -> None:
            await connection.run()
            await server_out.aclose()

        async def send(*frames: dict[str, Any]) -> None:
            await to_server.send_all(b"".join(json.dumps(f).encode() + b"\n" for f in frames))

        async def read() -> None:
            data = b""
            while chunk := await from_server.receive_some():
                data += chunk
                *lines, data = data.split(b"\n")
                for line in lines:
                    answer = json.loads(line)
                    answers[answer["id"]] = answer
                    got.unpark_all()

        async def answer(request_id: int) -> dict[str, Any]:
            while request_id not in answers:
                await got.park()
            return answers[request_id]

        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run)
                nursery.start_soon(read)
                await send(*HANDSHAKE, {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                    "name": "racing", "arguments": {"capsule_ids": ["a", "b", "c"]}}})
                running = (await answer(1))["result"]["structuredContent"]
                assert running["status"] == "running", running
                assert [len(server.runtime.capsule_queue.line(one)) for one in "abc"] == [1, 1, 1]
                await send(call(2, "c", 2))  # sent after the answer, as an agent would
                stepped = (await answer(2))["result"]["structuredContent"]
                await ended.wait()
                await to_server.aclose()
        return stepped

    stepped = trio.run(main)
    assert stepped == {"n": 2, "ticket": 4}  # the race's places were 1-3
    assert ran == [(1, 0, "race a"), (1, 0, "race b"), (1, 0, "race c"), (2, 4, "step")]
    assert [server.runtime.capsule_queue.line(one) for one in "abc"] == [[], [], []]


class _SlowPorts:
    """Forwards as capsules/ports.py's ``Ports`` keeps them: a look for the port's forward, then
    a wait (the helper's sockets, the program's start), then the forward made or closed."""

    def __init__(self) -> None:
        self.open_ports: dict[int, int] = {}  # capsule port: host port
        self.made: list[tuple[int, int]] = []  # every forward made: (capsule port, host port)
        self._free = itertools.count(41000)  # the kernel's pick for host port 0
        self.busy: set[int] = set()
        self.overlapped: list[int] = []

    async def _step(self, port: int) -> None:
        if port in self.busy:
            self.overlapped.append(port)
        self.busy.add(port)
        await trio.sleep(0.02)
        self.busy.discard(port)

    async def open(self, capsule_id: str, port: int, host_port: int = 0) -> dict[str, Any]:
        if port not in self.open_ports:
            await self._step(port)
            self.open_ports[port] = host_port or next(self._free)
            self.made.append((port, self.open_ports[port]))
        url = f"http://127.0.0.1:{self.open_ports[port]}/"
        return {"capsule_id": capsule_id, "port": port, "host_port": self.open_ports[port], "url": url, "open": True}

    async def close(self, capsule_id: str, port: int) -> dict[str, Any]:
        host_port = self.open_ports.pop(port)
        await self._step(port)
        url = f"http://127.0.0.1:{host_port}/"
        return {"capsule_id": capsule_id, "port": port, "host_port": host_port, "url": url, "open": False}


def test_a_ports_opens_and_closes_sent_together_run_one_after_the_other(tmp_path: Path) -> None:
    # Found in a trial: capsule_port 9100 sent three times at once made two forwards (two
    # ccw-forward programs on two host ports), of which the listing and a close knew one; a
    # close then an open of the same host port answered CONFLICT "in use by another program",
    # the close's program still holding it.  Another port's forward waits for none of them.
    config = dataclasses.replace(
        Config.from_env({"CCW_STATE_DIR": str(tmp_path / "state"), "CCW_TOOLSETS": "capsule"}), debug=True)
    server = CcwServer(config, State(config.state_dir), Registry.load(["capsule"]))
    Journal(server.state).add_capsule(capsule_record("cap_1"))
    ports = _SlowPorts()
    server.runtime.services.ports = ports  # type: ignore[assignment]
    sent = [{"port": 9100}, {"port": 9100}, {"port": 9100}, {"port": 9100, "close": True},
            {"port": 9100, "host_port": 40000}, {"port": 9200}]
    frames = [*HANDSHAKE, *({"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {
        "name": "capsule_port", "arguments": {"capsule_id": "cap_1", **args}}} for n, args in enumerate(sent, 1))]
    answers = {a["id"]: a["result"] for a in serve(server, frames)}
    assert not any(answers[n].get("isError") for n in range(1, 7)), answers
    first = answers[1]["structuredContent"]["host_port"]
    assert [answers[n]["structuredContent"]["host_port"] for n in range(1, 6)] == [first] * 4 + [40000]
    assert [made for made in ports.made if made[0] == 9100] == [(9100, first), (9100, 40000)]
    assert ports.overlapped == [] and sorted(ports.open_ports) == [9100, 9200] and ports.open_ports[9100] == 40000
    assert server.runtime.capsule_queue.line("cap_1") == []


def test_a_ports_forward_follows_the_service_starts_sent_before_it(tmp_path: Path) -> None:
    # Found in a trial: start postgres, run the tests, forward 5432, pipelined: the forward,
    # waiting for nothing, answered "nothing listens on port 5432" before the start had made
    # the server (and so took no kernel path until the next listing).  It waits for the starts
    # sent before it alone: not for the test run between.
    ran: list[str] = []
    forwarded = trio.Event()

    async def start(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        async with ctx.capsule_turn(args["capsule_id"], START.label):
            ran.append(f"start {args['name']}")
            await trio.sleep(0.05)
            ran.append(f"end {args['name']}")
        return {"n": 0, "ticket": 0}

    async def run(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        async with ctx.capsule_turn(args["capsule_id"], "exec"):
            ran.append("tests")
            with trio.fail_after(5):
                await forwarded.wait()  # ends only once the forward has answered
        return {"n": 0, "ticket": 0}

    async def port(ctx: Any, args: dict[str, Any]) -> dict[str, Any]:
        await ctx.follow(through=False)
        ran.append("port")
        forwarded.set()
        return {"n": 0, "ticket": 0}

    server = _server(
        tmp_path,
        ToolSpec("start", "server", "a service's start", NAMED, RESULT, start, turn=START),
        ToolSpec("run", "server", "a test run", NAMED, RESULT, run, turn=TakesTurn("exec")),
        ToolSpec("port", "server", "a forward", NAMED, RESULT, port,
                 turn=TakesTurn("port", subject_arg="name", follows="port", follows_any=START.label)))
    sent = [("start", {"name": "db"}), ("run", {"name": "tests"}), ("port", {"name": "5432"})]
    frames = [*HANDSHAKE, *({"jsonrpc": "2.0", "id": n, "method": "tools/call",
                             "params": {"name": tool, "arguments": {"capsule_id": "cap", **args}}}
                            for n, (tool, args) in enumerate(sent, 1))]
    answers = {a["id"]: a for a in serve(server, frames)}
    assert all(not answers[n]["result"].get("isError") for n in range(1, 4)), answers
    assert ran[:2] == ["start db", "end db"] and sorted(ran[2:]) == ["port", "tests"], ran
    assert server.runtime.capsule_queue.line("cap") == []

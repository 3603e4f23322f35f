"""What the front end does with a miss that a capsule's rules say to ask about (issue 37).

A capsule made with ``network: {..., "on_miss": "ask"}`` holds a connection no rule
allows at the proxy's gate (egress/session.py ``consider``) and calls ``Asking`` here:

1. A question is asked (capsules/asks.py): a new one, or the one already pending for the
   same host, port and protocol.  Past the bounds it is refused at once, and the
   connection is denied with that refusal's text.
2. The person is asked every way there is, at once: the MCP client that started the exec
   through an elicitation form, if it declared it (capsules/asker.py; a service's
   connections have no client to ask), and whoever looks at ``ccw net pending`` or
   ``ccw ui``.  The first answer wins; the question's row holds it, with who gave it.
3. ``allow for this capsule`` adds the rule to the capsule's live rules here, through
   the one way rules change (capsules/netlive.py ``change_rules``), named after who
   answered; ``allow once`` lets this connection through and changes nothing.
4. Past the question's time, or when nobody could be asked, it is denied, and the
   denial says how to allow it (``ccw capsule net CAP allow host:port``).

The connection's record keeps the answer (``asked``: the question's id, the answer, who).
An allowed connection is still judged by ``core/netspace.py`` when it connects, by the
rule the person allowed (``host:port``): a name allowed this way reaches no loopback,
host or private address, as any name rule.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import trio

from mcp_server.capsules import asks, netlive
from mcp_server.capsules.asker import Asker
from mcp_server.capsules.networks import Networks
from mcp_server.egress.relay import Attempt
from mcp_server.egress.session import Asked
from mcp_server.state import State
from sandbox.errors import CcwError

log = logging.getLogger("ccw.egress")


@dataclass
class Asking:
    """Asks a person about a capsule's misses: made by the Runtime, given to its Networks."""

    state: State
    networks: Networks
    # The exec running in each capsule now: its client (None: none to elicit) and argv.
    execs: dict[str, tuple[Asker | None, Sequence[str]]] = field(default_factory=dict)

    async def __call__(self, capsule_id: str, attempt: Attempt, service: str | None, timeout_s: float) -> Asked:
        """The person's answer about ``attempt`` (of ``service``, or of the exec running)."""
        asker, command = (None, (f"service {service}",)) if service else self.execs.get(capsule_id, (None, ()))
        try:
            question = asks.ask(self.state, capsule_id, attempt.host, attempt.port, attempt.protocol, command,
                                timeout_s)
        except CcwError as exc:  # too many pending: denied at once, saying so
            return Asked(False, None, exc.message, {"answer": "not asked", "why": exc.message})
        async with trio.open_nursery() as nursery:
            if asker is not None and asker.can_elicit():
                nursery.start_soon(self._elicit, asker, question)
            settled = await asks.wait(self.state, question)
            nursery.cancel_scope.cancel()  # an elicitation still open: its answer would come too late
        if settled.state == "capsule":
            try:
                await netlive.change_rules(self.networks, self.state, capsule_id, settled.who or "a person",
                                           allow=[settled.rule], asked={"allow": [settled.rule],
                                                                        "question": settled.id})
            except CcwError as exc:  # the capsule went, or its rules cannot take it: this one still passes
                log.warning("egress: adding %s to %s's rules after question %s failed: %s", settled.rule,
                            capsule_id, settled.id, exc.message)
        record: dict[str, object] = {"question": settled.id, "answer": settled.state, "who": settled.who}
        if settled.reason:
            record["reason"] = settled.reason
        return Asked(settled.allowed, settled.rule if settled.allowed else None,
                     None if settled.allowed else settled.refusal(), record)

    async def _elicit(self, asker: Asker, question: asks.Question) -> None:
        answer = await asker.ask(question)
        if answer is None:
            return
        verdict, reason = answer
        try:
            asks.answer(self.state, question.id, verdict, asker.who(), reason)
        except CcwError:
            pass  # answered another way first, or expired: the first answer stands

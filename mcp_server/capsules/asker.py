"""Asking a person through the MCP client that started a run (issue 37, "ask on a miss").

When a connection of a run waits on a question (capsules/asks.py) and the client that
asked for the run declared form elicitation, the front end sends it an
``elicitation/create`` form about the connection, tied to the tool call that started the
run (``related_request_id``, so the client shows it beside that call).  The answer is
written into the question like any other (``asks.answer``): a person at ``ccw net`` or
``ccw ui`` may answer first, and the first answer wins.

- **The form.**  One choice (allow once, allow for this capsule, deny) and a reason for
  the agent.  The message says plainly which parts a capsule chose: the host and the
  command are the jail's text, bounded and single-line by ``asks``; a client shows the
  message to a person, never runs it.
- **What counts as an answer.**  ``accept`` with a choice is the person's answer;
  ``decline`` is a denial ("declined in the MCP client"); ``cancel`` (the form dismissed)
  and a client error are no answer: the question waits for another way, or its time.
- **Who.**  ``uid N (MCP client NAME, elicitation)``: the front end's uid (the state dir's
  user, as for every stdio or socket client) and the name the client gave at
  initialize, which the client chose; the journal keeps it as said, as a label.
- The client that started the run is the one asked, never another: a question is about
  that run, and another client may be another agent.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from mcp_server.capsules.asks import Question

log = logging.getLogger("ccw.egress")

CHOICES = {"allow once": "once", "allow for this capsule": "capsule", "deny": "denied"}
FORM: dict[str, Any] = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "title": "Answer", "enum": list(CHOICES),
                   "description": "allow this connection once, allow the host for this capsule from now on, or deny"},
        "reason": {"type": "string", "title": "Reason", "maxLength": 256,
                   "description": "for a denial: what the agent is told"},
    },
    "required": ["answer"],
}


@dataclass(frozen=True)
class Asker:
    """The MCP client session of a run's tool call, and that call's request id."""

    session: Any
    request_id: Any = None

    def can_elicit(self) -> bool:
        """Whether the client declared form elicitation (a bare ``elicitation: {}`` means form)."""
        capabilities = getattr(self.session, "client_capabilities", None)
        elicitation = getattr(capabilities, "elicitation", None)
        if elicitation is None or not getattr(self.session, "can_send_request", True):
            return False
        return getattr(elicitation, "form", None) is not None or getattr(elicitation, "url", None) is None

    def who(self) -> str:
        """The answer's ``who``: this uid and the client's own name for itself."""
        params = getattr(self.session, "client_params", None)
        info = getattr(params, "client_info", None) or getattr(params, "clientInfo", None)
        name = getattr(info, "name", None) or "unnamed"
        return f"uid {os.getuid()} (MCP client {name}, elicitation)"

    async def ask(self, question: Question) -> tuple[str, str | None] | None:
        """The person's answer through the client, as (verdict, reason); None: no answer."""
        try:
            result = await self.session.elicit_form(message(question), FORM, related_request_id=self.request_id)
        except Exception as exc:  # the client refused or broke: no answer from here
            log.info("egress: asking the MCP client about %s failed: %s", question.rule, exc)
            return None
        if result.action == "decline":
            return "denied", "declined in the MCP client"
        if result.action != "accept" or not result.content:
            return None
        verdict = CHOICES.get(str(result.content.get("answer")))
        if verdict is None:
            return None
        reason = result.content.get("reason")
        return verdict, reason if isinstance(reason, str) and reason.strip() else None


def message(question: Question) -> str:
    """The form's text: what waits, and which of it the capsule chose."""
    return (f"A command in capsule {question.capsule_id} wants to connect to {question.rule} "
            f"({question.protocol}), which its rules do not allow. It waits for your answer until "
            f"{question.expires_at}. The host and the command are the capsule's own text: "
            f"command: {question.command}")

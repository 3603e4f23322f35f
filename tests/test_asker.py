"""mcp_server/capsules/asker.py: a run's question asked through the MCP client that started
it (an elicitation form), and what its answers mean; a fake session stands for the SDK's."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import mcp_types as types
import trio

from mcp_server.capsules import asks
from mcp_server.capsules.asker import FORM, Asker, message
from mcp_server.state import State

FORM_MODE = types.ElicitationCapability()  # `elicitation: {}`


class Client:
    """A session whose client answers each form with the next of ``answers``."""

    def __init__(self, answers: list[Any], elicitation: Any = FORM_MODE, name: str = "tester") -> None:
        self.answers = answers
        self.asked: list[tuple[str, dict[str, Any], Any]] = []
        self.client_capabilities = types.ClientCapabilities(elicitation=elicitation)
        self.client_params = SimpleNamespace(client_info=types.Implementation(name=name, version="1"))
        self.can_send_request = True

    async def elicit_form(self, text: str, schema: dict[str, Any], related_request_id: Any = None) -> Any:
        self.asked.append((text, schema, related_request_id))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def _question(tmp_path: Path) -> asks.Question:
    return asks.ask(State(tmp_path), "cap_a", "files.pythonhosted.org", 443, "https", ["pip", "install", "flask"], 30)


def test_the_form_is_a_valid_flat_schema_and_its_message_says_what_the_capsule_chose(tmp_path: Path) -> None:
    jsonschema.Draft202012Validator.check_schema(FORM)
    assert all(p["type"] == "string" for p in FORM["properties"].values())  # elicitation: primitives only
    text = message(_question(tmp_path))
    assert "capsule cap_a" in text and "files.pythonhosted.org:443" in text and "command: pip install flask" in text
    assert "the capsule's own text" in text


def test_each_answer_means_what_it_says(tmp_path: Path) -> None:
    question = _question(tmp_path)
    accept = [types.ElicitResult(action="accept", content={"answer": a, "reason": r}) for a, r in
              (("allow once", ""), ("allow for this capsule", None), ("deny", "not this host"), ("maybe", None))]
    client = Client([*accept, types.ElicitResult(action="decline"), types.ElicitResult(action="cancel"),
                     RuntimeError("client gone")])
    asker = Asker(client, request_id=7)

    async def main() -> list[Any]:
        return [await asker.ask(question) for _ in range(7)]

    assert trio.run(main) == [("once", None), ("capsule", None), ("denied", "not this host"), None,
                              ("denied", "declined in the MCP client"), None, None]
    assert {related for _, _, related in client.asked} == {7}  # tied to the run's tool call


def test_only_a_client_that_declared_elicitation_is_asked() -> None:
    assert Asker(Client([])).can_elicit()  # `elicitation: {}`: form, as before modes
    assert Asker(Client([], types.ElicitationCapability(form=types.FormElicitationCapability()))).can_elicit()
    assert not Asker(Client([], types.ElicitationCapability(url=types.UrlElicitationCapability()))).can_elicit()
    assert not Asker(Client([], None)).can_elicit()
    assert not Asker(None).can_elicit()
    assert Asker(Client([], name="Claude Code")).who().endswith("(MCP client Claude Code, elicitation)")

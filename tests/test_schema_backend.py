"""populate_backend against a real HTTP server on 127.0.0.1: success, 4xx, 5xx, timeout, refused."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio

from mcp_server.config import Config
from mcp_server.tools import schema as schema_tools
from mcp_server.tools import schema_backend as backend

FIXTURES = Path(__file__).parent / "schema_fixtures"
SPEC = next(spec for spec in schema_tools.TOOLS if spec.name == "populate_backend")


class Backend(ThreadingHTTPServer):
    daemon_threads = True
    requests: list[tuple[str, Any]]
    release: threading.Event


class Handler(BaseHTTPRequestHandler):
    server: Backend

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:
            pass  # the client gave up (timeout test)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.server.requests.append((self.path, json.loads(self.rfile.read(length))))
        mode = self.path.split("/")[1]
        if mode == "ok":
            self._answer(201, b'{"id": 42, "name": "stored"}')
        elif mode == "noid":
            self._answer(200, b'{"stored": true}')
        elif mode == "bad":
            self._answer(422, b'{"detail": "name must be unique"}')
        elif mode == "fail":
            self._answer(500, b"internal error", "text/plain")
        elif mode == "slow":
            self.server.release.wait(10)
            self._answer(201, b'{"id": 1}')


@pytest.fixture
def server() -> Iterator[Backend]:
    httpd = Backend(("127.0.0.1", 0), Handler)
    httpd.requests = []
    httpd.release = threading.Event()
    thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.release.set()
        httpd.shutdown()
        httpd.server_close()
        thread.join()


class Ctx:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.state = None

    def log(self, message: str) -> None:
        pass


def populate(url: str, args: dict[str, Any]) -> dict[str, Any]:
    ctx = Ctx(Config.from_env({"CCW_SCHEMAS_DIR": str(FIXTURES / "jsonschema"), "SYN_BACKEND_URL": url}))
    result = trio.run(SPEC.handler, ctx, args)  # type: ignore[arg-type]
    jsonschema.Draft202012Validator(SPEC.output_schema).validate(result)
    return result


def base(server: Backend, mode: str) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/{mode}"


ASSET = {"$schemaRef": "jsonschema/synesthetic-asset.schema.json", "name": "circle"}


def test_success_posts_once_to_the_assets_path(server: Backend) -> None:
    url = base(server, "ok")
    assert populate(url, {"asset": ASSET}) == {"ok": True, "asset_id": "42", "backend_url": url}
    assert server.requests == [("/ok/synesthetic-assets/", ASSET)]


def test_assets_path_is_overridable(server: Backend) -> None:
    ctx = Ctx(Config.from_env({"CCW_BACKEND_URL": base(server, "ok") + "/", "SYN_BACKEND_ASSETS_PATH": "v2/assets"}))
    result = trio.run(SPEC.handler, ctx, {"asset": {"name": "x"}, "validate_first": False})  # type: ignore[arg-type]
    assert result["ok"] is True
    assert server.requests == [("/ok/v2/assets", {"name": "x"})]


def test_invalid_asset_is_not_posted(server: Backend) -> None:
    result = populate(base(server, "ok"), {"asset": {"name": ""}, "schema": "synesthetic-asset"})
    assert result == {"ok": False, "reason": "validation_failed",
                      "errors": [{"path": "/name", "msg": "'' should be non-empty"}]}
    no_schema = populate(base(server, "ok"), {"asset": {"name": "x"}})
    assert no_schema["reason"] == "validation_failed" and "schema is required" in no_schema["errors"][0]["msg"]
    assert server.requests == []
    skipped = populate(base(server, "ok"), {"asset": {"name": ""}, "validate_first": False})
    assert skipped["ok"] is True and len(server.requests) == 1


def test_client_error_carries_status_and_detail(server: Backend) -> None:
    assert populate(base(server, "bad"), {"asset": ASSET}) == {
        "ok": False, "reason": "backend_error", "status": 422, "detail": "name must be unique",
    }


def test_server_error_is_not_retried(server: Backend) -> None:
    assert populate(base(server, "fail"), {"asset": ASSET}) == {
        "ok": False, "reason": "backend_error", "status": 500, "detail": "internal error",
    }
    assert len(server.requests) == 1


def test_answer_without_an_id_is_a_backend_error(server: Backend) -> None:
    result = populate(base(server, "noid"), {"asset": ASSET})
    assert result["reason"] == "backend_error" and result["status"] == 200


def test_timeout(server: Backend) -> None:
    # The tool uses backend.BACKEND_TIMEOUT_S (5 s); the core function takes it as a
    # parameter so this test need not wait that long.
    assert backend.BACKEND_TIMEOUT_S == 5.0
    result = trio.run(lambda: backend.populate(ASSET, base(server, "slow"), "/synesthetic-assets/", timeout_s=0.3))
    assert result == {"ok": False, "reason": "backend_error", "status": 504, "detail": "timeout"}
    deadline = time.monotonic() + 5
    while not server.requests and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(server.requests) == 1


def test_connection_refused_is_network_unreachable() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port now.
    assert populate(f"http://127.0.0.1:{port}", {"asset": ASSET}) == {
        "ok": False, "reason": "backend_error", "status": 503, "detail": "network_unreachable",
    }

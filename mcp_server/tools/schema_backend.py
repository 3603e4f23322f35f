"""``populate_backend``: POST one asset to the configured backend (seed 001 §2, §4, §6).

One request, httpx2 (the MCP SDK's own client), a 5 s timeout, no retries (a retry could store an asset twice).
The result is always one of seed 001's shapes, never an exception:

- 2xx with a JSON object naming the asset (``asset_id``, else ``id``, else
  ``synesthetic_asset_id``) → ``{"ok": true, "asset_id": str, "backend_url": base URL}``.
- 2xx without an id → ``backend_error`` with the status and ``detail`` saying so.
- 4xx/5xx → ``backend_error`` with the status and ``detail``: the response's ``detail``
  field if it is JSON with one, else the start of its body, else the reason phrase.
- no connection (refused, unreachable, DNS) → status 503, ``network_unreachable``.
- no answer within the timeout → status 504, ``timeout``.

Validation before the POST, and the ``unsupported`` answer when no backend is
configured, are the tool's business (mcp_server/tools/schema.py).
"""

from __future__ import annotations

from typing import Any

import httpx2

BACKEND_TIMEOUT_S = 5.0
DETAIL_LIMIT = 512  # characters of a response body quoted back in ``detail``
_ID_KEYS = ("asset_id", "id", "synesthetic_asset_id")


def assets_url(backend_url: str, assets_path: str) -> str:
    """The POST URL: the backend URL joined with the assets path (one slash between)."""
    return backend_url.rstrip("/") + "/" + assets_path.lstrip("/")


def _detail(response: httpx2.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("detail"), str):
        return str(body["detail"])[:DETAIL_LIMIT]
    text = response.text.strip()
    return text[:DETAIL_LIMIT] if text else response.reason_phrase


def backend_error(status: int, detail: str) -> dict[str, Any]:
    """Seed 001 §6's backend error shape."""
    return {"ok": False, "reason": "backend_error", "status": status, "detail": detail}


async def populate(
    asset: Any,
    backend_url: str,
    assets_path: str,
    *,
    timeout_s: float = BACKEND_TIMEOUT_S,
    transport: httpx2.AsyncBaseTransport | None = None,
) -> dict[str, Any]:
    """POST ``asset`` as JSON to the backend once and map the outcome to seed 001's shapes."""
    url = assets_url(backend_url, assets_path)
    # retries=0 is httpx2's default; trust_env=False keeps proxies from the environment
    # out of a call the operator pointed at one URL.
    transport = transport or httpx2.AsyncHTTPTransport(retries=0)
    try:
        async with httpx2.AsyncClient(
            timeout=timeout_s, transport=transport, trust_env=False, follow_redirects=False
        ) as client:
            response = await client.post(url, json=asset)
    except httpx2.TimeoutException:
        return backend_error(504, "timeout")
    except httpx2.TransportError:
        return backend_error(503, "network_unreachable")
    if response.status_code >= 300:
        return backend_error(response.status_code, _detail(response))
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict):
        for key in _ID_KEYS:
            value = body.get(key)
            if isinstance(value, (str, int)) and not isinstance(value, bool) and str(value):
                return {"ok": True, "asset_id": str(value), "backend_url": backend_url}
    return backend_error(response.status_code, "backend answered without an asset id (asset_id or id)")

"""core/placeholders.py and egress/credentials.py on AWS SigV4 (issue 38): not re-signed; a
placeholder inside a SigV4 Authorization header or an X-Amz-* query parameter refuses the
request with a reason saying so, before any value is fetched; a placeholder elsewhere in the
same request is still an exfiltration attempt."""

from __future__ import annotations

import pytest

from mcp_server.core.placeholders import SIGV4, CapsuleSecrets, rewrite_request
from mcp_server.core.secretbind import make_binding
from mcp_server.egress.credentials import EXFILTRATION, Credentials

VALUE = b"AKIA" + b"Q" * 16
HOST = "bucket.s3.example"


def _capsule() -> CapsuleSecrets:
    binding = make_binding("AWS_ACCESS_KEY_ID", [f"{HOST}:80"], "Authorization", "{}")
    return CapsuleSecrets({"AWS_ACCESS_KEY_ID": binding}, {"AWS_ACCESS_KEY_ID": len(VALUE)})


def _head(target: str, *headers: str) -> bytes:
    return "\r\n".join([f"GET {target} HTTP/1.1", f"Host: {HOST}", *headers, "", ""]).encode()


@pytest.mark.parametrize("form", ["header", "lower", "presigned", "security-token"])
def test_sigv4_with_a_placeholder_is_refused_as_unsupported(form: str) -> None:
    capsule = _capsule()
    key = capsule.env()["AWS_ACCESS_KEY_ID"]
    signed = (f"AWS4-HMAC-SHA256 Credential={key}/20260101/us-east-1/s3/aws4_request, "
              "SignedHeaders=host;x-amz-date, Signature=" + "ab" * 32)
    head = {
        "header": _head("/obj", f"Authorization: {signed}", "X-Amz-Date: 20260101T000000Z"),
        "lower": _head("/obj", f"authorization: {signed.lower().replace(key.lower(), key)}"),
        "presigned": _head(f"/obj?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={key}%2F20260101"
                           "&X-Amz-Signature=00"),
        "security-token": _head(f"/obj?x-amz-security-token={key}"),
    }[form]
    fetched: list[str] = []
    rewritten = rewrite_request(head, HOST, 80, capsule, lambda name: fetched.append(name) or VALUE)
    assert rewritten.head is None and rewritten.attempts == () and fetched == []
    assert rewritten.unsupported is not None and "SigV4 re-signing is not supported" in rewritten.unsupported
    judged = Credentials(capsule, lambda name: VALUE).judge(head, HOST, 80)
    assert judged.head is None and judged.reason == rewritten.unsupported
    assert EXFILTRATION not in judged.reason and VALUE.decode() not in judged.reason


def test_sigv4_beside_an_exfiltration_is_reported_as_the_exfiltration() -> None:
    capsule = _capsule()
    key = capsule.env()["AWS_ACCESS_KEY_ID"]
    head = _head("/obj", f"Authorization: AWS4-HMAC-SHA256 Credential={key}/x", f"X-Other: {key}")
    judged = Credentials(capsule, lambda name: VALUE).judge(head, HOST, 80)
    assert judged.head is None and judged.reason is not None and judged.reason.startswith(EXFILTRATION)


def test_sigv4_without_a_placeholder_passes_untouched_and_bearer_still_swaps() -> None:
    capsule = _capsule()
    plain = _head("/obj", "Authorization: AWS4-HMAC-SHA256 Credential=AKIAREAL/x, Signature=00")
    assert rewrite_request(plain, HOST, 80, capsule, lambda name: VALUE).head == plain
    key = capsule.env()["AWS_ACCESS_KEY_ID"]
    swapped = rewrite_request(_head("/obj", f"Authorization: {key}"), HOST, 80, capsule, lambda name: VALUE)
    assert swapped.head is not None and VALUE in swapped.head and swapped.unsupported is None
    assert SIGV4.format(where="x").startswith("AWS SigV4 re-signing is not supported")

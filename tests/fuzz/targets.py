"""Atheris targets: one per parser that reads what a client, an agent or the helper sends.

Run one by hand (longer than CI does; new inputs land in the first directory):

    .venv/bin/python -m tests.fuzz.targets patch -max_total_time=600 /tmp/patch tests/fuzz/corpus/patch

Each target asserts what the hypothesis fuzz tests assert for the same parser
(tests/test_fuzz_core.py, test_protocol_codec.py, test_framing_ndjson.py,
test_framing_json.py): only the parser's structured refusals come out (a ``CcwError``
whose code is not INTERNAL, a ``ProtocolError``, an ``Invalid`` frame answered with a
JSON-RPC error), and what it accepts keeps the parser's promises (paths stay inside the
root, encoders agree byte for byte, round trips are exact).  Anything else, exception or
failed assertion, is a crash: atheris prints it and saves the input.

Where a target has a choice to make (which decoder, how to chunk the stream) the input's
first byte makes it (``ConsumeBytes(1)``), so a checked-in seed is that byte followed by
a real frame, patch or path (tests/fuzz/seeds.py writes them).
"""

from __future__ import annotations

import json
import os
import posixpath
import shlex
import sys
from pathlib import Path
from typing import Any

import atheris

# Only ccw's own modules are instrumented: coverage of pydantic or the json module would
# steer the fuzzer towards their branches instead of ours.
with atheris.instrument_imports(include=["mcp_server", "sandbox"]):
    import mcp_types

    from mcp_server import framing
    from mcp_server.core import canonical, hashline, linetags, paths, rootspace, unidiff
    from mcp_server.core.patch import parse_patch
    from mcp_server.core.patch_apply import apply
    from sandbox import ops, protocol
    from sandbox.errors import CcwError, ProtocolError

from tests.support.patch_fuzz import check_patch


def _split(data: bytes) -> tuple[int, bytes]:
    """The choice byte and the payload after it."""
    provider = atheris.FuzzedDataProvider(data)
    choice = provider.ConsumeBytes(1)
    return (choice[0] if choice else 0), provider.ConsumeBytes(provider.remaining_bytes())


def _reference_dumps(value: Any, sort_keys: bool = False) -> bytes:
    """What ``framing.dumps`` promises to equal (test_framing_json.py's reference)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True, separators=(",", ":"), sort_keys=sort_keys).encode("ascii")


def _no_constant(name: str) -> Any:
    raise AssertionError(f"{name} in an answer: not JSON")


# --- the front end's NDJSON frames ------------------------------------------------------


def _check_answer(answer: dict[str, Any]) -> None:
    """An answer the server writes: strict JSON, a JSON-RPC response, dumps == json.dumps."""
    encoded = framing.dumps(answer)
    assert encoded == _reference_dumps(answer), answer
    message = json.loads(encoded.decode("utf-8"), parse_constant=_no_constant)
    assert message.get("jsonrpc") == "2.0" and ("result" in message) != ("error" in message), message
    assert message["id"] is None or framing.is_valid_id(message["id"]), message
    if "error" in message:
        assert isinstance(message["error"]["code"], int) and isinstance(message["error"]["message"], str)


def _serve_frame(event: framing.Event, order: framing.ResponseOrder) -> None:
    """What ``NdjsonConnection._handle`` does with one event, without trio or the SDK loop."""
    if isinstance(event, framing.Oversized):
        for direct in (False, True):
            _check_answer(framing.oversized_answer(event, direct))
        return
    frame = framing.classify(event.data)
    if isinstance(frame, framing.Invalid):
        _check_answer(frame.answer)
        order.fill(order.reserve(), framing.dumps(frame.answer))
        return
    assert framing.dumps(frame.message) == _reference_dumps(frame.message)
    if isinstance(frame, framing.Request):
        assert framing.is_valid_id(frame.id)
        order.reserve(frame.id)
    if isinstance(frame, framing.Notification) and frame.method == "notifications/cancelled":
        params = frame.message.get("params")
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if framing.is_valid_id(request_id):
            {}.get(framing.id_key(request_id))  # the id must be hashable
    try:
        mcp_types.jsonrpc_message_adapter.validate_python(frame.message, by_name=False)
    except ValueError:
        pass  # the front end answers -32600 (requests) or drops it (notifications)
    if isinstance(frame, framing.Request):
        order.fill_id(frame.id, b"{}")


def ndjson_frames(data: bytes) -> None:
    """Bytes on stdin or a unix socket: split into frames, classified, answered in order."""
    choice, stream = _split(data)
    limit = 16 + choice  # a small frame limit, so that oversized frames come up often
    step = choice % 17 + 1
    whole = framing.LineSplitter(max_frame=limit).feed(stream)
    chunked = framing.LineSplitter(max_frame=limit)
    pieces = [event for at in range(0, len(stream), step) for event in chunked.feed(stream[at:at + step])]
    assert whole == pieces, (whole, pieces)
    order = framing.ResponseOrder()
    events = framing.LineSplitter().feed(stream) + [e for e in whole if isinstance(e, framing.Oversized)]
    for event in events:
        _serve_frame(event, order)
    assert order.pending == 0


# --- the helper's IPC codec ---------------------------------------------------------------


def _comparable(message: Any) -> Any:
    # A Reply's error is a CcwError, which (like any exception) is equal only to itself.
    if isinstance(message, protocol.Reply) and message.error is not None:
        return (message.id, message.error.to_dict())
    return message


def _decode(stream: bytes, kind: str, step: int) -> tuple[list[Any], tuple[str, str] | None]:
    """The messages of ``stream`` fed ``step`` bytes at a time, and the error that ended it."""
    decoder = protocol.FrameDecoder(kind)
    messages: list[Any] = []
    try:
        for at in range(0, len(stream), step):
            decoder.feed(stream[at:at + step])
            messages.extend(decoder.messages())
        decoder.feed_eof()
        messages.extend(decoder.messages())
    except ProtocolError as exc:
        assert exc.code in ("INVALID_ARGUMENT", "TOO_LARGE"), exc
        return [_comparable(m) for m in messages], (exc.code, exc.message)
    return [_comparable(m) for m in messages], None


def ipc_frames(data: bytes) -> None:
    """A byte stream between front end and helper: frames, envelopes, op arguments."""
    choice, stream = _split(data)
    kind = ("request", "reply", "raw")[choice % 3]
    whole = _decode(stream, kind, max(len(stream), 1))
    assert whole == _decode(stream, kind, choice // 3 % 16 + 1)
    for message in whole[0]:
        if isinstance(message, protocol.Request):
            try:
                ops.validate_args(message.op, message.args)
            except ProtocolError:
                continue
            frame = ops.encode_request(message.id, message.op, message.args)
        elif isinstance(message, protocol.Reply):
            if message.progress is not None:
                assert message.id is not None
                frame = protocol.encode_progress(message.id, message.progress)
            else:
                assert message.result is not None
                frame = protocol.encode_reply(message.id, message.result)
        elif isinstance(message, tuple):  # an error reply, made comparable
            frame = protocol.encode_error(message[0], CcwError.from_dict(message[1]))
        else:
            frame = protocol.encode_frame(message)
        # What was accepted re-encodes, and decodes back to the same message.
        assert _decode(frame, kind, len(frame)) == ([message], None), (frame, message)


# --- patches ------------------------------------------------------------------------------

def patch_text(data: bytes) -> None:
    """A patch an agent sends to ``apply_patch``: parsed, then applied to a small tree."""
    _, text = _split(data)
    check_patch(text)


UNIDIFF_PATHS = ["a", "src/b.py", "q\xe9", "sp ace", "tab\tname", 'quo"te', "back\\slash", "new\nline", "x\udcff"]


def unidiff_round_trip(data: bytes) -> None:
    """What ccw renders as a diff, the patch parser reads back and applies exactly."""
    provider = atheris.FuzzedDataProvider(data)
    path = provider.PickValueInList(UNIDIFF_PATHS)
    old_mode, new_mode = (provider.PickValueInList([0o100644, 0o100755]) for _ in range(2))
    shape = provider.ConsumeIntInRange(0, 3)  # 0 change, 1 new file, 2 deletion, 3 forced binary
    half = provider.remaining_bytes() // 2
    old = None if shape == 1 else provider.ConsumeBytes(half)
    new = None if shape == 2 else provider.ConsumeBytes(provider.remaining_bytes())
    change = unidiff.FileChange(path, old, new, old_mode, new_mode, binary=True if shape == 3 else None)
    diff = unidiff.render(change)
    if not diff:
        assert old == new and old_mode == new_mode
        return
    result = apply(parse_patch(diff), lambda p: (old, old_mode) if p == path and old is not None else None)
    assert not result.rejects, (diff, result.rejects)
    expected = None if new is None else (new, new_mode)
    assert result.files == {path: expected}, (diff, result.files)


# --- paths ------------------------------------------------------------------------------------


def _stays_inside(normal: str) -> bool:
    joined = posixpath.normpath(posixpath.join("/root", normal))
    return joined == "/root" or joined.startswith("/root/")


def path_text(data: bytes) -> None:
    """A path an agent names: seed 000's ``normalize`` and RootSpace's ``normalize_path``."""
    raw = atheris.FuzzedDataProvider(data).ConsumeUnicode(len(data))  # lone surrogates too
    try:
        normal = paths.normalize(raw)
    except CcwError as exc:
        assert exc.code in ("INVALID_ARGUMENT", "PERMISSION_DENIED"), exc
        json.dumps(exc.to_dict())
    else:
        parts = normal.split("/")
        assert normal == "." or not normal.startswith("/"), normal
        assert ".." not in parts and "\x00" not in normal and not any(p.startswith("~") for p in parts), normal
        assert _stays_inside(normal) and paths.normalize(normal) == normal, normal
    try:
        rel = rootspace.normalize_path(raw)
    except CcwError as exc:
        assert exc.code in ("INVALID_ARGUMENT", "PERMISSION_DENIED"), exc
        json.dumps(exc.to_dict())
    else:
        assert not rel.startswith("/") and ".." not in rel.split("/") and "\\" not in rel, rel
        assert "\x00" not in rel and _stays_inside(rel), rel
        assert rootspace.normalize_path(rootspace.display_path(rel)) == rel, rel


# --- hashline ops ---------------------------------------------------------------------------

HASHLINE_CODES = ("INVALID_ARGUMENT", "STALE_FILE", "CONFLICT", "NOT_FOUND", "AMBIGUOUS")


def _document(provider: atheris.FuzzedDataProvider) -> str:
    lines = []
    for _ in range(provider.ConsumeIntInRange(0, 40)):
        text = provider.ConsumeUnicodeNoSurrogates(provider.ConsumeIntInRange(0, 12))
        lines.append(text + provider.PickValueInList(["\n", "\n", "\r\n", " \n", "\t\r\n"]))
    return "".join(lines) + provider.ConsumeUnicodeNoSurrogates(provider.ConsumeIntInRange(0, 3))


def _anchor(provider: atheris.FuzzedDataProvider, tag_list: list[str]) -> str:
    line = provider.ConsumeIntInRange(0, len(tag_list) + 1)
    if 1 <= line <= len(tag_list) and provider.ConsumeBool():
        return f"{line}:{tag_list[line - 1]}"  # the tag the agent read: an exact anchor
    return f"{line}:{provider.ConsumeIntInRange(0, 255):02x}"


def _op(provider: atheris.FuzzedDataProvider, tag_list: list[str]) -> dict[str, Any] | str:
    kind = provider.PickValueInList([*hashline.OPS, "bogus"])
    anchor = _anchor(provider, tag_list)
    if provider.ConsumeBool():
        anchor += ".." + _anchor(provider, tag_list)
    form = provider.ConsumeIntInRange(0, 3)
    if form == 0:
        return provider.ConsumeUnicode(provider.ConsumeIntInRange(0, 40))  # free text
    if form == 1:
        return {"op": kind, "anchor": provider.ConsumeUnicode(provider.ConsumeIntInRange(0, 12))}
    content = provider.ConsumeUnicode(provider.ConsumeIntInRange(0, 20))
    if form == 2:
        return f"{kind} {anchor} with {shlex.quote(content)}"
    op: dict[str, Any] = {"op": kind, "anchor": anchor}
    if kind not in ("delete", "delete_range") or provider.ConsumeBool():
        op["content"] = content
    return op


def hashline_ops(data: bytes) -> None:
    """A hashline edit: ops as objects or text, anchored on a file's tagged lines."""
    provider = atheris.FuzzedDataProvider(data)
    text = _document(provider)
    doc = hashline.split_text(text)
    assert doc.render() == text  # a file nobody edits comes back byte for byte
    tag_list = hashline.tags(doc.lines)
    assert tag_list == [linetags.line_tag(line) for line in doc.lines]
    ops = [_op(provider, tag_list) for _ in range(provider.ConsumeIntInRange(1, 4))]
    for index, raw in enumerate(ops):
        try:
            hashline.parse_op(raw, index)
        except CcwError as exc:
            assert exc.code == "INVALID_ARGUMENT", exc
    content = text.encode("utf-8")
    expected = hashline.file_hash(content) if provider.ConsumeBool() else provider.ConsumeUnicode(64)
    try:
        result = hashline.edit(content, expected, ops, "f.txt")
    except CcwError as exc:
        assert exc.code in HASHLINE_CODES, exc
        json.dumps(exc.to_dict())
        return
    result.text.encode("utf-8")  # what gets written is UTF-8 text
    assert result.doc.render() == result.text


# --- canonical JSON -----------------------------------------------------------------------


def _sorted_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    assert keys == sorted(set(keys)), keys  # byte order, each key once
    return dict(pairs)


def canonical_json(data: bytes) -> None:
    """Any JSON a peer sends, re-encoded canonically (what hashes and the IPC codec cover)."""
    _, body = _split(data)
    try:
        value = json.loads(body)  # lenient on purpose: NaN, duplicate keys, lone surrogates
    except (ValueError, RecursionError):
        return
    try:
        encoded = canonical.canonical_json(value)
    except UnicodeEncodeError:
        return  # a lone surrogate: no UTF-8 form
    except ValueError as exc:
        assert "Out of range float" in str(exc), exc  # NaN or an infinity
        return
    except RecursionError:
        return  # nests deeper than the encoder; the IPC decoder refuses it the same way
    assert encoded.decode("utf-8") == canonical.canonical_text(value)
    again = json.loads(encoded, object_pairs_hook=_sorted_pairs, parse_constant=_no_constant)
    assert again == value, (again, value)  # NaN, the one value unequal to itself, was refused
    assert canonical.canonical_json(again) == encoded  # idempotent
    assert framing.dumps(value, sort_keys=True) == encoded  # the front end's encoder agrees


TARGETS = {
    "ndjson": ndjson_frames,
    "ipc": ipc_frames,
    "patch": patch_text,
    "unidiff": unidiff_round_trip,
    "paths": path_text,
    "hashline": hashline_ops,
    "canonical": canonical_json,
}


def main() -> None:
    """``python -m tests.fuzz.targets NAME [libFuzzer flags and corpus dirs]``."""
    if len(sys.argv) < 2 or sys.argv[1] not in TARGETS:
        sys.exit(f"usage: python -m tests.fuzz.targets {{{','.join(TARGETS)}}} [libFuzzer args]")
    target = TARGETS[sys.argv[1]]
    keep = os.environ.get("CCW_FUZZ_CRASH_FILE")

    def run(data: bytes) -> None:
        try:
            target(data)
        except BaseException:
            # libFuzzer saves the input too, but not when its crash handler is cut short
            # (seen under a loaded CI machine: a SIGALRM before the artifact is written).
            if keep:
                Path(keep).write_bytes(data)
            raise

    atheris.Setup([sys.argv[0], *sys.argv[2:]], run)
    atheris.Fuzz()


if __name__ == "__main__":
    main()

"""A kernel data path for a forwarded port: two BPF socket hashes and an ``SK_SKB`` verdict
program that moves each byte a relayed socket receives straight to its peer's sending side.

Some facts about sockmap, as the forward uses it (kernel 6.18):

- A ``BPF_MAP_TYPE_SOCKHASH`` holds TCP sockets under keys of our choosing.  A program
  of type ``BPF_PROG_TYPE_SK_SKB`` attached to a map as ``BPF_SK_SKB_STREAM_VERDICT``
  runs for every skb that a socket *in that map* receives, in the receive path, instead
  of the skb waiting for ``recv``.  ``bpf_sk_redirect_hash(skb, map, &key, 0)`` hands
  the skb to the sending side of the socket stored under ``key`` (any socket map:
  the target needs only to be in one); a kernel worker sends it there.  So a relayed
  byte never reaches user space and no process wakes for it.
- The receive path hands the verdict the skb that carries a FIN too, empty when the FIN
  came alone.  Redirected, an empty skb breaks the target: the kernel's worker takes the
  0 bytes its send returns for a hard error, sets ``EPIPE`` on the target socket and
  stops sending there (tried: the HTTP answer before it was lost).  So the program drops
  empty skbs; the FIN has done its work already (the socket reads EOF), and the front end
  passes it on with ``shutdown`` once the bytes before it are out.
- The program here is fifteen instructions: the receiving socket's cookie
  (``bpf_get_socket_cookie``, the socket's unique 64-bit id, which user space reads with
  ``SO_COOKIE``) is the key into ``peers``, which stores each socket's peer under the
  socket's own cookie.  It is attached to ``members``, where each socket is stored under
  its own cookie; ``peers`` has no program.  Two maps so that the front end can enter
  both peers before either socket starts to be diverted (a verdict whose key is missing
  drops the skb).  A socket closed leaves both maps by itself.
- Making maps and loading an ``SK_SKB`` program takes ``CAP_BPF`` and ``CAP_NET_ADMIN``
  (``kernel.unprivileged_bpf_disabled`` aside); *using* a map's descriptor does not
  (since 6.5 the check is at map and program creation only).  So the helper makes them,
  hands both map descriptors to the front end (``net_sockets`` with ``sockmap``), and
  keeps nothing: the program lives as long as its attachment to ``members``, which lives
  as long as some descriptor of ``members``.  A rootless helper cannot make them; the
  front end then relays in user space.
- What the descriptors let the front end do: put sockets it holds into the maps, so that
  bytes one of its sockets receives go out of another of its sockets.  That is what its
  own relay does with ``recv`` and ``send``; nothing it could not do already.

The front end's side (pairing, half-close, the order of operations) is
mcp_server/egress/kernel_relay.py.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import struct

from sandbox import syscalls

BPF_MAP_CREATE = 0
BPF_PROG_LOAD = 5
BPF_PROG_ATTACH = 8
BPF_MAP_TYPE_SOCKHASH = 18
BPF_PROG_TYPE_SK_SKB = 14
BPF_SK_SKB_STREAM_VERDICT = 5
BPF_PSEUDO_MAP_FD = 1
FUNC_GET_SOCKET_COOKIE = 46
FUNC_SK_REDIRECT_HASH = 72
SK_DROP = 0
KEY_SIZE = 8  # a socket cookie
VALUE_SIZE = 8  # a socket descriptor on update (the kernel takes a u32 or u64)
LOG_SIZE = 1 << 16
_INSN = struct.Struct("=BBhi")  # struct bpf_insn: code, dst_reg:4 | src_reg:4, off, imm


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return _INSN.pack(code, (src << 4) | dst, off, imm)


def program(peers_fd: int) -> bytes:
    """The verdict: redirect the skb to the socket ``peers`` holds under the receiver's cookie."""
    return b"".join([
        _insn(0xBF, 6, 1),  # r6 = r1 (the skb)
        _insn(0x61, 2, 6, 0),  # r2 = skb->len
        _insn(0x55, 2, 0, 2, 0),  # if r2 != 0: skip the next two
        _insn(0xB7, 0, 0, 0, SK_DROP),  # a FIN alone: dropped (the socket's EOF is told apart)
        _insn(0x95),  # return
        _insn(0x85, imm=FUNC_GET_SOCKET_COOKIE),  # r0 = bpf_get_socket_cookie(skb)
        _insn(0x7B, 10, 0, -8),  # *(u64 *)(r10 - 8) = r0
        _insn(0xBF, 1, 6),  # r1 = skb
        _insn(0x18, 2, BPF_PSEUDO_MAP_FD, 0, peers_fd), _insn(0),  # r2 = peers (ld_imm64)
        _insn(0xBF, 3, 10),  # r3 = r10
        _insn(0x07, 3, 0, 0, -8),  # r3 += -8: &cookie
        _insn(0xB7, 4, 0, 0, 0),  # r4 = 0: to the peer's sending side
        _insn(0x85, imm=FUNC_SK_REDIRECT_HASH),  # r0 = bpf_sk_redirect_hash(skb, peers, &cookie, 0)
        _insn(0x95),  # return r0 (SK_PASS when redirected, SK_DROP when the key is missing)
    ])


def _socket_hash(entries: int) -> int:
    return syscalls.bpf(BPF_MAP_CREATE, struct.pack("=IIIII", BPF_MAP_TYPE_SOCKHASH, KEY_SIZE, VALUE_SIZE,
                                                     entries, 0))


def _load(code: bytes) -> int:
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")  # bpf_sk_redirect_hash is GPL-only
    log = ctypes.create_string_buffer(LOG_SIZE)
    attr = struct.pack("=IIQQIIQ", BPF_PROG_TYPE_SK_SKB, len(code) // _INSN.size, ctypes.addressof(insns),
                       ctypes.addressof(license_), 1, LOG_SIZE, ctypes.addressof(log))
    try:
        return syscalls.bpf(BPF_PROG_LOAD, attr)
    except OSError as exc:
        verifier = log.value.decode(errors="replace").strip().splitlines()[-3:]
        raise OSError(exc.errno, f"loading the sockmap verdict: {exc.strerror} {' | '.join(verifier)}") from None


def make(entries: int) -> tuple[int, int]:
    """(peers, members): two socket hashes of ``entries`` each, the verdict attached to
    ``members``.  OSError when this helper or kernel cannot (no CAP_BPF: EPERM)."""
    made: list[int] = []
    try:
        peers = _socket_hash(entries)
        made.append(peers)
        members = _socket_hash(entries)
        made.append(members)
        verdict = _load(program(peers))
        try:
            syscalls.bpf(BPF_PROG_ATTACH, struct.pack("=IIII", members, verdict, BPF_SK_SKB_STREAM_VERDICT, 0))
        finally:
            os.close(verdict)  # the attachment holds the program
    except OSError:
        for fd in made:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    return peers, members

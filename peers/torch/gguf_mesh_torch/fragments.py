"""Fragments (docs/protocol.md "Fragments"): a message starting with GMSF is one slice of a
frame larger than a carrier's message limit; the receiver joins slices in index order."""

from __future__ import annotations

import struct

from .errors import MeshError
from .frames import HEADER_BYTES, MAX_PAYLOAD_BYTES, Frame, decode_frame

MAGIC = b"GMSF"
VERSION = 1
HEADER = struct.Struct("<4sBBHIII")  # magic, version, flags, reserved, message id, index, total
FLAG_LAST = 1
MAX_PENDING = 16
MIN_MESSAGE_LIMIT = 64


def _fail(code: str, field: str, message: str) -> MeshError:
    return MeshError(code, f"fragment {field}: {message}", {"field": field})


def fragment(encoded: bytes, limit: int, message_id: int) -> list[bytes]:
    """Messages of at most `limit` bytes carrying `encoded` (one message when it fits)."""
    if limit < MIN_MESSAGE_LIMIT:
        raise MeshError("FRAGMENT_BAD_LIMIT", f"message limit {limit} is below {MIN_MESSAGE_LIMIT} bytes")
    if len(encoded) <= limit:
        return [encoded]
    step = limit - HEADER.size
    count = -(-len(encoded) // step)
    return [
        HEADER.pack(MAGIC, VERSION, FLAG_LAST if i == count - 1 else 0, 0, message_id & 0xFFFFFFFF, i, len(encoded)) + encoded[i * step : (i + 1) * step]
        for i in range(count)
    ]


class Reassembler:
    """Whole frames out of messages that are whole frames or fragments."""

    def __init__(self) -> None:
        # message id -> [total, next index, bytearray so far]
        self.pending: dict[int, list] = {}

    def push(self, message: bytes) -> Frame | None:
        if message[:4] == MAGIC:
            return self._push_fragment(message)
        return decode_frame(message)

    def _push_fragment(self, msg: bytes) -> Frame | None:
        if len(msg) < HEADER.size:
            raise _fail("FRAGMENT_TRUNCATED", "header", f"needs {HEADER.size} bytes, got {len(msg)}")
        _, version, flags, reserved, mid, index, total = HEADER.unpack_from(msg, 0)
        if version != VERSION:
            raise _fail("FRAGMENT_BAD_VERSION", "version", f"expected {VERSION}, got {version}")
        if flags & ~FLAG_LAST:
            raise _fail("FRAGMENT_BAD_FLAGS", "flags", f"unknown bits 0x{flags:x}")
        if reserved:
            raise _fail("FRAGMENT_BAD_RESERVED", "reserved", "bytes 6..7 must be zero")
        piece = msg[HEADER.size :]
        if not HEADER_BYTES <= total <= HEADER_BYTES + MAX_PAYLOAD_BYTES:
            raise _fail("FRAGMENT_BAD_LENGTH", "total", f"{total} bytes is not a possible frame size")
        p = self.pending.get(mid)
        if p is None:
            if index != 0:
                raise _fail("FRAGMENT_OUT_OF_ORDER", "index", f"message {mid} starts at fragment {index}, expected 0")
            if len(self.pending) >= MAX_PENDING:
                raise _fail("FRAGMENT_TOO_MANY", "message id", f"more than {MAX_PENDING} messages in reassembly")
            p = self.pending[mid] = [total, 0, bytearray()]
        if index != p[1]:
            raise _fail("FRAGMENT_OUT_OF_ORDER", "index", f"message {mid}: expected fragment {p[1]}, got {index}")
        if total != p[0]:
            raise _fail("FRAGMENT_BAD_LENGTH", "total", f"message {mid}: total changed from {p[0]} to {total}")
        if len(p[2]) + len(piece) > total:
            raise _fail("FRAGMENT_BAD_LENGTH", "total", f"message {mid}: fragments exceed {total} bytes")
        if not piece:
            raise _fail("FRAGMENT_BAD_LENGTH", "slice", f"message {mid}: empty fragment {index}")
        p[2] += piece
        p[1] += 1
        if not flags & FLAG_LAST:
            if len(p[2]) == total:
                raise _fail("FRAGMENT_BAD_LENGTH", "flags", f"message {mid}: all {total} bytes arrived but fragment {index} is not marked last")
            return None
        del self.pending[mid]
        if len(p[2]) != total:
            raise _fail("FRAGMENT_TRUNCATED", "total", f"message {mid}: last fragment leaves {total - len(p[2])} of {total} bytes missing")
        return decode_frame(bytes(p[2]))

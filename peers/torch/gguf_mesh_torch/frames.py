"""Frames, per docs/protocol.md "Frame header" and "Strict decoding": a 52-byte little-endian
header and a payload. Decoding checks the fields in the documented order and raises a
MeshError whose code and details.field name the first wrong one."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, replace

import numpy as np

from .errors import MeshError

MAGIC = b"GMSH"
VERSION = 1
HEADER_BYTES = 52
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
MAX_WIDTH = 1 << 20
MAX_TOKENS = 1 << 16
MAX_JSON_BYTES = 1 << 20
MAX_TOP_LOGPROBS = 20
TIMING_RECORD_BYTES = 32
MAX_TIMING_RECORDS = 255
NIL_SESSION = "0" * 32

# frame types
SESSION_OPEN, SESSION_CLOSE, PREFILL, DECODE, HIDDEN, TOKEN, STATUS, ERROR, LOGITS, REWIND, RESEND = range(1, 12)
TYPE_NAMES = {1: "SessionOpen", 2: "SessionClose", 3: "Prefill", 4: "Decode", 5: "Hidden", 6: "Token", 7: "Status", 8: "Error", 9: "Logits", 10: "Rewind", 11: "Resend"}

# flags (RETURN_DIRECT: the one-way token path; VERIFY: speculative decoding)
SAMPLE, REPLY, WANT_LOGITS, WANT_TIMINGS, TIMINGS, REPLAY, RETURN_DIRECT, VERIFY = 1, 2, 4, 8, 16, 32, 64, 128
KNOWN_FLAGS = SAMPLE | REPLY | WANT_LOGITS | WANT_TIMINGS | TIMINGS | REPLAY | RETURN_DIRECT | VERIFY

# dtypes
NONE, F32, F16, I32, JSON = range(5)
DTYPE_NAMES = {0: "None", 1: "F32", 2: "F16", 3: "I32", 4: "Json"}
ELEMENT_BYTES = {F32: 4, F16: 2, I32: 4}

# (allowed dtypes, fixed width or None for 1..MAX_WIDTH, token count rule)
_RULES = {
    SESSION_OPEN: ((JSON,), 0, "zero"),
    SESSION_CLOSE: ((NONE,), 0, "zero"),
    PREFILL: ((I32,), 1, "some"),
    DECODE: ((I32,), 1, "one"),
    HIDDEN: ((F16, F32), None, "some"),
    # width 1 (the token) or 2 + 2k (the token, its logprob, k alternatives): checked below
    TOKEN: ((I32,), None, "one"),
    STATUS: ((JSON, NONE), 0, "zero"),
    ERROR: ((JSON,), 0, "zero"),
    LOGITS: ((F32,), None, "one"),
    # repair requests (docs/protocol.md "Liveness and repair"): a JSON body, the position in the header
    REWIND: ((JSON,), 0, "zero"),
    RESEND: ((JSON,), 0, "zero"),
}

# magic 4s, version B, type B, flags H, route I, session 16s, seq I, position I, count I,
# dtype B, reserved 3s, width I, payload length I
_HEADER = struct.Struct("<4sBBHI16sIIIB3sII")
assert _HEADER.size == HEADER_BYTES


@dataclass(frozen=True)
class Frame:
    type: int
    flags: int = 0
    route_id: int = 0
    session_id: str = NIL_SESSION
    seq: int = 0
    position: int = 0
    n_tokens: int = 0
    dtype: int = NONE
    width: int = 0
    payload: bytes = b""
    # local only, never encoded: when the carrier received the frame (time.perf_counter())
    received_at: float | None = None

    def with_(self, **changes) -> "Frame":
        return replace(self, **changes)


def _fail(code: str, field: str, message: str) -> MeshError:
    return MeshError(code, f"frame {field}: {message}", {"field": field})


def validate_header(type_: int, flags: int, dtype: int, n_tokens: int, width: int, payload_length: int) -> None:
    """The checks of "Strict decoding" steps 5-7, in order; shared by encoder and decoder."""
    rules = _RULES.get(type_)
    if rules is None:
        raise _fail("FRAME_BAD_TYPE", "type", f"unknown frame type {type_}")
    dtypes, fixed_width, count_rule = rules
    if flags & ~KNOWN_FLAGS:
        raise _fail("FRAME_BAD_FLAGS", "flags", f"unknown flag bits 0x{flags & ~KNOWN_FLAGS:x}")
    if dtype not in dtypes:
        allowed = ", ".join(DTYPE_NAMES[d] for d in dtypes)
        raise _fail("FRAME_BAD_DTYPE", "dtype", f"dtype {dtype} is not allowed for a {TYPE_NAMES[type_]} frame (allowed: {allowed})")
    if payload_length > MAX_PAYLOAD_BYTES:
        raise _fail("FRAME_BAD_LENGTH", "payload length", f"{payload_length} bytes exceeds the limit of {MAX_PAYLOAD_BYTES}")
    name = TYPE_NAMES[type_]
    if count_rule == "zero" and n_tokens != 0:
        raise _fail("FRAME_BAD_DIMENSION", "token count", f"a {name} frame carries no tokens, got {n_tokens}")
    # a Verify answer is a Token frame of one token per verified position (width 1)
    verified = type_ == TOKEN and bool(flags & VERIFY)
    if verified and (not 1 <= n_tokens <= MAX_TOKENS or width != 1):
        raise _fail("FRAME_BAD_DIMENSION", "token count", f"a Verify Token frame carries 1..{MAX_TOKENS} tokens of width 1, got {n_tokens} x {width}")
    if count_rule == "one" and n_tokens != 1 and not verified:
        raise _fail("FRAME_BAD_DIMENSION", "token count", f"a {name} frame carries exactly 1 token, got {n_tokens}")
    if count_rule == "some" and not 1 <= n_tokens <= MAX_TOKENS:
        raise _fail("FRAME_BAD_DIMENSION", "token count", f"a {name} frame carries 1..{MAX_TOKENS} tokens, got {n_tokens}")
    if fixed_width is not None and width != fixed_width:
        raise _fail("FRAME_BAD_DIMENSION", "width", f"a {name} frame has width {fixed_width}, got {width}")
    if type_ == TOKEN and width != 1 and (width % 2 or width > 2 + 2 * MAX_TOP_LOGPROBS):
        raise _fail("FRAME_BAD_DIMENSION", "width", f"a Token frame has width 1 or 2 + 2k (k ≤ {MAX_TOP_LOGPROBS} top log-probabilities), got {width}")
    if fixed_width is None and not 1 <= width <= MAX_WIDTH:
        raise _fail("FRAME_BAD_DIMENSION", "width", f"width must be 1..{MAX_WIDTH}, got {width}")
    elem = ELEMENT_BYTES.get(dtype)
    if flags & TIMINGS:
        if elem is None:
            raise _fail("FRAME_BAD_FLAGS", "flags", f"a timing trailer needs a fixed-size dtype, not {DTYPE_NAMES[dtype]}")
        trailer = payload_length - n_tokens * width * elem - 4
        if trailer < 0 or trailer % TIMING_RECORD_BYTES or trailer // TIMING_RECORD_BYTES > MAX_TIMING_RECORDS:
            raise _fail("FRAME_BAD_LENGTH", "payload length", f"{payload_length} bytes is not {n_tokens} x {width} x {elem} plus a timing trailer of 4 + 32n bytes")
    elif elem is not None:
        expected = n_tokens * width * elem
        if payload_length != expected:
            raise _fail("FRAME_BAD_LENGTH", "payload length", f"{n_tokens} tokens x {width} x {elem} bytes = {expected}, got {payload_length}")
    elif dtype == NONE and payload_length != 0:
        raise _fail("FRAME_BAD_LENGTH", "payload length", f"dtype None carries no payload, got {payload_length} bytes")
    elif dtype == JSON and payload_length > MAX_JSON_BYTES:
        raise _fail("FRAME_BAD_LENGTH", "payload length", f"JSON payload of {payload_length} bytes exceeds {MAX_JSON_BYTES}")


def check_magic_prefix(data: bytes) -> None:
    """Step 1: the magic, as soon as any of its bytes are there."""
    for i in range(min(4, len(data))):
        if data[i] != MAGIC[i]:
            raise _fail("FRAME_BAD_MAGIC", "magic", f'expected "GMSH", byte {i} is 0x{data[i]:02x}')


def decode_header(data: bytes) -> tuple[Frame, int]:
    """Steps 1-7 on the first 52 bytes: the frame without its payload, and the payload length."""
    check_magic_prefix(data)
    if len(data) < HEADER_BYTES:
        raise _fail("FRAME_TRUNCATED", "header", f"needs {HEADER_BYTES} bytes, got {len(data)}")
    _, version, type_, flags, route, sid, seq, pos, count, dtype, reserved, width, length = _HEADER.unpack_from(data, 0)
    if version != VERSION:
        raise _fail("FRAME_BAD_VERSION", "version", f"this peer speaks version {VERSION}, got {version}")
    if reserved != b"\0\0\0":
        raise _fail("FRAME_BAD_RESERVED", "reserved", "bytes 41..43 must be zero")
    validate_header(type_, flags, dtype, count, width, length)
    f = Frame(type=type_, flags=flags, route_id=route, session_id=sid.hex(), seq=seq, position=pos, n_tokens=count, dtype=dtype, width=width)
    return f, length


def decode_frame(data: bytes) -> Frame:
    """One whole frame (a message carrier's message); missing or trailing bytes are errors."""
    f, length = decode_header(data)
    total = HEADER_BYTES + length
    if len(data) < total:
        raise _fail("FRAME_TRUNCATED", "payload", f"needs {length} bytes, got {len(data) - HEADER_BYTES}")
    if len(data) > total:
        raise _fail("FRAME_BAD_LENGTH", "payload length", f"{len(data) - total} bytes after the frame's end")
    return f.with_(payload=bytes(data[HEADER_BYTES:total]))


def encode_frame(f: Frame) -> bytes:
    for name in ("route_id", "seq", "position", "n_tokens", "width"):
        v = getattr(f, name)
        if not isinstance(v, int) or not 0 <= v <= 0xFFFFFFFF:
            raise _fail("FRAME_BAD_FIELD", name, f"{v} is not a u32")
    validate_header(f.type, f.flags, f.dtype, f.n_tokens, f.width, len(f.payload))
    sid = bytes.fromhex(f.session_id)
    if len(sid) != 16:
        raise _fail("FRAME_BAD_SESSION", "session id", f"'{f.session_id}' is not 32 lowercase hex digits")
    head = _HEADER.pack(MAGIC, VERSION, f.type, f.flags, f.route_id, sid, f.seq, f.position, f.n_tokens, f.dtype, b"\0\0\0", f.width, len(f.payload))
    return head + f.payload


# ---- payloads ----


def json_frame(type_: int, at: Frame, value, flags: int = 0) -> Frame:
    """A Json frame addressed like `at` (route, session, sequence)."""
    payload = json.dumps(value, separators=(",", ":")).encode()
    return Frame(type=type_, flags=flags, route_id=at.route_id, session_id=at.session_id, seq=at.seq, dtype=JSON, payload=payload)


def decode_json(f: Frame):
    try:
        return json.loads(payload_body(f).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise MeshError("FRAME_BAD_PAYLOAD", f"frame payload: not UTF-8 JSON ({e})", {"field": "payload"}) from None


def tokens_frame(type_: int, at: Frame, position: int, tokens, flags: int = 0) -> Frame:
    arr = np.asarray(tokens, dtype="<i4")
    return Frame(type=type_, flags=flags, route_id=at.route_id, session_id=at.session_id, seq=at.seq, position=position, n_tokens=len(arr), dtype=I32, width=1, payload=arr.tobytes())


def sampled_frame(at: Frame, position: int, token: int, logprob: float, top: list[tuple[int, float]], flags: int = 0) -> Frame:
    """A Token frame of width 2 + 2k: [token, f32 bits of its logprob, (id, f32 bits) per top alternative]."""
    row = np.zeros(2 + 2 * len(top), dtype="<i4")
    bits = row.view("<f4")
    row[0], bits[1] = token, logprob
    for i, (t, lp) in enumerate(top):
        row[2 + 2 * i], bits[3 + 2 * i] = t, lp
    return Frame(type=TOKEN, flags=flags, route_id=at.route_id, session_id=at.session_id, seq=at.seq, position=position, n_tokens=1, dtype=I32, width=len(row), payload=row.tobytes())


def rows_frame(type_: int, at: Frame, position: int, rows: np.ndarray, dtype: int, flags: int = 0) -> Frame:
    """Hidden or Logits rows [n x width] (f32 in), sent as F32 or F16 (round to nearest even)."""
    rows = np.ascontiguousarray(rows, dtype=np.float32)
    payload = rows.astype("<f4").tobytes() if dtype == F32 else rows.astype("<f2").tobytes()
    n, width = rows.shape
    return Frame(type=type_, flags=flags, route_id=at.route_id, session_id=at.session_id, seq=at.seq, position=position, n_tokens=n, dtype=dtype, width=width, payload=payload)


def body_bytes(f: Frame) -> int:
    """Bytes of data before a timing trailer."""
    elem = ELEMENT_BYTES.get(f.dtype)
    if elem is None:
        return len(f.payload)
    return f.n_tokens * f.width * elem


def payload_body(f: Frame) -> bytes:
    return f.payload[: body_bytes(f)]


def decode_i32(f: Frame) -> np.ndarray:
    return np.frombuffer(payload_body(f), dtype="<i4").astype(np.int64)


def decode_rows(f: Frame) -> np.ndarray:
    """Rows [n x width] as f32."""
    body = payload_body(f)
    if f.dtype == F32:
        a = np.frombuffer(body, dtype="<f4")
    elif f.dtype == F16:
        a = np.frombuffer(body, dtype="<f2").astype(np.float32)
    else:
        raise _fail("FRAME_BAD_DTYPE", "dtype", f"{DTYPE_NAMES.get(f.dtype, f.dtype)} is not a float row type")
    return a.reshape(f.n_tokens, f.width).astype(np.float32, copy=True)


# ---- timing trailer ----

_RECORD = struct.Struct("<8I")


def timings_of(f: Frame) -> list[tuple[int, ...]]:
    if not f.flags & TIMINGS:
        return []
    body = body_bytes(f)
    (n,) = struct.unpack_from("<I", f.payload, len(f.payload) - 4)
    return [_RECORD.unpack_from(f.payload, body + i * TIMING_RECORD_BYTES) for i in range(n)]


def without_timings(f: Frame) -> Frame:
    """The frame with its timing trailer (if any) taken off."""
    return f.with_(flags=f.flags & ~TIMINGS, payload=payload_body(f)) if f.flags & TIMINGS else f


def with_timings(f: Frame, *added: tuple[float, ...]) -> Frame:
    """The frame with 8-u32 records appended to its trailer (JSON/None replies carry none)."""
    if f.dtype not in ELEMENT_BYTES:
        return f
    clamp = lambda x: max(0, min(0xFFFFFFFF, int(round(x))))  # noqa: E731
    records = timings_of(f) + [tuple(clamp(x) for x in record) for record in added]
    out = bytearray(payload_body(f))
    for r in records:
        out += _RECORD.pack(*r)
    out += struct.pack("<I", len(records))
    return f.with_(flags=f.flags | TIMINGS, payload=bytes(out))

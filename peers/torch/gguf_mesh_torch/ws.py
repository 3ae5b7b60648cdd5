"""A small RFC 6455 WebSocket over asyncio streams, both ends (client handshake here, the
server's in http_server.py). Written here because the standard library has none, and one
asyncio HTTP server must answer the WebSocket upgrade and the binary HTTP paths on the same
port (upstream nodes reach http://host:port from ws://host:port/v1/frames), which Debian's
python3-websockets 10.4 cannot: it reads no request bodies."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import struct
from urllib.parse import urlsplit

import numpy as np

from .errors import MeshError

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
MAX_MESSAGE = 512 * 1024 * 1024  # as the TypeScript peers accept
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0, 1, 2, 8, 9, 10


def accept_key(key: str) -> str:
    return base64.b64encode(hashlib.sha1(key.encode() + GUID).digest()).decode()


def _mask(data: bytes, key: bytes) -> bytes:
    n = len(data)
    if n == 0:
        return data
    pad = (-n) % 4
    words = np.frombuffer(data + b"\0" * pad, dtype="<u4") ^ np.frombuffer(key, dtype="<u4")[0]
    return words.tobytes()[:n]


class Closed(Exception):
    """The connection ended (close frame, EOF or error)."""


class WebSocket:
    """One open connection. recv() yields whole messages; sends are serialised by a lock."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, client: bool, remote: str):
        self.reader, self.writer = reader, writer
        self.client = client  # clients mask what they send (RFC 6455 5.3)
        self.remote = remote
        self.closed = False
        self.close_code: int | None = None
        self._send_lock = asyncio.Lock()

    async def _read_frame(self) -> tuple[bool, int, bytes]:
        b0, b1 = await self.reader.readexactly(2)
        fin, opcode, masked, n = bool(b0 & 0x80), b0 & 0x0F, bool(b1 & 0x80), b1 & 0x7F
        if n == 126:
            (n,) = struct.unpack("!H", await self.reader.readexactly(2))
        elif n == 127:
            (n,) = struct.unpack("!Q", await self.reader.readexactly(8))
        if n > MAX_MESSAGE:
            raise Closed(f"a {n}-byte WebSocket frame exceeds {MAX_MESSAGE}")
        key = await self.reader.readexactly(4) if masked else None
        data = await self.reader.readexactly(n)
        return fin, opcode, _mask(data, key) if key else data

    async def recv(self) -> tuple[int, bytes]:
        """The next message as (OP_TEXT | OP_BINARY, bytes); raises Closed at the end."""
        parts: list[bytes] = []
        kind = None
        try:
            while True:
                fin, op, data = await self._read_frame()
                if op == OP_PING:
                    await self._send(OP_PONG, data)
                    continue
                if op == OP_PONG:
                    continue
                if op == OP_CLOSE:
                    self.close_code = struct.unpack("!H", data[:2])[0] if len(data) >= 2 else 1005
                    await self.close(self.close_code if self.close_code != 1005 else 1000)
                    raise Closed(f"closed by {self.remote} ({self.close_code})")
                if op in (OP_TEXT, OP_BINARY):
                    kind, parts = op, [data]
                elif op == OP_CONT and kind is not None:
                    parts.append(data)
                else:
                    raise Closed(f"unexpected WebSocket opcode {op} from {self.remote}")
                if sum(map(len, parts)) > MAX_MESSAGE:
                    raise Closed(f"a WebSocket message from {self.remote} exceeds {MAX_MESSAGE} bytes")
                if fin:
                    return kind, b"".join(parts)
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            self._abort()
            raise Closed(f"connection to {self.remote} ended ({e.__class__.__name__})") from None

    async def _send(self, opcode: int, data: bytes) -> None:
        if self.closed:
            raise Closed(f"connection to {self.remote} is closed")
        n = len(data)
        head = bytes([0x80 | opcode])
        mbit = 0x80 if self.client else 0
        if n < 126:
            head += bytes([mbit | n])
        elif n < 1 << 16:
            head += bytes([mbit | 126]) + struct.pack("!H", n)
        else:
            head += bytes([mbit | 127]) + struct.pack("!Q", n)
        if self.client:
            key = os.urandom(4)
            head, data = head + key, _mask(data, key)
        async with self._send_lock:
            try:
                self.writer.write(head)
                self.writer.write(data)
                await self.writer.drain()
            except (ConnectionError, OSError) as e:
                self._abort()
                raise Closed(f"connection to {self.remote} failed: {e}") from None

    async def send_binary(self, data: bytes) -> None:
        await self._send(OP_BINARY, data)

    async def send_text(self, text: str) -> None:
        await self._send(OP_TEXT, text.encode())

    async def close(self, code: int = 1000, reason: str = "") -> None:
        if self.closed:
            return
        try:
            await self._send(OP_CLOSE, struct.pack("!H", code) + reason.encode()[:120])
        except Closed:
            pass
        self._abort()

    def _abort(self) -> None:
        self.closed = True
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - closing a broken transport
            pass


async def read_http_head(reader: asyncio.StreamReader, limit: int = 65536) -> tuple[str, dict[str, str]]:
    """The start line and the headers (lower-case names) of an HTTP/1.1 message."""
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > limit:
        raise MeshError("BAD_REQUEST", f"HTTP head over {limit} bytes")
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return lines[0], headers


async def connect(url: str, headers: dict[str, str] | None = None, timeout: float = 10.0) -> WebSocket:
    """Opens ws://host:port/path. An HTTP refusal is AUTH_FAILED (401) or LINK_FAILED."""
    u = urlsplit(url)
    if u.scheme != "ws":
        raise MeshError("LINK_FAILED", f"cannot connect to {url}: only ws:// is supported")
    host, port = u.hostname or "127.0.0.1", u.port or 80
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    key = base64.b64encode(os.urandom(16)).decode()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port, limit=1 << 20), timeout)
        hostport = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        lines = [f"GET {path} HTTP/1.1", f"Host: {hostport}", "Upgrade: websocket", "Connection: Upgrade", f"Sec-WebSocket-Key: {key}", "Sec-WebSocket-Version: 13"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        await writer.drain()
        status_line, resp = await asyncio.wait_for(read_http_head(reader), timeout)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
        raise MeshError("LINK_FAILED", f"cannot connect to {url}: {e.__class__.__name__} {e}") from None
    parts = status_line.split(" ", 2)
    status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
    if status != 101 or resp.get("sec-websocket-accept") != accept_key(key):
        writer.close()
        code = "AUTH_FAILED" if status == 401 else "LINK_FAILED"
        raise MeshError(code, f"cannot connect to {url}: the server answered {status_line!r}")
    return WebSocket(reader, writer, client=True, remote=url)

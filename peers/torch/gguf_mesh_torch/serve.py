"""The listening side of the peer: one asyncio HTTP/1.1 server on one port answering the
WebSocket frame link at /v1/frames, the binary HTTP session paths and GET /v1/status
(docs/protocol.md, "Carriers"), every request checked for the room secret; and
serve_frames(), which answers request frames on any WebSocket (also the control socket)."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
import time
from typing import Awaitable, Callable

from . import frames as fr
from .errors import MeshError
from .fragments import Reassembler
from .frames import Frame, decode_frame, encode_frame
from .ws import OP_TEXT, Closed, WebSocket, accept_key, read_http_head

Handler = Callable[[Frame], Awaitable[Frame]]
SESSION_PATH = re.compile(r"^/v1/sessions/([0-9a-f]{32})(?:/(prefill|decode))?$")
MAX_BODY = fr.HEADER_BYTES + fr.MAX_PAYLOAD_BYTES

# HTTP status of each code (docs/errors.md); codes not named here are 500
_STATUS = {"AUTH_FAILED": 401, "NOT_FOUND": 404, "SESSION_UNKNOWN": 404, "ROUTE_UNKNOWN": 404, "BAD_REQUEST": 400, "BODY_TOO_LARGE": 413}
for _c in ("NOT_UPSTREAM", "SESSION_EXISTS", "POSITION_MISMATCH", "CONTEXT_FULL", "SESSION_BAD_STATE", "SESSION_CLOSED", "SESSION_FAILED"):
    _STATUS[_c] = 409
for _c in ("LINK_CLOSED", "LINK_FAILED", "STAGE_FAILED", "STAGE_UNREACHABLE"):
    _STATUS[_c] = 502


def http_status(code: str) -> int:
    if code.startswith("FRAME_") or code.startswith("FRAGMENT_"):
        return 400
    return _STATUS.get(code, 500)


def error_reply(req: Frame | None, e: BaseException) -> Frame:
    """The Error reply to `req` (None: a message that could not be decoded)."""
    err = e if isinstance(e, MeshError) else MeshError("INTERNAL", f"{e.__class__.__name__}: {e}")
    at = req or Frame(type=fr.ERROR)
    return fr.json_frame(fr.ERROR, at, err.to_body(), fr.REPLY)


async def answer(handler: Handler, req: Frame) -> Frame:
    """One request, one reply: route id and sequence of the request, Reply flag set."""
    try:
        reply = await handler(req)
    except BaseException as e:  # noqa: BLE001 - every failure is an Error reply
        if isinstance(e, (asyncio.CancelledError, KeyboardInterrupt)):
            raise
        reply = error_reply(req, e)
    return reply.with_(route_id=req.route_id, seq=req.seq, flags=reply.flags | fr.REPLY)


async def serve_frames(ws: WebSocket, handler: Handler, on_text: Callable[[str], None] | None = None) -> None:
    """Answers the binary request frames arriving on `ws` one at a time in arrival order; a
    message that does not decode is answered with an Error frame (sequence 0) and the socket
    stays usable. Text messages go to `on_text`. Returns when the socket closes."""
    reasm = Reassembler()
    queue: asyncio.Queue = asyncio.Queue()

    async def worker() -> None:
        while True:
            req = await queue.get()
            reply = await answer(handler, req)
            try:
                await ws.send_binary(encode_frame(reply))
            except Closed:
                return
            except MeshError as e:  # a reply we cannot encode: say so instead
                await ws.send_binary(encode_frame(error_reply(req, e).with_(seq=req.seq)))

    task = asyncio.ensure_future(worker())
    try:
        while True:
            kind, data = await ws.recv()
            if kind == OP_TEXT:
                if on_text:
                    on_text(data.decode("utf-8", errors="replace"))
                continue
            try:
                f = reasm.push(data)
            except MeshError as e:
                await ws.send_binary(encode_frame(error_reply(None, e)))
                continue
            if f is not None:
                queue.put_nowait(f.with_(received_at=time.perf_counter()))
    except Closed:
        pass
    finally:
        task.cancel()


PEER_HEADER = "x-mesh-peer"
MAX_PEER_ID = 64


def declared_peer(headers: dict) -> str | None:
    """The peer a request names itself (x-mesh-peer), None when it names none; BAD_REQUEST when malformed."""
    if PEER_HEADER not in headers:
        return None
    peer = headers[PEER_HEADER].strip()
    if not peer or len(peer) > MAX_PEER_ID:
        raise MeshError("BAD_REQUEST", f"{PEER_HEADER}: expected one peer id of 1 to {MAX_PEER_ID} characters", {"field": PEER_HEADER})
    return peer


class FrameServer:
    def __init__(self, secret: str, handler: Handler, status: Callable[[], dict], admit: Callable[[Frame, str | None], None] | None = None):
        """`admit(frame, declared peer)` raises to refuse a frame (the upstream fence, fence.py)."""
        self.secret_hash = hashlib.sha256(secret.encode()).digest()
        self.handler, self.status, self.admit = handler, status, admit
        self.server: asyncio.base_events.Server | None = None
        self.connections: set[WebSocket] = set()
        self.url = self.ws_url = ""

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._conn, host, port, limit=1 << 20)
        sock = self.server.sockets[0].getsockname()
        h = f"[{sock[0]}]" if ":" in sock[0] else sock[0]
        self.url = f"http://{h}:{sock[1]}"
        self.ws_url = f"ws://{h}:{sock[1]}/v1/frames"

    def _authorised(self, headers: dict) -> bool:
        m = re.match(r"^Bearer\s+(.+)$", headers.get("authorization", ""), re.I)
        presented = hashlib.sha256(m.group(1).strip().encode()).digest() if m else b""
        return hmac.compare_digest(presented, self.secret_hash)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                start_line, headers = await read_http_head(reader)
                parts = start_line.split(" ")
                if len(parts) < 2:
                    return
                method, path = parts[0], parts[1].split("?")[0]
                if headers.get("upgrade", "").lower() == "websocket":
                    await self._upgrade(reader, writer, path, headers)
                    return
                body = await self._body(reader, headers)
                status, ctype, payload = await self._route(method, path, headers, body)
                keep = headers.get("connection", "").lower() != "close"
                head = f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\ncontent-length: {len(payload)}\r\nconnection: {'keep-alive' if keep else 'close'}\r\n\r\n"
                writer.write(head.encode() + payload)
                await writer.drain()
                if not keep:
                    return
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError, MeshError, ValueError):
            pass
        finally:
            writer.close()

    async def _body(self, reader: asyncio.StreamReader, headers: dict) -> bytes:
        if headers.get("transfer-encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int((await reader.readline()).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    await reader.readline()
                    return bytes(out)
                if len(out) + size > MAX_BODY:
                    raise MeshError("BODY_TOO_LARGE", "request body too large")
                out += await reader.readexactly(size)
                await reader.readline()
        n = int(headers.get("content-length", "0") or 0)
        if n > MAX_BODY:
            raise MeshError("BODY_TOO_LARGE", f"a {n}-byte body exceeds {MAX_BODY}")
        return await reader.readexactly(n) if n else b""

    def _from(self, peer: str | None) -> Handler:
        """The handler for frames over a connection that declared `peer`."""

        async def handle(f: Frame) -> Frame:
            if self.admit:
                self.admit(f, peer)
            return await self.handler(f)

        return handle

    async def _upgrade(self, reader, writer, path: str, headers: dict) -> None:
        code = None if path == "/v1/frames" else "NOT_FOUND"
        if code is None and not self._authorised(headers):
            code = "AUTH_FAILED"
        peer = None
        try:
            peer = declared_peer(headers)
        except MeshError as e:
            code = code or e.code
        if code or "sec-websocket-key" not in headers:
            status = http_status(code or "BAD_REQUEST")
            writer.write(f"HTTP/1.1 {status} Refused\r\nconnection: close\r\ncontent-length: 0\r\n\r\n".encode())
            await writer.drain()
            return
        writer.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" f"Sec-WebSocket-Accept: {accept_key(headers['sec-websocket-key'])}\r\n\r\n").encode())
        await writer.drain()
        ws = WebSocket(reader, writer, client=False, remote="upstream")
        self.connections.add(ws)
        try:
            await serve_frames(ws, self._from(peer))
        finally:
            self.connections.discard(ws)

    async def _route(self, method: str, path: str, headers: dict, body: bytes) -> tuple[int, str, bytes]:
        def json_answer(status: int, value) -> tuple[int, str, bytes]:
            return status, "application/json", json.dumps(value).encode()

        if not self._authorised(headers):
            return json_answer(401, {"error": {"code": "AUTH_FAILED", "message": "missing or wrong room secret (Authorization: Bearer <secret>)"}})
        if method == "GET" and path == "/v1/status":
            return json_answer(200, self.status())
        m = SESSION_PATH.match(path)
        if not m:
            return json_answer(404, {"error": {"code": "NOT_FOUND", "message": f"{method} {path} is not served here"}})
        sid, step = m.group(1), m.group(2)
        try:
            handler = self._from(declared_peer(headers))
        except MeshError as e:
            return json_answer(400, {"error": e.to_body()})
        if method == "GET" and step is None:
            reply = await answer(handler, Frame(type=fr.STATUS, session_id=sid))
            if reply.type == fr.ERROR:
                b = fr.decode_json(reply)
                return json_answer(http_status(b["code"]), {"error": b})
            return json_answer(200, fr.decode_json(reply) if reply.dtype == fr.JSON else {})
        try:
            if method == "DELETE" and step is None:
                reply = await answer(handler, Frame(type=fr.SESSION_CLOSE, session_id=sid))
            else:
                allowed = {(None, "POST"): (fr.SESSION_OPEN,), ("prefill", "POST"): (fr.PREFILL, fr.HIDDEN), ("decode", "POST"): (fr.DECODE, fr.HIDDEN)}.get((step, method))
                if allowed is None:
                    raise MeshError("NOT_FOUND", f"{method} {path} is not a session endpoint")
                f = decode_frame(body)
                if f.session_id != sid:
                    raise MeshError("FRAME_SESSION_MISMATCH", f"frame session id: the path names {sid}, the frame {f.session_id}", {"field": "session id"})
                if f.type not in allowed:
                    raise MeshError("FRAME_BAD_TYPE", f"frame type: {fr.TYPE_NAMES[f.type]} is not accepted at {path}", {"field": "type"})
                reply = await answer(handler, f.with_(received_at=time.perf_counter()))
        except MeshError as e:
            reply = error_reply(None, e)
        status = http_status(fr.decode_json(reply)["code"]) if reply.type == fr.ERROR else 200
        return status, "application/octet-stream", encode_frame(reply)

    async def close(self) -> None:
        for ws in list(self.connections):
            await ws.close(1001)
        if self.server:
            self.server.close()

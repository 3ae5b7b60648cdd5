"""Links to the next stage: request frames out, replies (matched by sequence number) back.
`start(frame)` puts the request on the wire at once, in call order, and returns a future for
its reply, so a pipelined prefill chunk never overtakes or is overtaken by a later one."""

from __future__ import annotations

import asyncio
import base64
import urllib.error
import urllib.request

from . import frames as fr
from .errors import MeshError
from .fragments import Reassembler
from .frames import Frame, decode_frame, encode_frame
from .ws import Closed, WebSocket, connect


def unwrap(reply: Frame) -> Frame:
    """An Error reply becomes the MeshError it carries."""
    if reply.type == fr.ERROR:
        body = fr.decode_json(reply)
        raise MeshError.from_body(body if isinstance(body, dict) else {})
    return reply


class _Pending:
    def __init__(self) -> None:
        self.next_seq = 1
        self.waiting: dict[int, asyncio.Future] = {}

    def take(self) -> tuple[int, asyncio.Future]:
        seq = self.next_seq
        self.next_seq = (self.next_seq + 1) & 0xFFFFFFFF or 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[seq] = fut
        return seq, fut

    def deliver(self, f: Frame) -> None:
        fut = self.waiting.pop(f.seq, None)
        if fut and not fut.done():
            fut.set_result(f)

    def fail_all(self, e: MeshError) -> None:
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(e)
        self.waiting.clear()


def auth_headers(secret: str, peer_id: str | None) -> dict:
    """The room secret, and this peer's id: the next stage serves hidden states only from its current upstream (x-mesh-peer)."""
    return {"Authorization": f"Bearer {secret}", **({"x-mesh-peer": peer_id} if peer_id else {})}


class WsLink:
    def __init__(self, ws: WebSocket):
        self.ws, self.remote = ws, ws.remote
        self.pending = _Pending()
        self.closed: MeshError | None = None
        self.reader = asyncio.ensure_future(self._read())

    @staticmethod
    async def open(url: str, secret: str, timeout: float = 5.0, peer_id: str | None = None) -> "WsLink":
        return WsLink(await connect(url, auth_headers(secret, peer_id), timeout))

    async def _read(self) -> None:
        reasm = Reassembler()
        try:
            while True:
                kind, data = await self.ws.recv()
                if kind == 2:
                    f = reasm.push(data)
                    if f:
                        self.pending.deliver(f)
        except Closed as e:
            self._drop(MeshError("LINK_CLOSED", f"connection to {self.remote} closed ({e})"))
        except MeshError as e:
            self._drop(MeshError("LINK_FAILED", f"connection to {self.remote}: undecodable reply ({e.message})"))
            await self.ws.close(1002)

    def _drop(self, e: MeshError) -> None:
        self.closed = self.closed or e
        self.pending.fail_all(e)

    def start(self, frame: Frame) -> asyncio.Future:
        if self.closed:
            raise self.closed
        seq, fut = self.pending.take()
        data = encode_frame(frame.with_(seq=seq, flags=frame.flags & ~fr.REPLY))

        async def send():
            try:
                await self.ws.send_binary(data)
            except Closed as e:
                self._drop(MeshError("LINK_FAILED", f"connection to {self.remote} failed: {e}"))

        # the lock inside send_binary is taken at once when free, so call order is wire order
        asyncio.ensure_future(send())
        return fut

    async def request(self, frame: Frame) -> Frame:
        return unwrap(await self.start(frame))

    async def close(self) -> None:
        self._drop(MeshError("LINK_CLOSED", f"link to {self.remote} closed"))
        await self.ws.close()


class HttpLink:
    """Binary HTTP to a node (POST/DELETE /v1/sessions/…), one request at a time in order."""

    def __init__(self, base: str, secret: str, peer_id: str | None = None):
        self.remote, self.secret, self.peer_id = base.rstrip("/"), secret, peer_id
        self.queue: asyncio.Lock = asyncio.Lock()
        self.closed: MeshError | None = None

    def _post(self, frame: Frame) -> Frame:
        base = f"{self.remote}/v1/sessions/{frame.session_id}"
        method, url, body = "POST", base, encode_frame(frame)
        if frame.type in (fr.PREFILL, fr.DECODE, fr.HIDDEN):
            step = "decode" if frame.type == fr.DECODE or (frame.type == fr.HIDDEN and frame.n_tokens == 1) else "prefill"
            url = f"{base}/{step}"
        elif frame.type == fr.SESSION_CLOSE:
            method, body = "DELETE", None
        elif frame.type != fr.SESSION_OPEN:
            raise MeshError("FRAME_BAD_TYPE", f"frame type: {fr.TYPE_NAMES[frame.type]} has no HTTP endpoint", {"field": "type"})
        req = urllib.request.Request(url, data=body, method=method, headers={**auth_headers(self.secret, self.peer_id), "Content-Type": "application/octet-stream"})
        try:
            with urllib.request.urlopen(req, timeout=600) as res:
                data = res.read()
        except urllib.error.HTTPError as e:
            data = e.read()
            if e.headers.get("content-type") != "application/octet-stream":
                raise MeshError("LINK_FAILED", f"{method} {url}: HTTP {e.code} {data[:200]!r}") from None
        except OSError as e:
            raise MeshError("LINK_FAILED", f"{method} {url} failed: {e}") from None
        return decode_frame(data)

    def start(self, frame: Frame) -> asyncio.Future:
        async def run():
            async with self.queue:
                return await asyncio.to_thread(self._post, frame)

        return asyncio.ensure_future(run())

    async def request(self, frame: Frame) -> Frame:
        return unwrap(await self.start(frame))

    async def close(self) -> None:
        pass


class RelayLink:
    """Frames for a peer without a listen address, through the server's control socket."""

    def __init__(self, to: str, send_json):
        self.to, self.remote, self.send_json = to, f"relay to {to}", send_json
        self.next_id = 1
        self.waiting: dict[int, asyncio.Future] = {}

    def start(self, frame: Frame) -> asyncio.Future:
        rid = self.next_id
        self.next_id += 1
        fut = asyncio.get_running_loop().create_future()
        self.waiting[rid] = fut
        self.send_json({"t": "relay", "to": self.to, "id": rid, "frame": base64.b64encode(encode_frame(frame.with_(flags=frame.flags & ~fr.REPLY))).decode()})
        return fut

    def deliver(self, m: dict) -> None:
        fut = self.waiting.pop(int(m.get("id", -1)), None)
        if not fut or fut.done():
            return
        if m.get("error"):
            err = m["error"]
            fut.set_exception(MeshError.from_body(err) if isinstance(err, dict) else MeshError("LINK_FAILED", str(err)))
        else:
            try:
                fut.set_result(decode_frame(base64.b64decode(m.get("frame", ""))))
            except MeshError as e:
                fut.set_exception(MeshError("LINK_FAILED", f"relay reply: {e.message}"))

    async def request(self, frame: Frame) -> Frame:
        return unwrap(await self.start(frame))

    async def close(self) -> None:
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(MeshError("LINK_CLOSED", f"{self.remote} closed"))
        self.waiting.clear()


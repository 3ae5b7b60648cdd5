"""Joining a room as a native peer (docs/protocol.md, "Peer control connection" and
"Joining, step by step"): read the room's model and manifest, listen for frames, answer the
challenge with the hello, and on each assignment release the old stage, load the shard,
link to the next stage and report ready (or load-failed) — until the control socket closes.

Repair (items 7 and 8 there): a peer outside the route loads the standby shard it is given and
takes it over without reading it again when assigned it; a rewire links the stage to a new next
stage; SIGTERM/SIGINT is a graceful leave (the server hands the stage over, then says leave-ok).
The server's heartbeat pings are answered by the WebSocket layer (ws.py)."""

from __future__ import annotations

import asyncio
import base64
import hmac
import hashlib
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs, quote, urlsplit

import torch

from .config import ARCHITECTURES
from .dequant import SUPPORTED
from .engine import TensorStore, TorchStage
from .errors import MeshError
from .frames import Frame, encode_frame
from .fence import UpstreamFence
from .links import HttpLink, RelayLink, WsLink
from .loader import ProgressGate, ShardCache, load_shard
from .serve import FrameServer, serve_frames
from .stage import StageService
from .ws import Closed, connect


def parse_join_url(url: str) -> tuple[str, str, str | None]:
    """http(s)://host/room/<id>#secret=… → (base, room id, secret or None)."""
    u = urlsplit(url)
    m = re.search(r"/room/([A-Za-z0-9_.-]+)/?$", u.path)
    if not u.scheme.startswith("http") or not m:
        raise MeshError("BAD_JOIN_URL", f"'{url}' is not a room link (expected http(s)://host/room/<id>#secret=…)")
    secret = parse_qs(u.fragment).get("secret", [None])[0]
    return f"{u.scheme}://{u.netloc}", m.group(1), secret


def parse_byte_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*", text, re.I)
    if not m:
        raise MeshError("BAD_REQUEST", f"--memory: '{text}' is not a size (e.g. 4GiB = 4·2³⁰ bytes, 8GB = 8·10⁹)")
    unit = (m.group(2) or "B").upper()
    power = "BKMGT".index(unit[0])
    return int(float(m.group(1)) * ((1024 if "I" in unit else 1000) ** power))


def default_cache_dir() -> str:
    """Where verified shards live, as for gguf-mesh node: $GGUF_MESH_CACHE, else XDG, else ~/.cache/gguf-mesh; then shards/."""
    root = os.environ.get("GGUF_MESH_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gguf-mesh")
    return os.path.join(root, "shards")


def get_json(url: str, secret: str):
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {secret}"})
    try:
        with urllib.request.urlopen(req, timeout=60) as res:
            return json.loads(res.read())
    except urllib.error.HTTPError as e:
        try:
            err = json.loads(e.read())["error"]
            raise MeshError(str(err["code"]), f"GET {url}: {err.get('message', '')}") from None
        except (ValueError, KeyError, TypeError):
            raise MeshError("AUTH_FAILED" if e.code == 401 else "HTTP_ERROR", f"GET {url}: HTTP {e.code}") from None
    except OSError as e:
        raise MeshError("JOIN_FAILED", f"cannot reach {url}: {e}") from None


class Peer:
    def __init__(self, args, device: torch.device, log):
        self.args, self.device, self.log = args, device, log
        self.base, self.room, secret = parse_join_url(args.join)
        self.secret = args.secret or secret
        if not self.secret:
            raise MeshError("BAD_REQUEST", "--secret is required (or a join URL ending in #secret=…)")
        self.memory = parse_byte_size(args.memory)
        self.cache_dir = None if args.no_cache else (args.cache_dir or default_cache_dir())
        self.peer_id: str | None = None
        self.service: StageService | None = None
        self.downstream = None
        self.route_id: int | None = None
        # the assignment being loaded or served, until released
        self.assigned: dict | None = None
        # a spare's shard: {"m": the standby message, "task": future of (engine, bytes) or None}
        self.standby: dict | None = None
        # a rewire that came while the stage was loading, applied before it reports ready
        self.pending_rewire: dict | None = None
        self.leaving: asyncio.Future | None = None
        self.load_seq = 0
        self.compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="torch")
        self.control = None
        self.joined = asyncio.get_running_loop().create_future()
        # hidden states over the listen address only from the current previous stage
        self.fence = UpstreamFence(log)

    # ---- frames for this peer's stage ----

    async def handle(self, f: Frame) -> Frame:
        if self.service is None:
            raise MeshError("STAGE_NOT_LOADED", "this peer serves no stage yet")
        return await self.service.handle(f)

    def node_status(self) -> dict:
        return {"peerId": self.peer_id, "backend": "torch", "memoryBytes": self.memory, "routeId": self.route_id, **(self.service.status() if self.service else {}), "fence": self.fence.status()}

    # ---- control messages ----

    def send(self, m: dict) -> None:
        if self.control and not self.control.closed:
            asyncio.ensure_future(self._send(json.dumps(m)))

    async def _send(self, text: str) -> None:
        try:
            await self.control.send_text(text)
        except Closed:
            pass

    def on_text(self, text: str) -> None:
        try:
            m = json.loads(text)
        except ValueError:
            return
        t = m.get("t")
        if t == "challenge":
            proof = hmac.new(self.secret.encode(), str(m["nonce"]).encode(), hashlib.sha256).hexdigest()
            self.send({"t": "hello", "proof": proof, **self.offer})
        elif t == "welcome":
            self.peer_id = str(m["peerId"])
            if not self.joined.done():
                self.joined.set_result(m)
        elif t == "error":
            if not self.joined.done():
                self.joined.set_exception(MeshError(str(m.get("code")), str(m.get("message", ""))))
        elif t == "assign":
            asyncio.ensure_future(self.assign(m))
        elif t == "release":
            if self.route_id == m.get("routeId"):
                self.load_seq += 1
                self.route_id = self.assigned = None
                asyncio.ensure_future(self.release_stage())
        elif t == "standby":
            self.load_standby(m)
        elif t == "rewire":
            asyncio.ensure_future(self.rewire(m))
        elif t == "leave-ok":
            if self.leaving and not self.leaving.done():
                self.leaving.set_result(bool(m.get("moved")))
        elif t == "relay-reply" and isinstance(self.downstream, RelayLink):
            self.downstream.deliver(m)

    # ---- assignments ----

    async def release_stage(self) -> None:
        service, link = self.service, self.downstream
        self.service = self.downstream = None
        if service:
            await service.release_all()
        if link:
            await link.close()

    # ---- spares ----

    def load_standby(self, m: dict) -> None:
        """A spare loads and verifies its standby shard now, so taking the stage over later reads nothing."""
        if self.standby and _same_shard(self.standby["m"]["shard"], m["shard"]):
            # the same shard again (a new route): it is loaded, or its load will answer for the new one
            entry = self.standby
            entry["m"] = m
            task = entry["task"]
            if task.done() and not task.cancelled() and task.result():
                self.send({"t": "standby-ready", "routeId": m["routeId"], "stage": m["stage"], "loadMs": 0, "bytesRead": 0})
            return
        t0 = time.perf_counter()
        loop = asyncio.get_running_loop()
        entry: dict = {"m": m}
        self.standby = entry

        def routed() -> dict:
            return {"routeId": entry["m"]["routeId"], "stage": entry["m"]["stage"]}

        async def load():
            try:
                engine, fetched = await loop.run_in_executor(self.compute, self._load, m, ProgressGate(lambda d, t: None))
            except Exception as e:  # noqa: BLE001 - reported as standby-failed
                if self.standby is entry:
                    self.standby = None
                    err = e if isinstance(e, MeshError) else MeshError("LOAD_FAILED", f"{e.__class__.__name__}: {e}")
                    self.log(f"standby: layers {m['shard']['start']}-{m['shard']['end']} failed: {err.code} {err.message}")
                    self.send({"t": "standby-failed", **routed(), "code": err.code, "message": err.message})
                return None
            if self.standby is entry:
                self.log(f"standby: layers {m['shard']['start']}-{m['shard']['end']} loaded ({fetched} bytes read)")
                self.send({"t": "standby-ready", **routed(), "loadMs": (time.perf_counter() - t0) * 1000, "bytesRead": fetched})
            return engine, fetched

        entry["task"] = asyncio.ensure_future(load())

    async def _take_standby(self, a: dict):
        """The standby's loaded shard when it is the one assigned ((engine, bytes) or None); it stops being a standby."""
        s, self.standby = self.standby, None
        if not s or not _same_shard(s["m"]["shard"], a["shard"]):
            return None
        return await s["task"]

    # ---- assignments ----

    async def assign(self, a: dict) -> None:
        self.load_seq += 1
        seq = self.load_seq
        self.route_id = a["routeId"]
        self.assigned, self.pending_rewire = a, None
        self.fence.assigned(a.get("upstreamPeer"))
        t0 = time.perf_counter()
        shard = a["shard"]
        routed = {"routeId": a["routeId"], "stage": a["stage"]}
        loop = asyncio.get_running_loop()
        gate = ProgressGate(lambda d, t: loop.call_soon_threadsafe(self.send, {"t": "loading", **routed, "bytesDone": d, "bytesTotal": t}))
        link = None
        try:
            await self.release_stage()
            warm = await self._take_standby(a)
            engine, fetched = warm or await loop.run_in_executor(self.compute, self._load, a, gate)
            rewire, self.pending_rewire = self.pending_rewire, None
            target = {**a, "downstream": rewire.get("downstream"), "downstreamPeer": rewire.get("downstreamPeer")} if rewire and ("downstream" in rewire or "downstreamPeer" in rewire) else a
            link = await self._connect_next(target)
            if seq != self.load_seq:  # a newer assignment or a release superseded this load
                if link:
                    await link.close()
                return
            self.service = StageService(engine, a["stage"], link, self.compute, self._returner(routed))
            self.downstream = link
            late, self.pending_rewire = self.pending_rewire, None
            if late:  # a neighbour replaced while this stage was linking
                await self.rewire(late)
            hop = "last stage" if link is None else f"next stage via {_hop(link)}"
            self.log(f"stage {a['stage']} of route {a['routeId']}: layers {shard['start']}-{shard['end']} ready ({'from the standby shard; ' if warm else ''}{fetched} bytes read; {hop}; torch on {self.device})")
            self.send({"t": "ready", **routed, "loadMs": (time.perf_counter() - t0) * 1000, "bytesRead": 0 if warm else fetched})
            if rewire:
                self.send({"t": "rewired", **routed})
        except Exception as e:  # noqa: BLE001 - every failure is reported as load-failed
            if link:
                await link.close()
            if seq != self.load_seq:
                return
            err = e if isinstance(e, MeshError) else MeshError("LOAD_FAILED", f"{e.__class__.__name__}: {e}")
            self.log(f"stage {a['stage']} of route {a['routeId']}: load failed: {err.code} {err.message}")
            self.send({"t": "load-failed", **routed, "code": err.code, "message": err.message})

    def _returner(self, routed: dict):
        """The one-way way to the server (the ReturnDirect flag): a Token or Error frame as a `return` control message."""
        return lambda f: self.send({"t": "return", **routed, "frame": base64.b64encode(encode_frame(f)).decode()})

    async def rewire(self, m: dict) -> None:
        """A repair replaced a neighbour: link to the new next stage (steps in flight on the old
        link fail, and the server sends them again) and/or take hidden states from a new previous one."""
        a = self.assigned
        if "upstreamPeer" in m and a is not None and a["routeId"] == m.get("routeId") and a["stage"] == m.get("stage"):
            self.fence.moved(m["upstreamPeer"])
        served = self.service is not None and a is not None and a["routeId"] == m.get("routeId") and a["stage"] == m.get("stage")
        if not served:
            if a is not None and a["routeId"] == m.get("routeId") and a["stage"] == m.get("stage"):
                self.pending_rewire = {**(self.pending_rewire or {}), **m}
            return
        routed = {"routeId": m["routeId"], "stage": m["stage"]}
        try:
            if "downstream" in m or "downstreamPeer" in m:
                link = await self._connect_next({"downstream": m.get("downstream"), "downstreamPeer": m.get("downstreamPeer")})
                old, self.downstream = self.downstream, link
                if self.service is not None:
                    self.service.downstream = link
                if old:
                    await old.close()
                self.log(f"stage {m['stage']} of route {m['routeId']}: rewired to {_hop(link) if link else 'no next stage'}")
            self.send({"t": "rewired", **routed})
        except MeshError as e:
            self.log(f"stage {m['stage']} of route {m['routeId']}: rewire failed: {e.code} {e.message}")

    def _load(self, a: dict, gate) -> tuple[TorchStage, int]:
        shard = a["shard"]
        metadata, tensors, fetched = load_shard(a["modelUrl"], self.base, self.secret, self.peer_id or "unknown", self.manifest, shard["start"], shard["end"], self.cache_dir, gate)
        store = TensorStore(self.device)
        for name, (entry, data) in tensors.items():
            store.add(name, entry["type_id"], tuple(entry["shape"]), data)
        embd = next((t for t in self.manifest["tensors"] if t["name"] == "token_embd.weight"), None)
        return TorchStage(metadata, shard["start"], shard["end"], store, embd["shape"][1] if embd else None), fetched

    async def _connect_next(self, a: dict):
        down, peer = a.get("downstream"), a.get("downstreamPeer")
        if not down:
            return RelayLink(peer, self.send) if peer else None
        try:
            if self.args.carrier == "http":
                base = re.sub(r"/v1/frames$", "", re.sub(r"^ws", "http", down))
                await asyncio.to_thread(get_json, f"{base}/v1/status", self.secret)
                return HttpLink(base, self.secret, self.peer_id)
            return await WsLink.open(down, self.secret, peer_id=self.peer_id)
        except MeshError as e:
            if not peer:
                raise
            self.log(f"next stage {down} not reachable ({e.message}); relaying through the server")
            return RelayLink(peer, self.send)

    # ---- the whole run ----

    async def run(self) -> int:
        room = get_json(f"{self.base}/v1/rooms/{self.room}", self.secret)
        model_id = room["model"]["id"]
        self.manifest = get_json(f"{self.base}/v1/models/{quote(model_id, safe='')}/manifest", self.secret)
        if self.manifest.get("schema_version") != 1:
            raise MeshError("BAD_MANIFEST", f"manifest schema_version {self.manifest.get('schema_version')} is not supported (expected 1)")
        server = FrameServer(self.secret, self.handle, self.node_status, self.fence.admit)
        host, _, port = self.args.listen.rpartition(":")
        await server.start(host.strip("[]") or "127.0.0.1", int(port))
        listen = self.args.advertise or server.ws_url
        self.offer = {
            "backend": "torch",
            # takes the ReturnDirect flag (the one-way token path) and the Verify flag (speculative decoding)
            "directReturn": True,
            "verify": True,
            "memoryBytes": self.memory,
            # what this engine computes (docs/protocol.md: a peer without `serves` is given nothing)
            "serves": {"rangeArchitectures": list(ARCHITECTURES), "wholeModelArchitectures": list(ARCHITECTURES), "weightTypes": list(SUPPORTED)},
            "listen": listen,
            "httpUrl": re.sub(r"/v1/frames$", "", re.sub(r"^ws", "http", listen)),
            "artifact": self.manifest["artifact"]["sha256"],
            "units": ShardCache(self.cache_dir, self.manifest["artifact"]["sha256"]).units(self.manifest),
            **({"name": self.args.name} if self.args.name else {}),
            **({"layers": dict(zip(("start", "end"), map(int, self.args.layers.split("-"))))} if self.args.layers else {}),
        }
        ws_base = re.sub(r"^http", "ws", self.base)
        try:
            self.control = await connect(f"{ws_base}/v1/rooms/{self.room}/peer")
        except MeshError as e:
            raise MeshError("JOIN_FAILED", f"cannot reach {self.base}: {e.message}") from None
        serving = asyncio.ensure_future(serve_frames(self.control, self.handle, self.on_text))
        stop, force = loop_future(), loop_future()

        def on_signal(name: str) -> None:
            # the first signal leaves gracefully; a second one stops waiting for the hand-over
            target = force if stop.done() else stop
            if not target.done():
                target.set_result(name)

        for sig, name in ((signal.SIGTERM, "terminated"), (signal.SIGINT, "interrupted")):
            asyncio.get_running_loop().add_signal_handler(sig, on_signal, name)
        done, _ = await asyncio.wait([self.joined, serving], return_when=asyncio.FIRST_COMPLETED)
        if self.joined not in done:
            raise MeshError("JOIN_FAILED", f"control connection closed ({self.control.close_code}) before welcome")
        w = self.joined.result()  # raises the server's error (AUTH_FAILED …)
        self.log(f"joined room {w['roomId']} as {w['peerId']} (model {w['model']['id']}, {w['model']['nLayer']} layers); listening at {server.url}; torch {torch.__version__} on {self.device}")
        await asyncio.wait([serving, stop], return_when=asyncio.FIRST_COMPLETED)
        if not stop.done():
            self.log(f"leaving: control connection closed ({self.control.close_code})")
            await self.release_stage()
            await server.close()
            return 1
        why = stop.result()
        moved = await self.leave(why, serving, force)
        self.log("stage handed over" if moved else "stage not handed over (no replacement in time)")
        self.log(f"leaving: {why}")
        await self.control.close(1000)
        await self.release_stage()
        await server.close()
        return 0

    async def leave(self, why: str, serving: asyncio.Future, force: asyncio.Future, timeout_s: float = 40.0) -> bool:
        """A graceful leave: the server hands this peer's stage (and its sessions) to a
        replacement while this peer keeps serving, then answers leave-ok."""
        self.log(f"leaving ({why}): handing the stage over…")
        self.leaving = loop_future()
        self.send({"t": "leave"})
        await asyncio.wait([self.leaving, serving, force], timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        return self.leaving.done() and self.leaving.result()


def loop_future() -> asyncio.Future:
    return asyncio.get_running_loop().create_future()


def _same_shard(a: dict, b: dict) -> bool:
    return a["start"] == b["start"] and a["end"] == b["end"]


def _hop(link) -> str:
    return "server relay" if isinstance(link, RelayLink) else "http" if isinstance(link, HttpLink) else "ws"


def run_peer(args, device: torch.device) -> int:
    torch.set_num_threads(max(1, args.threads))

    def log(line: str) -> None:
        print(line, flush=True)

    async def main() -> int:
        return await Peer(args, device, log).run()

    try:
        return asyncio.run(main())
    except KeyboardInterrupt:
        return 0
    except MeshError as e:
        print(f"{e.code}: {e.message}", file=sys.stderr, flush=True)
        return 1

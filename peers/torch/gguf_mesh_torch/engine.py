"""A stage's compute: the weights of layers [start, end) (plus the embedding on the first
stage, the output norm and head on the last), one KV cache per session, and forward(), which
runs the shard over token ids or hidden states at the session's next position. Knows no
frames, sockets or routes."""

from __future__ import annotations

import time

import numpy as np
import torch

from .config import ModelConfig, config_from_metadata
from .dequant import dequantize
from .errors import MeshError
from .kv_cache import KvCache
from .layers import BlockWeights, Matrix, block, rms_norm, rope_tables


class TensorStore:
    """Verified tensor bytes by name, with their ggml type and shape."""

    def __init__(self, device: torch.device):
        self.device = device
        self.raw: dict[str, tuple[int, tuple[int, ...], bytes]] = {}

    def add(self, name: str, type_id: int, shape: tuple[int, ...], data: bytes) -> None:
        self.raw[name] = (type_id, shape, data)

    def has(self, name: str) -> bool:
        return name in self.raw

    def vector(self, name: str) -> torch.Tensor:
        type_id, shape, data = self._get(name)
        n = int(np.prod(shape))
        return torch.from_numpy(dequantize(data, type_id, n)).to(self.device)

    def matrix(self, name: str, rows: int, cols: int) -> Matrix:
        """A GGUF matrix of shape [cols (inner), rows] as torch [rows, cols]."""
        type_id, shape, data = self._get(name)
        if tuple(shape) != (cols, rows):
            raise MeshError("BAD_TENSOR_SHAPE", f"tensor '{name}' has shape {list(shape)}, expected [{cols}, {rows}]")
        w = dequantize(data, type_id, rows * cols).reshape(rows, cols)
        return Matrix(torch.from_numpy(w).to(self.device), type_id)

    def _get(self, name: str):
        if name not in self.raw:
            raise MeshError("TENSOR_MISSING", f"the shard needs tensor '{name}', which the artifact lacks")
        return self.raw[name]


class TorchStage:
    """Layers [start, end) of one model on one torch device."""

    kind = "torch"

    def __init__(self, metadata: dict, start: int, end: int, store: TensorStore, n_vocab_hint: int | None = None):
        self.cfg: ModelConfig = config_from_metadata(metadata, n_vocab_hint)
        cfg = self.cfg
        if not (0 <= start < end <= cfg.n_layer):
            raise MeshError("BAD_SHARD", f"shard [{start}, {end}) is not a layer range of a {cfg.n_layer}-layer model")
        if cfg.n_head % cfg.n_head_kv:
            raise MeshError("UNSUPPORTED_MODEL", f"{cfg.n_head} heads are not a multiple of {cfg.n_head_kv} KV heads")
        self.start, self.end, self.device = start, end, store.device
        d = cfg.n_embd
        self.embd = store.matrix("token_embd.weight", cfg.n_vocab, d).w if start == 0 else None
        self.freq_factors = store.vector("rope_freqs.weight").cpu().numpy() if store.has("rope_freqs.weight") else None
        self.blocks = [self._block(store, i) for i in range(start, end)]
        self.output_norm = self.head = None
        if end == cfg.n_layer:
            self.output_norm = store.vector("output_norm.weight")
            head_name = "output.weight" if store.has("output.weight") else "token_embd.weight"
            self.head = store.matrix(head_name, cfg.n_vocab, d)
        self.sessions: dict[str, KvCache] = {}

    def _block(self, store: TensorStore, i: int) -> BlockWeights:
        cfg = self.cfg
        d, qd, kvd, ff = cfg.n_embd, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim, cfg.n_ff
        p = f"blk.{i}."
        opt = lambda name: store.vector(p + name) if store.has(p + name) else None  # noqa: E731
        return BlockWeights(
            attn_norm=store.vector(p + "attn_norm.weight"),
            wq=store.matrix(p + "attn_q.weight", qd, d),
            wk=store.matrix(p + "attn_k.weight", kvd, d),
            wv=store.matrix(p + "attn_v.weight", kvd, d),
            wo=store.matrix(p + "attn_output.weight", d, qd),
            ffn_norm=store.vector(p + "ffn_norm.weight"),
            w_gate=store.matrix(p + "ffn_gate.weight", ff, d),
            w_up=store.matrix(p + "ffn_up.weight", ff, d),
            w_down=store.matrix(p + "ffn_down.weight", d, ff),
            bq=opt("attn_q.bias"), bk=opt("attn_k.bias"), bv=opt("attn_v.bias"),
            q_norm=opt("attn_q_norm.weight"), k_norm=opt("attn_k_norm.weight"),
        )

    @property
    def is_first(self) -> bool:
        return self.start == 0

    @property
    def is_last(self) -> bool:
        return self.end == self.cfg.n_layer

    # ---- sessions ----

    def open_session(self, sid: str, context_length: int) -> None:
        if sid in self.sessions:
            raise MeshError("SESSION_EXISTS", f"session {sid} is already open")
        self.sessions[sid] = KvCache(self.end - self.start, self.cfg.n_head_kv, self.cfg.head_dim, context_length, self.device)

    def release_session(self, sid: str) -> None:
        kv = self.sessions.pop(sid, None)
        if kv:
            kv.free()

    def truncate_session(self, sid: str, position: int) -> None:
        kv = self.sessions.get(sid)
        if kv is None:
            raise MeshError("SESSION_UNKNOWN", f"frame session id: no session {sid} on this stage", {"field": "session id"})
        kv.truncate(position)

    def session_stats(self, sid: str) -> dict:
        kv = self.sessions[sid]
        return {"position": kv.length, "kvBytes": kv.bytes, "processedTokens": list(kv.processed)}

    # ---- forward ----

    def check_step(self, sid: str, position: int, n: int) -> KvCache:
        """The checks a step passes before anything changes: session, position, room."""
        kv = self.sessions.get(sid)
        if kv is None:
            raise MeshError("SESSION_UNKNOWN", f"frame session id: no session {sid} on this stage", {"field": "session id"})
        if position != kv.length:
            raise MeshError("POSITION_MISMATCH", f"session {sid} is at position {kv.length}, the frame is for position {position}", {"expected": kv.length, "got": position})
        if kv.length + n > kv.context_length:
            raise MeshError("CONTEXT_FULL", f"session context is full: {kv.length} positions held + {n} new > context length {kv.context_length}")
        return kv

    @torch.no_grad()
    def forward(self, sid: str, position: int, tokens: np.ndarray | None = None, hidden: np.ndarray | None = None) -> tuple[str, np.ndarray, float]:
        """Runs the shard at positions [position, position + n). Returns ("hidden", [n, d]) or
        ("logits", [n_vocab] of the last position), and the compute time in ms."""
        cfg = self.cfg
        n = len(tokens) if tokens is not None else hidden.shape[0]
        kv = self.check_step(sid, position, n)
        if tokens is not None:
            bad = [int(t) for t in tokens if not 0 <= int(t) < cfg.n_vocab]
            if bad:
                raise MeshError("BAD_TOKEN", f"token id {bad[0]} is outside the vocabulary [0, {cfg.n_vocab})")
        elif hidden.shape[1] != cfg.n_embd:
            raise MeshError("BAD_STAGE_INPUT", f"hidden states are {hidden.shape[1]} wide, this model's n_embd is {cfg.n_embd}")
        t0 = time.perf_counter()
        kv.reserve(n)
        if tokens is not None:
            x = self.embd[torch.from_numpy(np.asarray(tokens, dtype=np.int64)).to(self.device)]
        else:
            x = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32)).to(self.device)
        cos, sin = rope_tables(cfg, position, n, self.freq_factors, self.device)
        counted = list(kv.processed)
        try:
            for j, w in enumerate(self.blocks):
                x = block(cfg, w, x, position, cos, sin, lambda k, v, j=j: kv.write(j, k, v))
        except BaseException:
            kv.processed = counted  # a failed step leaves the session as it was
            raise
        kv.advance(n)
        if self.head is not None:
            last = rms_norm(x[-1:], self.output_norm, cfg.rms_eps)
            out = ("logits", self.head(last)[0].float().cpu().numpy())
        else:
            out = ("hidden", x.float().cpu().numpy())
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return out[0], out[1], (time.perf_counter() - t0) * 1000.0

    def dispose(self) -> None:
        for kv in self.sessions.values():
            kv.free()
        self.sessions.clear()

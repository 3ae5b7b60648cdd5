"""The transformer block of llama, qwen2 and qwen3, as llama.cpp computes it, in f32 torch.
Shapes: n = tokens in the step, d = n_embd, h = heads, g = KV heads, e = head_dim.
Matrices are stored as GGUF holds them: [out, in] row-major, so y = x · Wᵀ."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .config import ModelConfig
from .rounding import round_activations


@dataclass
class Matrix:
    """A weight matrix [out, in] f32 (dequantised) and the GGUF type it was stored as."""

    w: torch.Tensor
    type_id: int

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [n, in] → [n, out], the activations rounded as ggml rounds them for this type."""
        return round_activations(x, self.type_id) @ self.w.T


@dataclass
class BlockWeights:
    attn_norm: torch.Tensor  # [d]
    wq: Matrix  # [h·e, d]
    wk: Matrix  # [g·e, d]
    wv: Matrix  # [g·e, d]
    wo: Matrix  # [d, h·e]
    ffn_norm: torch.Tensor  # [d]
    w_gate: Matrix  # [ff, d]
    w_up: Matrix  # [ff, d]
    w_down: Matrix  # [d, ff]
    bq: torch.Tensor | None = None  # qwen2: [h·e]
    bk: torch.Tensor | None = None
    bv: torch.Tensor | None = None
    q_norm: torch.Tensor | None = None  # qwen3: [e], RMS norm of each head
    k_norm: torch.Tensor | None = None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., k] scaled to unit RMS over its last axis, times weight [k]. As ggml: the f32
    squares summed in double, their mean rounded to f32, scale = 1/sqrt(mean + eps) in f32."""
    mean = ((x * x).double().sum(dim=-1, keepdim=True) / x.shape[-1]).float()
    scale = 1.0 / torch.sqrt(mean + eps)
    return (x * scale) * weight


def rope_tables(cfg: ModelConfig, start: int, n: int, freq_factors: np.ndarray | None, device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [n, n_rot/2] for positions [start, start + n). As ggml's rope cache: θ starts
    at the position and is multiplied by base^(-2/n_rot) per pair, in f32; each pair's θ is
    divided by its frequency factor (rope_freqs.weight) and scaled by the linear factor."""
    half = cfg.n_rot // 2
    theta_scale = np.float32(cfg.rope_base) ** np.float32(-2.0 / cfg.n_rot)
    pos = np.arange(start, start + n, dtype=np.float32)
    theta = np.empty((n, half), dtype=np.float32)
    t = pos.copy()
    for i in range(half):
        theta[:, i] = t
        t = (t * theta_scale).astype(np.float32)
    if freq_factors is not None:
        theta = (theta / freq_factors[None, :half].astype(np.float32)).astype(np.float32)
    theta = (theta * np.float32(cfg.rope_freq_scale)).astype(np.float32)
    return torch.from_numpy(np.cos(theta)).to(device), torch.from_numpy(np.sin(theta)).to(device)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, n_rot: int, neox: bool) -> torch.Tensor:
    """Rotates the first n_rot dims of every head of x [n, heads, e]: pairs (2i, 2i+1) for
    llama ("normal"), (i, i + n_rot/2) for qwen ("neox"); the other dims pass unchanged."""
    c, s = cos[:, None, :], sin[:, None, :]
    r = x[..., :n_rot]
    if neox:
        a, b = r[..., : n_rot // 2], r[..., n_rot // 2 :]
        rotated = torch.cat([a * c - b * s, a * s + b * c], dim=-1)
    else:
        a, b = r[..., 0::2], r[..., 1::2]
        rotated = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    return torch.cat([rotated, x[..., n_rot:]], dim=-1)


QUERY_CHUNK = 256  # queries per score matrix: a long prefill chunk needs [h, 256, T] at a time, not [h, n, T]


def attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, start: int) -> torch.Tensor:
    """Causal attention of queries q [n, h, e] at positions [start, start+n) over the cached
    keys/values [start+n, g, e] with grouped KV heads; → [n, h·e]."""
    n, h, e = q.shape
    g, t = keys.shape[1], keys.shape[0]
    k = keys.repeat_interleave(h // g, dim=1).permute(1, 2, 0)  # [h, e, T]
    v = values.repeat_interleave(h // g, dim=1).permute(1, 0, 2)  # [h, T, e]
    kpos = torch.arange(t, device=q.device)[None, :]
    out = []
    for a in range(0, n, QUERY_CHUNK):
        qc = q[a : a + QUERY_CHUNK].permute(1, 0, 2)  # [h, c, e]
        scores = torch.bmm(qc, k) * (1.0 / math.sqrt(e))  # [h, c, T]
        qpos = torch.arange(start + a, start + a + qc.shape[1], device=q.device)[:, None]
        probs = torch.softmax(scores.masked_fill(kpos > qpos, float("-inf")), dim=-1)
        out.append(torch.bmm(probs, v).permute(1, 0, 2))  # [c, h, e]
    return torch.cat(out).reshape(n, h * e)


def block(cfg: ModelConfig, w: BlockWeights, x: torch.Tensor, start: int, cos, sin, kv_write) -> torch.Tensor:
    """One transformer block over the residual stream x [n, d]; kv_write(k, v) stores this
    step's keys and values and returns the layer's cached ones. Returns the new x [n, d]."""
    n = x.shape[0]
    h, g, e = cfg.n_head, cfg.n_head_kv, cfg.head_dim
    # attention norm → Q, K, V (qwen2: + biases)
    a = rms_norm(x, w.attn_norm, cfg.rms_eps)
    q, k, v = w.wq(a), w.wk(a), w.wv(a)
    if w.bq is not None:
        q, k, v = q + w.bq, k + w.bk, v + w.bv
    q, k, v = q.view(n, h, e), k.view(n, g, e), v.view(n, g, e)
    # qwen3: RMS norm of each head's q and k
    if w.q_norm is not None:
        q, k = rms_norm(q, w.q_norm, cfg.rms_eps), rms_norm(k, w.k_norm, cfg.rms_eps)
    # RoPE on q and k, then attend over the cache (this step's positions included)
    q = rope(q, cos, sin, cfg.n_rot, cfg.rope_neox)
    k = rope(k, cos, sin, cfg.n_rot, cfg.rope_neox)
    keys, values = kv_write(k, v)
    att = attention(q, keys, values, start)
    # output projection → residual
    x = x + w.wo(att)
    # feed-forward norm → SwiGLU → down → residual
    f = rms_norm(x, w.ffn_norm, cfg.rms_eps)
    gate, up = w.w_gate(f), w.w_up(f)
    return x + w.w_down(torch.nn.functional.silu(gate) * up)

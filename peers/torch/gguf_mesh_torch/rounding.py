"""Activation rounding before a matrix product, as ggml's CPU backend does it on x86: the
activations are converted to the weight type's `vec_dot_type` first (F16 → f16, BF16 → bf16,
Q4_0/Q5_0/Q8_0 → Q8_0, Q4_1/Q5_1 → Q8_1, K-quants → Q8_K). Doing the same here is what makes
greedy tokens agree with llama.cpp on quantised models (docs/protocol.md, "What a stage
computes"). Every function maps f32 [rows, k] to f32 [rows, k]."""

from __future__ import annotations

import torch

F32, F16, BF16 = 0, 1, 30
Q8_0_TYPES = {2, 6, 8}  # Q4_0, Q5_0, Q8_0
Q8_1_TYPES = {3, 7}  # Q4_1, Q5_1
Q8_K_TYPES = {10, 11, 12, 13, 14}  # Q2_K..Q6_K


def _q8_blocks_32(x: torch.Tensor) -> torch.Tensor:
    """quantize_row_q8_0 (AVX2 path): per 32 values, id = 127/amax, q = round-half-even(x·id),
    stored with d = f16(amax/127); the value seen by the dot product is q·d."""
    rows, k = x.shape
    b = x.reshape(rows, k // 32, 32)
    amax = b.abs().amax(dim=-1, keepdim=True)
    d = (amax / 127.0).to(torch.float16).to(torch.float32)
    inv = torch.where(amax != 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(b * inv)
    return (q * d).reshape(rows, k)


def _q8_blocks_256(x: torch.Tensor) -> torch.Tensor:
    """quantize_row_q8_K: per 256 values, the value of largest magnitude `max` (signed) gives
    iscale = -127/max, q = min(127, nearest(iscale·x)), d = 1/iscale (f32)."""
    rows, k = x.shape
    b = x.reshape(rows, k // 256, 256)
    idx = b.abs().argmax(dim=-1, keepdim=True)
    mx = torch.gather(b, -1, idx)
    nonzero = mx != 0
    iscale = torch.where(nonzero, -127.0 / torch.where(nonzero, mx, torch.ones_like(mx)), torch.zeros_like(mx))
    q = torch.clamp(torch.round(iscale * b), max=127.0)
    d = torch.where(nonzero, 1.0 / torch.where(nonzero, iscale, torch.ones_like(iscale)), torch.zeros_like(iscale))
    return (q * d).reshape(rows, k)


def round_activations(x: torch.Tensor, weight_type: int) -> torch.Tensor:
    """x [rows, k] f32 as a matmul against a `weight_type` matrix sees it."""
    if weight_type == F32:
        return x
    if weight_type == F16:
        return x.to(torch.float16).to(torch.float32)
    if weight_type == BF16:
        return x.to(torch.bfloat16).to(torch.float32)
    if weight_type in Q8_0_TYPES or weight_type in Q8_1_TYPES:
        return _q8_blocks_32(x)
    if weight_type in Q8_K_TYPES:
        return _q8_blocks_256(x)
    return x

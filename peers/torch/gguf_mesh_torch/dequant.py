"""Dequantisation of GGUF tensor bytes to f32, block by block as ggml lays them out
(ggml-common.h) and in ggml's order of float operations, so the results are bit-identical to
ggml's own to_float (test/torch-dequant.test.ts checks every type against libggml)."""

from __future__ import annotations

import numpy as np

from .errors import MeshError
from .gguf import GGML_TYPES

f32 = np.float32


def _blocks(data: bytes, n: int, block: int, size: int) -> np.ndarray:
    """The bytes as [n_blocks, size] u8."""
    nb = n // block
    if n % block or len(data) < nb * size:
        raise MeshError("BAD_TENSOR_SIZE", f"{n} elements need {nb * size} bytes of {block}-element blocks, got {len(data)}")
    return np.frombuffer(data, dtype=np.uint8, count=nb * size).reshape(nb, size)


def _half(b: np.ndarray) -> np.ndarray:
    """Little-endian f16 in byte pairs [..., 2] → f32 [...]."""
    return np.ascontiguousarray(b).view("<f2")[..., 0].astype(f32)


def _q4_0(b):  # d f16, qs[16]: low nibbles are elements 0..15, high nibbles 16..31
    d = _half(b[:, 0:2])[:, None]
    qs = b[:, 2:18]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int16) - 8
    return q.astype(f32) * d


def _q4_1(b):  # d f16, m f16, qs[16]
    d, m = _half(b[:, 0:2])[:, None], _half(b[:, 2:4])[:, None]
    qs = b[:, 4:20]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(f32)
    return q * d + m


def _fifth_bits(qh_bytes):
    """qh u32 → [n, 32] bit j of qh for element j, as 0 or 16."""
    qh = np.ascontiguousarray(qh_bytes).view("<u4")[:, 0]
    j = np.arange(32, dtype=np.uint32)
    return (((qh[:, None] >> j) & 1) << 4).astype(np.int16)


def _q5_0(b):  # d f16, qh[4], qs[16]
    d = _half(b[:, 0:2])[:, None]
    qs = b[:, 6:22]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int16) | _fifth_bits(b[:, 2:6])
    return (q - 16).astype(f32) * d


def _q5_1(b):  # d f16, m f16, qh[4], qs[16]
    d, m = _half(b[:, 0:2])[:, None], _half(b[:, 2:4])[:, None]
    qs = b[:, 8:24]
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1).astype(np.int16) | _fifth_bits(b[:, 4:8])
    return q.astype(f32) * d + m


def _q8_0(b):  # d f16, qs[32] int8
    d = _half(b[:, 0:2])[:, None]
    return b[:, 2:34].view(np.int8).astype(f32) * d


def _scale_min_k4(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit (scale, min) pairs packed in 12 bytes (ggml's get_scale_min_k4): [n, 8] each."""
    q = scales.astype(np.uint8)
    sc = np.empty((q.shape[0], 8), np.uint8)
    mn = np.empty((q.shape[0], 8), np.uint8)
    sc[:, :4] = q[:, 0:4] & 63
    mn[:, :4] = q[:, 4:8] & 63
    sc[:, 4:] = (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)
    mn[:, 4:] = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return sc.astype(f32), mn.astype(f32)


def _q4_k(b):  # d f16, dmin f16, scales[12], qs[128]; 8 sub-blocks of 32
    d, dmin = _half(b[:, 0:2])[:, None], _half(b[:, 2:4])[:, None]
    sc, mn = _scale_min_k4(b[:, 4:16])
    d_sub, m_sub = d * sc, dmin * mn  # [n, 8]
    qs = b[:, 16:144].reshape(-1, 4, 32)  # 4 chunks of 32 bytes: low nibbles = sub 2j, high = 2j+1
    q = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32).astype(f32)
    return (d_sub[:, :, None] * q - m_sub[:, :, None]).reshape(-1, 256)


def _q5_k(b):  # d f16, dmin f16, scales[12], qh[32], qs[128]
    d, dmin = _half(b[:, 0:2])[:, None], _half(b[:, 2:4])[:, None]
    sc, mn = _scale_min_k4(b[:, 4:16])
    d_sub, m_sub = d * sc, dmin * mn
    qh = b[:, 16:48]  # bit s of qh[l] is the fifth bit of sub-block s, element l
    qs = b[:, 48:176].reshape(-1, 4, 32)
    low = np.stack([qs & 0xF, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.int16)
    bits = ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1).astype(np.int16) << 4
    q = (low + bits).astype(f32)
    return (d_sub[:, :, None] * q - m_sub[:, :, None]).reshape(-1, 256)


def _q6_k(b):  # ql[128], qh[64], scales[16] int8, d f16
    ql = b[:, 0:128].reshape(-1, 2, 64)
    qh = b[:, 128:192].reshape(-1, 2, 32)
    sc = b[:, 192:208].view(np.int8).astype(f32).reshape(-1, 2, 8)
    d = _half(b[:, 208:210])[:, None, None]
    # per half of 128: four runs of 32 elements
    q1 = (ql[:, :, 0:32] & 0xF) | (((qh >> 0) & 3) << 4)
    q2 = (ql[:, :, 32:64] & 0xF) | (((qh >> 2) & 3) << 4)
    q3 = (ql[:, :, 0:32] >> 4) | (((qh >> 4) & 3) << 4)
    q4 = (ql[:, :, 32:64] >> 4) | (((qh >> 6) & 3) << 4)
    q = np.stack([q1, q2, q3, q4], axis=2).astype(np.int16) - 32  # [n, 2, 4, 32]
    # element l of run r uses scale is = l // 16 + 2r
    scale = sc.reshape(-1, 2, 4, 2)  # [n, half, r, l//16]
    ds = (d[:, :, :, None] * scale)[..., None]  # d * sc, then * q
    return (ds * q.reshape(-1, 2, 4, 2, 16).astype(f32)).reshape(-1, 256)


def _q2_k(b):  # scales[16], qs[64], d f16, dmin f16
    sc = b[:, 0:16]
    qs = b[:, 16:80].reshape(-1, 2, 32)
    d, dmin = _half(b[:, 80:82])[:, None], _half(b[:, 82:84])[:, None]
    dl = (d * (sc & 0xF).astype(f32)).reshape(-1, 2, 4, 2)  # [n, half, shift, l//16]
    ml = (dmin * (sc >> 4).astype(f32)).reshape(-1, 2, 4, 2)
    shifts = np.arange(0, 8, 2, dtype=np.uint8)[None, None, :, None]
    q = ((qs[:, :, None, :] >> shifts) & 3).astype(f32).reshape(-1, 2, 4, 2, 16)
    return (dl[..., None] * q - ml[..., None]).reshape(-1, 256)


def _q3_k(b):  # hmask[32], qs[64], scales[12] (sixteen 6-bit scales), d f16
    hm = b[:, 0:32]
    qs = b[:, 32:96].reshape(-1, 2, 32)
    aux = np.ascontiguousarray(b[:, 96:108]).view("<u4")  # [n, 3]
    k1, k2 = np.uint32(0x03030303), np.uint32(0x0F0F0F0F)
    a0, a1, tmp = aux[:, 0], aux[:, 1], aux[:, 2]
    words = np.stack([
        (a0 & k2) | (((tmp >> 0) & k1) << 4),
        (a1 & k2) | (((tmp >> 2) & k1) << 4),
        ((a0 >> 4) & k2) | (((tmp >> 4) & k1) << 4),
        ((a1 >> 4) & k2) | (((tmp >> 6) & k1) << 4),
    ], axis=1).astype("<u4")
    scales = np.ascontiguousarray(words).view(np.int8).astype(np.int16) - 32  # [n, 16]
    d = _half(b[:, 108:110])[:, None]
    dl = (d * scales.astype(f32)).reshape(-1, 2, 4, 2)  # [n, half, shift, l//16]
    shifts = np.arange(0, 8, 2, dtype=np.uint8)[None, None, :, None]
    low = ((qs[:, :, None, :] >> shifts) & 3).astype(np.int16)  # [n, half, shift, 32]
    bit = (np.arange(2)[:, None] * 4 + np.arange(4)[None, :]).astype(np.uint8)  # hmask bit 4·half + shift
    high = ((hm[:, None, None, :] >> bit[None, :, :, None]) & 1).astype(np.int16)
    q = (low - np.where(high == 1, 0, 4)).astype(f32).reshape(-1, 2, 4, 2, 16)
    return (dl[..., None] * q).reshape(-1, 256)


_KERNELS = {2: _q4_0, 3: _q4_1, 6: _q5_0, 7: _q5_1, 8: _q8_0, 10: _q2_k, 11: _q3_k, 12: _q4_k, 13: _q5_k, 14: _q6_k}
SUPPORTED = ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def dequantize(data: bytes, type_id: int, n: int) -> np.ndarray:
    """`n` elements of ggml type `type_id` stored in `data`, as f32 [n]."""
    if type_id not in GGML_TYPES:
        raise MeshError("UNSUPPORTED_TENSOR_TYPE", f"ggml type id {type_id} is unknown")
    name, block, size = GGML_TYPES[type_id]
    if type_id == 0:
        return _blocks(data, n, 1, 4).view("<f4").reshape(n).astype(f32)
    if type_id == 1:
        return _blocks(data, n, 1, 2).view("<f2").reshape(n).astype(f32)
    if type_id == 30:  # bf16: the top half of an f32
        return (_blocks(data, n, 1, 2).view("<u2").reshape(n).astype(np.uint32) << 16).view(f32)
    kernel = _KERNELS.get(type_id)
    if kernel is None:
        raise MeshError("UNSUPPORTED_TENSOR_TYPE", f"this peer cannot dequantise {name} (it reads {', '.join(SUPPORTED)})")
    return kernel(_blocks(data, n, block, size)).reshape(n).astype(f32, copy=False)

"""One session's KV cache on one stage: keys (after RoPE) and values of every position seen,
per layer of the shard, [capacity, n_head_kv, head_dim] f32 each. Capacity starts at 256
positions and doubles up to the context length, as the TypeScript stages' caches do."""

from __future__ import annotations

import torch

from .errors import MeshError

INITIAL_POSITIONS = 256


class KvCache:
    def __init__(self, n_layers: int, n_head_kv: int, head_dim: int, context_length: int, device: torch.device):
        self.n_layers, self.context_length, self.device = n_layers, context_length, device
        self.capacity = min(context_length, INITIAL_POSITIONS)
        shape = (self.capacity, n_head_kv, head_dim)
        self.keys = [torch.zeros(shape, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, device=device) for _ in range(n_layers)]
        self.length = 0  # positions filled = the next position expected
        self.processed = [0] * n_layers  # tokens each layer has processed (index 0 = shard start)

    @property
    def bytes(self) -> int:
        """Bytes the keys and values of all layers hold allocated."""
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def reserve(self, n: int) -> None:
        """Room for positions [length, length + n); CONTEXT_FULL past the context length."""
        need = self.length + n
        if need > self.context_length:
            raise MeshError("CONTEXT_FULL", f"session context is full: {self.length} positions held + {n} new > context length {self.context_length}")
        if need <= self.capacity:
            return
        cap = self.capacity
        while cap < need:
            cap *= 2
        cap = min(cap, self.context_length)

        def grow(t: torch.Tensor) -> torch.Tensor:
            out = torch.zeros((cap, *t.shape[1:]), device=self.device)
            out[: self.length] = t[: self.length]
            return out

        self.keys = [grow(t) for t in self.keys]
        self.values = [grow(t) for t in self.values]
        self.capacity = cap

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stores positions [length, length + n) of `layer` (k, v: [n, n_head_kv, head_dim]);
        returns that layer's keys and values of positions [0, length + n)."""
        n = k.shape[0]
        end = self.length + n
        self.keys[layer][self.length : end] = k
        self.values[layer][self.length : end] = v
        self.processed[layer] += n
        return self.keys[layer][:end], self.values[layer][:end]

    def advance(self, n: int) -> None:
        self.length += n

    def truncate(self, position: int) -> None:
        """Forgets positions [position, length) (a repair's rewind). The rows stay allocated and
        are overwritten by the next write; `processed` keeps counting what was computed."""
        if not 0 <= position <= self.length:
            raise MeshError("POSITION_MISMATCH", f"the session holds {self.length} positions; cannot rewind it to {position}", {"expected": self.length, "got": position})
        self.length = position

    def free(self) -> None:
        self.keys, self.values, self.capacity = [], [], 0

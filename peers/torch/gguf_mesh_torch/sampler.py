"""The last stage's choice of the next token. Greedy (no sampler, or temperature 0) is the
argmax with the lowest id among equal maxima — the same token on every implementation.
With a temperature: top-k, then top-p, then a draw from this peer's own seeded generator
(a seed repeats a run on this peer; other implementations draw differently). Each sampled
token with a temperature is one draw (one uniform double); `draws` given to the constructor
are made first, so a replacement last stage continues the session's random stream."""

from __future__ import annotations

import numpy as np


def argmax(logits: np.ndarray) -> int:
    return int(np.argmax(logits))  # numpy returns the first of equal maxima


class Sampler:
    def __init__(self, settings: dict | None, draws: int = 0):
        s = settings or {}
        self.temperature = float(s.get("temperature") or 0)
        self.top_k = int(s.get("topK") or 0)
        self.top_p = float(s.get("topP") or 1.0)
        self.rng = np.random.default_rng(int(s.get("seed") or 0) & 0xFFFFFFFF)
        if self.temperature > 0 and draws > 0:
            self.rng.random(int(draws))  # the draws the session made already, one double each

    def __call__(self, logits: np.ndarray) -> int:
        if self.temperature <= 0:
            return argmax(logits)
        order = np.argsort(-logits, kind="stable")  # descending, ties: lower id first
        if 0 < self.top_k < len(order):
            order = order[: self.top_k]
        z = logits[order].astype(np.float64) / self.temperature
        p = np.exp(z - z.max())
        p /= p.sum()
        if self.top_p < 1.0:
            keep = int(np.searchsorted(np.cumsum(p), self.top_p) + 1)
            order, p = order[:keep], p[:keep] / p[:keep].sum()
        # one draw: the first index whose cumulative probability passes a uniform double
        cdf = np.cumsum(p)
        i = int(np.searchsorted(cdf / cdf[-1], self.rng.random(), side="right"))
        return int(order[min(i, len(order) - 1)])

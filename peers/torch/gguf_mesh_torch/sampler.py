"""The last stage's choice of the next token: llama.cpp's sampler chain as docs/protocol.md
"A stage" specifies it and the TypeScript sampler (src/model) runs it, step for step and in f32
where they are: logit bias → repeat/frequency/presence penalties over the last `repeatLastN`
tokens → greedy when temperature is 0, else top-k → top-p → min-p → temperature → one draw from
std::mt19937 (mt19937.py). Candidates keep llama.cpp's order (id order until a step sorts
them), because the draw walks them in that order; sums run in order (np.cumsum), not
pairwise (np.sum), and exp/log are taken in f64 and rounded to f32 as the TypeScript stage
does, so a seed draws the same tokens here as there. Each sampled token with a temperature is
one draw; `draws` given to the constructor are skipped first, so a replacement last stage
continues the session's random stream."""

from __future__ import annotations

import math

import numpy as np

from .errors import MeshError
from .mt19937 import Mt19937

DEFAULT_SEED = 0xC0FFEE
f32 = np.float32


def argmax(logits: np.ndarray) -> int:
    return int(np.argmax(logits))  # numpy returns the first of equal maxima


def _opt(s: dict, key: str, default):
    v = s.get(key)
    return default if v is None else v


class Sampler:
    def __init__(self, settings: dict | None, draws: int = 0):
        s = settings if isinstance(settings, dict) else {}
        self.temperature = _opt(s, "temperature", 0)
        self.top_k = _opt(s, "topK", 0)
        self.top_p = _opt(s, "topP", 1)
        self.min_p = _opt(s, "minP", 0)
        self.repeat_penalty = _opt(s, "repeatPenalty", 1)
        self.frequency_penalty = _opt(s, "frequencyPenalty", 0)
        self.presence_penalty = _opt(s, "presencePenalty", 0)
        self.repeat_last_n = _opt(s, "repeatLastN", 64)
        self.seed = _opt(s, "seed", DEFAULT_SEED)
        self.logit_bias = self._check(_opt(s, "logitBias", {}))
        self.rng = Mt19937(self.seed)
        self.draws = 0
        for _ in range(draws):  # the draws the session made already
            self.rng.next_double()
        self.draws = draws

    def _check(self, logit_bias) -> list[tuple[int, float]]:
        """The same checks and BAD_SAMPLER_OPTION messages as the TypeScript sampler (src/model)."""

        def bad(what: str):
            raise MeshError("BAD_SAMPLER_OPTION", what)

        def num(v) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool)

        def integer(v) -> bool:
            return num(v) and float(v).is_integer()

        if not (num(self.temperature) and self.temperature >= 0):
            bad(f"temperature must be >= 0, got {self.temperature}")
        if not (integer(self.top_k) and self.top_k >= 0):
            bad(f"topK must be a non-negative integer, got {self.top_k}")
        if not (num(self.top_p) and 0 < self.top_p <= 1):
            bad(f"topP must be in (0, 1], got {self.top_p}")
        if not (num(self.min_p) and 0 <= self.min_p <= 1):
            bad(f"minP must be in [0, 1], got {self.min_p}")
        if not (num(self.repeat_penalty) and self.repeat_penalty > 0):
            bad(f"repeatPenalty must be > 0, got {self.repeat_penalty}")
        for name, v in (("frequencyPenalty", self.frequency_penalty), ("presencePenalty", self.presence_penalty)):
            if not (num(v) and math.isfinite(v)):
                bad(f"{name} must be a finite number, got {v}")
        if not (integer(self.repeat_last_n) and self.repeat_last_n >= 0):
            bad(f"repeatLastN must be a non-negative integer, got {self.repeat_last_n}")
        if not (integer(self.seed) and 0 <= self.seed <= 0xFFFFFFFF):
            bad(f"seed must be an integer in [0, 2^32), got {self.seed}")
        if not isinstance(logit_bias, dict):
            bad(f"logitBias must be an object of token id → bias, got {logit_bias!r}")
        out = []
        for k, b in logit_bias.items():
            ok_id = isinstance(k, str) and k.isdigit()
            if not ok_id or not num(b) or math.isnan(b):
                bad(f"logitBias: token {k} → {b} is not a token id and a number")
            out.append((int(k), float(b)))
        self.top_k, self.repeat_last_n, self.seed = int(self.top_k), int(self.repeat_last_n), int(self.seed)
        return out

    @property
    def uses_history(self) -> bool:
        """Whether sampling reads the token history (a penalty is on)."""
        return self.repeat_last_n > 0 and (self.repeat_penalty != 1 or self.frequency_penalty != 0 or self.presence_penalty != 0)

    def __call__(self, logits: np.ndarray, history=()) -> int:
        ids = np.arange(len(logits), dtype=np.int64)
        lg = np.array(logits, dtype=np.float32)
        for i, b in self.logit_bias:
            if i < len(lg):
                lg[i] = f32(float(lg[i]) + b)
        self._penalise(lg, history)
        if self.temperature <= 0:
            return int(ids[int(np.argmax(lg))])
        c = _Candidates(ids, lg)
        if self.top_k > 0:
            c.top_k(self.top_k)
        if self.top_p < 1:
            c.top_p(self.top_p)
        if self.min_p > 0:
            c.min_p(self.min_p)
        c.logits = (c.logits / f32(self.temperature)).astype(np.float32)
        return int(c.ids[self._dist(c)])

    def _penalise(self, lg: np.ndarray, history) -> None:
        """llama.cpp's penalties sampler: counts over the last repeatLastN tokens."""
        if not self.uses_history or len(history) == 0:
            return
        counts: dict[int, int] = {}
        for t in list(history)[-self.repeat_last_n :]:
            counts[int(t)] = counts.get(int(t), 0) + 1
        rep = f32(self.repeat_penalty)
        for t, n in counts.items():
            if not 0 <= t < len(lg):
                continue
            x = lg[t]
            scaled = f32(x * rep) if x <= 0 else f32(x / rep)
            lg[t] = f32(scaled - f32(f32(f32(n) * f32(self.frequency_penalty)) + f32(self.presence_penalty)))

    def _dist(self, c: "_Candidates") -> int:
        """llama.cpp's dist sampler: f32 softmax terms summed in f64 in order, one uniform double, the first candidate whose running sum reaches it."""
        u = self.rng.next_double()
        self.draws += 1
        if len(c.ids) == 1:
            return 0
        p = _exp_f32(c.logits - c.max())
        run = np.cumsum(p.astype(np.float64))
        i = int(np.searchsorted(run, run[-1] * u, side="left"))
        return min(i, len(c.ids) - 1)


class _Candidates:
    """llama.cpp's llama_token_data_array: ids and f32 logits, in id order or sorted by logit."""

    def __init__(self, ids: np.ndarray, logits: np.ndarray):
        self.ids, self.logits, self.sorted = ids, logits, False

    def max(self) -> np.float32:
        return self.logits[0] if self.sorted else self.logits.max()

    def _sort(self, p: np.ndarray | None = None) -> np.ndarray | None:
        """Descending by logit, ties: lower id first."""
        order = np.lexsort((self.ids, -self.logits.astype(np.float64)))
        self.ids, self.logits, self.sorted = self.ids[order], self.logits[order], True
        return None if p is None else p[order]

    def top_k(self, k: int) -> None:
        k = min(k, len(self.ids))
        if not self.sorted:
            self._sort()
        self.ids, self.logits = self.ids[:k], self.logits[:k]

    def top_p(self, p: float) -> None:
        """Softmax in f32 (summed in order), sorted, cut where the f32 running sum reaches p."""
        e = _exp_f32(self.logits - self.max())
        probs = (e / np.cumsum(e, dtype=np.float32)[-1]).astype(np.float32)
        if not self.sorted:
            probs = self._sort(probs)
        cum = np.cumsum(probs, dtype=np.float32)
        reached = np.nonzero(cum >= f32(p))[0]
        if len(reached):
            n = int(reached[0]) + 1
            self.ids, self.logits = self.ids[:n], self.logits[:n]

    def min_p(self, p: float) -> None:
        """Keep logits ≥ max + ln(p), in the current order (the first one always, when sorted)."""
        floor = f32(self.max() + f32(math.log(float(f32(p)))))
        keep = self.logits >= floor
        if self.sorted:
            keep[0] = True
            n = int(np.argmin(keep)) if not keep.all() else len(keep)
            self.ids, self.logits = self.ids[:n], self.logits[:n]
        else:
            self.ids, self.logits = self.ids[keep], self.logits[keep]


def _exp_f32(x: np.ndarray) -> np.ndarray:
    """f32(exp(x)) with exp in f64, as Math.fround(Math.exp(x)) makes it."""
    return np.exp(x.astype(np.float64)).astype(np.float32)


def token_logprob(logits: np.ndarray, token: int, top: int) -> tuple[float, list[tuple[int, float]]]:
    """The token's natural-log probability under the raw logits (log-softmax in f64, summed in order) and the `top` most likely tokens' (ties: lower id first)."""
    x = np.asarray(logits, dtype=np.float32).astype(np.float64)
    m = x.max()
    log_z = m + math.log(float(np.cumsum(np.exp(x - m))[-1]))
    best = np.lexsort((np.arange(len(x)), -x))[:top] if top > 0 else []
    return float(x[token] - log_z), [(int(i), float(x[i] - log_z)) for i in best]

"""Speculative decoding on a stage (the Verify flag, docs/protocol.md). The server sends the
step's token and k drafts as one sampled Prefill; every stage computes all k + 1 positions, and
the last stage answers the greedy token after each. The drafts the server then rejects are
dropped by the next Verify frame itself: a stage holding positions past that frame's start, all
of them written past an earlier Verify frame's first token, forgets them before computing — so
the rollback travels in order with the step on every hop. Positions a plain frame wrote are
never dropped so (a Verify frame there is POSITION_MISMATCH, as any frame at the wrong position)."""

from __future__ import annotations

import math
from typing import Awaitable, Callable

import numpy as np

from . import frames as fr
from .frames import Frame

NONE_TENTATIVE = math.inf


def verifies(f: Frame) -> bool:
    """Whether the last stage answers `f` as a Verify frame (a repair's replay computes only)."""
    return bool(f.flags & fr.VERIFY) and not f.flags & fr.REPLAY


def rejected_from(f: Frame, held: int, tentative: float) -> int | None:
    """The position the stage forgets from before Verify frame `f` (the rejected drafts at
    [f.position, held)), or None when it holds nothing there or a plain frame wrote it."""
    return f.position if held > f.position and f.position >= tentative else None


def row_of(f: Frame, i: int) -> Frame:
    """Row i of frame `f` as a one-token sampled frame of its own."""
    row_bytes = len(f.payload) // f.n_tokens
    return f.with_(flags=fr.SAMPLE, position=f.position + i, n_tokens=1, payload=f.payload[i * row_bytes : (i + 1) * row_bytes])


async def verify_answer(f: Frame, tokens, hidden, step: Callable[[Frame, object, object], Awaitable[Frame]]) -> Frame:
    """The last stage's answer to Verify frame `f`: each row computed and sampled as a one-token
    step of its own (`step`: the stage's plain sampled step), exactly as plain decoding computes
    it, and the tokens as one Token frame with the Verify flag at start + count: token i follows
    position start + i."""
    out: list[int] = []
    for i in range(f.n_tokens):
        answer = await step(row_of(f, i), None if tokens is None else tokens[i : i + 1], None if hidden is None else np.ascontiguousarray(hidden[i : i + 1]))
        out.append(int(fr.decode_i32(answer)[0]))
    return fr.tokens_frame(fr.TOKEN, f.with_(seq=0), f.position + f.n_tokens, out, fr.VERIFY)

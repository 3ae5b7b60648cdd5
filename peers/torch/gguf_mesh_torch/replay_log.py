"""What a stage keeps per session for repairs (docs/protocol.md, Rewind / Resend / Replay and
Status `sentHashes` / `receivedHashes`): the Hidden payloads it sent to the next stage, exactly
as sent and frame by frame, so a replacement of the next stage can be rebuilt from them without
recomputing this one; and a 32-bit FNV-1a hash of every row it received, so a repair can find
the first position where a replacement's rows differ from the lost stage's."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FNV_OFFSET = 0x811C9DC5
FNV_PRIME = 0x01000193


def row_hashes(payload: bytes, n_rows: int) -> list[int]:
    """FNV-1a (32-bit) of each of the `n_rows` equal rows of `payload`: byte by byte along a
    row, all rows at once (numpy's uint32 product wraps mod 2^32, as FNV wants)."""
    if n_rows == 0:
        return []
    rows = np.frombuffer(payload, dtype=np.uint8).reshape(n_rows, -1)  # [rows, row bytes]
    h = np.full(n_rows, FNV_OFFSET, dtype=np.uint32)
    prime = np.uint32(FNV_PRIME)
    with np.errstate(over="ignore"):
        for j in range(rows.shape[1]):
            h = (h ^ rows[:, j]) * prime
    return [int(x) for x in h]


@dataclass(frozen=True)
class Logged:
    """One Hidden frame as this stage sent it: rows [position, position + n_tokens)."""

    position: int
    n_tokens: int
    dtype: int
    width: int
    payload: bytes

    @property
    def row_bytes(self) -> int:
        return len(self.payload) // self.n_tokens

    def rows(self, a: int, b: int) -> "Logged":
        """Positions [a, b) of this frame (a, b within it)."""
        rb = self.row_bytes
        return Logged(a, b - a, self.dtype, self.width, self.payload[(a - self.position) * rb : (b - self.position) * rb])


class ReplayLog:
    def __init__(self) -> None:
        self.frames: list[Logged] = []
        self.in_hashes: list[int] = []
        self.bytes = 0  # payload bytes held

    def append(self, f: Logged) -> None:
        self.frames.append(f)
        self.bytes += len(f.payload)

    def received(self, position: int, hashes: list[int]) -> None:
        """Hashes of the rows received at positions [position, position + len(hashes))."""
        del self.in_hashes[position:]
        self.in_hashes.extend(hashes)

    def truncate(self, position: int) -> None:
        """Forgets positions from `position` on (a rewind); a frame across the cut keeps its first rows."""
        while self.frames and self.frames[-1].position + self.frames[-1].n_tokens > position:
            last = self.frames.pop()
            self.bytes -= len(last.payload)
            if last.position < position:
                self.append(last.rows(last.position, position))
                break
        del self.in_hashes[position:]

    @property
    def end(self) -> int:
        """Positions the log covers, from 0."""
        return self.frames[-1].position + self.frames[-1].n_tokens if self.frames else 0

    def slice(self, start: int, end: int, max_tokens: int) -> list[Logged]:
        """The logged frames covering [start, end) as they were sent, or (max_tokens > 1)
        neighbours merged up to max_tokens rows."""
        out: list[Logged] = []
        for f in self.frames:
            a, b = max(f.position, start), min(f.position + f.n_tokens, end)
            if a >= b:
                continue
            part = f.rows(a, b)
            prev = out[-1] if out else None
            if prev and max_tokens > 1 and prev.dtype == part.dtype and prev.position + prev.n_tokens == a and prev.n_tokens + part.n_tokens <= max_tokens:
                out[-1] = Logged(prev.position, prev.n_tokens + part.n_tokens, prev.dtype, prev.width, prev.payload + part.payload)
            else:
                out.append(part)
        return out

    def sent_hashes(self, start: int, end: int) -> list[int]:
        return [h for f in self.slice(start, end, 1) for h in row_hashes(f.payload, f.n_tokens)]

    def received_hashes(self, start: int, end: int) -> list[int]:
        return self.in_hashes[start:end]

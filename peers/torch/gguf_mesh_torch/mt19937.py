"""std::mt19937 (32-bit Mersenne Twister) and libstdc++'s uniform double over it, as
docs/protocol.md specifies the last stage's draw: seeded with the session's `seed`, each draw
is generate_canonical<double, 53> = (a + b * 2^32) / 2^64 of two 32-bit outputs — what
llama.cpp's dist sampler and the TypeScript generator (src/model) draw. numpy's MT19937 seeds
differently (SeedSequence) and makes doubles differently, so the generator is written out here."""

from __future__ import annotations

_N, _M = 624, 397
_MASK = 0xFFFFFFFF


class Mt19937:
    def __init__(self, seed: int):
        mt = [0] * _N
        mt[0] = seed & _MASK
        for i in range(1, _N):
            prev = mt[i - 1] ^ (mt[i - 1] >> 30)
            mt[i] = (1812433253 * prev + i) & _MASK
        self._mt, self._index = mt, _N

    def next_u32(self) -> int:
        if self._index >= _N:
            self._twist()
        y = self._mt[self._index]
        self._index += 1
        y ^= y >> 11
        y ^= (y << 7) & 0x9D2C5680
        y ^= (y << 15) & 0xEFC60000
        y ^= y >> 18
        return y & _MASK

    def next_double(self) -> float:
        """Uniform in [0, 1): (a + b * 2^32) / 2^64, as libstdc++ makes it (1 is pulled below 1)."""
        a = self.next_u32()
        b = self.next_u32()
        r = (a + b * 4294967296) / 18446744073709551616
        return r if r < 1 else 1 - 2.0**-53

    def _twist(self) -> None:
        mt = self._mt
        for i in range(_N):
            y = (mt[i] & 0x80000000) | (mt[(i + 1) % _N] & 0x7FFFFFFF)
            mt[i] = mt[(i + _M) % _N] ^ (y >> 1) ^ (0x9908B0DF if y & 1 else 0)
        self._index = 0

// The Mersenne Twister (MT19937, 32-bit) and libstdc++'s uniform double over it: what
// llama.cpp's `dist` sampler draws with (std::mt19937 seeded with the request's seed, then
// std::uniform_real_distribution<double>(0, 1)), so a seed picks the same tokens here as in
// llama.cpp. Written here because it is 40 lines and npm's copies differ in how they make a
// double (the one that matters is generate_canonical<double, 53>: two 32-bit draws).

const N = 624;
const M = 397;

export class Mt19937 {
  private readonly mt = new Uint32Array(N);
  private index = N;

  constructor(seed: number) {
    this.mt[0] = seed >>> 0;
    for (let i = 1; i < N; i++) {
      const prev = this.mt[i - 1]! ^ (this.mt[i - 1]! >>> 30);
      this.mt[i] = (Math.imul(1812433253, prev) + i) >>> 0;
    }
  }

  /** the next 32 random bits, as an unsigned integer */
  nextU32(): number {
    if (this.index >= N) this.twist();
    let y = this.mt[this.index++]!;
    y ^= y >>> 11;
    y ^= (y << 7) & 0x9d2c5680;
    y ^= (y << 15) & 0xefc60000;
    y ^= y >>> 18;
    return y >>> 0;
  }

  /** uniform in [0, 1) as libstdc++'s generate_canonical<double, 53> makes it: (a + b·2^32) / 2^64 */
  nextDouble(): number {
    const a = this.nextU32();
    const b = this.nextU32();
    const r = (a + b * 4294967296) / 18446744073709551616;
    return r >= 1 ? 1 - Number.EPSILON / 2 : r;
  }

  private twist(): void {
    const mt = this.mt;
    for (let i = 0; i < N; i++) {
      const y = (mt[i]! & 0x80000000) | (mt[(i + 1) % N]! & 0x7fffffff);
      mt[i] = mt[(i + M) % N]! ^ (y >>> 1) ^ (y & 1 ? 0x9908b0df : 0);
    }
    this.index = 0;
  }
}

// The one seeded PRNG of the project: xoshiro128** seeded through splitmix32. Small, fast and
// bit-exact on every platform (32-bit integer ops only), so a seed means the same stream
// everywhere: the sampler's draws and the synthetic models' weights both depend on that.

export class Prng {
  // xoshiro128** state: four 32-bit words (kept as plain numbers; only their low 32 bits matter)
  private a: number;
  private b: number;
  private c: number;
  private d: number;

  constructor(seed: number) {
    let s = seed >>> 0;
    const splitmix32 = (): number => {
      s = (s + 0x9e3779b9) >>> 0;
      let z = s;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.a = splitmix32();
    this.b = splitmix32();
    this.c = splitmix32();
    this.d = splitmix32();
  }

  /** next 32 random bits, as an unsigned integer */
  nextU32(): number {
    const result = Math.imul(rotl(Math.imul(this.b, 5), 7), 9) >>> 0;
    const t = this.b << 9;
    this.c ^= this.a;
    this.d ^= this.b;
    this.b ^= this.c;
    this.a ^= this.d;
    this.c ^= t;
    this.d = rotl(this.d, 11);
    return result;
  }

  /** uniform in [0, 1) with 32 bits of resolution */
  next(): number {
    return this.nextU32() / 4294967296;
  }

  /** approximately normal(0, 1): a sum of 4 uniforms (Irwin–Hall), cheap and platform-exact */
  normal(): number {
    return (this.next() + this.next() + this.next() + this.next() - 2) * 1.7320508075688772;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

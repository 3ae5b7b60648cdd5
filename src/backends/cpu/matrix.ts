// The one thing every CPU kernel file needs to know of a weight matrix: its shape, its bytes,
// a product with activations, and a row read out (embeddings). Its own module, so the weight
// loader, the layer tables and the feed-forward code all name it without importing each other.

/** A weight matrix of `rows` output features × `cols` input features (ggml shape [cols, rows]). */
export interface Matrix {
  readonly name: string;
  readonly rows: number;
  readonly cols: number;
  /** bytes this matrix occupies in memory */
  readonly bytes: number;
  /** y = x · selfᵀ. x: [nTokens × cols]; y: [nTokens × rows] */
  matmul(y: Float32Array, x: Float32Array, nTokens: number): void;
  /** copies row r, as f32, into out[outOffset …]. out: [cols] */
  row(r: number, out: Float32Array, outOffset: number): void;
}

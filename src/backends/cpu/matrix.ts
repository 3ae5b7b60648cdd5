// The one thing every CPU kernel file needs to know of a weight matrix: its shape, its bytes,
// a product with activations, a row read out (embeddings), and the arena staging a product
// takes. Its own module, so the weight loader, the layer tables, the matrix kinds and the
// feed-forward code all name it without importing each other.

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
  /** bytes of arena staging a matmul of nTokens needs when x and y are arena views */
  staging(nTokens: number): number;
}

// Architecture hyper-parameters of a llama-family model, read from GGUF metadata.
// `configFromHeader` (below the types) is the one place that knows metadata key names.

export type Architecture = 'llama' | 'qwen2' | 'qwen3';

export type RopeMode = 'normal' | 'neox';

export interface RopeConfig {
  /** 'normal' rotates adjacent pairs (2i, 2i+1); 'neox' rotates (i, i + n_rot/2) */
  mode: RopeMode;
  /** number of rotated dimensions per head (rope.dimension_count, default head_dim) */
  nRot: number;
  freqBase: number;
  /** linear scaling: positions are multiplied by freqScale (= 1 / rope.scaling.factor) */
  freqScale: number;
  /** llama3-style per-frequency scaling factors (rope_freqs.weight), length nRot/2, or null */
  freqFactors: Float32Array | null;
}

export interface ModelConfig {
  architecture: Architecture;
  nLayer: number;
  nEmbd: number;
  nHead: number;
  nHeadKv: number;
  /** per-head dimension of queries and keys (n_embd / n_head unless key_length says otherwise) */
  headDim: number;
  nFf: number;
  nVocab: number;
  nCtxTrain: number;
  rmsEps: number;
  rope: RopeConfig;
  /** output head shares the token embedding (no output.weight tensor) */
  tiedEmbeddings: boolean;
}

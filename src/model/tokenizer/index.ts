// Public face of the tokenizer layer.
export { Tokenizer } from './tokenizer.ts';
export type { DecodeOptions, EncodeOptions } from './tokenizer.ts';
export { StreamingDecoder } from './stream.ts';
export { loadTokenizer } from './load.ts';
export type { Vocab } from './vocab.ts';
export { SUPPORTED_PRE_TOKENIZERS } from './pretokenize.ts';

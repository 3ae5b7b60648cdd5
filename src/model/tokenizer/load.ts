// Builds the tokenizer of a GGUF artifact from its header (local path or http(s) URL). The
// GGUF reader is imported on first use so that importing the tokenizer pulls in no Node-only
// module (browser code builds a Tokenizer from metadata it already has).

import { Tokenizer } from './tokenizer.ts';

export async function loadTokenizer(location: string): Promise<Tokenizer> {
  const { readHeader } = await import('../../gguf/parse.ts');
  const header = await readHeader(location);
  return Tokenizer.fromMetadata(header.metadata);
}

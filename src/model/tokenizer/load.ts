// Builds the tokenizer of a GGUF artifact from its header (local path or http(s) URL).

import { readHeader } from '../../gguf/parse.ts';
import { Tokenizer } from './tokenizer.ts';

export async function loadTokenizer(location: string): Promise<Tokenizer> {
  const header = await readHeader(location);
  return Tokenizer.fromMetadata(header.metadata);
}

// Turns a stream of generated token ids into text deltas that are always whole UTF-8
// characters: a character split across byte tokens comes out once its last byte arrives.

import type { DecodeOptions, Tokenizer } from './tokenizer.ts';

export class StreamingDecoder {
  private readonly decoder = new TextDecoder('utf-8', { ignoreBOM: true });
  private readonly special: boolean;

  constructor(
    private readonly tokenizer: Tokenizer,
    { special = false }: DecodeOptions = {},
  ) {
    this.special = special;
  }

  /** Text completed by this token ('' while a character is still incomplete). */
  push(id: number): string {
    return this.decoder.decode(this.tokenizer.tokenPiece(id, { special: this.special }), { stream: true });
  }

  /** Ends the stream: an incomplete trailing character comes out as U+FFFD. */
  flush(): string {
    return this.decoder.decode();
  }
}

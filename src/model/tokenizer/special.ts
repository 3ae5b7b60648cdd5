// Splits text around special-token texts before the tokenizer proper runs, as llama.cpp does:
// special tokens are tried longest first, each one cutting every text fragment still left at
// all of its occurrences. Control and unknown tokens are only matched when parsing specials;
// user-defined tokens always are.

import { Attr } from './vocab.ts';
import type { Vocab } from './vocab.ts';

export type Fragment = { text: string } | { token: number };

// C's isspace in the "C" locale
const isAsciiSpace = (c: string | undefined) => c === ' ' || c === '\t' || c === '\n' || c === '\v' || c === '\f' || c === '\r';

export function partitionSpecial(vocab: Vocab, text: string, parseSpecial: boolean): Fragment[] {
  let fragments: Fragment[] = text === '' ? [] : [{ text }];
  for (const id of vocab.specialTokens) {
    const attr = vocab.attrs[id]!;
    if (!parseSpecial && attr & (Attr.CONTROL | Attr.UNKNOWN)) continue;
    const special = vocab.texts[id]!;
    const next: Fragment[] = [];
    for (const frag of fragments) {
      if (!('text' in frag) || !frag.text.includes(special)) {
        next.push(frag);
        continue;
      }
      let rest = frag.text;
      for (let at = rest.indexOf(special); at >= 0; at = rest.indexOf(special)) {
        let left = rest.slice(0, at);
        if (attr & Attr.LSTRIP) left = left.replace(/[ \t\n\v\f\r]+$/, '');
        if (left !== '') next.push({ text: left });
        next.push({ token: id });
        rest = rest.slice(at + special.length);
        if (attr & Attr.RSTRIP) {
          let k = 0;
          while (isAsciiSpace(rest[k])) k++;
          rest = rest.slice(k);
        }
      }
      if (rest !== '') next.push({ text: rest });
    }
    fragments = next;
  }
  return fragments;
}

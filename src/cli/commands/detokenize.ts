// `gguf-mesh detokenize --model <path|url> --tokens 1,2,3`: the text a token sequence stands
// for, as llama.cpp detokenizes it. The text is written exactly, with no newline added.

import type { Command } from '../command.ts';
import { stringOption, UsageError } from '../command.ts';
import { loadTokenizer } from '../../model/tokenizer/index.ts';

/** "1,2,3", "1 2 3" or "[1,2,3]" → ids */
export function parseTokenList(raw: string): number[] {
  const body = raw.trim().replace(/^\[/, '').replace(/\]$/, '').trim();
  if (body === '') return [];
  return body.split(/[\s,]+/).map((part) => {
    if (!/^\d+$/.test(part)) throw new UsageError(`--tokens must be non-negative integers separated by commas, got '${part}'`);
    return Number(part);
  });
}

export const command: Command = {
  name: 'detokenize',
  summary: "turn token ids back into text with a model's tokenizer",
  usage: '--model <path|url> --tokens <id,id,…> [--special] [--json]',
  options: {
    model: { type: 'string', valueName: '<path|url>', description: 'GGUF file or URL whose tokenizer to use' },
    tokens: { type: 'string', valueName: '<id,id,…>', description: 'token ids, e.g. 1,403,407' },
    special: { type: 'boolean', description: 'render control tokens such as <s> as their text' },
    json: { type: 'boolean', description: 'print {"text":"…"} instead of the bare text' },
  },
  async run(args) {
    const model = stringOption(args, 'model', true);
    const ids = parseTokenList(stringOption(args, 'tokens', true));
    const tokenizer = await loadTokenizer(model);
    const text = tokenizer.decode(ids, { special: args.values.special === true });
    if (args.values.json) console.log(JSON.stringify({ text }));
    else process.stdout.write(text);
    return 0;
  },
};

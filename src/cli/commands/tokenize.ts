// `gguf-mesh tokenize --model <path|url> --text <string> [--json]`: the token ids a model's
// own tokenizer gives a text, as llama.cpp tokenizes prompts for generation (BOS/EOS where
// the model asks for them, special-token texts such as <|im_start|> parsed).

import type { Command } from '../command.ts';
import { stringOption } from '../command.ts';
import { loadTokenizer } from '../../model/tokenizer/index.ts';

export const command: Command = {
  name: 'tokenize',
  summary: "turn text into the token ids of a model's tokenizer",
  usage: '--model <path|url> --text <string> [--json]',
  options: {
    model: { type: 'string', valueName: '<path|url>', description: 'GGUF file or URL whose tokenizer to use' },
    text: { type: 'string', valueName: '<string>', description: 'text to tokenize' },
    json: { type: 'boolean', description: 'print {"tokens":[…]} instead of one token per line' },
    'no-add-special': { type: 'boolean', description: 'do not add BOS/EOS' },
    'no-parse-special': { type: 'boolean', description: 'treat special-token texts (e.g. <s>) as plain text' },
  },
  async run(args) {
    const model = stringOption(args, 'model', true);
    const text = stringOption(args, 'text', true);
    const tokenizer = await loadTokenizer(model);
    const tokens = tokenizer.encode(text, {
      addSpecial: args.values['no-add-special'] !== true,
      parseSpecial: args.values['no-parse-special'] !== true,
    });
    if (args.values.json) {
      console.log(JSON.stringify({ tokens }));
    } else {
      for (const id of tokens) console.log(`${id}\t${JSON.stringify(tokenizer.tokenText(id))}`);
    }
    return 0;
  },
};

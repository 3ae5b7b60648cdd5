// `response_format` json_object / json_schema as a token constraint, with xgrammar
// (`@mlc-ai/web-xgrammar`: the xgrammar C++ engine in WebAssembly, MLC's, the one WebLLM uses;
// it compiles a JSON schema or the JSON grammar against the model's vocabulary and gives a
// token bitmask per step, so the output always parses and matches the schema). Chosen over
// writing a JSON automaton here: schemas (refs, enums, patterns, lengths) are a large surface
// and xgrammar is kept well. One tokenizer info and compiler per room, compiled grammars cached
// by their schema; a matcher per choice.

import { createRequire } from 'node:module';
import { dirname } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { CompiledGrammar, GrammarCompiler } from '@mlc-ai/web-xgrammar';
import { MeshError } from '../src/errors.ts';
import type { Tokenizer } from '../src/model/tokenizer/tokenizer.ts';
import type { TokenConstraint } from '../src/route/constrained-stepper.ts';
import { badParam } from './openai-request.ts';
import type { OutputFormat } from './openai-request.ts';

type XGrammar = typeof import('@mlc-ai/web-xgrammar');

let loaded: Promise<XGrammar> | null = null;

/** The package is an Emscripten UMD bundle: as an ES module it wants CommonJS's require/__filename and leaves itself on globalThis.xgrammar. */
function xgrammar(): Promise<XGrammar> {
  loaded ??= (async () => {
    const g = globalThis as Record<string, unknown>;
    g.require ??= createRequire(import.meta.url);
    g.__filename ??= fileURLToPath(import.meta.url);
    g.__dirname ??= dirname(fileURLToPath(import.meta.url));
    await import('@mlc-ai/web-xgrammar');
    const xg = g.xgrammar as XGrammar | undefined;
    if (!xg?.GrammarCompiler) throw new MeshError('INTERNAL', '@mlc-ai/web-xgrammar did not load');
    return xg;
  })();
  return loaded;
}

interface RoomGrammars {
  compiler: Promise<GrammarCompiler>;
  compiled: Map<string, Promise<CompiledGrammar>>;
}
const perTokenizer = new WeakMap<Tokenizer, RoomGrammars>();

function grammarsOf(xg: XGrammar, tokenizer: Tokenizer): RoomGrammars {
  let r = perTokenizer.get(tokenizer);
  if (!r) {
    const v = tokenizer.vocab;
    const info = xg.TokenizerInfo.createTokenizerInfo(v.texts, v.kind === 'spm' ? 'byte_fallback' : 'byte_level', v.kind === 'spm' && v.addSpacePrefix, v.texts.length, [...v.eog]);
    r = { compiler: info.then((i) => xg.GrammarCompiler.createGrammarCompiler(i)), compiled: new Map() };
    perTokenizer.set(tokenizer, r);
  }
  return r;
}

/** A fresh matcher for `format` over the tokenizer's vocabulary, as a TokenConstraint. */
export async function outputConstraint(tokenizer: Tokenizer, format: OutputFormat): Promise<TokenConstraint> {
  const xg = await xgrammar();
  const g = grammarsOf(xg, tokenizer);
  const key = format.kind === 'json' ? 'json' : JSON.stringify(format.schema);
  let compiled = g.compiled.get(key);
  if (!compiled) {
    // compact JSON (no free whitespace): a sampled model cannot pad the output forever
    // json_object: any object (xgrammar's builtin JSON grammar takes any value; strict mode off keeps additionalProperties open)
    compiled = g.compiler.then((c) => (format.kind === 'json' ? c.compileJSONSchema('{"type":"object"}', false, undefined, undefined, false) : c.compileJSONSchema(key, false)));
    g.compiled.set(key, compiled);
    compiled.catch(() => g.compiled.delete(key));
  }
  let grammar: CompiledGrammar;
  try {
    grammar = await compiled;
  } catch (e) {
    throw badParam('response_format', `the schema does not compile: ${e instanceof Error ? e.message : String(e)}`);
  }
  const matcher = await xg.GrammarMatcher.createGrammarMatcher(grammar);
  return {
    allowed: () => matcher.getNextTokenBitmask(),
    accept: (token) => matcher.acceptToken(token),
    dispose: () => matcher.dispose(),
  };
}

/**
 * JSON as a constrained model writes it, delta by delta, with raw control characters inside strings escaped
 * (\u00XX). xgrammar's grammar forbids them, but byte-fallback tokens can still carry one into a
 * string (seen with a synthetic SentencePiece vocabulary); JSON.parse refuses them, so the
 * output is made to parse without changing what it says.
 */
export function controlEscaper(): (delta: string) => string {
  let inString = false;
  let escaped = false;
  return (delta) => {
    let out = '';
    for (const ch of delta) {
      const code = ch.charCodeAt(0);
      if (inString && escaped) escaped = false;
      else if (inString && ch === '\\') escaped = true;
      else if (ch === '"') inString = !inString;
      out += inString && code < 0x20 ? `\\u${code.toString(16).padStart(4, '0')}` : ch;
    }
    return out;
  };
}

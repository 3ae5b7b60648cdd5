// Architectures of the llama.cpp that node-llama-cpp@3.21.1 bundles (libllama.v0.4.0.so), as
// its src/llama-arch.cpp `LLM_ARCH_NAMES` spells them — data only, so the browser bundle and the
// audit can read it without loading llama.cpp. test/llamacpp-capabilities.test.ts checks every
// name against the shipped library. Change it together with the node-llama-cpp pin.

/**
 * Architectures llama.cpp loads and generates with, whole (one stage). Left out: the dummy
 * `clip`, encoder-only and embedding models (the BERT family, t5encoder, gemma-embedding,
 * llama-embed) and the wavtokenizer vocoder, which llama.cpp loads but cannot generate text with.
 */
export const LLAMACPP_WHOLE_MODEL_ARCHITECTURES: readonly string[] = [
  'llama', 'llama4', 'deci', 'falcon', 'grok', 'gpt2', 'gptj', 'gptneox', 'mpt', 'baichuan',
  'starcoder', 'refact', 'bloom', 'stablelm', 'qwen', 'qwen2', 'qwen2moe', 'qwen2vl', 'qwen3',
  'qwen3moe', 'qwen3next', 'qwen3vl', 'qwen3vlmoe', 'qwen35', 'qwen35moe', 'qwen4exp', 'phi2',
  'phi3', 'phimoe', 'plamo', 'plamo2', 'plamo3', 'codeshell', 'orion', 'internlm2', 'minicpm',
  'minicpm3', 'gemma', 'gemma2', 'gemma3', 'gemma3n', 'gemma4', 'gemma4-assistant', 'starcoder2',
  'mamba', 'mamba2', 'jamba', 'falcon-h1', 'xverse', 'command-r', 'cohere2', 'cohere2moe', 'dbrx',
  'olmo', 'olmo2', 'olmoe', 'muse-glimmer', 'openelm', 'arctic', 'deepseek', 'deepseek2',
  'deepseek2-ocr', 'deepseek32', 'deepseek4', 'chatglm', 'glm4', 'glm4moe', 'glm-dsa', 'bitnet',
  't5', 'jais', 'jais2', 'nemotron', 'nemotron_h', 'nemotron_h_moe', 'exaone', 'exaone4',
  'exaone-moe', 'rwkv6', 'rwkv6qwen2', 'rwkv7', 'arwkv7', 'granite', 'granitemoe', 'granitehybrid',
  'graniteswitch', 'granite_swa', 'chameleon', 'plm', 'bailingmoe', 'bailingmoe2', 'bailingmoe3',
  'dots1', 'dots3note', 'arcee', 'afmoe', 'laguna', 'ernie4_5', 'ernie4_5-moe', 'hunyuan-moe',
  'hunyuan-dense', 'hunyuan_vl', 'hy_v3', 'smollm3', 'gpt-oss', 'lfm2', 'lfm2moe', 'dream',
  'smallthinker', 'llada', 'llada-moe', 'seed_oss', 'grovemoe', 'apertus', 'minimax-01',
  'minimax-m2', 'minimax-m3', 'cogvlm', 'rnd1', 'pangu-embedded', 'mistral3', 'eagle3', 'dflash',
  'mistral4', 'paddleocr', 'mimo2', 'step35', 'maincoder', 'kimi-linear', 'kimi-k3', 'talkie',
  'mellum', 'nanbeige', 'qwen3tts', 'pockettts',
];

/**
 * Architectures a llama.cpp node serves any layer range of (range-stage.ts): those whose
 * graph (src/models/<arch>.cpp) takes the batch's embeddings as its input unchanged, names
 * each block's output `l_out-<il>`, and carries nothing but the n_embd-wide residual from one
 * block to the next — checked for each one by test/llamacpp-range.test.ts.
 */
export const LLAMACPP_RANGE_ARCHITECTURES: readonly string[] = ['llama', 'qwen2', 'qwen3'];

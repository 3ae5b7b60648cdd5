// Every error code the product raises, with what it means and the HTTP status a server answers
// when it reaches one. `MeshError` takes only these keys, so an unregistered code fails `tsc`;
// `docs/errors.md` is generated from this table (`npm run docs:errors`) and a test keeps the two
// in step. Codes are stable: tests and peers of other versions match on them, so never rename
// one. A status says whose fault it is: 4xx the caller's, 5xx ours or a stage's.

interface CodeInfo {
  /** the HTTP status a server answers with when this error ends a request */
  readonly status: 400 | 401 | 403 | 404 | 409 | 413 | 429 | 500 | 502 | 503;
  /** one line: what went wrong */
  readonly meaning: string;
}

type Codes = Readonly<Record<string, CodeInfo>>;

const GGUF = {
  GGUF_NOT_FOUND: { status: 500, meaning: 'the GGUF path does not name a readable regular file' },
  GGUF_NOT_GGUF: { status: 500, meaning: "the file does not start with the magic bytes 'GGUF'" },
  GGUF_BAD_VERSION: { status: 500, meaning: 'the GGUF version is not 2 or 3, or the file is big-endian' },
  GGUF_TRUNCATED_HEADER: { status: 500, meaning: 'the file ends before its header does' },
  GGUF_MALFORMED_HEADER: { status: 500, meaning: 'a header field is out of range or the header does not parse' },
  GGUF_MISSING_METADATA: { status: 500, meaning: 'a metadata key the model needs is absent' },
  GGUF_BAD_TENSOR: { status: 500, meaning: 'a tensor is not whole rows of blocks, shares its name, or is not where the previous one ends (misaligned, a gap, an overlap)' },
  GGUF_BAD_METADATA: { status: 500, meaning: 'a metadata value disagrees with the tensors (block_count with the blk.N tensors)' },
  GGUF_UNKNOWN_TYPE: { status: 500, meaning: 'a tensor has a ggml type id this build does not know' },
  GGUF_DATA_PAST_EOF: { status: 500, meaning: "a tensor's bytes run past the end of the file" },
  GGUF_BAD_SPLIT: { status: 500, meaning: 'the parts of a split GGUF disagree (split.* metadata, sizes, duplicate tensors)' },
  GGUF_WRITE_INVALID: { status: 500, meaning: 'the GGUF writer was given metadata or tensors it cannot write' },
  HTTP_ERROR: { status: 500, meaning: 'a fetch failed or a server answered with an HTTP error and no error body' },
  RANGE_NOT_SUPPORTED: { status: 500, meaning: 'the server ignored an HTTP Range request (200 instead of 206)' },
  RANGE_MISMATCH: { status: 500, meaning: 'the server sent other bytes than the Range request asked for' },
  BAD_BYTE_RANGE: { status: 500, meaning: 'a byte range to read has a negative offset or length, or ends past 2^53' },
  SHORT_READ: { status: 500, meaning: 'fewer bytes arrived than the header promised for the file or a tensor' },
  BAD_MANIFEST: { status: 500, meaning: 'an artifact manifest is not JSON or has an unsupported schema' },
  UNKNOWN_TENSOR: { status: 500, meaning: "a tensor was asked for that is not in the artifact's manifest" },
  TENSOR_HASH_MISMATCH: { status: 500, meaning: "a tensor's bytes do not hash to the manifest's sha256, even after a re-fetch" },
  ARTIFACT_HASH_MISMATCH: { status: 500, meaning: "a downloaded artifact file does not hash to the manifest's sha256" },
  BAD_TENSOR_SIZE: { status: 500, meaning: 'an element count is not a whole number of blocks, or the bytes are too few' },
  QUANT_BAD_ROW: { status: 500, meaning: 'the values to quantise are not whole rows of whole blocks' },
  QUANT_UNSUPPORTED_TYPE: { status: 500, meaning: 'the quantiser cannot write this ggml type' },
} as const satisfies Codes;

const MODEL = {
  BAD_MODEL_METADATA: { status: 500, meaning: 'the metadata describes a model this runtime cannot build a config for' },
  UNSUPPORTED_ARCHITECTURE: { status: 500, meaning: 'the architecture is not one the engines run (llama, qwen2, qwen3, qwen2moe, qwen3moe, gemma3, phi3, qwen35, qwen35moe), or uses a feature of it they lack (experts on a dense architecture, grouped expert selection)' },
  UNEXPECTED_TENSOR: { status: 500, meaning: 'the file holds a tensor its architecture and block count do not use (llama.cpp refuses such files)' },
  UNSUPPORTED_ROPE_SCALING: { status: 500, meaning: 'the RoPE scaling type is not none, linear, yarn or longrope' },
  TOKENIZER_MISSING: { status: 500, meaning: 'the model has no tokenizer.ggml.model' },
  TOKENIZER_MISSING_VOCAB: { status: 500, meaning: 'tokenizer.ggml.tokens is missing or not an array of strings' },
  TOKENIZER_MISSING_MERGES: { status: 500, meaning: 'a gpt2 tokenizer lacks tokenizer.ggml.merges' },
  TOKENIZER_BAD_METADATA: { status: 500, meaning: 'tokenizer arrays (scores, token types) disagree with the vocabulary size' },
  TOKENIZER_UNSUPPORTED_MODEL: { status: 500, meaning: 'the tokenizer model is neither llama nor gpt2' },
  TOKENIZER_UNSUPPORTED_PRE: { status: 500, meaning: 'the pre-tokenizer (tokenizer.ggml.pre) is not one this runtime implements' },
  TOKENIZER_NO_BYTE_TOKEN: { status: 500, meaning: 'byte fallback needs a <0xNN> token the vocabulary lacks' },
  TOKENIZER_NO_SPECIAL: { status: 500, meaning: 'a special token (BOS, EOS, …) is asked for but the model defines none' },
  TOKEN_OUT_OF_RANGE: { status: 500, meaning: 'a token id to detokenize is outside the vocabulary' },
  CHAT_TEMPLATE_MISSING: { status: 500, meaning: 'the model has no tokenizer.chat_template and no fallback was accepted' },
  CHAT_TEMPLATE_INVALID: { status: 500, meaning: 'the chat template does not parse as Jinja' },
  CHAT_TEMPLATE_RENDER: { status: 500, meaning: 'the chat template failed while rendering the messages' },
  BAD_SAMPLER_OPTION: { status: 500, meaning: 'a sampler setting is out of range (temperature, top-k, top-p, …)' },
  MAKE_MODEL_BAD_OPTION: { status: 500, meaning: 'an option of make-model is out of range' },
  MAKE_MODEL_BAD_SHAPE: { status: 500, meaning: 'the synthetic model has rows the chosen weight type cannot store' },
  VOCAB_BAD_OPTION: { status: 500, meaning: 'an option of the synthetic vocabulary does not apply or is unknown' },
  VOCAB_TOO_SMALL: { status: 500, meaning: "the synthetic vocabulary size cannot hold the tokenizer's fixed tokens" },
} as const satisfies Codes;

const BACKENDS = {
  BAD_SHARD: { status: 500, meaning: 'a layer range is empty, out of the model, malformed, or its sources do not match' },
  BAD_CONTEXT_LENGTH: { status: 500, meaning: 'a context length is not a positive integer' },
  BAD_STAGE_INPUT: { status: 500, meaning: 'a forward got token ids where hidden states belong (or back), or the wrong count' },
  BAD_TOKEN: { status: 500, meaning: 'a token id fed to the embedding is outside the vocabulary' },
  BAD_TENSOR_SHAPE: { status: 500, meaning: 'a weight tensor has another shape than the config implies' },
  BAD_TENSOR_DATA: { status: 500, meaning: 'a weight tensor has another byte length than its rows need' },
  TENSOR_MISSING: { status: 500, meaning: 'a shard needs a tensor the artifact lacks' },
  TENSOR_TOO_LARGE: { status: 500, meaning: "one row of a matrix exceeds the device's storage binding limit" },
  TENSOR_BYTES_DETACHED: { status: 500, meaning: "a tensor's bytes were already transferred to a worker and cannot be read again" },
  UNSUPPORTED_TENSOR_TYPE: { status: 500, meaning: 'a tensor has a type this engine cannot read' },
  UNSUPPORTED_TENSOR_LAYOUT: { status: 500, meaning: 'the model stores weights in a layout this engine does not implement (fused expert gate/up)' },
  UNSUPPORTED_MODEL: { status: 500, meaning: "the model exceeds what this engine's kernels support (head dimension)" },
  BATCH_UNSUPPORTED: { status: 500, meaning: "a stage was asked to batch sessions' steps over layers it runs one session at a time (WebGPU: Gated DeltaNet, experts)" },
  UNSUPPORTED_SHARD: { status: 500, meaning: 'this backend cannot serve a partial layer range' },
  ALREADY_LOADED: { status: 500, meaning: 'the backend already holds a shard; dispose it first' },
  NOT_LOADED: { status: 500, meaning: 'the backend holds no shard yet; load one first' },
  DISPOSED: { status: 500, meaning: 'the object was disposed and cannot be used again' },
  SESSION_EXISTS: { status: 409, meaning: 'a session with this id is already open' },
  SESSION_UNKNOWN: { status: 404, meaning: 'no session with this id is open here' },
  POSITION_MISMATCH: { status: 409, meaning: "a step is for another position than the session's current one" },
  CONTEXT_FULL: { status: 409, meaning: "the session's KV cache holds its context length; no more positions fit" },
  CONTEXT_TOO_LARGE: { status: 500, meaning: "the asked context's KV cache does not fit the device's buffer limits" },
  EMPTY_PROMPT: { status: 500, meaning: 'the prompt tokenizes to no tokens' },
  WASM_UNAVAILABLE: { status: 500, meaning: 'WebAssembly SIMD (or the int8 kernels) is not available here' },
  WASM_TOO_LARGE: { status: 500, meaning: "a shard's weights do not fit one WebAssembly memory" },
  CPU_WORKER_FAILED: { status: 500, meaning: 'a kernel call of the CPU engine trapped, or one of its worker threads failed' },
  WASM_ARENA_FULL: { status: 500, meaning: "the CPU engine's WebAssembly memory is full (4 GiB) or could not grow" },
  WEBGPU_UNAVAILABLE: { status: 500, meaning: 'WebGPU is missing here or gave no adapter' },
  WEBGPU_DEVICE_LOST: { status: 500, meaning: 'the GPU device was lost; the shard must be loaded again' },
  WEBGPU_OUT_OF_MEMORY: { status: 500, meaning: 'the GPU ran out of memory' },
  WEBGPU_ERROR: { status: 500, meaning: 'WebGPU rejected a command (a validation error)' },
  WEBGPU_WORKER_FAILED: { status: 500, meaning: 'the WebGPU worker died or could not start' },
  WEBGPU_WORKER_ERROR: { status: 500, meaning: 'the WebGPU worker threw an error that was not a MeshError' },
  ALREADY_INITIALISED: { status: 500, meaning: 'the WebGPU worker already has a device' },
  NOT_INITIALISED: { status: 500, meaning: 'the WebGPU worker has no device yet' },
  SHADER_MISSING: { status: 500, meaning: 'no WGSL source has the asked name' },
  LLAMACPP_UNAVAILABLE: { status: 500, meaning: "node-llama-cpp's prebuilt libllama is not installed" },
  TORCH_UNAVAILABLE: { status: 500, meaning: 'no Python here imports torch and numpy (Debian: python3-torch, python3-numpy), or torch sees no CUDA device for --device cuda' },
  LLAMACPP_LOAD_FAILED: { status: 500, meaning: 'llama.cpp could not load the model file' },
  LLAMACPP_LOCAL_ONLY: { status: 500, meaning: 'llama.cpp loads local files only, not URLs' },
  LLAMACPP_EVAL_FAILED: { status: 500, meaning: 'llama.cpp failed while evaluating a batch' },
  LLAMACPP_CONTEXT_FAILED: { status: 500, meaning: 'llama.cpp could not create a context' },
  LLAMACPP_DECODE_FAILED: { status: 500, meaning: 'llama_decode returned an error' },
  LLAMACPP_NO_OUTPUT: { status: 500, meaning: "llama.cpp returned no logits, or its graph has no layer output to read a range's hidden states from" },
  LLAMACPP_THREAD_FAILED: { status: 500, meaning: "the worker thread running a node's llama.cpp stage died or could not start, or threw an error that was not a MeshError" },
  LLAMACPP_SHARD_METADATA: { status: 500, meaning: "a shard GGUF cannot be written: the header lacks its metadata's GGUF types, nests arrays, or has a per-layer array of another length" },
  // 503, not 409: the request is sound and the session's own state is fine; the stage is at
  // capacity until other sessions close (or its --memory is too small), so it is ours, and a retry may succeed
  STAGE_MEMORY_FULL: { status: 503, meaning: "a new session's KV cache and buffers do not fit the stage's --memory beside its weights and open sessions" },
} as const satisfies Codes;

const PROTOCOL = {
  FRAME_BAD_MAGIC: { status: 400, meaning: "a frame does not start with 'GMSH'" },
  FRAME_BAD_VERSION: { status: 400, meaning: 'a frame has another protocol version than this peer speaks' },
  FRAME_BAD_TYPE: { status: 400, meaning: 'the frame type is unknown or not accepted here' },
  FRAME_BAD_FLAGS: { status: 400, meaning: 'a frame sets unknown flag bits or a flag its dtype cannot carry' },
  FRAME_BAD_FIELD: { status: 400, meaning: 'a header field is not a u32' },
  FRAME_BAD_SESSION: { status: 400, meaning: 'the session id is not 32 lowercase hex digits, or is the reserved all-zero id' },
  FRAME_BAD_ROUTE: { status: 400, meaning: 'the route id is not the route the session runs on' },
  FRAME_BAD_DIMENSION: { status: 400, meaning: "the token count or width is out of range for the frame's type" },
  FRAME_BAD_WIDTH: { status: 400, meaning: "a Hidden frame's width is not the n_embd of the stage it reaches" },
  FRAME_BAD_DTYPE: { status: 400, meaning: "the dtype is not allowed for the frame's type" },
  FRAME_BAD_RESERVED: { status: 400, meaning: 'the reserved header bytes are not zero' },
  FRAME_BAD_LENGTH: { status: 400, meaning: 'the payload length exceeds the limit or does not match count × width × size' },
  FRAME_BAD_PAYLOAD: { status: 400, meaning: 'a JSON payload is not UTF-8 JSON' },
  FRAME_TOO_MANY_TOKENS: { status: 400, meaning: 'a Prefill or Hidden frame carries more tokens than the receiver takes in one frame (send smaller chunks)' },
  FRAME_TRUNCATED: { status: 400, meaning: 'the stream ended inside a frame' },
  FRAME_DECODE_FAILED: { status: 400, meaning: 'the frame decoder failed on earlier bytes and accepts no more' },
  FRAME_SESSION_MISMATCH: { status: 400, meaning: "the frame's session id is not the one the HTTP path names" },
  FRAGMENT_BAD_LIMIT: { status: 400, meaning: "a message limit is below the minimum, or a message exceeds the channel's" },
  FRAGMENT_BAD_VERSION: { status: 400, meaning: 'a fragment has an unknown version' },
  FRAGMENT_BAD_FLAGS: { status: 400, meaning: 'a fragment sets unknown flag bits' },
  FRAGMENT_BAD_RESERVED: { status: 400, meaning: 'the reserved fragment bytes are not zero' },
  FRAGMENT_BAD_LENGTH: { status: 400, meaning: "a fragment's total is impossible or changed within its message" },
  FRAGMENT_OUT_OF_ORDER: { status: 400, meaning: 'fragments of a message arrived out of order' },
  FRAGMENT_TOO_MANY: { status: 400, meaning: 'too many messages are in reassembly at once' },
  FRAGMENT_TRUNCATED: { status: 400, meaning: 'a fragment header is short, or a message ended with bytes missing' },
  STUN_BIND_FAILED: { status: 500, meaning: "serve cannot answer STUN on its address's UDP port (taken, or not this machine's)" },
  BAD_ICE_SERVER: { status: 500, meaning: 'an ICE server is not stun:host:port or turn:user:pass@host:port' },
  BAD_JOIN_URL: { status: 500, meaning: 'a join URL is not …/room/<id>#secret=…' },
  BAD_HEADER: { status: 500, meaning: "a model header is incomplete or disagrees with the artifact's manifest" },
  REMOTE_ERROR: { status: 500, meaning: 'a peer answered an error with no code, or a code this build does not know (details.remoteCode)' },
} as const satisfies Codes;

const TRANSPORT = {
  LINK_CLOSED: { status: 502, meaning: 'the link closed before the reply arrived' },
  LINK_FAILED: { status: 502, meaning: 'the link could not be opened or failed mid-request' },
  WEBRTC_FAILED: { status: 500, meaning: 'a WebRTC data channel failed' },
  WEBRTC_TIMEOUT: { status: 500, meaning: 'no WebRTC data channel opened in time' },
  NOT_FOUND: { status: 404, meaning: 'the HTTP path is not served here' },
  BAD_CA_FINGERPRINT: { status: 500, meaning: 'a CA fingerprint (#ca=, --ca-fingerprint) is not 64 hex digits of a sha256' },
  BAD_CA_CERT: { status: 500, meaning: 'a CA certificate to trust (--ca-file) cannot be read or is not a PEM certificate' },
  TLS_FINGERPRINT_MISMATCH: { status: 500, meaning: 'the https server presented no CA certificate with the pinned sha256 fingerprint' },
  TLS_UNTRUSTED: { status: 500, meaning: "the https server's certificate does not verify against the pinned or named CA" },
} as const satisfies Codes;

const ROUTE = {
  ROUTE_UNKNOWN: { status: 404, meaning: 'no (ready) route has this id' },
  ROUTE_NOT_READY: { status: 409, meaning: 'the room has no ready route yet' },
  SESSION_BAD_STATE: { status: 409, meaning: "the request does not fit the session's state (a decode before any prefill, …)" },
  SESSION_LIMIT: { status: 429, meaning: 'too many sessions open: per client, per route or per stage (retry later)' },
  SESSION_CLOSED: { status: 409, meaning: 'the session is closed or expired' },
  SESSION_REWOUND: { status: 409, meaning: "a frame was queued or computing on a stage when its session was rewound (a repair or a continued turn); the rewind forgot it" },
  SESSION_FAILED: { status: 409, meaning: 'the session failed earlier; open a new one' },
  BAD_CHAIN: { status: 500, meaning: 'a chain of stages is empty, or its outputs do not chain (logits before the last stage, hidden states after it)' },
  STAGE_FAILED: { status: 502, meaning: 'a stage failed with an error that was not a MeshError' },
  STAGE_UNREACHABLE: { status: 502, meaning: 'the next stage has no peer, or the hop to it broke' },
  RING_BROKEN: { status: 502, meaning: "the last stage could not send a ring token to stage 0: the step sent ahead for it is dropped, and the session goes on one-way" },
  STAGE_LOST: { status: 502, meaning: "a stage's peer left the room while sessions ran on it, and no replacement took over in time" },
  STAGE_STALLED: { status: 502, meaning: 'a step got no answer within the step deadline: a stage stopped answering' },
  STAGE_NOT_LOADED: { status: 500, meaning: 'the peer serves no stage yet' },
  STAGE_INPUT_KIND: { status: 500, meaning: 'a stage got token ids where it takes hidden states, or back' },
} as const satisfies Codes;

const PEER = {
  AUTH_FAILED: { status: 401, meaning: 'the room secret is missing or wrong' },
  JOIN_FAILED: { status: 500, meaning: 'the peer could not reach the server or its control connection closed while joining' },
  LOAD_FAILED: { status: 500, meaning: 'loading a stage failed with an error that was not a MeshError' },
  CALIBRATION_FAILED: { status: 500, meaning: "a peer could not measure its own speed on one layer of the room's model (it joins without a speed; the planner splits by memory)" },
  MODEL_FETCH_FAILED: { status: 500, meaning: "downloading the model's file from the server failed" },
  RELAY_FAILED: { status: 500, meaning: 'a frame relayed through the server got no answer' },
  RELAY_REFUSED: { status: 500, meaning: 'the server refuses to relay this frame between these peers' },
  NOT_UPSTREAM: { status: 409, meaning: "a stage refused a frame from a peer that is not its current previous stage (a stale peer after a repair)" },
  TENSOR_NOT_IN_SLICE: { status: 500, meaning: "a tensor was asked for outside the peer's verified slice" },
  CACHE_INCOMPLETE: { status: 500, meaning: 'a shard unit was stored without all its tensors' },
  UNKNOWN_UNIT: { status: 500, meaning: 'the artifact has no shard unit of this name' },
  STORAGE_UNAVAILABLE: { status: 500, meaning: 'IndexedDB or the Origin Private File System is not available here' },
  STORAGE_QUOTA: { status: 500, meaning: 'browser storage is full or the quota is spent' },
  STORAGE_FAILED: { status: 500, meaning: 'browser storage failed for another reason' },
} as const satisfies Codes;

const SERVER = {
  BAD_REQUEST: { status: 400, meaning: 'the request body or a parameter is malformed' },
  CONTEXT_LENGTH_EXCEEDED: { status: 400, meaning: "the prompt and max_tokens together exceed the model's context (OpenAI's context_length_exceeded)" },
  QUEUE_FULL: { status: 429, meaning: 'the server runs and queues as many generations as it may; retry after the Retry-After seconds' },
  BODY_TOO_LARGE: { status: 413, meaning: 'a request body is larger than the endpoint accepts' },
  BODY_NOT_JSON: { status: 400, meaning: 'a request body that must be JSON is not' },
  BAD_MESSAGE: { status: 400, meaning: 'a control message is not JSON, does not match its schema (the field is named), or comes out of order' },
  HELLO_TIMEOUT: { status: 500, meaning: 'a peer sent no hello in time after connecting' },
  FORBIDDEN: { status: 403, meaning: 'the credential does not allow this (a join secret on the API, an API key on management or model bytes), or rooms are opened from elsewhere than the server\'s machine' },
  MODEL_CHANGED: { status: 409, meaning: 'a hosted model file changed on disk under a running room; restart serve to host the new file' },
  NOT_SUPPORTED: { status: 500, meaning: 'this server does not open rooms for other models' },
  UI_NOT_BUILT: { status: 500, meaning: 'the web app is not built and vite is not installed' },
  UI_BUILD_LOCKED: { status: 500, meaning: 'another process has been building the web app for too long (a stale lock in dist/)' },
  UI_BUILD_FAILED: { status: 500, meaning: 'building the web app with vite failed' },
  TLS_BAD_OPTIONS: { status: 400, meaning: 'the TLS options of serve contradict each other (--tls-cert without --tls-key, --insecure-http with --tls…)' },
  TLS_BAD_CERT: { status: 500, meaning: "the operator's certificate or key (--tls-cert/--tls-key) cannot be read or do not make a TLS context" },
  TLS_BAD_KEY: { status: 500, meaning: "the cached local CA's private key is not a PKCS#8 ECDSA P-256 key" },
  TOOL_CALL_BROKEN: { status: 500, meaning: 'a streamed tool call whose first deltas went out broke off: the model wrote text that is not JSON in its arguments, or ended its reply inside them' },
  UI_DEV_UNAVAILABLE: { status: 500, meaning: '--ui dev needs vite (a development install) and a loopback host' },
  BAD_REDIS_URL: { status: 400, meaning: '--redis is not a redis:// or rediss:// URL' },
  REDIS_UNREACHABLE: { status: 503, meaning: "the cluster's Redis does not answer" },
  STALE_LEASE: { status: 409, meaning: "an instance wrote a room's state under a lease that has passed to another instance (the write is refused)" },
  ROOM_ELSEWHERE: { status: 503, meaning: 'the instance holding this room cannot be reached now (retry: the room passes to a live instance when its lease expires)' },
  RESUME_DIVERGED: { status: 502, meaning: "a completion resumed after its room's holder died came back different from what the client was already sent (the stream stops there)" },
  RESUME_BAD_EVENT_ID: { status: 400, meaning: "a completion's Last-Event-ID is not an event id of this server's streams (<completion id>:<offset>)" },
  RESUME_UNKNOWN: { status: 404, meaning: 'the stream a Last-Event-ID names is unknown, expired, ended, or journaled nowhere (resuming a stream takes serve --redis)' },
  RESUME_MISMATCH: { status: 409, meaning: 'a reconnect with Last-Event-ID sent another request (body, endpoint or seed) than the one that opened the stream' },
  RESUME_BEYOND: { status: 400, meaning: "a Last-Event-ID's offset is past the text its stream was sent" },
  SESSION_RESUME_FAILED: { status: 503, meaning: "a frame-API session's link to its instance dropped and no instance of the room had a ready route to continue it on within the resume bound (joinRoom's resumeMs), or reopening it there was refused" },
  CLUSTER_NEEDS_SECRET: { status: 400, meaning: 'serve --redis needs --secret (or --join-secret): every instance must open the same rooms' },
} as const satisfies Codes;

const ENTRY = {
  NO_ROOM: { status: 500, meaning: 'an element has no room link or is not connected to a room' },
  NO_MODEL: { status: 500, meaning: 'no model was picked on the landing page' },
  NO_WEBGPU: { status: 500, meaning: 'this browser cannot serve layers (no WebGPU); it stays a chat client' },
  CHAT_BUSY: { status: 500, meaning: 'a reply is still streaming' },
  SERVER_UNREACHABLE: { status: 500, meaning: 'the signaling server cannot be reached' },
  BAD_USAGE: { status: 400, meaning: 'a command-line option or argument is malformed (the CLI exits with status 2)' },
} as const satisfies Codes;

const ANYWHERE = {
  INTERNAL: { status: 500, meaning: 'an error that was not a MeshError reached a boundary (a bug)' },
} as const satisfies Codes;

/** The codes by the layer that raises them (the sections of docs/errors.md). */
export const ERROR_AREAS: ReadonlyArray<{ readonly title: string; readonly codes: Codes }> = [
  { title: 'gguf/ — reading, verifying and writing artifacts', codes: GGUF },
  { title: 'model/ — configuration, tokenizer, chat template, sampler, synthetic models', codes: MODEL },
  { title: 'backends/ — stage backends and their engines', codes: BACKENDS },
  { title: 'protocol/ — frames (each code names the field), fragments, control messages, wire headers', codes: PROTOCOL },
  { title: 'transport/ — links that carry frames', codes: TRANSPORT },
  { title: 'route/ — sessions and generation across stages', codes: ROUTE },
  { title: 'peer/, storage/ — peers joining rooms, loading and caching slices', codes: PEER },
  { title: 'signaling-server/ — rooms, HTTP API, control messages', codes: SERVER },
  { title: 'ui/, components/, cli/ — entry points', codes: ENTRY },
  { title: 'anywhere', codes: ANYWHERE },
];

export const ERROR_CODES = { ...GGUF, ...MODEL, ...BACKENDS, ...PROTOCOL, ...TRANSPORT, ...ROUTE, ...PEER, ...SERVER, ...ENTRY, ...ANYWHERE } as const satisfies Codes;

export type ErrorCode = keyof typeof ERROR_CODES;

export function isErrorCode(code: unknown): code is ErrorCode {
  return typeof code === 'string' && Object.hasOwn(ERROR_CODES, code);
}

/** HTTP status for an error code: the registry's, or 500 for a code this build does not know. */
export function httpStatusFor(code: string): number {
  return isErrorCode(code) ? ERROR_CODES[code].status : 500;
}

/** The code for an HTTP status that refused a link (a non-frame answer, a refused upgrade). */
export function codeForRefusal(status: number): ErrorCode {
  return status === 401 ? 'AUTH_FAILED' : 'LINK_FAILED';
}

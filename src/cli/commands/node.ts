// `gguf-mesh node --join <room url>`: a native peer. Joins the room, advertises its backend (cpu,
// llama.cpp, or WebGPU through Dawn, with its adapter), what that backend can serve and its
// memory, loads the shard the planner assigns (only that shard's bytes; llama.cpp runs a layer
// range from a shard GGUF, a whole model from the artifact's own file), and serves frames
// until stopped or the server goes away.

import type { Command } from '../command.ts';
import { intOption, optionalIntOption, stringOption, UsageError } from '../command.ts';
import type { ShardRange } from '../../gguf/types.ts';
import { parseJoinUrl } from '../../protocol/control.ts';
import { parseByteSize } from '../../units.ts';
import { startNodePeer } from '../../peer/native-peer.ts';
import { trustRoomServer } from '../../transport/tls-trust.ts';
import type { BackendKind } from '../../peer/native-peer.ts';
import { runTorchPeer } from '../../peer/torch-process.ts';

/** The test-only shaping flags (peer/test-shaping.ts), checked. */
function testShaping(slow: string | undefined, after: string | undefined, delay: string | undefined): { testSlowFactor?: number; testSlowAfter?: number; testLinkDelayMs?: number } {
  const out: { testSlowFactor?: number; testSlowAfter?: number; testLinkDelayMs?: number } = {};
  if (slow !== undefined) {
    if (!(Number(slow) >= 1)) throw new UsageError(`--test-slow-factor must be a number ≥ 1, got '${slow}'`);
    out.testSlowFactor = Number(slow);
  }
  if (after !== undefined) {
    if (!/^\d+$/.test(after)) throw new UsageError(`--test-slow-after must be a whole number of forward passes, got '${after}'`);
    if (slow === undefined) throw new UsageError('--test-slow-after needs --test-slow-factor');
    out.testSlowAfter = Number(after);
  }
  if (delay !== undefined) {
    if (!(Number(delay) >= 0)) throw new UsageError(`--test-link-delay-ms must be a number ≥ 0, got '${delay}'`);
    out.testLinkDelayMs = Number(delay);
  }
  return out;
}

/** `--layers a-b`: the half-open range [a, b). */
function parseLayerRange(text: string): ShardRange {
  const m = /^\s*(\d+)\s*-\s*(\d+)\s*$/.exec(text);
  if (!m || Number(m[2]) <= Number(m[1])) throw new UsageError(`--layers must be a-b with a < b (layers [a, b)), got '${text}'`);
  return { start: Number(m[1]), end: Number(m[2]) };
}

export const command: Command = {
  name: 'node',
  summary: 'join a room as a native peer and serve the layers the route planner assigns',
  usage: '--join <room url> [--secret S] [--ca-fingerprint SHA256 | --ca-file F] [--backend cpu|llamacpp|webgpu|torch] [--layers a-b] [--memory 4GiB] [--listen host:port]',
  options: {
    join: { type: 'string', description: 'room URL printed by `serve` (the #secret= fragment is read too)', valueName: '<url>' },
    secret: { type: 'string', description: 'room secret (default: from the URL fragment)', valueName: '<secret>' },
    backend: { type: 'string', description: 'cpu, llamacpp, webgpu (Dawn in this process; exits if it finds no adapter), or torch (the PyTorch peer of peers/torch/, needs python3-torch)', default: 'cpu', valueName: '<kind>' },
    device: { type: 'string', description: 'torch only: cpu or cuda', default: 'cpu', valueName: '<cpu|cuda>' },
    threads: { type: 'string', description: 'cpu, llamacpp: threads the engine computes on (default: cpu every core, llamacpp all but one); torch: CPU threads for torch (default 1)', valueName: '<n>' },
    'pin-threads': { type: 'boolean', description: 'cpu (Linux): each engine thread on a CPU of its own — faster on a machine this node has to itself (a VM wakes idle threads on one core), slower where other work needs those CPUs' },
    layers: { type: 'string', description: 'serve exactly layers [a, b) instead of what the planner picks', valueName: '<a-b>' },
    memory: { type: 'string', description: 'memory offered for weights (a llama.cpp range also admits sessions only while their KV fits beside them)', default: '4GiB', valueName: '<size>' },
    listen: { type: 'string', description: 'where other stages reach this node', default: '127.0.0.1:0', valueName: '<host:port>' },
    carrier: { type: 'string', description: 'hidden states to the next stage over ws or http', default: 'ws', valueName: '<ws|http>' },
    advertise: { type: 'string', description: 'the ws://host:port/v1/frames address to tell others, when not the listen address', valueName: '<url>' },
    name: { type: 'string', description: 'a name shown in the room', valueName: '<name>' },
    'cache-dir': { type: 'string', description: 'keep verified shards here (default: $GGUF_MESH_CACHE/shards, else ~/.cache/gguf-mesh/shards)', valueName: '<dir>' },
    'no-cache': { type: 'boolean', description: 'keep no shard cache (every load fetches)' },
    'session-ttl': { type: 'string', description: 'release a session that sent no frame for this many seconds', default: '900', valueName: '<s>' },
    'max-sessions': { type: 'string', description: 'most sessions this stage holds at once', default: '64', valueName: '<n>' },
    trusted: { type: 'string', description: "a public room's trusted secret (serve --trusted-secret): this node may serve the first and last stages", valueName: '<secret>' },
    'reconnect-for': { type: 'string', description: 'after the server goes away, keep trying to rejoin for this many seconds (0: leave at once)', default: '600', valueName: '<s>' },
    'no-webrtc': { type: 'boolean', description: 'no WebRTC data channels to and from tabs: those hops go through the server relay' },
    'no-calibrate': { type: 'boolean', description: 'join without measuring this node\'s speed on one layer of the model (the planner then splits by memory)' },
    'test-slow-factor': { type: 'string', description: 'test only: every forward pass takes this many times as long (a slow peer on one machine)', valueName: '<factor>' },
    'test-slow-after': { type: 'string', description: "test only: --test-slow-factor applies only after this node's first N forward passes (its calibration's among them): a peer that calibrated fast and then got slower", valueName: '<passes>' },
    'test-link-delay-ms': { type: 'string', description: 'test only: every frame and control message in and out waits this long (a far peer on one machine: 2× this of round trip)', valueName: '<ms>' },
    'ca-fingerprint': { type: 'string', description: "an https room server's local CA: its sha256 fingerprint (default: the link's #ca=)", valueName: '<sha256>' },
    'ca-file': { type: 'string', description: "an https room server's CA certificate (PEM), trusted beside the system's", valueName: '<file>' },
  },
  async run(args) {
    const joinUrl = stringOption(args, 'join', true);
    let room;
    try {
      room = parseJoinUrl(joinUrl);
    } catch (e) {
      throw new UsageError((e as Error).message);
    }
    const secret = stringOption(args, 'secret') ?? room.secret;
    if (!secret) throw new UsageError('--secret is required (or a join URL ending in #secret=…)');
    const backend = stringOption(args, 'backend') ?? 'cpu';
    if (backend !== 'cpu' && backend !== 'llamacpp' && backend !== 'webgpu' && backend !== 'torch') throw new UsageError(`--backend must be cpu, llamacpp, webgpu or torch, got '${backend}'`);
    const layersText = stringOption(args, 'layers');
    const memoryText = stringOption(args, 'memory') ?? '4GiB';
    const memoryBytes = parseByteSize(memoryText);
    if (memoryBytes === undefined) throw new UsageError(`--memory: '${memoryText}' is not a size (e.g. 4GiB = 4·2³⁰ bytes, 8GB = 8·10⁹)`);
    const carrier = stringOption(args, 'carrier') ?? 'ws';
    if (carrier !== 'ws' && carrier !== 'http') throw new UsageError(`--carrier must be ws or http, got '${carrier}'`);
    const listen = stringOption(args, 'listen') ?? '127.0.0.1:0';
    const lm = /^(.*):(\d+)$/.exec(listen);
    if (!lm) throw new UsageError(`--listen must be host:port, got '${listen}'`);
    // an https server with a local CA: pin it (the link's #ca= or the flags) before any request
    await trustRoomServer(joinUrl, { fingerprint: stringOption(args, 'ca-fingerprint'), caFile: stringOption(args, 'ca-file') });
    const cacheDir = args.values['no-cache'] ? null : stringOption(args, 'cache-dir');
    if (backend === 'torch') {
      const device = stringOption(args, 'device') ?? 'cpu';
      if (device !== 'cpu' && device !== 'cuda') throw new UsageError(`--device must be cpu or cuda, got '${device}'`);
      const threads = Number(stringOption(args, 'threads') ?? '1');
      if (!Number.isInteger(threads) || threads < 1) throw new UsageError(`--threads must be a positive integer, got '${stringOption(args, 'threads')}'`);
      return runTorchPeer(
        {
          joinUrl, secret, memoryBytes, listen, carrier, device, threads,
          ...(layersText ? { layers: parseLayerRange(layersText) } : {}),
          ...(stringOption(args, 'advertise') ? { advertise: stringOption(args, 'advertise')! } : {}),
          ...(stringOption(args, 'name') ? { name: stringOption(args, 'name')! } : {}),
          ...(cacheDir !== undefined ? { cacheDir } : {}),
        },
        (line) => console.log(line),
      );
    }
    const peer = await startNodePeer({
      joinUrl,
      secret,
      backend: backend as BackendKind,
      memoryBytes,
      ...(layersText ? { layers: parseLayerRange(layersText) } : {}),
      listenHost: lm[1]!.replace(/^\[|\]$/g, ''),
      listenPort: Number(lm[2]),
      ...(stringOption(args, 'advertise') ? { advertise: stringOption(args, 'advertise')! } : {}),
      carrier,
      ...(stringOption(args, 'name') ? { name: stringOption(args, 'name')! } : {}),
      ...(optionalIntOption(args, 'threads') ? { threads: optionalIntOption(args, 'threads')! } : {}),
      ...(args.values['pin-threads'] ? { pinThreads: true } : {}),
      ...(args.values['no-webrtc'] ? { webrtc: false } : {}),
      ...(args.values['no-calibrate'] ? { calibrate: false } : {}),
      ...testShaping(stringOption(args, 'test-slow-factor'), stringOption(args, 'test-slow-after'), stringOption(args, 'test-link-delay-ms')),
      ...(cacheDir !== undefined ? { cacheDir } : {}),
      ...(stringOption(args, 'trusted') ? { trustedSecret: stringOption(args, 'trusted')! } : {}),
      limits: { idleTtlMs: intOption(args, 'session-ttl', 900) * 1000, maxSessions: intOption(args, 'max-sessions', 64) },
      reconnect: intOption(args, 'reconnect-for', 600) > 0 ? { forMs: intOption(args, 'reconnect-for', 600) * 1000 } : false,
      log: (line) => console.log(line),
    });
    const stop = new Promise<string>((resolve) => {
      process.once('SIGINT', () => resolve('interrupted'));
      process.once('SIGTERM', () => resolve('terminated'));
    });
    const why = await Promise.race([peer.closed, stop]);
    if (!why.startsWith('control')) {
      // a graceful leave: the server hands this peer's stage (and its sessions) to a replacement first
      console.log(`leaving (${why}): handing the stage over…`);
      const forced = new Promise<boolean>((resolve) => process.once('SIGINT', () => resolve(false)));
      const moved = await Promise.race([peer.leave(), forced, peer.closed.then(() => false)]);
      console.log(moved ? 'stage handed over' : 'stage not handed over (no replacement in time)');
    }
    console.log(`leaving: ${why}`);
    await peer.close();
    return why.startsWith('control') ? 1 : 0;
  },
};

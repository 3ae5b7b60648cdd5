// `gguf-mesh serve`: the signaling server. Hosts each --model with Range support, opens a
// room per model, prints each room's join URL (secret in the fragment) and runs until stopped.
// Bound beyond loopback it serves HTTPS/WSS (other devices get WebGPU only on a secure page):
// with the operator's certificate, or a local CA it makes once (signaling-server/tls.ts).

import { networkInterfaces } from 'node:os';
import type { Command, ParsedArgs } from '../command.ts';
import { intOption, sizeOption, stringOption, UsageError } from '../command.ts';
import { startSignalingServer } from '../../../signaling-server/server.ts';
import type { SignalingServerOptions } from '../../../signaling-server/server.ts';
import { startServerWithApp } from '../../../signaling-server/static.ts';
import type { WebAppMode } from '../../../signaling-server/static.ts';
import { modelsToServe } from '../../model/default-model.ts';
import { DEFAULT_STEP_TIMEOUT_MS } from '../../route/session-types.ts';
import { parseIceServer } from '../../protocol/control.ts';
import { MAX_DRAFT_TOKENS } from '../../protocol/session.ts';
import type { IceServer } from '../../protocol/control.ts';
import { chooseTls, isLoopbackHost, localCaTls, machineNames, operatorTls } from '../../../signaling-server/tls.ts';
import type { ServerTls } from '../../../signaling-server/tls.ts';
import { meshCacheDir } from '../../cache-dir.ts';
import { join } from 'node:path';

/** Non-loopback IPv4 addresses of this machine. */
function interfaceAddresses(): string[] {
  return Object.values(networkInterfaces())
    .flat()
    .filter((a): a is NonNullable<typeof a> => !!a && a.family === 'IPv4' && !a.internal)
    .map((a) => a.address);
}

/** --redis and its companions: this server as one instance of a cluster. */
function clusterOption(args: ParsedArgs, joinSecret: string | undefined): Pick<SignalingServerOptions, 'cluster'> {
  const redisUrl = stringOption(args, 'redis');
  if (!redisUrl) {
    if (stringOption(args, 'instance-url')) throw new UsageError('--instance-url needs --redis');
    return {};
  }
  if (!joinSecret) throw new UsageError('--redis needs --secret (or --join-secret): every instance must open the same rooms');
  const url = stringOption(args, 'instance-url');
  if (url && !/^https?:\/\/[^/]+$/.test(url)) throw new UsageError(`--instance-url must be http(s)://host:port, got '${url}'`);
  return { cluster: { redisUrl, leaseMs: intOption(args, 'redis-lease', 3000), prefix: stringOption(args, 'redis-prefix') ?? 'gm:', ...(url ? { url } : {}) } };
}

/** --trusted-secret with its spot-check fraction and tolerance. */
function publicRoomOptions(args: Parameters<Command['run']>[0]): { trustedSecret: string; fraction: number; tolerance: number } {
  const fraction = Number(stringOption(args, 'spot-check') ?? '0.1');
  const tolerance = Number(stringOption(args, 'spot-check-tolerance') ?? '0.02');
  if (!(fraction >= 0 && fraction <= 1)) throw new UsageError(`--spot-check must be a fraction in [0, 1], got '${stringOption(args, 'spot-check')}'`);
  if (!(tolerance > 0)) throw new UsageError(`--spot-check-tolerance must be a positive number, got '${stringOption(args, 'spot-check-tolerance')}'`);
  return { trustedSecret: stringOption(args, 'trusted-secret')!, fraction, tolerance };
}

function speculateOption(n: number): number {
  if (n >= 0 && n <= MAX_DRAFT_TOKENS) return n;
  throw new UsageError(`--speculate must be 0..${MAX_DRAFT_TOKENS} drafts, got ${n}`);
}

function nonNegative(name: string, n: number): number {
  if (n >= 0) return n;
  throw new UsageError(`--${name} must be 0 or more, got ${n}`);
}

function plannerOption(v: string | undefined): 'speed' | 'memory' {
  if (v === undefined || v === 'speed' || v === 'memory') return v ?? 'memory';
  throw new UsageError(`--planner must be speed or memory, got '${v}'`);
}

/** `--replan-gain`: a number ≥ 1, or off (0: never re-plan). */
function replanGainOption(v: string | undefined): number {
  if (v === undefined) return 1.3;
  if (v === 'off') return 0;
  if (Number(v) >= 1) return Number(v);
  throw new UsageError(`--replan-gain must be a number ≥ 1 or off, got '${v}'`);
}

/** `--<name> on|off`; absent: `fallback`. */
function onOffOption(name: string, v: string | undefined, fallback: boolean): boolean {
  if (v === undefined) return fallback;
  if (v === 'on' || v === 'off') return v === 'on';
  throw new UsageError(`--${name} must be on or off, got '${v}'`);
}

export const command: Command = {
  name: 'serve',
  summary: 'run the signaling server: host models, open a room per model, plan routes over joining peers',
  usage: '[--host 127.0.0.1] [--port 8080] [--model <path|url> …] [--secret S | --join-secret J --api-key K … --admin-secret A] [--tls | --tls-cert F --tls-key F | --insecure-http] [--stun on|off] [--ice-server <url> … [--turn-secret S]] [--ui dist|dev|off]',
  options: {
    host: { type: 'string', description: 'interface to bind', default: '127.0.0.1', valueName: '<host>' },
    port: { type: 'string', description: 'TCP port (0 = any free port)', default: '8080', valueName: '<port>' },
    model: { type: 'string', multiple: true, description: 'GGUF path or URL; one room each (repeatable; a split GGUF: name its first part, e.g. m-00001-of-00003.gguf)', valueName: '<path|url>' },
    secret: { type: 'string', description: 'room secret: joins peers, and alone (no --api-key/--admin-secret) also the API key and admin secret (default: random per model, kept under the cache dir so links survive restarts)', valueName: '<secret>' },
    'join-secret': { type: 'string', description: 'the secret peers join with (the join link carries it); same as --secret', valueName: '<secret>' },
    'api-key': { type: 'string', multiple: true, description: 'an API key for OpenAI clients (repeatable): it runs completions and sees only its own sessions; turns separate credentials on', valueName: '<key>' },
    'admin-secret': { type: 'string', description: 'the secret for rooms, peers, routes and every session (default: --secret, else random; printed in the page URL); turns separate credentials on', valueName: '<secret>' },
    'api-downloads': { type: 'boolean', description: 'let API keys download the model files (peers always may)' },
    'max-active': { type: 'string', description: 'completions generating at once', default: '16', valueName: '<n>' },
    'max-queue': { type: 'string', description: 'completions waiting beyond those; more are answered 429 with Retry-After', default: '64', valueName: '<n>' },
    'trusted-secret': { type: 'string', description: 'a public room: peers proving this secret (node --trusted) serve the first and last stages; the others only the middle', valueName: '<secret>' },
    'spot-check': { type: 'string', description: 'public rooms: the fraction of sessions the trusted first stage re-runs through the middle stages (0..1)', default: '0.1', valueName: '<fraction>' },
    'spot-check-tolerance': { type: 'string', description: 'public rooms: the relative difference of hidden states past which a middle stage is excluded', default: '0.02', valueName: '<x>' },
    'max-sessions': { type: 'string', description: 'live sessions one client (connection or API key) may hold', default: '16', valueName: '<n>' },
    'ice-server': { type: 'string', multiple: true, description: 'STUN/TURN server for browser peers across the internet, sent to them on join (repeatable): stun:host:port or turn:user:pass@host:port (with --turn-secret: turn:host:port)', valueName: '<url>' },
    stun: { type: 'string', description: 'answer STUN on UDP at this address and port number, so browser tabs on other networks (where their mDNS host candidates mean nothing) reach each other directly (default: on beyond loopback)', valueName: '<on|off>' },
    'turn-secret': { type: 'string', description: "mint each peer a short-lived TURN credential with this shared secret (coturn's use-auth-secret / static-auth-secret)", valueName: '<secret>' },
    'turn-ttl': { type: 'string', description: 'minted TURN credentials expire after this many seconds', default: '3600', valueName: '<s>' },
    tls: { type: 'boolean', description: 'HTTPS/WSS with the local CA even on loopback (the default beyond loopback)' },
    'tls-cert': { type: 'string', description: 'HTTPS/WSS with this certificate chain (PEM) instead of the local CA', valueName: '<file>' },
    'tls-key': { type: 'string', description: 'the private key (PEM) of --tls-cert', valueName: '<file>' },
    'insecure-http': { type: 'boolean', description: 'plain HTTP beyond loopback: other devices then get no WebGPU (browsers need https)' },
    'min-peers': { type: 'string', description: 'plan a route once this many peers joined', default: '1', valueName: '<n>' },
    'stage-min-stay': { type: 'string', description: 'a peer becomes a stage only after this long in the room, unless it holds a verified shard; until then it is a spare (ms)', default: '0', valueName: '<ms>' },
    'stage-min-memory': { type: 'string', description: 'a peer with less memory to give is never a stage, only a spare or a client (e.g. 1GiB)', default: '0', valueName: '<size>' },
    'plan-delay': { type: 'string', description: 'wait after the last join before planning (ms)', default: '300', valueName: '<ms>' },
    'session-ttl': { type: 'string', description: 'idle sessions expire after this many seconds', default: '300', valueName: '<s>' },
    'repair-timeout': { type: 'string', description: 'a route that lost a stage waits this long for a replacement before its sessions fail (ms; 0 = never repair)', default: '30000', valueName: '<ms>' },
    heartbeat: { type: 'string', description: 'ping every peer this often (ms)', default: '500', valueName: '<ms>' },
    'heartbeat-timeout': { type: 'string', description: 'a peer that answers no ping for this long is lost (ms)', default: '3500', valueName: '<ms>' },
    planner: { type: 'string', description: 'how routes are planned: in proportion to memory (memory), or by measured speed and round trips where every peer reports one (speed: nodes then measure themselves on one layer as they join)', default: 'memory', valueName: '<memory|speed>' },
    'replan-gain': { type: 'string', description: "with --planner speed: an idle route (no session on it) is re-planned when the peers' live step timings predict another chain this many times faster (off: never; a route never changes mid-session)", default: '1.3', valueName: '<x|off>' },
    standby: { type: 'string', description: 'spares load the shard they would take over ahead of time (on), or only when they take it over (off)', default: 'on', valueName: '<on|off>' },
    speculate: { type: 'string', description: `speculative decoding for greedy requests: up to N drafts (prompt lookup over the session's own tokens) verified per route pass, so a route pays its hop latency once per accepted run (0 = off, at most ${MAX_DRAFT_TOKENS})`, default: '0', valueName: '<N>' },
    'link-probe-interval': { type: 'string', description: 'every pair of native peers times its frame link again this often, for the planner and the idle re-planner (ms; 0: only as peers join)', default: '30000', valueName: '<ms>' },
    'step-timeout': { type: 'string', description: 'a step unanswered this long makes the server probe its stages for a stalled one (ms; a live stage answers the probe at once)', default: '1000', valueName: '<ms>' },
    redis: { type: 'string', description: 'run as one instance of a cluster sharing this Redis (redis://host:port): any instance answers any room, one holds each room at a time, a lost instance\'s rooms pass to another (needs --secret; docs/cluster.md)', valueName: '<url>' },
    'instance-url': { type: 'string', description: 'with --redis: how the other instances reach this one (default: the URL this server prints)', valueName: '<url>' },
    'redis-lease': { type: 'string', description: "with --redis: a room's lease lives this long unless its holder renews it — the takeover time after an instance dies (ms)", default: '3000', valueName: '<ms>' },
    'redis-prefix': { type: 'string', description: 'with --redis: the key prefix (several clusters may share one Redis)', default: 'gm:', valueName: '<prefix>' },
    quiet: { type: 'boolean', description: 'print only the join URLs, not room events' },
    ui: { type: 'string', description: 'the web app: dist (the production build, made on install and rebuilt when sources changed), dev (vite from the sources with HMR, 127.0.0.1 only), or off', default: 'dist', valueName: '<mode>' },
  },
  async run(args) {
    let iceServers: IceServer[];
    try {
      const minted = stringOption(args, 'turn-secret') !== undefined;
      iceServers = ((args.values['ice-server'] as string[] | undefined) ?? []).map((t) => parseIceServer(t, { minted }));
    } catch (e) {
      throw new UsageError(`--ice-server: ${(e as Error).message}`);
    }
    const ui = stringOption(args, 'ui') ?? 'dist';
    if (!['dist', 'dev', 'off'].includes(ui)) throw new UsageError(`--ui must be dist, dev or off, got '${ui}'`);
    const host = stringOption(args, 'host') ?? '127.0.0.1';
    // vite's dev server answers for every file of the repository (sources, node_modules, models)
    if (ui === 'dev' && !isLoopbackHost(host)) throw new UsageError(`--ui dev serves the whole source tree, so it binds 127.0.0.1 only (got --host ${host}); other devices get the build (--ui dist)`);
    const tls = await serverTls(args, host);
    const stun = onOffOption('stun', stringOption(args, 'stun'), !isLoopbackHost(host));
    // no --model: $GGUF_MESH_MODEL, else the default synthetic model (made once, cached)
    const { models, describe, made } = await modelsToServe((args.values.model as string[] | undefined) ?? []);
    if (made) console.log(`made the default model ${models[0]}`);
    const joinSecret = stringOption(args, 'join-secret') ?? stringOption(args, 'secret');
    if (stringOption(args, 'join-secret') && stringOption(args, 'secret') && stringOption(args, 'join-secret') !== stringOption(args, 'secret')) throw new UsageError('--secret and --join-secret name the same secret: give one');
    const apiKeys = (args.values['api-key'] as string[] | undefined) ?? [];
    const turnSecret = stringOption(args, 'turn-secret');
    const serverOptions: SignalingServerOptions = {
      host,
      port: intOption(args, 'port', 8080),
      models,
      ...(joinSecret ? { secret: joinSecret } : {}),
      ...(apiKeys.length ? { apiKeys } : {}),
      ...(stringOption(args, 'admin-secret') ? { adminSecret: stringOption(args, 'admin-secret')! } : {}),
      ...(args.values['api-downloads'] ? { apiDownloads: true } : {}),
      ...(stringOption(args, 'trusted-secret') ? { publicRoom: publicRoomOptions(args) } : {}),
      limits: { maxActive: intOption(args, 'max-active', 16), maxQueue: intOption(args, 'max-queue', 64), maxSessionsPerClient: intOption(args, 'max-sessions', 16) },
      minPeers: intOption(args, 'min-peers', 1),
      planDelayMs: intOption(args, 'plan-delay', 300),
      sessionTtlMs: intOption(args, 'session-ttl', 300) * 1000,
      repairTimeoutMs: intOption(args, 'repair-timeout', 30_000),
      heartbeatMs: intOption(args, 'heartbeat', 500),
      heartbeatTimeoutMs: intOption(args, 'heartbeat-timeout', 3_500),
      standby: onOffOption('standby', stringOption(args, 'standby'), true),
      planner: plannerOption(stringOption(args, 'planner')),
      replanGain: replanGainOption(stringOption(args, 'replan-gain')),
      linkProbeMs: nonNegative('link-probe-interval', intOption(args, 'link-probe-interval', 30_000)),
      stagePolicy: { minStayMs: intOption(args, 'stage-min-stay', 0), minMemoryBytes: sizeOption(args, 'stage-min-memory') },
      stepTimeoutMs: intOption(args, 'step-timeout', DEFAULT_STEP_TIMEOUT_MS),
      speculate: speculateOption(intOption(args, 'speculate', 0)),
      ...(iceServers.length ? { iceServers } : {}),
      ...(stun ? { stun: true } : {}),
      ...(turnSecret ? { turn: { secret: turnSecret, ttlS: intOption(args, 'turn-ttl', 3600) } } : {}),
      ...(tls ? { tls } : {}),
      ...clusterOption(args, joinSecret),
      log: args.values.quiet ? () => undefined : (line) => console.log(line),
    };
    const { server, app } =
      ui === 'off' ? { server: await startSignalingServer(serverOptions), app: null } : await startServerWithApp(serverOptions, { mode: ui as WebAppMode, describe, log: serverOptions.log! });
    console.log(`gguf-mesh signaling server listening on ${server.url}`);
    if (app) console.log(`page:     ${server.pageUrl}  (web app: ${app.mode})`);
    if (server.access.separate) console.log(`credentials: join secret (peers), ${apiKeys.length} API key(s) (completions, own sessions${args.values['api-downloads'] ? ', model downloads' : ''}), admin secret (rooms, peers, routes, all sessions)`);
    if (!isLoopbackHost(host)) console.log(`bound to ${host}: every room still requires its secret`);
    if (tls) console.log(`tls:      ${tls.description}`);
    if (stun) console.log(`stun:     udp ${new URL(server.url).hostname}:${new URL(server.url).port} (browser peers learn their address for peers on other networks)`);
    if (tls?.ca) console.log(`trust:    ${server.url}/tls/ca.crt  (install once on each device; the landing page says how)`);
    if (!tls && !isLoopbackHost(host)) console.log(`plain HTTP on ${host}: other devices get no WebGPU, SubtleCrypto or OPFS there (browsers give them to https:// pages only); they can chat but not serve layers`);
    // bound to every interface: also print the join URL for each address others can use
    const otherAddresses = host === '0.0.0.0' || host === '::' ? interfaceAddresses().filter((a) => a !== new URL(server.url).hostname) : [];
    for (const room of server.rooms) {
      console.log(`room ${room.id} model ${room.model.id} (${room.model.nLayer} layers)${describe.has(room.model.location) ? `: ${describe.get(room.model.location)}` : ''}`);
      console.log(`  join:   ${server.joinUrl(room)}`);
      for (const addr of otherAddresses) console.log(`  join:   ${server.joinUrl(room).replace(server.url, `${new URL(server.url).protocol}//${addr}:${new URL(server.url).port}`)}`);
      console.log(`  secret: ${room.secret}`);
    }
    await new Promise<void>((resolve) => {
      process.once('SIGINT', resolve);
      process.once('SIGTERM', resolve);
    });
    await app?.close();
    await server.close();
    return 0;
  },
};

/** The certificate `serve` presents, or null for plain HTTP (signaling-server/tls.ts decides). */
async function serverTls(args: Parameters<Command['run']>[0], host: string): Promise<ServerTls | null> {
  let choice;
  try {
    choice = chooseTls({ host, certFile: stringOption(args, 'tls-cert'), keyFile: stringOption(args, 'tls-key'), force: Boolean(args.values.tls), insecureHttp: Boolean(args.values['insecure-http']) });
  } catch (e) {
    throw new UsageError((e as Error).message);
  }
  if (choice.kind === 'off') return null;
  if (choice.kind === 'operator') return operatorTls(choice.certFile, choice.keyFile);
  return localCaTls(join(meshCacheDir(), 'tls'), machineNames(host), (line) => console.log(line));
}


// `gguf-mesh serve`: the signaling server. Hosts each --model with Range support, opens a
// room per model, prints each room's join URL (secret in the fragment) and runs until stopped.

import { networkInterfaces } from 'node:os';
import type { Command } from '../command.ts';
import { intOption, stringOption, UsageError } from '../command.ts';
import { startSignalingServer } from '../../../signaling-server/server.ts';
import type { SignalingServerOptions } from '../../../signaling-server/server.ts';
import { startServerWithApp } from '../../../signaling-server/static.ts';
import type { WebAppMode } from '../../../signaling-server/static.ts';
import { modelsToServe } from '../../model/default-model.ts';
import { parseIceServer } from '../../protocol/control.ts';
import type { IceServer } from '../../protocol/control.ts';

const LOOPBACK_HOSTS = new Set(['127.0.0.1', 'localhost', '::1']);

/** Non-loopback IPv4 addresses of this machine. */
function interfaceAddresses(): string[] {
  return Object.values(networkInterfaces())
    .flat()
    .filter((a): a is NonNullable<typeof a> => !!a && a.family === 'IPv4' && !a.internal)
    .map((a) => a.address);
}

export const command: Command = {
  name: 'serve',
  summary: 'run the signaling server: host models, open a room per model, plan routes over joining peers',
  usage: '[--host 127.0.0.1] [--port 8080] [--model <path|url> …] [--secret S] [--ice-server <url> …] [--ui dist|dev|off]',
  options: {
    host: { type: 'string', description: 'interface to bind', default: '127.0.0.1', valueName: '<host>' },
    port: { type: 'string', description: 'TCP port (0 = any free port)', default: '8080', valueName: '<port>' },
    model: { type: 'string', multiple: true, description: 'GGUF path or URL; one room each (repeatable; a split GGUF: name its first part, e.g. m-00001-of-00003.gguf)', valueName: '<path|url>' },
    secret: { type: 'string', description: 'room secret (default: random per room)', valueName: '<secret>' },
    'ice-server': { type: 'string', multiple: true, description: 'STUN/TURN server for browser peers across the internet, sent to them on join (repeatable): stun:host:port or turn:user:pass@host:port', valueName: '<url>' },
    'min-peers': { type: 'string', description: 'plan a route once this many peers joined', default: '1', valueName: '<n>' },
    'plan-delay': { type: 'string', description: 'wait after the last join before planning (ms)', default: '300', valueName: '<ms>' },
    'session-ttl': { type: 'string', description: 'idle sessions expire after this many seconds', default: '300', valueName: '<s>' },
    quiet: { type: 'boolean', description: 'print only the join URLs, not room events' },
    ui: { type: 'string', description: 'the web app: dist (the production build, made on install and rebuilt when sources changed), dev (vite from the sources with HMR, 127.0.0.1 only), or off', default: 'dist', valueName: '<mode>' },
  },
  async run(args) {
    let iceServers: IceServer[];
    try {
      iceServers = ((args.values['ice-server'] as string[] | undefined) ?? []).map(parseIceServer);
    } catch (e) {
      throw new UsageError(`--ice-server: ${(e as Error).message}`);
    }
    const ui = stringOption(args, 'ui') ?? 'dist';
    if (!['dist', 'dev', 'off'].includes(ui)) throw new UsageError(`--ui must be dist, dev or off, got '${ui}'`);
    const host = stringOption(args, 'host') ?? '127.0.0.1';
    // vite's dev server answers for every file of the repository (sources, node_modules, models)
    if (ui === 'dev' && !LOOPBACK_HOSTS.has(host)) throw new UsageError(`--ui dev serves the whole source tree, so it binds 127.0.0.1 only (got --host ${host}); other devices get the build (--ui dist)`);
    // no --model: $GGUF_MESH_MODEL, else the default synthetic model (made once, cached)
    const { models, describe, made } = await modelsToServe((args.values.model as string[] | undefined) ?? []);
    if (made) console.log(`made the default model ${models[0]}`);
    const serverOptions: SignalingServerOptions = {
      host,
      port: intOption(args, 'port', 8080),
      models,
      ...(stringOption(args, 'secret') ? { secret: stringOption(args, 'secret')! } : {}),
      minPeers: intOption(args, 'min-peers', 1),
      planDelayMs: intOption(args, 'plan-delay', 300),
      sessionTtlMs: intOption(args, 'session-ttl', 300) * 1000,
      ...(iceServers.length ? { iceServers } : {}),
      log: args.values.quiet ? () => undefined : (line) => console.log(line),
    };
    const { server, app } =
      ui === 'off' ? { server: await startSignalingServer(serverOptions), app: null } : await startServerWithApp(serverOptions, { mode: ui as WebAppMode, describe, log: serverOptions.log! });
    console.log(`gguf-mesh signaling server listening on ${server.url}`);
    if (app) console.log(`page:     ${server.url}/  (web app: ${app.mode})`);
    if (!LOOPBACK_HOSTS.has(host)) console.log(`bound to ${host}: every room still requires its secret`);
    // bound to every interface: also print the join URL for each address others can use
    const otherAddresses = host === '0.0.0.0' || host === '::' ? interfaceAddresses() : [];
    for (const room of server.rooms) {
      console.log(`room ${room.id} model ${room.model.id} (${room.model.nLayer} layers)${describe.has(room.model.location) ? `: ${describe.get(room.model.location)}` : ''}`);
      console.log(`  join:   ${server.joinUrl(room)}`);
      for (const addr of otherAddresses) console.log(`  join:   ${server.joinUrl(room).replace(server.url, `http://${addr}:${new URL(server.url).port}`)}`);
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

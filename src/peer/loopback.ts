// A whole route inside one process, stage to stage over real sockets: each loaded backend gets
// its own frame server on 127.0.0.1, each stage links to the next over WebSocket (or HTTP),
// and a SessionManager drives them. Used by tests and `npm run bench -- route`; the CLI's
// `serve` + `node` processes are assembled from the same parts.

import { randomBytes } from 'node:crypto';
import type { ShardRange, StageBackend } from '../backends/types.ts';
import { HttpLink } from '../transport/http.ts';
import { LocalLink } from '../transport/link.ts';
import type { FrameLink } from '../transport/link.ts';
import { startFrameServer } from '../transport/frame-server.ts';
import type { FrameServer } from '../transport/frame-server.ts';
import { WsLink } from '../transport/ws.ts';
import { SessionManager } from '../route/sessions.ts';
import type { RouteHandle, SessionManagerOptions } from '../route/sessions.ts';
import { StageService } from './stage-service.ts';
import type { SamplerFactory, StageServiceOptions } from './stage-service.ts';

export interface LoopbackStage {
  backend: StageBackend;
  shard: ShardRange;
}

export interface LoopbackOptions {
  nLayer: number;
  /** 'ws' (default), 'http', or 'local' (no sockets: function calls) */
  carrier?: 'ws' | 'http' | 'local';
  messageLimit?: number;
  samplerFactory?: SamplerFactory;
  sessions?: SessionManagerOptions;
  /** the one-way token path (FrameFlag.ReturnDirect): the last stage hands tokens straight to the session manager (default true) */
  directReturn?: boolean;
  /** the ring (FrameFlag.Ring): the last stage also links to stage 0, for sessions that open with tokenPath 'ring' (default true, with directReturn, on 2 stages or more) */
  ring?: boolean;
  /** every stage's limits (chunk size, frame and session caps) */
  stageLimits?: Partial<Pick<StageServiceOptions, 'chunkTokens' | 'maxFrameTokens' | 'maxSessions' | 'idleTtlMs'>>;
}

export interface LoopbackRoute {
  manager: SessionManager;
  route: RouteHandle;
  services: StageService[];
  servers: FrameServer[];
  /** a link a client uses to reach the session manager */
  clientLink: FrameLink;
  secret: string;
  /** stops one stage's server, as if its peer died */
  killStage(i: number): Promise<void>;
  close(): Promise<void>;
}

export async function startLoopbackRoute(stages: LoopbackStage[], opts: LoopbackOptions): Promise<LoopbackRoute> {
  const secret = randomBytes(16).toString('hex');
  const headers = { authorization: `Bearer ${secret}` };
  const carrier = opts.carrier ?? 'ws';
  const services = stages.map(
    (s, i) =>
      new StageService({
        ...opts.stageLimits,
        backend: s.backend,
        stage: i,
        shard: s.shard,
        nLayer: opts.nLayer,
        downstream: null,
        ...(opts.samplerFactory ? { samplerFactory: opts.samplerFactory } : {}),
      }),
  );
  const servers: FrameServer[] = [];
  const links: FrameLink[] = [];
  const connect = async (i: number): Promise<FrameLink> => {
    let link: FrameLink;
    if (carrier === 'local') link = new LocalLink(services[i]!.handle);
    else if (carrier === 'http') link = new HttpLink(servers[i]!.url, headers);
    else link = await WsLink.connect(servers[i]!.wsUrl, { headers, ...(opts.messageLimit ? { messageLimit: opts.messageLimit } : {}) });
    links.push(link);
    return link;
  };
  if (carrier !== 'local') {
    for (const svc of services) {
      servers.push(await startFrameServer({ host: '127.0.0.1', port: 0, secret, handler: svc.handle, status: () => svc.status(), ...(opts.messageLimit ? { messageLimit: opts.messageLimit } : {}) }));
    }
  }
  // downstream links first (the last stage is ready before anyone sends to it)
  for (let i = services.length - 2; i >= 0; i--) services[i]!.setDownstream(await connect(i + 1));
  const control: Array<FrameLink | null> = [];
  for (let i = 0; i < services.length; i++) control.push(await connect(i));
  const entry = await connect(0);
  // the last stage's own link to stage 0, for ring tokens (answered by a Status nobody waits for)
  const ringLink = opts.ring !== false && opts.directReturn !== false && services.length > 1 ? await connect(0) : null;
  const route: RouteHandle = {
    id: 1,
    entry: () => entry,
    stageLinks: () => control,
    stagePeers: () => services.map((_, i) => servers[i]?.url ?? `local-${i}`),
    directReturn: () => opts.directReturn !== false,
    ring: () => ringLink !== null,
    verify: () => true,
  };
  const manager = new SessionManager((id) => (id === route.id ? route : undefined), opts.sessions);
  for (const svc of services) svc.setReturnTo((answer) => void manager.deliverReturn(answer));
  if (ringLink) services[services.length - 1]!.setReturnTo((answer) => void manager.deliverReturn(answer), (token) => ringLink.request(token));
  const clientLink = new LocalLink((f) => manager.handle(f));
  return {
    manager,
    route,
    services,
    servers,
    clientLink,
    secret,
    async killStage(i: number) {
      control[i] = null;
      await servers[i]?.close();
    },
    async close() {
      await manager.dispose();
      await Promise.all(links.map((l) => l.close().catch(() => undefined)));
      await Promise.all(servers.map((s) => s.close()));
    },
  };
}

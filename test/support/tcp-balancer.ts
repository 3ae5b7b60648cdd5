// A load balancer for the cluster tests, as any TCP one in front of N `serve` instances would be:
// each new connection goes to the next live backend in turn, and to the one after when that one
// does not accept. Live: it answered its last health check (GET /v1/health, any status, within a
// second, every half second) — a stopped instance's kernel still accepts connections, so only
// the check takes it out; and, as HAProxy's `on-marked-down shutdown-sessions`, the connections
// already open to a backend marked down are cut (a kept-alive HTTP connection would hang). Bytes are passed through untouched, so HTTP, WebSocket upgrades and
// Server-Sent Events all work through it.
import { get } from 'node:http';
import { createConnection, createServer } from 'node:net';
import type { AddressInfo, Server, Socket } from 'node:net';

export interface TcpBalancer {
  url: string;
  /** connections each backend accepted */
  accepted: number[];
  /** new connections go to backend `i` while it is live (as a sticky balancer would send one client); null: in turn again */
  pin(i: number | null): void;
  close(): Promise<void>;
}

export async function startTcpBalancer(backends: ReadonlyArray<{ host: string; port: number }>): Promise<TcpBalancer> {
  let next = 0;
  let pinned: number | null = null;
  const accepted = backends.map(() => 0);
  const live = backends.map(() => true);
  /** open connections per backend: upstream → client */
  const through = backends.map(() => new Map<Socket, Socket>());
  const check = (): void =>
    backends.forEach((b, i) => {
      const req = get({ host: b.host, port: b.port, path: '/v1/health', timeout: 1_000 }, (res) => {
        live[i] = true;
        res.resume();
      });
      req.on('timeout', () => req.destroy(new Error('timeout')));
      req.on('error', () => {
        if (live[i]) for (const [up, client] of through[i]!) (up.destroy(), client.destroy());
        live[i] = false;
      });
    });
  const checker = setInterval(check, 500);
  checker.unref();
  const open = new Set<Socket>();
  const connect = (client: Socket, tries: number): void => {
    if (tries >= backends.length) return void client.destroy();
    // (pinned: a refusal goes on to the backend after it)
    if (pinned !== null && live[pinned] && tries === 0) next = pinned;
    let i = next++ % backends.length;
    for (let k = 0; k < backends.length && !live[i]; k++) i = next++ % backends.length;
    const upstream = createConnection(backends[i]!);
    let joined = false;
    upstream.once('connect', () => {
      joined = true;
      accepted[i]!++;
      open.add(upstream);
      through[i]!.set(upstream, client);
      upstream.on('close', () => (open.delete(upstream), through[i]!.delete(upstream), client.destroy()));
      client.on('close', () => upstream.destroy());
      client.pipe(upstream).pipe(client);
      client.resume();
    });
    // refused before it joined: the next backend; after: the client's connection ends with it
    upstream.on('error', () => (joined ? client.destroy() : connect(client, tries + 1)));
  };
  const server: Server = createServer({ pauseOnConnect: true }, (client) => {
    open.add(client);
    client.on('close', () => open.delete(client));
    client.on('error', () => undefined);
    connect(client, 0);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    accepted,
    pin: (i) => void (pinned = i),
    close: () =>
      new Promise((r) => {
        clearInterval(checker);
        for (const s of open) s.destroy();
        server.close(() => r());
      }),
  };
}

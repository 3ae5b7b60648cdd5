// Types for comlink's Node adapter, which the package ships as node-adapter.d.ts beside an
// .mjs file that TypeScript's resolution does not pair with it.
declare module 'comlink/dist/esm/node-adapter.mjs' {
  import type { Endpoint } from 'comlink';
  import type { MessagePort, Worker } from 'node:worker_threads';
  /** a worker thread (seen from its parent) or its parentPort (seen from inside) */
  export type NodeEndpoint = Worker | MessagePort;
  export default function nodeEndpoint(nep: NodeEndpoint): Endpoint;
}

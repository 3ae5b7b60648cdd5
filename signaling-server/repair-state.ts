// What a route's repair holds while it is under way (route-repair.ts runs it): the lost stages,
// each with its replacement and phase, and the promise the sessions wait on; and the spares,
// peers holding a standby shard. Plain state: it knows no room and no route.

import { MeshError } from '../src/errors.ts';
import type { ShardRange } from '../src/gguf/types.ts';
import type { RouteRepair } from '../src/route/session-types.ts';

export interface Spare {
  peerId: string;
  /** the route and stage whose shard it holds (re-targeted when the route changes) */
  routeId: number;
  stage: number;
  shard: ShardRange;
  status: 'loading' | 'ready' | 'failed';
}

export interface LostStage {
  stage: number;
  lostPeer: string;
  cause: string;
  /** the peer taking over, once one is chosen */
  replacement: string | null;
  warm: boolean;
  /** graceful leave: the leaving peer serves until the replacement is ready */
  graceful: boolean;
  /** told when a leaving peer goes away before its hand-over is done: its steps in flight will not settle */
  gone?: () => void;
  phase: 'waiting' | 'loading' | 'rewiring' | 'done';
}

/** A route's repair: the lost stages, and the promise sessions wait on. */
export class RepairState implements RouteRepair {
  readonly lost = new Map<number, LostStage>();
  readonly since = Date.now();
  readonly done: Promise<void>;
  resolve!: () => void;
  reject!: (e: MeshError) => void;
  timer: NodeJS.Timeout | null = null;

  constructor() {
    this.done = new Promise<void>((resolve, reject) => {
      this.resolve = resolve;
      this.reject = reject;
    });
    this.done.catch(() => undefined); // observed by the sessions that wait on it
  }

  get stages(): number[] {
    return [...this.lost.keys()].sort((a, b) => a - b);
  }
}

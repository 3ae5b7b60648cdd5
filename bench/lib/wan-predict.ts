// Bench wan's prediction of a route's decode step, `Σ compute + (S − 1)·hop + 1 return`, from
// what the same run measured (bench/wan.ts, bench/wan-lab.ts):
//  - Σ compute: the route's stages' own forward passes (the timing records of the decode steps
//    measured; route/telemetry.ts stepBreakdown), not the single process's, which ran minutes
//    apart on a machine shared with other work;
//  - the stages' overhead: what each stage spends on a step besides the pass, the wait for its
//    turn and the wait downstream (the worker thread's round trip, encoding, sampling) — real
//    per-token work the formula leaves out, measured by every stage, reported beside it;
//  - every hop: its added latency (the node's delay on each side it touches) plus one loopback
//    message's own time, over the S + 3 socket hops a token takes: client → server → stage 0 →
//    … → stage S − 1 → server → client. A loopback message's time is measured on the route's
//    own stage-to-stage hops, on the climbing token path's steps of the same run (each stage
//    there times its wait for the next one's reply: route/telemetry.ts transferMs, a round trip
//    of hidden state and answer less the added delays on it, halved). A WebSocket ping to the
//    server took half of that or less (0.1-0.2 ms against 0.3-1.0): a hop costs the waking of
//    an idle node, which a ping between two busy processes does not; the server's heartbeat
//    round trips are a running mean that a loaded machine's bursts inflated to 2-10 ms;
//  - the entry and the return (the formula's "1 return"): where the run measured a one-stage
//    route (bench/wan.ts does), that route's median step less its stage's compute and overhead —
//    the client → server → stage 0 and last stage → server → client messages with the server's
//    and the client's own handling of them (the server's ~0.8 ms of CPU a token, which loopback
//    messages between stages do not have) — and the S − 1 stage-to-stage hops one loopback
//    message each; otherwise the S + 3 socket hops one loopback message each (reported beside).
// Measured and predicted alike are medians over the run's tokens (each term's median): on two
// shared cores one token in a few is held up by other work for tens of ms, in a stage or on
// the wire, which a round's mean carries and the path's model does not.
import { stepBreakdown } from '../../src/route/telemetry.ts';
import type { StepTiming } from '../../src/protocol/payload.ts';
import { median } from '../../src/stats.ts';

/** One decode step on the one-way path: its time as the client saw it, Σ compute and Σ overhead of the route's stages (ms). */
export interface StepCost {
  ms: number;
  compute_ms: number;
  stage_overhead_ms: number;
}

/** Step `ms` long whose reply carried `records`. */
export function stepCost(ms: number, records: readonly StepTiming[]): StepCost {
  const c: StepCost = { ms, compute_ms: 0, stage_overhead_ms: 0 };
  for (const s of stepBreakdown(records)) {
    c.compute_ms += s.computeMs;
    c.stage_overhead_ms += s.overheadMs;
  }
  return c;
}

/** Each figure's median over `steps`: the token a shared machine's bursts of other work did not hold up. */
export function medianStep(steps: readonly StepCost[]): StepCost {
  return { ms: median(steps.map((s) => s.ms)), compute_ms: median(steps.map((s) => s.compute_ms)), stage_overhead_ms: median(steps.map((s) => s.stage_overhead_ms)) };
}

/** Each stage-to-stage hop's round trip (ms) of a climbing-path step: the stage's wait for the next one less the next one's handling. */
export function hopRoundTrips(records: readonly StepTiming[]): number[] {
  return stepBreakdown(records).slice(0, -1).map((s) => s.transferMs);
}


export interface RunPrediction {
  predicted_ms_per_token: number;
  /**
   * loopback_hop_ms null: not measured (a one-stage route has no stage-to-stage hop), the
   * prediction has no loopback term. entry_return_ms: the "1 return" as a one-stage route of the
   * same run measured it (null: not measured; the S + 3 socket hops then stand for it), and
   * predicted_as_socket_hops_ms the prediction with every hop a loopback message instead.
   */
  terms: Omit<StepCost, 'ms'> & { added_latency_ms: number; loopback_hop_ms: number | null; socket_hops: number; entry_return_ms: number | null; predicted_as_socket_hops_ms: number };
}

/**
 * The entry and the return of a step, client → server → stage 0 and last stage → server →
 * client with the server's and the client's handling, from a one-stage route's median step:
 * what is left of it after its stage's compute and overhead.
 */
export function entryReturnMs(oneStage: StepCost): number {
  return oneStage.ms - oneStage.compute_ms - oneStage.stage_overhead_ms;
}

/**
 * The prediction from a step's stage costs, each node's added one-way delay (ms), one loopback
 * message's time (ms; NaN: not measured) and, where measured, the entry and return (ms; NaN:
 * not measured): Σ compute + Σ overhead + added latency + (S − 1)·hop + entry and return. Without
 * the entry and return, the S + 3 socket hops each count one loopback message.
 */
export function predictFromRun(costs: Omit<StepCost, 'ms'>, nodeDelaysMs: readonly number[], loopbackHopMs: number, entryReturn = NaN): RunPrediction {
  const added = nodeDelaysMs.reduce((a, d) => a + 2 * d, 0); // in and out of each node
  const socketHops = nodeDelaysMs.length + 3;
  const hop = Number.isFinite(loopbackHopMs) ? loopbackHopMs : null;
  const r = (x: number): number => Math.round(x * 1000) / 1000;
  const stages = costs.compute_ms + costs.stage_overhead_ms + added;
  const asSocketHops = stages + socketHops * (hop ?? 0);
  const measured = Number.isFinite(entryReturn) ? entryReturn : null;
  return {
    predicted_ms_per_token: r(measured === null ? asSocketHops : stages + (nodeDelaysMs.length - 1) * (hop ?? 0) + measured),
    terms: {
      compute_ms: r(costs.compute_ms),
      stage_overhead_ms: r(costs.stage_overhead_ms),
      added_latency_ms: added,
      loopback_hop_ms: hop === null ? null : r(hop),
      socket_hops: socketHops,
      entry_return_ms: measured === null ? null : r(measured),
      predicted_as_socket_hops_ms: r(asSocketHops),
    },
  };
}

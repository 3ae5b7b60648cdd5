// What every benchmark reports beside its figures: the goals it checks (each a measured ratio
// against its target, met or not) and how busy the machine was, since these run on shared
// machines. `npm run bench` exits non-zero when a goal is missed.

import { availableParallelism, loadavg } from 'node:os';

export interface Goal {
  /** what is measured, e.g. "cpu decode / bare llama.cpp decode" */
  figure: string;
  value: number;
  /** 'min': value ≥ target is met; 'max': value ≤ target */
  kind: 'min' | 'max';
  target: number;
  met: boolean;
  /** why this goal could not be checked in this run (it does not fail the bench) */
  skipped?: string;
}

export function goal(figure: string, value: number, kind: Goal['kind'], target: number): Goal {
  const v = Math.round(value * 1000) / 1000;
  return { figure, value: v, kind, target, met: Number.isFinite(value) && (kind === 'min' ? value >= target : value <= target) };
}

/** a goal this run cannot check (say, a GPU goal on a software adapter): reported with the reason */
export function skippedGoal(figure: string, value: number, kind: Goal['kind'], target: number, why: string): Goal {
  return { ...goal(figure, value, kind, target), skipped: why };
}

/** the machine's load while a bench ran (1-minute load average, sampled at the start and end) */
export interface MachineLoad {
  cpus: number;
  loadavg_1m_start: number;
  loadavg_1m_end?: number;
}

export function machineLoad(): MachineLoad {
  return { cpus: availableParallelism(), loadavg_1m_start: Math.round(loadavg()[0]! * 100) / 100 };
}

export function finishLoad(l: MachineLoad): MachineLoad {
  return { ...l, loadavg_1m_end: Math.round(loadavg()[0]! * 100) / 100 };
}

export const round2 = (x: number): number => Math.round(x * 100) / 100;

/** the smallest of a list (the least disturbed measurement on a shared machine) */
export const best = (xs: readonly number[]): number => Math.min(...xs);

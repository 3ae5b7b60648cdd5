// CPU time a process has spent (user + system, every thread), from /proc on Linux: what a bench
// charges each process per token. Unlike wall time, it holds on a shared machine (a process
// waiting for a core spends none).
import { readFileSync } from 'node:fs';

/** Linux's USER_HZ: the unit of /proc/<pid>/stat's times */
const TICK_MS = 10;

/** ms of CPU `pid` has used so far; null where /proc cannot tell (not Linux, a process gone) */
export function cpuMs(pid: number): number | null {
  try {
    // the command name (field 2) is in parentheses and may hold spaces: count from after it
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) * TICK_MS; // utime, stime: fields 14 and 15
  } catch {
    return null;
  }
}

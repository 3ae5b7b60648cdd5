// simple-peer (and the readable-stream it uses) expects Node's Buffer, process and global.
// Browsers and vite provide none of them, so this module sets them on globalThis; it must be
// evaluated before simple-peer, which is why webrtc.ts imports it first. Where they exist
// already (Node), nothing changes.
import { Buffer } from 'buffer';
import process from 'process';

const g = globalThis as Record<string, unknown>;
g.global ??= globalThis;
g.Buffer ??= Buffer;
g.process ??= process;

// Headless Chromium inside a lab host (test/support/netns.ts), trusting CAs the way a person
// would: imported into the certificate store of the browser's own profile — an NSS database
// made with certutil (Debian's libnss3-tools) at $HOME/.pki/nssdb, where Chromium on Linux
// reads user-trusted roots. No certificate-bypass flag: a certificate a phone would refuse
// fails the page load.
import { execFile } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { chromium } from 'playwright-core';
import type { Browser } from 'playwright-core';
import { chromiumArgs } from '../../vite.config.ts';
import type { NetLab } from './netns.ts';

const run = promisify(execFile);

export interface LabBrowser {
  browser: Browser;
  close(): Promise<void>;
}

/** A home folder whose NSS database trusts each PEM in `cas` as a TLS root (certutil -t C,,). */
export async function trustingHome(cas: string[]): Promise<string> {
  const home = mkdtempSync(join(tmpdir(), 'gguf-mesh-lab-home-'));
  const db = join(home, '.pki', 'nssdb');
  mkdirSync(db, { recursive: true });
  try {
    await run('certutil', ['-N', '-d', `sql:${db}`, '--empty-password']);
    for (const [k, pem] of cas.entries()) {
      const file = join(home, `ca-${k}.pem`);
      writeFileSync(file, pem);
      await run('certutil', ['-A', '-d', `sql:${db}`, '-n', `test CA ${k}`, '-t', 'C,,', '-i', file]);
    }
  } catch (e) {
    rmSync(home, { recursive: true, force: true });
    const err = e as Error & { code?: string };
    throw new Error(err.code === 'ENOENT' ? 'certutil is missing: install Debian\'s libnss3-tools' : `certutil: ${err.message}`);
  }
  return home;
}

/** Chromium (the project's WebGPU flags) in lab host `host`, its profile trusting `cas`. */
export async function launchInHost(lab: NetLab, host: string, cas: string[]): Promise<LabBrowser> {
  const home = await trustingHome(cas);
  const wrapper = join(home, 'chromium-in-netns.sh');
  const exe = process.env.CHROME_PATH ?? '/usr/bin/chromium';
  // ip netns exec replaces itself with the browser, so playwright's pipe (fds 3 and 4) reaches it
  writeFileSync(wrapper, `#!/bin/sh\nexec ${lab.exec(host, [exe]).join(' ')} "$@"\n`);
  chmodSync(wrapper, 0o755);
  let browser: Browser;
  try {
    browser = await chromium.launch({ executablePath: wrapper, args: chromiumArgs, env: { ...process.env, HOME: home } });
  } catch (e) {
    rmSync(home, { recursive: true, force: true });
    throw e;
  }
  return {
    browser,
    async close() {
      await browser.close().catch(() => undefined);
      rmSync(home, { recursive: true, force: true });
    },
  };
}

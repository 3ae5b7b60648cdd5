// Prints the closing line CI reads: `tests: N passed, N failed, N skipped`. A test file that
// fails to load and an unhandled error each count as one failure, so a broken import is never
// a silent zero.
import type { Reporter, TestModule } from 'vitest/node';

export default class CountReporter implements Reporter {
  onTestRunEnd(testModules: ReadonlyArray<TestModule>, unhandledErrors: ReadonlyArray<unknown>): void {
    let passed = 0;
    let failed = unhandledErrors.length;
    let skipped = 0;
    for (const mod of testModules) {
      let tests = 0;
      for (const test of mod.children.allTests()) {
        tests++;
        const state = test.result().state;
        if (state === 'passed') passed++;
        else if (state === 'failed') failed++;
        else skipped++;
      }
      if (tests === 0 || (mod.state() === 'failed' && mod.errors().length > 0)) {
        if (mod.state() === 'failed') failed++;
      }
    }
    // Printed last, on its own line, after vitest's own summary.
    process.on('exit', () => {
      process.stdout.write(`\ntests: ${passed} passed, ${failed} failed, ${skipped} skipped\n`);
    });
  }
}

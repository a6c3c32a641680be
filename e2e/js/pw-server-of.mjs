// A Playwright server for Chromium on a free loopback port, run by a given
// playwright-core package (an npm alias of another version, say):
//
//   node pw-server-of.mjs <package>      e.g. playwright-core-old
//
// prints "WS <wsEndpoint> <package version>" once it listens, then runs
// until it is killed. Like pw-server.mjs, the browser is $E2E_CHROMIUM
// (default /usr/bin/chromium): never a downloaded one.
import { createRequire } from 'node:module';

const pkg = process.argv[2];
if (!pkg) {
  console.error('usage: node pw-server-of.mjs <package>');
  process.exit(2);
}
const require = createRequire(import.meta.url);
const { version } = require(`${pkg}/package.json`);
const { chromium } = await import(pkg);

const server = await chromium.launchServer({
  executablePath: process.env.E2E_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  host: '127.0.0.1',
  port: 0,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--disable-dev-shm-usage'],
});
console.log(`WS ${server.wsEndpoint()} ${version}`);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, async () => {
    await server.close().catch(() => {});
    process.exit(0);
  });
}
// Stay alive until killed.
setInterval(() => {}, 1 << 30);

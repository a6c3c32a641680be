// A Playwright server for Chromium on a free loopback port:
//
//   node pw-server.mjs
//
// prints "WS <wsEndpoint>" once it listens, then runs until it is killed.
// The browser is $E2E_CHROMIUM (default /usr/bin/chromium): never a
// downloaded one.
import { chromium } from 'playwright-core';

const server = await chromium.launchServer({
  executablePath: process.env.E2E_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  host: '127.0.0.1',
  port: 0,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--disable-dev-shm-usage'],
});
console.log(`WS ${server.wsEndpoint()}`);
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, async () => {
    await server.close().catch(() => {});
    process.exit(0);
  });
}
// Stay alive until killed.
setInterval(() => {}, 1 << 30);

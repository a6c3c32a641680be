// A browserless v2 server (@browserless.io/browserless) on 127.0.0.1, as a
// provider for the e2e suite:
//
//   node browserless.mjs <port>        (or $BROWSERLESS_PORT)
//
// with its cap from CONCURRENT and QUEUED and, when TOKEN is set, that
// token required of every client (?token=…). It prints "ready <port>
// <version>" once it accepts connections, and ends when its stdin closes
// (the Go test that started it is gone) or on SIGTERM / SIGINT.
//
// Every session is a Chromium browserless launches: $E2E_CHROMIUM (default
// /usr/bin/chromium), never a downloaded one. browserless finds Chromium
// where Playwright installs its own, and at start refuses a route whose
// browser it cannot find; so its copy of playwright-core is pointed at our
// Chromium before browserless is loaded, and the routes of the browsers
// only Chromium stands in for here (Chrome, Edge, Firefox, WebKit) are
// disabled. What is left: Chromium's routes (CDP at / and /chromium,
// Playwright at /chromium/playwright, the REST APIs) and the management
// routes (/pressure, /sessions …).
import { createRequire } from 'node:module';
import { readFileSync } from 'node:fs';
import path from 'node:path';

const port = Number(process.argv[2] || process.env.BROWSERLESS_PORT);
if (!Number.isInteger(port) || port <= 0 || port > 65535) {
  console.error('usage: node browserless.mjs <port>');
  process.exit(2);
}
const chromium = process.env.E2E_CHROMIUM || '/usr/bin/chromium';

// browserless reads its settings from the environment when its classes are
// made: loopback only, on the port given.
process.env.HOST = '127.0.0.1';
process.env.PORT = String(port);

// The playwright-core browserless itself imports (its own pinned copy).
const require = createRequire(import.meta.url);
const entry = require.resolve('@browserless.io/browserless');
const root = path.resolve(path.dirname(entry), '..');
const playwright = createRequire(entry)('playwright-core');
playwright.chromium.executablePath = () => chromium;

const bl = await import('@browserless.io/browserless');
const { version } = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8'));

// browserless reads the Playwright versions it serves from ./package.json:
// its own.
process.chdir(root);

const server = new bl.Browserless();
server.disableRoutes(
  ...Object.values(bl.BrowserlessChromeRoutes),
  ...Object.values(bl.BrowserlessEdgeRoutes),
  ...Object.values(bl.BrowserlessFirefoxRoutes),
  ...Object.values(bl.BrowserlessWebKitRoutes),
);

let stopping = false;
async function stop(why) {
  if (stopping) return;
  stopping = true;
  console.error(`browserless.mjs: ${why}, stopping`);
  // stop closes the browsers, then waits for the HTTP server's last
  // connections: bounded, the exit kills what is left (Puppeteer kills
  // its browsers when the process exits).
  const bound = setTimeout(() => process.exit(0), 5000);
  await server.stop().catch((err) => console.error(err));
  clearTimeout(bound);
  process.exit(0);
}
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => stop(sig));
}
process.stdin.on('end', () => stop('stdin closed'));
process.stdin.on('error', () => stop('stdin closed'));
process.stdin.resume();

await server.start();
console.log(`ready ${port} ${version}`);

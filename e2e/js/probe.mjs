// One connection attempt of a real client, whatever its outcome:
//
//   node probe.mjs <mode> <url>
//
// modes:
//   puppeteer-ws    puppeteer.connect({browserWSEndpoint: url})
//   puppeteer-bidi  puppeteer.connect({browserWSEndpoint: url, protocol: 'webDriverBiDi'})
//   pw-cdp          playwright chromium.connectOverCDP(url)
//   pw-connect      playwright chromium.connect(url)
//
// Prints "CONNECTED <browser version>" (and disconnects at once) or
// "FAILED <first line of the error>", and exits 0 either way: the Go test
// decides which it expected (exit 2: bad usage). Used against servers that
// are not browsers (to see the handshake a client sends) and against a
// gateway that must turn a client away.
import puppeteer from 'puppeteer-core';
import { chromium } from 'playwright-core';

const [mode, url] = process.argv.slice(2);
if (!mode || !url) {
  console.error('usage: node probe.mjs <mode> <url>');
  process.exit(2);
}
const timeout = 20_000;
const guard = setTimeout(() => {
  console.log(`FAILED ${mode}: gave up after 40s`);
  process.exit(0);
}, 40_000);

async function attempt() {
  switch (mode) {
    case 'puppeteer-ws': {
      const browser = await puppeteer.connect({ browserWSEndpoint: url, protocolTimeout: timeout });
      const version = await browser.version();
      await browser.disconnect();
      return version;
    }
    case 'puppeteer-bidi': {
      const browser = await puppeteer.connect({ browserWSEndpoint: url, protocol: 'webDriverBiDi', protocolTimeout: timeout });
      const version = await browser.version();
      await browser.disconnect();
      return version;
    }
    case 'pw-cdp': {
      const browser = await chromium.connectOverCDP(url, { timeout });
      const version = browser.version();
      await browser.close();
      return version;
    }
    case 'pw-connect': {
      const browser = await chromium.connect(url, { timeout });
      const version = browser.version();
      await browser.close();
      return version;
    }
    default:
      console.error(`unknown mode ${mode}`);
      process.exit(2);
  }
}

try {
  const version = await attempt();
  console.log(`CONNECTED ${version}`);
} catch (err) {
  const msg = String(err && err.message ? err.message : err).split('\n').find((l) => l.trim() !== '') || String(err);
  console.log(`FAILED ${msg.trim()}`);
}
clearTimeout(guard);
process.exit(0);

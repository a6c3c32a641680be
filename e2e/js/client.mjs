// One real automation client against the gateway.
//
//   node client.mjs <mode> <url> [--big-screenshot] [--bidi]
//
// modes:
//   puppeteer-ws    puppeteer.connect({browserWSEndpoint: url})
//   puppeteer-url   puppeteer.connect({browserURL: url})   (GET <url>/json/version first)
//   pw-cdp          playwright chromium.connectOverCDP(url) (ws:// or http:// URL)
//   pw-connect      playwright chromium.connect(url)        (a Playwright server)
//   puppeteer-hold  like puppeteer-ws, then stays connected: prints READY, and
//                   DISCONNECTED when the browser connection drops (exit 0),
//                   or gives up after 60 s (exit 1).
//   puppeteer-idle  like puppeteer-ws, then sends nothing for --idle-ms=N, or
//                   until the file --until-file=PATH exists (printing IDLE
//                   when it starts), evaluates 6*7 again in the same page
//                   and prints "AFTER <value>".
//
// Each mode opens a page, evaluates 6*7 in it and prints
// "RESULT <mode> <value> <browser version>"; the exit code is 0 only when the
// value is 42. With --big-screenshot (Puppeteer modes) it also takes a
// screenshot of random pixels (a CDP answer of several MB) and prints
// "SCREENSHOT <bytes>". With --bidi the Puppeteer modes speak WebDriver BiDi
// (protocol: 'webDriverBiDi', as to Firefox), and before the RESULT line the
// page loads a data: URL and "TITLE <its title>" is printed.
import { existsSync } from 'node:fs';
import puppeteer from 'puppeteer-core';
import { chromium } from 'playwright-core';

const [mode, url, ...flags] = process.argv.slice(2);
const bigScreenshot = flags.includes('--big-screenshot');
const bidi = flags.includes('--bidi');
const idleFlag = flags.find((f) => f.startsWith('--idle-ms='));
const idleMs = idleFlag ? Number(idleFlag.slice('--idle-ms='.length)) : 0;
const untilFlag = flags.find((f) => f.startsWith('--until-file='));
const untilFile = untilFlag ? untilFlag.slice('--until-file='.length) : '';
if (!mode || !url) {
  console.error('usage: node client.mjs <mode> <url>');
  process.exit(2);
}
const timeout = 30_000;
// Whatever happens, never hang: the Go side also enforces its own limit.
const guard = setTimeout(() => {
  console.error(`${mode}: gave up after 60s`);
  process.exit(1);
}, 60_000);

async function viaPuppeteer(connectOpts, hold) {
  const protocol = bidi ? { protocol: 'webDriverBiDi' } : {};
  const browser = await puppeteer.connect({ ...connectOpts, ...protocol, protocolTimeout: timeout });
  const version = await browser.version();
  const page = await browser.newPage();
  if (bidi) {
    await page.goto('data:text/html,<title>hello bidi</title><p>gateway</p>');
    console.log(`TITLE ${await page.title()}`);
  }
  const value = await page.evaluate(() => 6 * 7);
  console.log(`RESULT ${mode} ${value} ${version}`);
  if (bigScreenshot) {
    // A big CDP message: a PNG of random pixels does not compress, so the
    // answer is one WebSocket message of several MB.
    await page.setViewport({ width: 1024, height: 1024 });
    await page.setContent('<body style="margin:0"><canvas id="c" width="1024" height="1024"></canvas></body>');
    await page.evaluate(() => {
      const c = document.getElementById('c').getContext('2d');
      const img = c.createImageData(1024, 1024);
      for (let i = 0; i < img.data.length; i++) img.data[i] = (i % 4 === 3) ? 255 : Math.random() * 256;
      c.putImageData(img, 0, 0);
    });
    const png = await page.screenshot({ type: 'png', encoding: 'binary' });
    console.log(`SCREENSHOT ${png.length}`);
    if (png.length < 1 << 20) throw new Error(`screenshot of ${png.length} bytes, want over 1 MiB`);
  }
  if (idleMs > 0 || untilFile) {
    console.log('IDLE');
    if (untilFile) {
      while (!existsSync(untilFile)) await new Promise((resolve) => setTimeout(resolve, 50));
    } else {
      await new Promise((resolve) => setTimeout(resolve, idleMs));
    }
    const again = await page.evaluate(() => 6 * 7);
    console.log(`AFTER ${again}`);
    if (again !== 42) throw new Error(`6*7 = ${again} after the idle time`);
  }
  if (!hold) {
    await page.close();
    await browser.disconnect();
    return value;
  }
  await new Promise((resolve) => {
    browser.on('disconnected', resolve);
    console.log('READY');
  });
  console.log('DISCONNECTED');
  return value;
}

async function viaPlaywright(connect) {
  const browser = await connect();
  const version = browser.version();
  const context = await browser.newContext();
  const page = await context.newPage();
  const value = await page.evaluate(() => 6 * 7);
  console.log(`RESULT ${mode} ${value} ${version}`);
  await context.close();
  await browser.close();
  return value;
}

let value;
try {
  switch (mode) {
    case 'puppeteer-ws':
      value = await viaPuppeteer({ browserWSEndpoint: url });
      break;
    case 'puppeteer-url':
      value = await viaPuppeteer({ browserURL: url });
      break;
    case 'puppeteer-hold':
      value = await viaPuppeteer({ browserWSEndpoint: url }, true);
      break;
    case 'puppeteer-idle':
      if (!(idleMs > 0) && !untilFile) {
        console.error('puppeteer-idle needs --idle-ms=N or --until-file=PATH');
        process.exit(2);
      }
      value = await viaPuppeteer({ browserWSEndpoint: url });
      break;
    case 'pw-cdp':
      value = await viaPlaywright(() => chromium.connectOverCDP(url, { timeout }));
      break;
    case 'pw-connect':
      value = await viaPlaywright(() => chromium.connect(url, { timeout }));
      break;
    default:
      console.error(`unknown mode ${mode}`);
      process.exit(2);
  }
} catch (err) {
  // Puppeteer rejects a refused upgrade with the socket's error event,
  // which has a message and no stack.
  console.error(`${mode} ${url}: ${err && err.stack ? err.stack : (err && err.message) || err}`);
  process.exit(1);
}
clearTimeout(guard);
process.exit(value === 42 ? 0 : 1);

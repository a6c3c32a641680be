// A real WebDriver client against the gateway.
//
//   node webdriver.mjs <client> <url> [--bidi] [--hold] [--no-delete]
//
// clients:
//   wdio      WebdriverIO v9 remote({hostname, port, path}); BiDi only with --bidi
//             (webSocketUrl: true, WebdriverIO's own default), classic otherwise
//   selenium  selenium-webdriver 4 Builder().usingServer(url); with --bidi
//             enableBidi() and a BiDi call
//
// url is the gateway's WebDriver base, e.g. http://127.0.0.1:8080/wd/hub.
// The client creates a Chrome session (Debian's chromium, headless, a fresh
// profile), loads a data: URL and prints "SESSION <id>", "TITLE <title>",
// "RESULT <6*7>"; with --bidi also "BIDI <number of browsing contexts>",
// learnt over the session's WebSocket. With --hold it then prints READY and
// waits for a line on stdin before going on. It ends the session (DELETE)
// unless --no-delete, prints DONE and exits 0.
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import readline from 'node:readline';

const [client, url, ...flags] = process.argv.slice(2);
const bidi = flags.includes('--bidi');
const hold = flags.includes('--hold');
const noDelete = flags.includes('--no-delete');
if (!client || !url) {
  console.error('usage: node webdriver.mjs <wdio|selenium> <url> [--bidi] [--hold] [--no-delete]');
  process.exit(2);
}
const guard = setTimeout(() => {
  console.error(`${client}: gave up after 120s`);
  process.exit(1);
}, 120_000);

const chromeOptions = {
  binary: process.env.E2E_CHROMIUM || '/usr/bin/chromium',
  args: ['--headless=new', '--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    `--user-data-dir=${mkdtempSync(join(tmpdir(), 'wd-chrome-'))}`],
};
const page = 'data:text/html,<title>hello webdriver</title><p id="p">gateway</p>';

function waitForLine() {
  return new Promise((resolve) => {
    const rl = readline.createInterface({ input: process.stdin });
    rl.once('line', () => { rl.close(); resolve(); });
  });
}

async function withWdio() {
  const { remote } = await import('webdriverio');
  const u = new URL(url);
  const browser = await remote({
    hostname: u.hostname,
    port: Number(u.port),
    path: u.pathname,
    protocol: u.protocol.replace(':', ''),
    logLevel: 'error',
    connectionRetryCount: 0,
    capabilities: { browserName: 'chrome', 'goog:chromeOptions': chromeOptions, webSocketUrl: bidi },
  });
  console.log(`SESSION ${browser.sessionId}`);
  await browser.url(page);
  console.log(`TITLE ${await browser.getTitle()}`);
  console.log(`RESULT ${await browser.execute(() => 6 * 7)}`);
  if (bidi) {
    if (!browser.isBidi) throw new Error('WebdriverIO did not open the BiDi socket');
    const tree = await browser.browsingContextGetTree({});
    console.log(`BIDI ${tree.contexts.length}`);
  }
  if (hold) {
    console.log('READY');
    await waitForLine();
    console.log(`AFTER ${await browser.getTitle()}`);
  }
  if (!noDelete) await browser.deleteSession();
}

async function withSelenium() {
  const { Builder } = await import('selenium-webdriver');
  const chrome = await import('selenium-webdriver/chrome.js');
  const opts = new chrome.Options();
  opts.setChromeBinaryPath(chromeOptions.binary);
  opts.addArguments(...chromeOptions.args);
  if (bidi) opts.enableBidi();
  const driver = await new Builder().usingServer(url).forBrowser('chrome').setChromeOptions(opts).build();
  const session = await driver.getSession();
  console.log(`SESSION ${session.getId()}`);
  await driver.get(page);
  console.log(`TITLE ${await driver.getTitle()}`);
  console.log(`RESULT ${await driver.executeScript('return 6 * 7')}`);
  if (bidi) {
    const { default: BrowsingContext } = await import('selenium-webdriver/bidi/browsingContext.js');
    const ctx = await BrowsingContext(driver, { browsingContextId: await driver.getWindowHandle() });
    const tree = await ctx.getTree();
    console.log(`BIDI ${Array.isArray(tree) ? tree.length : 1}`);
  }
  if (hold) {
    console.log('READY');
    await waitForLine();
    console.log(`AFTER ${await driver.getTitle()}`);
  }
  if (!noDelete) await driver.quit();
}

try {
  if (client === 'wdio') await withWdio();
  else if (client === 'selenium') await withSelenium();
  else throw new Error(`unknown client ${client}`);
  console.log('DONE');
  clearTimeout(guard);
  process.exit(0);
} catch (e) {
  console.error(`${client}: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
}

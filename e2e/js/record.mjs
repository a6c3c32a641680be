// A client's flow through a recorded (or unrecorded) session, written down
// as the client sees it.
//
//   node record.mjs <mode> <url>
//
// modes:
//   puppeteer   puppeteer.connect over a transport of its own that notes
//               every message the client sends and receives
//   pw-cdp      playwright chromium.connectOverCDP(url)
//
// The flow: a new page, three navigations (data: URLs with titles one,
// two, three), then a popup opened by the page (title popup) that draws
// for a moment (about:blank written by its opener), then both closed. It prints "TITLES <t1> <t2> <t3> <popup>"
// and, in puppeteer mode, "SENT <json>" for each command (id, method,
// sessionId) and "GOT <json>" for each message received (id or method,
// sessionId, and for Target.attachedToTarget the session and target type
// it announces). Exit 0 when every title was seen.
import puppeteer from 'puppeteer-core';
import { chromium } from 'playwright-core';
import WebSocket from 'ws';

const [mode, url] = process.argv.slice(2);
const guard = setTimeout(() => {
  console.error(`${mode}: gave up after 90s`);
  process.exit(1);
}, 90_000);

const page = (title, colour) =>
  `data:text/html,<title>${title}</title><body style="margin:0;background:${colour}"><h1 style="font-size:80px">${title}</h1></body>`;

// openPopup runs in the page: it opens a popup (a page may not open a
// data: URL) and writes it.
function openPopup() {
  const w = window.open('about:blank');
  w.document.write('<title>popup</title><body style="margin:0;background:orange"><h1 style="font-size:80px">popup</h1></body>');
  w.document.close();
}

// A transport that writes down what goes through it.
class NotingTransport {
  static async create(u) {
    const ws = new WebSocket(u, [], { perMessageDeflate: false, followRedirects: true, maxPayload: 256 * 1024 * 1024 });
    await new Promise((resolve, reject) => {
      ws.addEventListener('open', resolve, { once: true });
      ws.addEventListener('error', reject, { once: true });
    });
    return new NotingTransport(ws);
  }
  constructor(ws) {
    this.ws = ws;
    this.onmessage = null;
    this.onclose = null;
    ws.addEventListener('message', (event) => {
      const data = event.data.toString();
      note('GOT', data);
      if (this.onmessage) this.onmessage.call(null, data);
    });
    ws.addEventListener('close', () => {
      if (this.onclose) this.onclose.call(null);
    });
    ws.addEventListener('error', () => {});
  }
  send(message) {
    note('SENT', message);
    this.ws.send(message);
  }
  close() {
    this.ws.close();
  }
}

function note(dir, raw) {
  let m;
  try {
    m = JSON.parse(raw);
  } catch {
    console.log(`${dir} ${JSON.stringify({ unparsed: raw.length })}`);
    return;
  }
  const o = { sessionId: m.sessionId || '' };
  if (m.id !== undefined) o.id = m.id;
  if (m.method) o.method = m.method;
  if (m.error) o.error = true;
  if (m.method === 'Target.attachedToTarget' || m.method === 'Target.detachedFromTarget') {
    o.announces = m.params.sessionId;
    if (m.params.targetInfo) o.type = m.params.targetInfo.type;
  }
  console.log(`${dir} ${JSON.stringify(o)}`);
}

const pause = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function viaPuppeteer() {
  const transport = await NotingTransport.create(url);
  const browser = await puppeteer.connect({ transport, protocolTimeout: 30_000 });
  const p = await browser.newPage();
  await p.setViewport({ width: 640, height: 400 });
  const titles = [];
  for (const [t, c] of [['one', 'red'], ['two', 'green'], ['three', 'blue']]) {
    await p.goto(page(t, c));
    titles.push(await p.title());
    await pause(400);
  }
  const opened = new Promise((resolve) => p.once('popup', resolve));
  await p.evaluate(openPopup);
  const popup = await opened;
  await popup.waitForFunction(() => document.title === 'popup');
  titles.push(await popup.title());
  // It draws for a moment.
  await popup.evaluate(async () => {
    for (let i = 0; i < 5; i++) {
      document.body.style.background = i % 2 ? 'orange' : 'purple';
      await new Promise((r) => setTimeout(r, 150));
    }
  });
  await pause(300);
  await popup.close();
  await p.close();
  await browser.disconnect();
  return titles;
}

async function viaPlaywright() {
  const browser = await chromium.connectOverCDP(url, { timeout: 30_000 });
  const context = browser.contexts()[0] || (await browser.newContext());
  const p = await context.newPage();
  await p.setViewportSize({ width: 640, height: 400 });
  const titles = [];
  for (const [t, c] of [['one', 'red'], ['two', 'green'], ['three', 'blue']]) {
    await p.goto(page(t, c));
    titles.push(await p.title());
    await pause(400);
  }
  const [popup] = await Promise.all([p.waitForEvent('popup'), p.evaluate(openPopup)]);
  await popup.waitForFunction(() => document.title === 'popup');
  titles.push(await popup.title());
  await popup.evaluate(async () => {
    for (let i = 0; i < 5; i++) {
      document.body.style.background = i % 2 ? 'orange' : 'purple';
      await new Promise((r) => setTimeout(r, 150));
    }
  });
  await pause(300);
  await popup.close();
  await p.close();
  await browser.close();
  return titles;
}

let titles;
try {
  titles = mode === 'pw-cdp' ? await viaPlaywright() : await viaPuppeteer();
} catch (err) {
  console.error(`${mode} ${url}: ${err && err.stack ? err.stack : err}`);
  process.exit(1);
}
clearTimeout(guard);
console.log(`TITLES ${titles.join(' ')}`);
process.exit(titles.join(' ') === 'one two three popup' ? 0 : 1);

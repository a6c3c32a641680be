// Drives resumable sessions through the gateway for resume_test.go: one
// command a line on stdin, one answer line on stdout (an error is answered
// "ERROR <command> <message>"). Connections are kept under labels, so that
// a test can open a session, drop it, and take it back with another client.
//
//   connect <label> <url>
//       Puppeteer over a transport on the ws package (as the docs show),
//       which reads the gateway's Browser-Failover-Session and
//       Browser-Failover-Resume-Token headers from the 101:
//       "CONNECTED <label> <session id> <ms> <resume token or ->". A
//       refused upgrade is answered "REFUSED <label> <status> <body>".
//   connect-url <label> <url>
//       puppeteer.connect({browserWSEndpoint: url}), Puppeteer's own
//       connection: "CONNECTED <label> - <ms>".
//   connect-browserurl <label> <url>
//       puppeteer.connect({browserURL: url}): Puppeteer GETs
//       <url's path>/json/version with url's query, and connects to the
//       webSocketDebuggerUrl it is given: "CONNECTED <label> - <ms>".
//   open <label> <title>
//       A new page showing <title>, with window.x = 42: "OPENED <label> <title>".
//   check <label> <title>
//       Looks for that page among browser.pages():
//       "CHECK <label> pages=<n> found=<bool> x=<window.x>".
//   drop <label>
//       Resets the client's TCP connection (no close frame), waits until
//       Puppeteer notices: "DROPPED <label>".
//   disconnect <label>
//       browser.disconnect() (a close frame): "DISCONNECTED <label>".
//   pw <label> <url> <title>
//       Playwright chromium.connectOverCDP(url), then looks for the page in
//       browser.contexts()[*].pages():
//       "PW <label> contexts=<n> pages=<n> found=<bool> x=<window.x>".
//   pwclose <label>
//       browser.close() of that Playwright browser: "PWCLOSED <label>".
//   raw <label> <url> <title>
//       A bare CDP client on the ws package: Target.getTargets, then
//       Target.attachToTarget {flatten: true} to the page with that title,
//       and Runtime.evaluate window.x in it:
//       "RAW <label> <session id> targets=<n> found=<bool> x=<window.x>".
//   rawclose <label>
//       Closes that connection with a close frame: "RAWCLOSED <label>".
//   quit
import readline from 'node:readline';
import puppeteer from 'puppeteer-core';
import { chromium } from 'playwright-core';
import WebSocket from 'ws';

const protocolTimeout = 30_000;
const conns = new Map();

// A bounded wait: nothing here may hang the script (the Go side has its own
// limit too).
function within(ms, what, p) {
  let timer;
  return Promise.race([
    p.finally(() => clearTimeout(timer)),
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
    }),
  ]);
}

// refusal turns a refused upgrade into an error carrying its status and body.
class Refused extends Error {
  constructor(status, body) {
    super(`upgrade refused: ${status} ${body}`);
    this.status = status;
    this.body = body;
  }
}

// gatewayTransport opens url and resolves to a Puppeteer ConnectionTransport
// that keeps the gateway's session ID and its socket.
function gatewayTransport(url) {
  return new Promise((resolve, reject) => {
    const ws = new WebSocket(url, { perMessageDeflate: false, maxPayload: 256 * 1024 * 1024 });
    const t = {
      ws,
      sessionId: null,
      resumeToken: null,
      onmessage: null,
      onclose: null,
      send: (m) => ws.send(m),
      close: () => ws.close(),
    };
    ws.on('upgrade', (res) => {
      t.sessionId = res.headers['browser-failover-session'] || null;
      t.resumeToken = res.headers['browser-failover-resume-token'] || null;
    });
    ws.on('unexpected-response', (req, res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (d) => { body += d; });
      res.on('end', () => { req.destroy(); reject(new Refused(res.statusCode, body.replace(/\s+/g, ' ').trim())); });
    });
    ws.on('message', (d) => t.onmessage && t.onmessage(d.toString()));
    ws.on('close', () => t.onclose && t.onclose());
    ws.on('open', () => resolve(t));
    ws.on('error', reject);
  });
}

// cdp sends one command over a bare ws connection and waits for its answer.
function cdpClient(ws) {
  let next = 1;
  const pending = new Map();
  ws.on('message', (d) => {
    const m = JSON.parse(d.toString());
    if (m.id && pending.has(m.id)) {
      const { resolve, reject } = pending.get(m.id);
      pending.delete(m.id);
      if (m.error) reject(new Error(`${m.error.code} ${m.error.message}`));
      else resolve(m.result);
    }
  });
  return (method, params = {}, sessionId) => within(protocolTimeout, method, new Promise((resolve, reject) => {
    const id = 1_000_000 + next++;
    pending.set(id, { resolve, reject });
    const msg = { id, method, params };
    if (sessionId) msg.sessionId = sessionId;
    ws.send(JSON.stringify(msg));
  }));
}

async function findPage(pages, title) {
  for (const p of pages) {
    let tt = '';
    try {
      tt = await within(10_000, 'page title', p.title());
    } catch {
      continue;
    }
    if (tt === title) return p;
  }
  return null;
}

async function pageX(page) {
  if (!page) return 'none';
  return String(await within(protocolTimeout, 'window.x', page.evaluate(() => window.x)));
}

// rawOpen opens a bare WebSocket connection, kept under label.
async function rawOpen(label, url) {
  const ws = new WebSocket(url, { perMessageDeflate: false, maxPayload: 256 * 1024 * 1024 });
  let sessionId = null;
  ws.on('upgrade', (res) => { sessionId = res.headers['browser-failover-session'] || null; });
  await within(protocolTimeout, 'upgrade', new Promise((resolve, reject) => {
    ws.on('open', resolve);
    ws.on('error', reject);
    ws.on('unexpected-response', (req, res) => { req.destroy(); reject(new Error(`upgrade refused: ${res.statusCode}`)); });
  }));
  conns.set(label, { ws });
  return { ws, sessionId };
}

const dataPage = (title) => 'data:text/html,' + encodeURIComponent(`<title>${title}</title><p>resume</p>`);

const commands = {
  async connect(label, url) {
    const start = Date.now();
    let t;
    try {
      t = await within(protocolTimeout, 'upgrade', gatewayTransport(url));
    } catch (err) {
      if (err instanceof Refused) return `REFUSED ${label} ${err.status} ${err.body}`;
      throw err;
    }
    const browser = await within(protocolTimeout, 'puppeteer.connect', puppeteer.connect({ transport: t, protocolTimeout }));
    conns.set(label, { t, browser });
    return `CONNECTED ${label} ${t.sessionId || '-'} ${Date.now() - start} ${t.resumeToken || '-'}`;
  },
  async 'connect-url'(label, url) {
    const start = Date.now();
    const browser = await within(protocolTimeout, 'puppeteer.connect', puppeteer.connect({ browserWSEndpoint: url, protocolTimeout }));
    conns.set(label, { browser });
    return `CONNECTED ${label} - ${Date.now() - start}`;
  },
  async 'connect-browserurl'(label, url) {
    const start = Date.now();
    const browser = await within(protocolTimeout, 'puppeteer.connect', puppeteer.connect({ browserURL: url, protocolTimeout }));
    conns.set(label, { browser });
    return `CONNECTED ${label} - ${Date.now() - start}`;
  },
  async open(label, title) {
    const { browser } = conns.get(label);
    const page = await browser.newPage();
    await page.goto(dataPage(title));
    await page.evaluate(() => { window.x = 42; });
    return `OPENED ${label} ${title}`;
  },
  async check(label, title) {
    const { browser } = conns.get(label);
    const pages = await within(protocolTimeout, 'browser.pages', browser.pages());
    const page = await findPage(pages, title);
    return `CHECK ${label} pages=${pages.length} found=${!!page} x=${await pageX(page)}`;
  },
  async drop(label) {
    const { t, browser } = conns.get(label);
    const gone = new Promise((resolve) => browser.once('disconnected', resolve));
    // A reset: the gateway gets no close frame, its read fails.
    t.ws._socket.resetAndDestroy();
    await within(protocolTimeout, 'disconnected', gone);
    conns.delete(label);
    return `DROPPED ${label}`;
  },
  async disconnect(label) {
    const { browser } = conns.get(label);
    await within(protocolTimeout, 'browser.disconnect', browser.disconnect());
    conns.delete(label);
    return `DISCONNECTED ${label}`;
  },
  async pw(label, url, title) {
    const browser = await chromium.connectOverCDP(url, { timeout: protocolTimeout });
    conns.set(label, { browser });
    const contexts = browser.contexts();
    const pages = contexts.flatMap((c) => c.pages());
    const page = await findPage(pages, title);
    return `PW ${label} contexts=${contexts.length} pages=${pages.length} found=${!!page} x=${await pageX(page)}`;
  },
  async pwclose(label) {
    const { browser } = conns.get(label);
    await within(protocolTimeout, 'browser.close', browser.close());
    conns.delete(label);
    return `PWCLOSED ${label}`;
  },
  async raw(label, url, title) {
    const { ws, sessionId } = await rawOpen(label, url);
    const send = cdpClient(ws);
    const { targetInfos } = await send('Target.getTargets');
    const target = targetInfos.find((ti) => ti.type === 'page' && ti.title === title);
    let x = 'none';
    if (target) {
      const { sessionId: s } = await send('Target.attachToTarget', { targetId: target.targetId, flatten: true });
      const { result } = await send('Runtime.evaluate', { expression: 'window.x', returnByValue: true }, s);
      x = String(result.value);
    }
    return `RAW ${label} ${sessionId || '-'} targets=${targetInfos.length} found=${!!target} x=${x}`;
  },
  async rawclose(label) {
    const { ws } = conns.get(label);
    const closed = new Promise((resolve) => ws.once('close', resolve));
    ws.close(1000);
    await within(protocolTimeout, 'close', closed);
    conns.delete(label);
    return `RAWCLOSED ${label}`;
  },
};

const rl = readline.createInterface({ input: process.stdin });
for await (const line of rl) {
  const [cmd, ...args] = line.trim().split(/\s+/);
  if (!cmd) continue;
  if (cmd === 'quit') break;
  const fn = commands[cmd];
  if (!fn) {
    console.log(`ERROR ${cmd} unknown command`);
    continue;
  }
  try {
    console.log(await fn(...args));
  } catch (err) {
    console.log(`ERROR ${cmd} ${String(err && err.message ? err.message : err).replace(/\s+/g, ' ')}`);
  }
}
process.exit(0);

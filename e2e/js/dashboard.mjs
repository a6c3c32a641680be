// The dashboard page in a real headless Chromium, driven by Puppeteer:
//
//   node dashboard.mjs '<json>'
//
// with a JSON argument of:
//   authURL      the page behind basic_auth (controls off)
//   user, pass   its credentials
//   controlsURL  the page on a localhost-only site (controls on)
//   providers    every provider name the page must show
//   session      the ID of a live session the page must show
//   drain        the provider to drain from the page
//   unreleased   the provider of the session, which creates its browsers
//                over REST: its row must say one is created, not released
//                yet, while the session is live, and no more once it ended
//   warm         a provider with warm 1: its row must say its warm session
//                is ready
//   rate, rateSays  a provider with create_rate, and what its row must say
//                of its window
//   screenshot   where to save a PNG of the page
//   bodies       where to write everything the browser loaded (the page's
//                HTML and every JSON answer), for the caller's secret search
//
// It checks, and prints a line for each step:
//   1. without credentials the page is refused (401);
//   2. with them the page shows every provider and the session, no button,
//      and an action from the page is refused (403: controls off);
//   3. on the controls site the page shows the same, and the session's
//      provider's row says one session is created, not released yet,
//      the warm provider's that its warm session is ready, and the rate
//      provider's how much of its window is used;
//      "Drain" on the
//      provider (confirmed) makes status.json say it is draining and the row
//      say so; the screenshot is taken; "End" on the session (confirmed)
//      removes it from the page, and the provider's row no longer says
//      anything unreleased. At 1280 px wide no table scrolls sideways
//      and every Reset button is inside the window.
// Exit 0 when every check held; 1 otherwise, with the reason on stderr.
import puppeteer from 'puppeteer-core';
import { writeFileSync } from 'node:fs';

const cfg = JSON.parse(process.argv[2] || '{}');
for (const k of ['authURL', 'user', 'pass', 'controlsURL', 'providers', 'session', 'drain', 'unreleased', 'warm', 'rate', 'rateSays', 'screenshot', 'bodies']) {
  if (cfg[k] === undefined) {
    console.error(`usage: node dashboard.mjs '<json>' (missing ${k})`);
    process.exit(2);
  }
}
// Generous: the machine may be busy; nothing here waits on a timer.
const timeout = 45_000;
const t0 = Date.now();
const el = () => `[${((Date.now() - t0) / 1000).toFixed(1)}s]`;
const guard = setTimeout(() => {
  console.error('dashboard: gave up after 90s');
  process.exit(1);
}, 90_000);

const loaded = []; // [url, status, body] of everything the pages loaded
const pending = [];
const tags = [];
const dialogs = [];
const external = [];

function watch(page, origin) {
  page.on('request', (req) => {
    const u = req.url();
    if (!u.startsWith(origin) && !u.startsWith('data:')) external.push(u);
  });
  page.on('response', (resp) => {
    const tag = { url: resp.url(), done: false };
    const pr = resp.text().finally(() => { tag.done = true; });
    tags.push(tag);
    pending.push(pr.then(
      (body) => loaded.push([resp.url(), resp.status(), body]),
      () => loaded.push([resp.url(), resp.status(), ''])));
  });
  page.on('dialog', async (d) => {
    dialogs.push(d.message());
    console.log(`DIALOG ${d.message()}`);
    await d.accept();
  });
  page.on('pageerror', (err) => {
    console.error(`page error: ${err}`);
    process.exitCode = 1;
  });
  page.on('console', (m) => {
    // A refused action is logged by Chromium as a failed load: expected
    // where the script provokes one. Anything else (a blocked script, a
    // policy violation) is a failure.
    if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) {
      console.error(`page console error: ${m.text()}`);
      process.exitCode = 1;
    }
  });
}

// settle waits until every answer seen so far has been read, so that the
// caller's secret search covers it; one not read within 10 s fails.
async function settle() {
  const all = pending.splice(0);
  const late = new Promise((r) => setTimeout(r, 10_000, 'late'));
  if (await Promise.race([Promise.all(all), late]) === 'late') {
    throw new Error(`answers not read within 10s: ${tags.filter((t) => !t.done).map((t) => t.url).join(', ')}`);
  }
}

// shows waits until the page lists every provider and the session.
async function shows(page) {
  for (const name of cfg.providers) {
    await page.waitForSelector(`tr[data-provider=${JSON.stringify(name)}]`, { timeout });
  }
  await page.waitForSelector(`tr[data-session=${JSON.stringify(cfg.session)}]`, { timeout });
}

// subSays waits until the row of provider name has a line of class cls
// that says want.
const subSays = (page, name, cls, want) => page.waitForFunction((name, cls, want) => {
  const s = document.querySelector(`tr[data-provider=${JSON.stringify(name)}] .${cls}`);
  return !!s && s.textContent === want;
}, { timeout }, name, cls, want);

// unreleasedSays waits until the row of provider name says want of the
// sessions it created and did not release yet ('' when it says nothing).
const unreleasedSays = (page, name, want) => page.waitForFunction((name, want) => {
  const s = document.querySelector(`tr[data-provider=${JSON.stringify(name)}] .unreleased`);
  return (s ? s.textContent : '') === want;
}, { timeout }, name, want);

const browser = await puppeteer.launch({
  executablePath: process.env.E2E_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--disable-dev-shm-usage'],
  defaultViewport: { width: 1440, height: 900 },
});
try {
  // 1 and 2: behind basic_auth, controls off.
  {
    const page = await browser.newPage();
    watch(page, new URL(cfg.authURL).origin);
    // (Chromium itself would stop at the 401 with an error page.)
    for (const p of ['', 'status.json', 'sessions.json']) {
      const refused = await fetch(cfg.authURL + p);
      if (refused.status !== 401) throw new Error(`${p || 'the page'} without credentials: HTTP ${refused.status}, want 401`);
    }
    console.log(`${el()} STEP refused without credentials`);
    await page.authenticate({ username: cfg.user, password: cfg.pass });
    const ok = await page.goto(cfg.authURL, { timeout, waitUntil: 'domcontentloaded' });
    if (ok.status() !== 200) throw new Error(`with credentials: HTTP ${ok.status()}`);
    await shows(page);
    const buttons = await page.$$eval('button[data-action]', (bs) => bs.filter((b) => b.offsetParent !== null).length);
    if (buttons !== 0) throw new Error(`${buttons} action buttons with controls off`);
    const badge = await page.$eval('#controls', (e) => e.textContent);
    if (badge !== 'off') throw new Error(`controls badge says ${badge}`);
    // The page's own fetch, as a button would send it: refused.
    const status = await page.evaluate(async (name) => {
      const r = await fetch(`providers/${encodeURIComponent(name)}/drain`, { method: 'POST', headers: { 'X-Browser-Failover-Dashboard': '1' } });
      await r.text();
      return r.status;
    }, cfg.drain);
    if (status !== 403) throw new Error(`an action with controls off: HTTP ${status}, want 403`);
    console.log(`${el()} STEP basic_auth page shows every provider and the session, no controls`);
    await settle();
    await page.close();
  }

  // 3: the localhost-only site, controls on, under a stripped prefix.
  const page = await browser.newPage();
  watch(page, new URL(cfg.controlsURL).origin);
  const resp = await page.goto(cfg.controlsURL, { timeout, waitUntil: 'domcontentloaded' });
  if (resp.status() !== 200) throw new Error(`controls page: HTTP ${resp.status()}`);
  await shows(page);
  await unreleasedSays(page, cfg.unreleased, '1 created, not released yet');
  console.log(`${el()} STEP controls page shows every provider and the session, and its provider's unreleased session`);
  await subSays(page, cfg.warm, 'warm', '1 of 1 warm ready');
  await subSays(page, cfg.rate, 'rate', cfg.rateSays);
  console.log(`${el()} STEP controls page shows the warm session and the creation rate`);

  const drained = page.waitForResponse(async (r) => {
    if (!r.url().endsWith('/status.json')) return false;
    const st = await r.json().catch(() => null);
    return !!st && st.providers.some((p) => p.name === cfg.drain && p.draining === true);
  }, { timeout });
  await page.click(`tr[data-provider=${JSON.stringify(cfg.drain)}] button[data-action="drain"]`);
  await drained;
  await page.waitForFunction((name) => {
    const b = document.querySelector(`tr[data-provider=${JSON.stringify(name)}] .badge`);
    return b && b.textContent === 'draining';
  }, { timeout }, cfg.drain);
  if (!dialogs.some((d) => d.includes(cfg.drain))) throw new Error('drain did not ask for confirmation');
  console.log(`${el()} STEP drained ${cfg.drain}: status.json says draining`);

  // At 1280 px wide no table scrolls sideways, the page does not, and
  // every Reset button is inside the window.
  await page.setViewport({ width: 1280, height: 900 });
  await page.waitForFunction(() => window.innerWidth === 1280, { timeout });
  const fit = await page.evaluate(() => {
    const out = [];
    for (const s of document.querySelectorAll('main > section')) {
      if (s.offsetParent !== null && s.scrollWidth > s.clientWidth) out.push(`section "${s.querySelector('h2').textContent}" is ${s.scrollWidth} px wide in ${s.clientWidth}`);
    }
    if (document.documentElement.scrollWidth > window.innerWidth) out.push(`the page is ${document.documentElement.scrollWidth} px wide`);
    const resets = Array.from(document.querySelectorAll('button[data-action="reset"]'));
    for (const b of resets) {
      const r = b.getBoundingClientRect();
      if (r.right > window.innerWidth) out.push(`a Reset button ends at ${r.right} px`);
    }
    return { out, resets: resets.length };
  });
  if (fit.resets !== cfg.providers.length || fit.out.length) throw new Error(`at 1280 px (${fit.resets} Reset buttons): ${fit.out.join('; ')}`);
  await page.setViewport({ width: 1440, height: 900 });
  console.log(`${el()} STEP at 1280 px every table fits and the ${fit.resets} Reset buttons are in the window`);

  // Let a countdown tick once, then take the picture.
  await new Promise((r) => setTimeout(r, 1200));
  await page.screenshot({ path: cfg.screenshot, fullPage: true });
  console.log(`${el()} STEP screenshot ${cfg.screenshot}`);

  const before = dialogs.length;
  await page.click(`tr[data-session=${JSON.stringify(cfg.session)}] button[data-action="end"]`);
  await page.waitForFunction((id) => !document.querySelector(`tr[data-session=${JSON.stringify(id)}]`), { timeout }, cfg.session);
  if (dialogs.length !== before + 1 || !dialogs[dialogs.length - 1].includes(cfg.session)) {
    throw new Error('ending the session did not ask for confirmation');
  }
  await unreleasedSays(page, cfg.unreleased, '');
  console.log(`${el()} STEP ended ${cfg.session} from the page; its provider released it`);
  const banner = await page.$eval('#banner', (e) => e.textContent);
  if (banner) throw new Error(`the page shows an error: ${banner}`);
  await settle();
  await page.close();

  if (external.length) throw new Error(`the page loaded from elsewhere: ${external.join(', ')}`);
  writeFileSync(cfg.bodies, loaded.map(([u, s, b]) => `=== ${s} ${u}\n${b}\n`).join(''));
  console.log(`${el()} STEP ${loaded.length} answers written`);
} catch (err) {
  console.error(`dashboard: ${err && err.stack ? err.stack : err}`);
  process.exitCode = 1;
} finally {
  await browser.close().catch(() => {});
  clearTimeout(guard);
}
process.exit(process.exitCode || 0);

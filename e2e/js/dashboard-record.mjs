// The dashboard's live view and recordings in a real headless Chromium,
// driven by Playwright, while a Puppeteer client's session through the
// gateway is recorded:
//
//   node dashboard-record.mjs '<json>'
//
// with a JSON argument of:
//   gateway      the gateway's WebSocket URL (every CDP session recorded)
//   controlsURL  the dashboard with controls on
//   readonlyURL  the dashboard with controls off
//   shots        a folder for screenshots (for people to look at)
//
// It checks, and prints a line for each step:
//   1. the client's page (red) is in the sessions table with a Watch link;
//      the live view shows it; the client navigates (blue) and the live
//      view's image changes to it; the client opens a popup (orange) and
//      the live view shows a second page with it;
//   2. at 1280 px wide no table of the page scrolls sideways, the page
//      does not, and every button is inside the window;
//   3. the client leaves: the Recordings list shows the recording, ended;
//      its player lays the timeline out from the meta, scrubs to the end
//      (the page's last frame: blue) and to the start (its first frame),
//      plays (the frame moves on), pauses (the position stays), switches
//      to the popup (orange); its MP4 link serves a video; the gateway's
//      own URL (the client's) serves nothing of it;
//   4. the dashboard with controls off lists it with no Delete button, and
//      refuses a deletion (403);
//   5. Delete on the controls dashboard (confirmed) deletes it: the row
//      goes, its meta answers 404.
// It prints "RECORDING <id>". Exit 0 when every check held; 1 otherwise,
// with the reason on stderr.
import { chromium } from 'playwright-core';
import puppeteer from 'puppeteer-core';

const cfg = JSON.parse(process.argv[2] || '{}');
for (const k of ['gateway', 'controlsURL', 'readonlyURL', 'shots']) {
  if (cfg[k] === undefined) {
    console.error(`usage: node dashboard-record.mjs '<json>' (missing ${k})`);
    process.exit(2);
  }
}
// Generous: the machine may be busy; nothing here waits on a timer.
const timeout = 45_000;
const t0 = Date.now();
const el = () => `[${((Date.now() - t0) / 1000).toFixed(1)}s]`;
const guard = setTimeout(() => {
  console.error('dashboard-record: gave up after 140s');
  process.exit(1);
}, 140_000);

const doc = (title, colour) =>
  `data:text/html,<title>${title}</title><body style="margin:0;height:100vh;background:${colour}"><h1>${title}</h1></body>`;

// openPopup runs in the client's page: it opens a popup and writes it.
function openPopup() {
  const w = window.open('about:blank');
  w.document.write('<title>popup</title><body style="margin:0;height:100vh;background:orange"><h1>popup</h1></body>');
  w.document.close();
}

// colourOf runs in the dashboard: the colour of the image sel shows,
// low in the middle (the page's background), or null before it loaded.
function colourOf(sel) {
  const img = document.querySelector(sel);
  if (!img || !img.complete || !img.naturalWidth) return null;
  const c = document.createElement('canvas');
  c.width = img.naturalWidth;
  c.height = img.naturalHeight;
  const g = c.getContext('2d');
  g.drawImage(img, 0, 0);
  const d = g.getImageData(Math.floor(c.width / 2), Math.floor(c.height * 0.8), 1, 1).data;
  const [r, gr, b] = d;
  if (r > 150 && gr < 90 && b < 90) return 'red';
  if (b > 130 && r < 90 && gr < 90) return 'blue';
  if (r > 200 && gr > 120 && gr < 200 && b < 90) return 'orange';
  if (r > 230 && gr > 230 && b > 230) return 'white';
  return `rgb(${r},${gr},${b})`;
}

// showsColour waits until the image sel shows colour (asking every
// 100 ms; the page's policy allows no code made from strings).
async function showsColour(page, sel, colour) {
  const end = Date.now() + timeout;
  let now;
  for (;;) {
    now = await page.evaluate(colourOf, sel);
    if (now === colour) return;
    if (Date.now() > end) throw new Error(`${sel} does not show ${colour} within ${timeout} ms (it shows ${now})`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// fits checks that no table of page scrolls sideways, the page does not,
// and every visible button is inside the window.
async function fits(page, what) {
  const r = await page.evaluate(() => {
    const out = [];
    for (const s of document.querySelectorAll('main > section')) {
      if (s.offsetParent === null) continue;
      if (s.scrollWidth > s.clientWidth) out.push(`section "${s.querySelector('h2').textContent}" is ${s.scrollWidth} px wide in ${s.clientWidth}`);
    }
    const de = document.documentElement;
    if (de.scrollWidth > window.innerWidth) out.push(`the page is ${de.scrollWidth} px wide in a ${window.innerWidth} px window`);
    let buttons = 0;
    for (const b of document.querySelectorAll('button, a.watch, a.play')) {
      if (b.offsetParent === null) continue;
      buttons++;
      const box = b.getBoundingClientRect();
      if (box.left < 0 || box.right > window.innerWidth) out.push(`"${b.textContent}" at ${box.left}..${box.right}`);
    }
    return { problems: out, buttons, width: window.innerWidth };
  });
  if (r.width !== 1280) throw new Error(`the window is ${r.width} px wide`);
  if (r.problems.length) throw new Error(`at 1280 px (${what}): ${r.problems.join('; ')}`);
  return r.buttons;
}

const launch = {
  executablePath: process.env.E2E_CHROMIUM || '/usr/bin/chromium',
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
    '--disable-background-networking', '--disable-component-update', '--disable-sync',
    '--disable-dev-shm-usage'],
};
const browser = await chromium.launch(launch);
let client;
try {
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 800 } });
  const dialogs = [];
  const external = [];
  const watchPage = (page) => {
    const origin = new URL(cfg.controlsURL).origin;
    page.on('request', (req) => {
      const u = req.url();
      if (!u.startsWith(new URL(cfg.controlsURL).origin) && !u.startsWith(new URL(cfg.readonlyURL).origin) && !u.startsWith('data:')) external.push(u);
    });
    page.on('dialog', async (d) => {
      dialogs.push(d.message());
      await d.accept();
    });
    page.on('pageerror', (err) => {
      console.error(`page error: ${err}`);
      process.exitCode = 1;
    });
    page.on('console', (m) => {
      if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) {
        console.error(`page console error: ${m.text()}`);
        process.exitCode = 1;
      }
    });
    return origin;
  };

  // 1: a recorded live session, watched.
  client = await puppeteer.connect({ browserWSEndpoint: cfg.gateway, defaultViewport: { width: 800, height: 600 }, protocolTimeout: timeout });
  const cpage = await client.newPage();
  await cpage.goto(doc('one', 'red'), { timeout });
  console.log(`${el()} STEP the client shows a red page`);

  const page = await ctx.newPage();
  watchPage(page);
  const resp = await page.goto(cfg.controlsURL, { timeout, waitUntil: 'domcontentloaded' });
  if (resp.status() !== 200) throw new Error(`controls page: HTTP ${resp.status()}`);
  const watch = page.locator('#sessions a.watch');
  await watch.waitFor({ timeout });
  const id = await watch.getAttribute('data-watch');
  console.log(`RECORDING ${id}`);
  await page.waitForSelector(`tr[data-recording="${id}"]`, { timeout });
  const buttons = await fits(page, 'a recorded live session');
  await page.screenshot({ path: `${cfg.shots}/main-live.png`, fullPage: true });
  console.log(`${el()} STEP the sessions table has a Watch link; everything fits at 1280 px (${buttons} buttons and links)`);

  await watch.click();
  await page.waitForFunction((id) => location.hash === '#watch/' + id, id, { timeout });
  // The client's page and its popup, by what they show (the browser's
  // first blank page is followed too; a page's title may lag its frames).
  const showing = async (colour) => {
    const end = Date.now() + timeout;
    for (;;) {
      const n = await page.$$eval('#watch-targets [data-target]', (cs) => cs.map((c) => c.dataset.target));
      for (const t of n) {
        const sel = `#watch-targets [data-target="${t}"] img`;
        if (await page.evaluate(colourOf, sel) === colour) return sel;
      }
      if (Date.now() > end) {
        const live = await page.evaluate(async (u) => (await fetch(u)).text(), cfg.controlsURL + 'live.json');
        const seen = await page.$$eval('#watch-targets [data-target] img', (is) => is.map((i) => `${i.getAttribute('src')} n=${i.dataset.n}`));
        throw new Error(`no page of the live view shows ${colour} within ${timeout} ms; live.json ${live}; images ${seen.join(', ')}`);
      }
      await new Promise((r) => setTimeout(r, 100));
    }
  };
  const shot = await showing('red');
  console.log(`${el()} STEP the live view shows the red page`);
  const n0 = Number(await page.getAttribute(shot, 'data-n'));
  await cpage.goto(doc('two', 'blue'), { timeout });
  await showsColour(page, shot, 'blue');
  const n1 = Number(await page.getAttribute(shot, 'data-n'));
  if (!(n1 > n0)) throw new Error(`the live frame's number went from ${n0} to ${n1}`);
  console.log(`${el()} STEP the client navigated: the live view shows the blue page (frame ${n0} then ${n1})`);
  await cpage.evaluate(openPopup);
  const popupShot = await showing('orange');
  if (popupShot === shot) throw new Error('the popup shows in the page\'s place');
  await showsColour(page, shot, 'blue');
  await page.screenshot({ path: `${cfg.shots}/watch.png`, fullPage: true });
  console.log(`${el()} STEP the popup: the live view shows a second page, orange`);

  // 3: the client leaves; the recording is listed and plays.
  await client.disconnect();
  client = null;
  await page.click('#view-close');
  await page.waitForFunction((id) => {
    const a = document.querySelector(`tr[data-recording="${id}"] a.play`);
    return !document.querySelector('#sessions a.watch') && a && a.textContent === 'Play';
  }, id, { timeout });
  const row = await page.$$eval(`tr[data-recording="${id}"] td`, (tds) => tds.map((td) => td.textContent));
  if (row[0] !== id || !(Number(row[4]) >= 2) || !(Number(row[5]) > 2) || row[7] !== 'whole session') {
    throw new Error(`the recording's row: ${JSON.stringify(row)}`);
  }
  await fits(page, 'a stored recording');
  await page.screenshot({ path: `${cfg.shots}/main-recorded.png`, fullPage: true });
  console.log(`${el()} STEP the Recordings list shows it, ended: ${JSON.stringify(row)}`);

  await page.click(`tr[data-recording="${id}"] a.play`);
  await page.waitForFunction(() => Number(document.getElementById('scrub').max) > 0 && document.querySelectorAll('#target option').length >= 2, null, { timeout });
  const meta = await page.evaluate(async (id) => (await fetch('recordings/' + id)).json(), id);
  // The client's page by its URL; the popup is the page drawn last
  // besides it (a title may lag its page's frames).
  const pageT = meta.targets.find((t) => t.url.includes('<title>two') || t.url.includes('%3Ctitle%3Etwo'));
  const popupT = meta.targets.filter((t) => t !== pageT && t.frames.length > 0).sort((a, b) => b.frames[0] - a.frames[0])[0];
  if (!pageT || !popupT || pageT.frames.length === 0) throw new Error(`the meta's pages: ${JSON.stringify(meta.targets.map((t) => [t.url, t.title, t.frames.length]))}`);
  const drawn = meta.targets.filter((t) => t.frames.length > 0);
  const first = Math.min(...drawn.map((t) => t.frames[0]));
  const last = Math.max(...drawn.map((t) => t.frames[t.frames.length - 1]));
  const max = Number(await page.getAttribute('#scrub', 'max'));
  if (max !== last - first) throw new Error(`the timeline is ${max} ms, the frames' times span ${last - first}`);
  const scrub = async (v) => {
    await page.$eval('#scrub', (s, v) => { s.value = String(v); s.dispatchEvent(new Event('input', { bubbles: true })); }, v);
  };
  const shown = () => page.$eval('#player-img', (i) => [Number(i.dataset.target), Number(i.dataset.frame)]);
  await page.selectOption('#target', String(pageT.index));
  await scrub(max);
  await showsColour(page, '#player-img', 'blue');
  let [tg, fr] = await shown();
  if (tg !== pageT.index || fr !== pageT.frames.length - 1) throw new Error(`at the end: target ${tg} frame ${fr}`);
  await scrub(0);
  await page.waitForFunction(() => document.getElementById('player-img').dataset.frame === '0', null, { timeout });
  await page.waitForFunction(() => { const i = document.getElementById('player-img'); return i.complete && i.naturalWidth > 0; }, null, { timeout });
  console.log(`${el()} STEP the player scrubs: the end shows the page's last frame (blue), the start its first`);

  await page.click('#play');
  await page.waitForFunction(() => document.getElementById('player').dataset.state === 'playing', null, { timeout });
  await page.waitForFunction(() => Number(document.getElementById('player-img').dataset.frame) > 0 && Number(document.getElementById('scrub').value) > 0, null, { timeout });
  await page.click('#pause');
  await page.waitForFunction(() => document.getElementById('player').dataset.state === 'paused', null, { timeout });
  const at = await page.$eval('#scrub', (s) => s.value);
  await page.waitForTimeout(1500);
  const still = await page.$eval('#scrub', (s) => s.value);
  if (at !== still) throw new Error(`paused at ${at}, then at ${still}`);
  console.log(`${el()} STEP the player plays (the frame moves on) and pauses (it stays at ${at} ms)`);

  await page.selectOption('#target', String(popupT.index));
  await scrub(max);
  await showsColour(page, '#player-img', 'orange');
  [tg, fr] = await shown();
  if (tg !== popupT.index) throw new Error(`after switching: target ${tg}`);
  await page.screenshot({ path: `${cfg.shots}/player.png`, fullPage: true });
  await fits(page, 'the player');
  console.log(`${el()} STEP the player switches to the popup (orange)`);

  const video = await page.evaluate(async () => {
    const r = await fetch(document.getElementById('video').href);
    const b = await r.arrayBuffer();
    return [r.status, r.headers.get('content-type'), b.byteLength, String.fromCharCode(...new Uint8Array(b.slice(4, 8)))];
  });
  if (video[0] !== 200 || video[1] !== 'video/mp4' || video[2] < 1000 || video[3] !== 'ftyp') throw new Error(`the MP4 link: ${JSON.stringify(video)}`);
  console.log(`${el()} STEP the MP4 link serves ${video[2]} bytes of video/mp4`);
  // Nothing of it on the client's URL.
  {
    const gw = cfg.gateway.replace(/^ws/, 'http');
    const seen = [];
    for (const p of ['recordings.json', 'live.json', `recordings/${id}`, `recordings/${id}/targets/${pageT.index}/frames/0`,
      `browser_failover/recordings/${id}`, `browser_failover/recordings/${id}/targets/${pageT.index}/frames/0`]) {
      const r = await fetch(gw + p);
      const b = Buffer.from(await r.arrayBuffer());
      seen.push(`${p}: ${r.status}`);
      if (r.status === 200 || (b[0] === 0xff && b[1] === 0xd8) || b.includes('"targets"') || b.includes('<title>two')) {
        throw new Error(`the client's URL serves ${p}: ${r.status} ${b.subarray(0, 200)}`);
      }
    }
    console.log(`${el()} STEP the client's URL serves nothing of it (${seen.join(', ')})`);
  }
  await page.click('#view-close');

  // 4: controls off.
  {
    const ro = await ctx.newPage();
    watchPage(ro);
    await ro.goto(cfg.readonlyURL, { timeout, waitUntil: 'domcontentloaded' });
    await ro.waitForSelector(`tr[data-recording="${id}"] a.play`, { timeout });
    const dels = await ro.$$eval('button[data-action="delete"]', (bs) => bs.length);
    if (dels !== 0) throw new Error(`${dels} Delete buttons with controls off`);
    const status = await ro.evaluate(async (id) => {
      const r = await fetch(`recordings/${id}/delete`, { method: 'POST', headers: { 'X-Browser-Failover-Dashboard': '1' } });
      return [r.status, await r.text()];
    }, id);
    if (status[0] !== 403) throw new Error(`a deletion with controls off: ${status}`);
    await fits(ro, 'controls off');
    await ro.close();
    console.log(`${el()} STEP controls off: no Delete button, a deletion refused (403)`);
  }

  // 5: Delete, confirmed.
  const before = dialogs.length;
  await page.click(`tr[data-recording="${id}"] button[data-action="delete"]`);
  await page.waitForSelector(`tr[data-recording="${id}"]`, { state: 'detached', timeout });
  if (dialogs.length !== before + 1 || !dialogs[before].includes(id)) throw new Error('the deletion did not ask for confirmation');
  const gone = await page.evaluate(async (id) => (await fetch('recordings/' + id)).status, id);
  if (gone !== 404) throw new Error(`the deleted recording's meta: HTTP ${gone}`);
  const banner = await page.$eval('#banner', (e) => e.textContent);
  if (banner) throw new Error(`the page shows an error: ${banner}`);
  console.log(`${el()} STEP Delete deleted it`);
  if (external.length) throw new Error(`the page loaded from elsewhere: ${external.join(', ')}`);
} catch (err) {
  console.error(`dashboard-record: ${err && err.stack ? err.stack : err}`);
  process.exitCode = 1;
} finally {
  if (client) await client.disconnect().catch(() => {});
  await browser.close().catch(() => {});
  clearTimeout(guard);
}
process.exit(process.exitCode || 0);

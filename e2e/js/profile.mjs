// A client with a browser profile: it logs in at a site, or looks whether
// it is still logged in there, then disconnects.
//
//   node profile.mjs <mode> <gateway url> <site> <login|check>
//
// modes:
//   puppeteer   puppeteer.connect({browserWSEndpoint: url})
//   pw-cdp      playwright chromium.connectOverCDP(url), in its default
//               context
//
// login opens <site>/login (the site sets an HttpOnly session cookie and
// the page a localStorage token); check opens <site>/whoami. Either
// prints "SITE <what the site says of the cookie it got>" and
// "TOKEN <the page's localStorage token, or none>", then disconnects
// (Puppeteer's disconnect, Playwright's close of a CDP connection: the
// browser stays).
import puppeteer from 'puppeteer-core';
import { chromium } from 'playwright-core';

const [mode, url, site, action] = process.argv.slice(2);
if (!mode || !url || !site || !action) {
  console.error('usage: node profile.mjs <mode> <url> <site> <login|check>');
  process.exit(2);
}
const guard = setTimeout(() => {
  console.error(`${mode}: gave up after 60s`);
  process.exit(1);
}, 60_000);

const path = action === 'login' ? '/login' : '/whoami';

async function visit(page) {
  await page.goto(site + path, { waitUntil: 'load' });
  const said = await page.evaluate(() => document.body.innerText.trim());
  const token = await page.evaluate(() => localStorage.getItem('token') || 'none');
  console.log(`SITE ${said}`);
  console.log(`TOKEN ${token}`);
}

try {
  if (mode === 'puppeteer') {
    const browser = await puppeteer.connect({ browserWSEndpoint: url, protocolTimeout: 30_000 });
    const page = await browser.newPage();
    await visit(page);
    await page.close();
    await browser.disconnect();
  } else if (mode === 'pw-cdp') {
    const browser = await chromium.connectOverCDP(url, { timeout: 30_000 });
    const context = browser.contexts()[0];
    const page = await context.newPage();
    await visit(page);
    await page.close();
    await browser.close();
  } else {
    console.error(`unknown mode ${mode}`);
    process.exit(2);
  }
  clearTimeout(guard);
} catch (e) {
  console.error(`${mode}: ${e && e.stack ? e.stack : e}`);
  process.exit(1);
}

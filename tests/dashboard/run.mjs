// tests/dashboard/run.mjs -- drives Debian's Chromium for tests/test_dashboard.py.
//
//   node tests/dashboard/run.mjs --base http://127.0.0.1:PORT --profile DIR
//
// Starts headless Chromium (CHROMIUM, default /usr/bin/chromium) through
// playwright-core with a fresh profile in DIR, then answers commands, one JSON
// object a line on stdin, with one JSON object a line on stdout:
//
//   {"cmd":"open","path":"/dashboard/"}        load the page
//   {"cmd":"snapshot"}                          what the page shows (DOM)
//   {"cmd":"buy","user":"7","voucher":"1"}     fill the buy form, submit, wait
//                                               for the answer it shows
//   {"cmd":"screenshot","path":"/x.png"}       full-page PNG
//   {"cmd":"close"}                             close the browser and exit
//
// Every answer has "ok" (and "error" when false) and "problems": console
// errors, page errors, failed requests and any request to a host other than
// --base (those are blocked: the page must work with no internet). Each
// command is bounded by its own timeout; the whole run by --max-seconds.

import { chromium } from "playwright-core";
import { createInterface } from "node:readline";
import { mkdirSync } from "node:fs";

function arg(name, dflt) {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 && i + 1 < process.argv.length ? process.argv[i + 1] : dflt;
}

const BASE = (arg("base", "") || "").replace(/\/$/, "");
const PROFILE = arg("profile", "");
const MAX_SECONDS = Number(arg("max-seconds", "120"));
const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
const origin = BASE ? new URL(BASE).origin : "";

if (!BASE || !PROFILE) {
  process.stderr.write("usage: run.mjs --base URL --profile DIR [--max-seconds N]\n");
  process.exit(2);
}

const problems = [];
function problem(kind, text) {
  if (problems.length < 200) problems.push(`${kind}: ${text}`);
}

function send(obj) {
  process.stdout.write(JSON.stringify({ ...obj, problems }) + "\n");
}

// The whole run is bounded: a hung browser must not hang the test.
const killer = setTimeout(() => {
  process.stderr.write(`run.mjs: still running after ${MAX_SECONDS}s: exiting\n`);
  process.exit(3);
}, MAX_SECONDS * 1000);
killer.unref();

mkdirSync(PROFILE, { recursive: true });
let context;
try {
  context = await chromium.launchPersistentContext(PROFILE, {
    executablePath: CHROMIUM,
    headless: true,
    timeout: 30000,
    viewport: { width: 1440, height: 900 },
    deviceScaleFactor: 1,
    locale: "en-US",
    timezoneId: "UTC",
    args: [
      "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
      "--disable-background-networking", "--disable-component-update", "--disable-sync",
      "--disable-dev-shm-usage",
    ],
  });
} catch (e) {
  send({ ok: false, error: `could not start ${CHROMIUM}: ${e.message}` });
  process.exit(1);
}

// No request may leave the base origin.
await context.route("**/*", (route) => {
  const url = route.request().url();
  if (url.startsWith(origin + "/") || url === origin || url.startsWith("data:") || url.startsWith("blob:")) {
    return route.continue();
  }
  problem("external request blocked", url);
  return route.abort("blockedbyclient");
});

const page = context.pages()[0] || (await context.newPage());
page.setDefaultTimeout(15000);
page.on("console", (msg) => {
  if (msg.type() !== "error") return;
  // Chromium logs every non-2xx answer of fetch(); a 4xx of the seckill
  // endpoint is an answer the page shows, not a fault.
  const url = (msg.location() || {}).url || "";
  if (/^Failed to load resource: the server responded with a status of 4\d\d/.test(msg.text())
      && /\/voucher\/[^/]+\/seckill$/.test(url)) return;
  problem("console error", `${msg.text()}${url ? ` (${url})` : ""}`);
});
page.on("pageerror", (err) => problem("page error", err.message));
page.on("requestfailed", (req) => {
  const f = req.failure();
  // A poll cut short by navigation or the page's own abort is not a fault.
  if (f && /ERR_ABORTED/.test(f.errorText) && req.url().endsWith("/stats")) return;
  problem("request failed", `${req.method()} ${req.url()}: ${f ? f.errorText : "?"}`);
});
page.on("response", (resp) => {
  if (resp.status() >= 500) problem("server error", `${resp.status()} ${resp.request().method()} ${resp.url()}`);
});

// Everything a test asserts on, read from the DOM as a person would see it.
async function snapshot() {
  return page.evaluate(() => {
    const txt = (root, sel) => {
      const n = root.querySelector(sel);
      return n ? n.textContent.trim() : null;
    };
    const tiles = {};
    for (const id of ["inv-all", "inv-oversold", "inv-duplicates", "inv-drift"]) {
      const t = document.getElementById(id);
      tiles[id] = t ? { state: t.dataset.state, value: txt(t, ".value"), note: txt(t, ".note") } : null;
    }
    const vouchers = {};
    for (const tr of document.querySelectorAll("#vouchers-table tbody tr[data-voucher-id]")) {
      const row = {};
      for (const td of tr.querySelectorAll("td[data-field]")) row[td.dataset.field] = td.textContent.trim();
      row.state = txt(tr, ".pill");
      vouchers[tr.dataset.voucherId] = row;
    }
    const cards = {};
    for (const c of document.querySelectorAll(".voucher-card[data-voucher-id]")) {
      const card = { state: c.dataset.state, label: txt(c, ".pill.state") };
      for (const f of c.querySelectorAll("[data-field]")) card[f.dataset.field] = f.textContent.trim();
      cards[c.dataset.voucherId] = card;
    }
    const instances = {};
    for (const tr of document.querySelectorAll("#instances-table tbody tr[data-instance]")) {
      const row = { state: txt(tr, ".pill") };
      for (const td of tr.querySelectorAll("td[data-field]")) row[td.dataset.field] = td.textContent.trim();
      instances[tr.dataset.instance] = row;
    }
    const outcomes = {};
    for (const tr of document.querySelectorAll("#rates-legend tbody tr[data-outcome]")) {
      outcomes[tr.dataset.outcome] = {
        rate: txt(tr, '[data-field="rate"]'), total: txt(tr, '[data-field="total"]'),
      };
    }
    const conn = document.getElementById("conn-status");
    const canvases = [...document.querySelectorAll("canvas")].map((c) => {
      // A drawn chart has non-blank pixels.
      const ctx = c.getContext("2d");
      let inked = 0;
      try {
        const d = ctx.getImageData(0, 0, c.width, c.height).data;
        for (let i = 3; i < d.length; i += 4 * 7) if (d[i] > 0) inked++;
      } catch (_) { inked = -1; }
      return { id: c.id || c.closest("[data-voucher-id]")?.dataset.voucherId || "", w: c.width, h: c.height, inked };
    });
    return {
      title: document.title,
      polls: Number(document.body.dataset.polls || 0),
      conn: conn ? { state: conn.dataset.state, text: conn.textContent.trim() } : null,
      strategies: txt(document, "#strategies"),
      kpis: {
        orders: txt(document, "#kpi-orders"), rejected: txt(document, "#kpi-rejected"),
        requests: txt(document, "#kpi-requests"), success: txt(document, "#kpi-success"),
      },
      tiles, vouchers, cards, instances, outcomes, canvases,
      shareSegments: [...document.querySelectorAll("#share-bar .seg:not(.idle)")].length,
      text: document.body.innerText,
    };
  });
}

async function buy(user, voucher, timeoutMs) {
  const before = Number(await page.getAttribute("#buy-result", "data-seq")) || 0;
  await page.fill("#buy-user", String(user));
  await page.fill("#buy-voucher", String(voucher));
  await page.click("#buy-submit");
  await page.waitForFunction(
    (n) => Number(document.getElementById("buy-result").dataset.seq) > n, before, { timeout: timeoutMs },
  );
  return page.evaluate(() => {
    const box = document.getElementById("buy-result");
    return {
      state: box.dataset.state, status: Number(box.dataset.status),
      badge: document.getElementById("buy-badge").textContent.trim(),
      meta: document.getElementById("buy-meta").textContent.trim(),
      body: document.getElementById("buy-body").textContent,
      history: [...document.querySelectorAll("#buy-history li")].map((li) => li.textContent.trim()),
    };
  });
}

async function handle(msg) {
  switch (msg.cmd) {
    case "open": {
      const resp = await page.goto(BASE + (msg.path || "/dashboard/"), { waitUntil: "load", timeout: msg.timeoutMs || 15000 });
      return { ok: true, status: resp ? resp.status() : 0, url: page.url(), title: await page.title() };
    }
    case "snapshot":
      return { ok: true, snapshot: await snapshot() };
    case "buy":
      return { ok: true, answer: await buy(msg.user, msg.voucher, msg.timeoutMs || 10000) };
    case "screenshot":
      await page.screenshot({ path: msg.path, fullPage: msg.fullPage !== false, timeout: msg.timeoutMs || 15000 });
      return { ok: true, path: msg.path };
    case "close":
      return { ok: true, close: true };
    default:
      return { ok: false, error: `unknown command ${JSON.stringify(msg.cmd)}` };
  }
}

send({ ok: true, ready: true, browser: context.browser()?.version() || "chromium" });

const rl = createInterface({ input: process.stdin });
for await (const line of rl) {
  if (!line.trim()) continue;
  let msg;
  try {
    msg = JSON.parse(line);
  } catch (e) {
    send({ ok: false, error: `bad JSON: ${e.message}` });
    continue;
  }
  let out;
  try {
    out = await handle(msg);
  } catch (e) {
    out = { ok: false, error: `${msg.cmd}: ${e.message.split("\n")[0]}` };
  }
  send(out);
  if (out.close) break;
}
await context.close().catch(() => {});
process.exit(0);

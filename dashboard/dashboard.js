// seckill live dashboard: polls GET /stats once a second and draws what it
// says. No framework, no build step, nothing loaded from elsewhere.
//
// Where the figures come from (see docs/operations.md, "/stats"):
//   vouchers[]             stock, orders, oversold, duplicateUsers, stockDrift
//                          per voucher, read from Postgres on every call;
//   instances[].requests   each live instance's counters (total, byStatus,
//                          byError), published to Redis once a second;
//   GET /stats/edge        nginx's own: the sold-out answers it gave without
//                          an instance (the sold-out edge), in the same shape,
//                          shown as one more row, "nginx-edge" (absent when
//                          nginx runs without the edge: then ignored).
// Rates are deltas between polls: orders/s from the vouchers' order counts,
// rejections/s by reason from the instances' (and nginx's) byError counters.

import { drawTimeChart, formatCount } from "./charts.js";

const STATS_URL = "/stats";
const EDGE_URL = "/stats/edge";
const POLL_MS = 1000;
const FETCH_TIMEOUT_MS = 2500;
const WINDOW_MS = 120 * 1000;       // what the charts show at most
const MIN_WINDOW_MS = 30 * 1000;    // and at least (right after the page loads)
const KEEP_MS = 6 * 60 * 1000;      // history kept in memory
const RATE_SPAN_MS = 3000;          // rates are averaged over this span
const SHARE_SPAN_MS = 10000;        // instance share and success ratio window
const MAX_CARDS = 4;                // voucher cards with a chart

const ORDER_COLOR = "#16a34a";
const STOCK_COLOR = "#2563eb";
const REASON_COLORS = {
  sold_out: "#f59e0b",
  already_ordered: "#8b5cf6",
  not_started: "#0ea5e9",
  ended: "#64748b",
  unavailable: "#dc2626",
  voucher_not_found: "#db2777",
  invalid_user_id: "#a16207",
  invalid_voucher_id: "#a16207",
};
const SPARE_COLORS = ["#0d9488", "#7c3aed", "#ea580c", "#4b5563", "#be123c", "#0369a1"];
const INSTANCE_COLORS = ["#6366f1", "#0d9488", "#ea580c", "#db2777", "#0ea5e9", "#a16207", "#7c3aed", "#475569"];

const $ = (sel) => document.querySelector(sel);

// ------------------------------------------------------------------ state

const state = {
  polls: 0,
  failures: 0,
  lastOk: 0,
  // per instance key (uuid or name): last counters seen
  instPrev: new Map(),
  // per instance name: {color, firstSeen, lastSeen, port, total, errors, alive}
  instances: new Map(),
  // per voucher id: {v (latest), points: [[t, stock, orders]], lastChange, meta}
  vouchers: new Map(),
  // cumulative counters (monotonic, since the page loaded), one sample per poll
  cum: { orders: 0, requests: 0, byError: {}, byStatus: {}, perInstance: {} },
  samples: [],
  reasonColors: new Map(),
};

function reasonColor(code) {
  if (!state.reasonColors.has(code)) {
    const c = REASON_COLORS[code] || SPARE_COLORS[state.reasonColors.size % SPARE_COLORS.length];
    state.reasonColors.set(code, c);
  }
  return state.reasonColors.get(code);
}

function instanceColor(name) {
  const inst = state.instances.get(name);
  if (inst) return inst.color;
  return INSTANCE_COLORS[state.instances.size % INSTANCE_COLORS.length];
}

// ------------------------------------------------------------------ helpers

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k === "style") e.style.cssText = v;    // CSSOM: allowed by the page's CSP
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) if (c != null) e.append(c);
  return e;
}

function num(v, fallback = 0) {
  const n = Number(v);
  return Number.isFinite(n) ? n : fallback;
}

function fmtRate(v) {
  if (!Number.isFinite(v)) return "–";
  if (v === 0) return "0";
  if (v < 10) return v.toFixed(1);
  return formatCount(Math.round(v));
}

function fmtPct(v) {
  if (!Number.isFinite(v)) return "–";
  if (v > 0 && v < 0.01) return "<1%";
  return `${Math.round(v * 100)}%`;
}

function setState(node, s) {
  if (node.dataset.state !== s) node.dataset.state = s;
}

// The charts' time window: the last WINDOW_MS, or since the page loaded.
function windowStart(now) {
  const first = state.samples.length ? state.samples[0].t : now;
  return Math.min(now - MIN_WINDOW_MS, Math.max(now - WINDOW_MS, first));
}

// Sample i vs the newest sample at least `span` older: per-second rate.
function rateAt(i, span, pick) {
  const s = state.samples;
  let j = i;
  while (j > 0 && s[i].t - s[j].t < span) j--;
  if (j === i) return 0;
  const dt = (s[i].t - s[j].t) / 1000;
  return dt > 0 ? Math.max(0, pick(s[i]) - pick(s[j])) / dt : 0;
}

// ------------------------------------------------------------------ polling

async function fetchStats() {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), FETCH_TIMEOUT_MS);
  try {
    const r = await fetch(STATS_URL, { cache: "no-store", signal: ctrl.signal, headers: { Accept: "application/json" } });
    const text = await r.text();
    if (!r.ok) {
      let msg = text.slice(0, 200);
      try { msg = JSON.parse(text).message || msg; } catch (_) { /* not JSON */ }
      throw new Error(`HTTP ${r.status}: ${msg}`);
    }
    return JSON.parse(text);
  } catch (e) {
    if (e.name === "AbortError") throw new Error(`no answer within ${FETCH_TIMEOUT_MS / 1000} s`);
    throw e;
  } finally {
    clearTimeout(timer);
  }
}

// nginx's counters of the sold-out edge, or null (no edge, or no answer).
async function fetchEdge() {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(), FETCH_TIMEOUT_MS);
  try {
    const r = await fetch(EDGE_URL, { cache: "no-store", signal: ctrl.signal, headers: { Accept: "application/json" } });
    if (!r.ok) return null;
    const e = await r.json();
    return e && e.edge === true && e.requests ? e : null;
  } catch (_) {
    return null;
  } finally {
    clearTimeout(timer);
  }
}

async function pollLoop() {
  const started = performance.now();
  try {
    const [stats, edge] = await Promise.all([fetchStats(), fetchEdge()]);
    ingest(stats, Date.now(), edge);
    state.lastOk = Date.now();
    state.failures = 0;
    render(stats);
  } catch (e) {
    state.failures++;
    renderConnError(e);
  }
  state.polls++;
  document.body.dataset.polls = String(state.polls);
  const wait = Math.max(50, POLL_MS - (performance.now() - started));
  setTimeout(pollLoop, wait);
}

// ------------------------------------------------------------------ ingest

function ingest(stats, now, edge) {
  const cum = state.cum;

  // Instances: what each one's counters grew by. /stats shows the answering
  // instance's own counters live and the others' as published to Redis up to
  // a second ago, and nginx spreads the polls over the instances: a counter
  // can read lower than at the poll before. So the deltas are taken against
  // the highest value seen (per instance uuid: a restarted instance comes back
  // with a new one and counts from zero), which counts every request once.
  let list = Array.isArray(stats.instances) ? stats.instances : [];
  if (!list.length && stats.requests) list = [{ instance: stats.instance, requests: stats.requests, self: true }];
  // The answers nginx gave by itself count like an instance's.
  if (edge) list = [...list, edge];
  const seen = new Set();
  for (const inst of list) {
    const name = String(inst.instance || "?");
    const key = String(inst.uuid || name);
    const req = inst.requests || {};
    const cur = { total: num(req.total), byError: req.byError || {}, byStatus: req.byStatus || {} };
    let high = state.instPrev.get(key);
    if (high) {
      const d = Math.max(0, cur.total - high.total);
      cum.requests += d;
      cum.perInstance[name] = (cum.perInstance[name] || 0) + d;
      high.total = Math.max(high.total, cur.total);
      for (const [field, sum] of [["byError", cum.byError], ["byStatus", cum.byStatus]]) {
        for (const [code, n] of Object.entries(cur[field])) {
          const dd = Math.max(0, num(n) - num(high[field][code]));
          if (dd) {
            sum[code] = (sum[code] || 0) + dd;
            high[field][code] = num(n);
          }
        }
      }
    } else {
      high = { total: cur.total, byError: {}, byStatus: {} };
      for (const f of ["byError", "byStatus"]) {
        for (const [code, n] of Object.entries(cur[f])) high[f][code] = num(n);
      }
      state.instPrev.set(key, high);
      if (!(name in cum.perInstance)) cum.perInstance[name] = 0;
    }
    seen.add(name);
    let info = state.instances.get(name);
    if (!info) {
      info = { color: instanceColor(name), firstSeen: now };
      state.instances.set(name, info);
    }
    const errors = Object.entries(high.byStatus)
      .filter(([s]) => Number(s) >= 400)
      .reduce((a, [, n]) => a + num(n), 0);
    Object.assign(info, {
      lastSeen: now, alive: true, port: inst.port, total: high.total, errors,
      self: !!inst.self, startedAt: inst.startedAt || "", edge: inst.edge === true,
    });
  }
  for (const [name, info] of state.instances) {
    if (!seen.has(name)) info.alive = false;
  }

  // Vouchers: orders/s from the order counts (a reset starts a new baseline).
  for (const v of stats.vouchers || []) {
    const id = String(v.voucherId);
    let rec = state.vouchers.get(id);
    const cur = {
      id, title: String(v.title ?? ""), initialStock: num(v.initialStock), stock: num(v.stock),
      orders: num(v.orders), oversold: num(v.oversold), duplicateUsers: num(v.duplicateUsers),
      stockDrift: num(v.stockDrift),
    };
    if (!rec) {
      rec = { points: [], lastChange: 0, firstSeen: now, meta: null, metaFetched: 0 };
      state.vouchers.set(id, rec);
      const prevT = state.samples.length ? state.samples[state.samples.length - 1].t : 0;
      if (prevT) {
        // Created since the last poll: its orders are new, its chart starts full.
        cum.orders += cur.orders;
        rec.points.push([prevT, cur.initialStock, 0]);
        rec.lastChange = now;
      }
    } else if (rec.v) {
      const reset = cur.initialStock !== rec.v.initialStock || cur.orders < rec.v.orders;
      if (reset) {
        rec.points = [];
        rec.meta = null;
      } else {
        cum.orders += Math.max(0, cur.orders - rec.v.orders);
      }
      if (reset || cur.orders !== rec.v.orders || cur.stock !== rec.v.stock) rec.lastChange = now;
    }
    rec.v = cur;
    rec.seen = now;
    rec.points.push([now, cur.stock, cur.orders]);
    while (rec.points.length > 2 && rec.points[0][0] < now - KEEP_MS) rec.points.shift();
  }
  const present = new Set((stats.vouchers || []).map((v) => String(v.voucherId)));
  for (const id of [...state.vouchers.keys()]) if (!present.has(id)) state.vouchers.delete(id);

  state.samples.push({
    t: now, orders: cum.orders, requests: cum.requests, byError: { ...cum.byError },
    perInstance: { ...cum.perInstance },
  });
  while (state.samples.length > 2 && state.samples[0].t < now - KEEP_MS) state.samples.shift();
}

// ------------------------------------------------------------------ render

function render(stats) {
  delete document.body.dataset.stale;
  renderHeader(stats);
  renderInvariants();
  renderRates();
  renderInstances();
  renderVouchers();
}

function renderHeader(stats) {
  const conn = $("#conn-status");
  setState(conn, "ok");
  const time = new Date().toLocaleTimeString([], { hour12: false });
  conn.querySelector(".text").textContent = `live · ${time} · via ${stats.instance || "?"}`;
  conn.title = `GET ${STATS_URL} answered by ${stats.instance || "?"}`;

  const chip = $("#strategies");
  chip.textContent = `lock ${stats.lockStrategy || "?"} · stock ${stats.stockStrategy || "?"}`;
  setState(chip, stats.unsafe ? "bad" : "ok");
  chip.title = stats.unsafe
    ? "UNSAFE strategies: this instance runs a step of the demo ladder that can oversell or sell twice"
    : "safe default strategies";
}

function renderConnError(err) {
  const conn = $("#conn-status");
  setState(conn, "bad");
  const ago = state.lastOk ? ` · last data ${Math.round((Date.now() - state.lastOk) / 1000)} s ago` : "";
  conn.querySelector(".text").textContent = `/stats failed: ${err.message}${ago}`;
  conn.title = String(err.message);
  // The figures below are what the last answer said: shown greyed out.
  if (!state.lastOk || Date.now() - state.lastOk > 2500) document.body.dataset.stale = "1";
}

function invariantTile(id, total, offenders, what) {
  const tile = $(id);
  const bad = total !== 0;
  setState(tile, bad ? "bad" : "ok");
  tile.querySelector(".value").textContent = String(total);
  tile.querySelector(".note").textContent = bad
    ? `${what}: ${offenders.slice(0, 4).map(([vid, n]) => `voucher ${vid} (${n > 0 && id === "#inv-drift" ? "+" : ""}${n})`).join(", ")}${offenders.length > 4 ? ", …" : ""}`
    : `0 in ${state.vouchers.size} voucher${state.vouchers.size === 1 ? "" : "s"}`;
}

function renderInvariants() {
  const vs = [...state.vouchers.values()].map((r) => r.v);
  const over = vs.filter((v) => v.oversold !== 0).map((v) => [v.id, v.oversold]);
  const dup = vs.filter((v) => v.duplicateUsers !== 0).map((v) => [v.id, v.duplicateUsers]);
  const drift = vs.filter((v) => v.stockDrift !== 0).map((v) => [v.id, v.stockDrift]);
  const sum = (a) => a.reduce((s, [, n]) => s + n, 0);
  invariantTile("#inv-oversold", sum(over), over, "OVERSOLD");
  invariantTile("#inv-duplicates", sum(dup), dup, "SOLD TWICE");
  invariantTile("#inv-drift", drift.reduce((s, [, n]) => s + Math.abs(n), 0), drift, "LOST UPDATES");

  const all = $("#inv-all");
  const ok = !over.length && !dup.length && !drift.length;
  setState(all, ok ? "ok" : "bad");
  all.querySelector(".value").textContent = ok ? "✓ hold" : "✗ VIOLATED";
  all.querySelector(".note").textContent = ok
    ? "no oversell, nobody bought twice, no lost update"
    : `${over.length + dup.length + drift.length} violation(s): see the red tiles`;
}

function renderRates() {
  const s = state.samples;
  const now = s.length ? s[s.length - 1].t : Date.now();
  const last = s.length - 1;

  // Reasons seen, most frequent first.
  const totals = state.cum.byError;
  const reasons = Object.keys(totals).filter((c) => totals[c] > 0).sort((a, b) => totals[b] - totals[a]);

  const orderPts = [];
  const reasonPts = Object.fromEntries(reasons.map((c) => [c, []]));
  for (let i = 1; i < s.length; i++) {
    if (s[i].t < windowStart(now) - 5000) continue;
    orderPts.push([s[i].t, rateAt(i, RATE_SPAN_MS, (x) => x.orders)]);
    for (const c of reasons) reasonPts[c].push([s[i].t, rateAt(i, RATE_SPAN_MS, (x) => x.byError[c] || 0)]);
  }
  const series = [
    { name: "orders", color: ORDER_COLOR, points: orderPts, width: 2.5, fill: "rgba(22,163,74,0.10)" },
    ...reasons.map((c) => ({ name: c, color: reasonColor(c), points: reasonPts[c], width: 1.8 })),
  ];
  drawTimeChart($("#rates-chart"), { series: s.length > 1 ? series : [], tMin: windowStart(now), tMax: now, empty: "collecting two polls…" });

  const nowOrders = last > 0 ? rateAt(last, RATE_SPAN_MS, (x) => x.orders) : NaN;
  const nowReq = last > 0 ? rateAt(last, RATE_SPAN_MS, (x) => x.requests) : NaN;
  const sumErr = (x) => Object.values(x.byError).reduce((a, b) => a + b, 0);
  const nowRej = last > 0 ? rateAt(last, RATE_SPAN_MS, sumErr) : NaN;
  const winOrders = last > 0 ? rateAt(last, SHARE_SPAN_MS, (x) => x.orders) : 0;
  const winRej = last > 0 ? rateAt(last, SHARE_SPAN_MS, sumErr) : 0;
  $("#kpi-orders").textContent = fmtRate(nowOrders);
  $("#kpi-rejected").textContent = fmtRate(nowRej);
  $("#kpi-requests").textContent = fmtRate(nowReq);
  $("#kpi-success").textContent = winOrders + winRej > 0 ? fmtPct(winOrders / (winOrders + winRej)) : "–";

  const allOutcomes = state.cum.orders + reasons.reduce((a, c) => a + totals[c], 0);
  const rows = [["orders", ORDER_COLOR, nowOrders, state.cum.orders, "order"],
    ...reasons.map((c) => [c, reasonColor(c), last > 0 ? rateAt(last, RATE_SPAN_MS, (x) => x.byError[c] || 0) : NaN, totals[c], "reason"])];
  const tbody = $("#rates-legend tbody");
  tbody.replaceChildren(...rows.map(([name, color, rate, total, kind]) => el("tr", { "data-outcome": name, "data-kind": kind },
    el("td", {}, el("span", { class: "swatch", style: `background:${color}` })),
    el("td", { class: kind === "order" ? "strong" : "" }, kind === "order" ? "orders (success)" : name),
    el("td", { class: "num", "data-field": "rate", text: fmtRate(rate) }),
    el("td", { class: "num", "data-field": "total", text: formatCount(total) }),
    el("td", { class: "num", text: allOutcomes ? fmtPct(total / allOutcomes) : "–" }))));
}

function renderInstances() {
  const s = state.samples;
  const last = s.length - 1;
  const names = [...state.instances.keys()].sort();
  const rates = {};
  let windowTotal = 0;
  for (const n of names) {
    rates[n] = {
      now: last > 0 ? rateAt(last, RATE_SPAN_MS, (x) => x.perInstance[n] || 0) : NaN,
      win: last > 0 ? rateAt(last, SHARE_SPAN_MS, (x) => x.perInstance[n] || 0) : 0,
    };
    windowTotal += rates[n].win;
  }
  const now = last >= 0 ? s[last].t : Date.now();
  const t0 = windowStart(now);
  const series = names.map((n) => {
    const pts = [];
    for (let i = 1; i < s.length; i++) {
      if (s[i].t >= t0 - 5000) pts.push([s[i].t, rateAt(i, RATE_SPAN_MS, (x) => x.perInstance[n] || 0)]);
    }
    return { name: n, color: state.instances.get(n).color, points: pts, width: 2 };
  });
  drawTimeChart($("#instances-chart"), { series: s.length > 1 ? series : [], tMin: t0, tMax: now, empty: "collecting two polls…" });

  const bar = $("#share-bar");
  bar.replaceChildren(...names.filter((n) => rates[n].win > 0).map((n) => {
    const share = rates[n].win / windowTotal;
    return el("div", {
      class: "seg", style: `width:${(share * 100).toFixed(2)}%;background:${state.instances.get(n).color}`,
      title: `${n}: ${fmtPct(share)}`, text: share > 0.12 ? `${n} ${fmtPct(share)}` : "",
    });
  }));
  if (!windowTotal) bar.append(el("div", { class: "seg idle", text: "no requests in the last 10 s" }));

  const tbody = $("#instances-table tbody");
  tbody.replaceChildren(...names.map((n) => {
    const info = state.instances.get(n);
    const share = windowTotal ? rates[n].win / windowTotal : NaN;
    return el("tr", { "data-instance": n },
      el("td", {}, el("span", { class: "swatch", style: `background:${info.color}` }), ` ${n}`,
        info.port ? el("span", { class: "muted", text: ` :${info.port}` }) : null),
      el("td", { class: "num", "data-field": "rate", text: fmtRate(rates[n].now) }),
      el("td", { class: "num", "data-field": "share", text: windowTotal ? fmtPct(share) : "–" }),
      el("td", { class: "num", "data-field": "total", text: formatCount(info.total || 0) }),
      el("td", { class: "num", "data-field": "errors", text: formatCount(info.errors || 0) }),
      el("td", {}, el("span", { class: `pill ${info.alive ? "ok" : "bad"}`, text: info.alive ? "live" : "gone" })));
  }));
  const apps = names.filter((n) => !state.instances.get(n).edge);
  const live = apps.filter((n) => state.instances.get(n).alive).length;
  const edge = names.some((n) => state.instances.get(n).edge && state.instances.get(n).alive);
  $("#inst-summary").textContent = `${live} live${apps.length > live ? `, ${apps.length - live} gone` : ""}`
    + (edge ? " + nginx's sold-out edge" : "");
}

function voucherState(rec) {
  const v = rec.v;
  if (v.oversold || v.duplicateUsers || v.stockDrift) return ["VIOLATED", "bad"];
  const m = rec.meta;
  const now = Date.now();
  if (m && m.beginTime && Date.parse(m.beginTime) > now) return ["not started", "muted"];
  if (m && m.endTime && Date.parse(m.endTime) < now) return ["ended", "muted"];
  if (v.stock <= 0) return ["sold out", "done"];
  return ["on sale", "live"];
}

// Begin and end times are not in /stats: GET /voucher/{id} once per voucher
// shown in a card.
function fetchMeta(rec) {
  const now = Date.now();
  if (rec.meta || now - rec.metaFetched < 15000) return;
  rec.metaFetched = now;
  fetch(`/voucher/${encodeURIComponent(rec.v.id)}`, { cache: "no-store" })
    .then((r) => (r.ok ? r.json() : null))
    .then((m) => { if (m) rec.meta = m; })
    .catch(() => {});
}

function invCell(n, field) {
  return el("td", { class: `num inv ${n === 0 ? "ok" : "bad"}`, "data-field": field, text: String(n) });
}

function renderVouchers() {
  const recs = [...state.vouchers.values()];
  const byId = (a, b) => Number(b.v.id) - Number(a.v.id);
  // Cards: the vouchers that moved most recently, then the newest.
  const cards = [...recs].sort((a, b) => (b.lastChange - a.lastChange) || byId(a, b)).slice(0, MAX_CARDS);
  cards.sort(byId);
  const sold = recs.reduce((a, r) => a + r.v.orders, 0);
  $("#vouchers-summary").textContent = recs.length
    ? `${recs.length} voucher${recs.length === 1 ? "" : "s"}, ${formatCount(sold)} orders${recs.length > MAX_CARDS ? ` · charts for the ${MAX_CARDS} most recently active` : ""}`
    : "";
  $("#no-vouchers").hidden = recs.length > 0;

  const box = $("#voucher-cards");
  const want = new Set(cards.map((r) => r.v.id));
  for (const node of [...box.querySelectorAll(".voucher-card")]) {
    if (!want.has(node.dataset.voucherId)) node.remove();
  }
  const now = state.samples.length ? state.samples[state.samples.length - 1].t : Date.now();
  for (const rec of cards) {
    fetchMeta(rec);
    let card = box.querySelector(`.voucher-card[data-voucher-id="${CSS.escape(rec.v.id)}"]`);
    if (!card) card = makeCard(rec.v.id);
    box.append(card);   // keeps the order
    fillCard(card, rec, now);
  }

  // The table of every voucher.
  const tbody = $("#vouchers-table tbody");
  tbody.replaceChildren(...[...recs].sort(byId).map((rec) => {
    const v = rec.v;
    const [label, cls] = voucherState(rec);
    return el("tr", { "data-voucher-id": v.id },
      el("td", { class: "num", text: v.id }),
      el("td", { class: "title", text: v.title, title: v.title }),
      el("td", { class: "num strong", "data-field": "stock", text: String(v.stock) }),
      el("td", { class: "num", "data-field": "orders", text: String(v.orders) }),
      el("td", { class: "num", "data-field": "initialStock", text: String(v.initialStock) }),
      invCell(v.oversold, "oversold"), invCell(v.duplicateUsers, "duplicateUsers"), invCell(v.stockDrift, "stockDrift"),
      el("td", {}, el("span", { class: `pill ${cls}`, text: label })));
  }));

  const dl = $("#voucher-ids");
  dl.replaceChildren(...[...recs].sort(byId).map((r) => el("option", { value: r.v.id, label: r.v.title })));
  const input = $("#buy-voucher");
  if (!input.value && recs.length && document.activeElement !== input) input.value = [...recs].sort(byId)[0].v.id;
}

function makeCard(id) {
  const field = (name, label, cls = "") => el("div", { class: `fig ${cls}` },
    el("span", { class: "k", text: label }), el("span", { class: "v", "data-field": name }));
  const card = el("article", { class: "card voucher-card", "data-voucher-id": id },
    el("div", { class: "vc-head" },
      el("div", {}, el("span", { class: "vid", text: `#${id}` }), el("span", { class: "vtitle" })),
      el("span", { class: "pill state" })),
    el("div", { class: "figs" },
      field("stock", "stock", "stock"), field("orders", "orders", "orders"), field("initialStock", "initial")),
    el("div", { class: "progress" }, el("div", { class: "fill" })),
    el("canvas", { class: "chart small" }),
    el("div", { class: "vc-legend" },
      el("span", {}, el("span", { class: "swatch", style: `background:${STOCK_COLOR}` }), " stock"),
      el("span", {}, el("span", { class: "swatch", style: `background:${ORDER_COLOR}` }), " orders")),
    el("div", { class: "vc-inv" },
      el("span", { class: "invchip", "data-inv": "oversold" }),
      el("span", { class: "invchip", "data-inv": "duplicateUsers" }),
      el("span", { class: "invchip", "data-inv": "stockDrift" })));
  return card;
}

function fillCard(card, rec, now) {
  const v = rec.v;
  card.querySelector(".vtitle").textContent = v.title;
  card.querySelector(".vtitle").title = v.title;
  card.querySelector('[data-field="stock"]').textContent = String(v.stock);
  card.querySelector('[data-field="orders"]').textContent = String(v.orders);
  card.querySelector('[data-field="initialStock"]').textContent = String(v.initialStock);
  const [label, cls] = voucherState(rec);
  const pill = card.querySelector(".pill.state");
  pill.textContent = label;
  pill.className = `pill state ${cls}`;
  const pct = v.initialStock > 0 ? Math.min(100, (v.orders / v.initialStock) * 100) : 0;
  const fill = card.querySelector(".progress .fill");
  fill.style.width = `${pct.toFixed(1)}%`;
  fill.title = `${pct.toFixed(0)}% sold`;
  const inv = [["oversold", "oversold", v.oversold], ["duplicateUsers", "dup. users", v.duplicateUsers], ["stockDrift", "drift", v.stockDrift]];
  for (const [key, label2, n] of inv) {
    const chip = card.querySelector(`[data-inv="${key}"]`);
    chip.textContent = `${n === 0 ? "✓" : "✗"} ${label2} ${n}`;
    chip.dataset.state = n === 0 ? "ok" : "bad";
    chip.setAttribute("data-field", key);
  }
  setState(card, v.oversold || v.duplicateUsers || v.stockDrift ? "bad" : "ok");

  const pts = rec.points;
  drawTimeChart(card.querySelector("canvas"), {
    tMin: windowStart(now), tMax: now, yMax: Math.max(v.initialStock, 1),
    series: pts.length ? [
      { name: "stock", color: STOCK_COLOR, points: pts.map((p) => [p[0], p[1]]), width: 2, fill: "rgba(37,99,235,0.08)" },
      { name: "orders", color: ORDER_COLOR, points: pts.map((p) => [p[0], p[2]]), width: 2 },
    ] : [],
  });
}

// ------------------------------------------------------------------ buy form

let buySeq = 0;

function randomUser() {
  return String(1_000_000 + Math.floor(Math.random() * 8_999_000_000));
}

async function buy(ev) {
  ev.preventDefault();
  const user = $("#buy-user").value.trim();
  const voucher = $("#buy-voucher").value.trim();
  const seq = ++buySeq;
  const box = $("#buy-result");
  const badge = $("#buy-badge");
  const meta = $("#buy-meta");
  const body = $("#buy-body");
  const button = $("#buy-submit");
  button.disabled = true;
  setState(box, "pending");
  badge.textContent = "sending…";
  meta.textContent = "";
  body.textContent = "";
  const t0 = performance.now();
  let status = 0;
  let text = "";
  let instance = "";
  let rid = "";
  try {
    const ctrl = new AbortController();
    const timer = setTimeout(() => ctrl.abort(), 10000);
    const r = await fetch(`/voucher/${encodeURIComponent(voucher)}/seckill`, {
      method: "POST", headers: { "X-User-Id": user }, cache: "no-store", signal: ctrl.signal,
    });
    clearTimeout(timer);
    status = r.status;
    text = await r.text();
    instance = r.headers.get("X-Instance-Id") || "";
    rid = (r.headers.get("X-Request-Id") || "").split(",")[0].trim();
  } catch (e) {
    text = e.name === "AbortError" ? "no answer within 10 s" : `request failed: ${e.message}`;
  }
  const ms = performance.now() - t0;
  if (seq !== buySeq) return;
  button.disabled = false;
  let parsed = null;
  try { parsed = JSON.parse(text); } catch (_) { /* not JSON */ }
  const ok = status === 200 && parsed && parsed.orderId;
  const kind = ok ? "ok" : status === 409 ? "rejected" : "bad";
  setState(box, kind);
  box.dataset.status = String(status);
  box.dataset.seq = String(seq);
  const code = parsed && parsed.error ? parsed.error : "";
  badge.textContent = ok ? `200 · order ${parsed.orderId}` : status ? `${status}${code ? ` · ${code}` : ""}` : "no answer";
  meta.textContent = [`${ms.toFixed(0)} ms`, instance && `by ${instance}`, rid && `request id ${rid}`].filter(Boolean).join(" · ");
  body.textContent = parsed ? JSON.stringify(parsed, null, 2) : text;

  const hist = $("#buy-history");
  hist.prepend(el("li", { "data-state": kind },
    el("span", { class: "when", text: new Date().toLocaleTimeString([], { hour12: false }) }),
    ` user ${user} · voucher ${voucher} → `,
    el("strong", { text: ok ? "order" : code || String(status || "error") })));
  while (hist.children.length > 5) hist.lastChild.remove();
}

// ------------------------------------------------------------------ start

function start() {
  $("#buy-user").value = randomUser();
  $("#buy-random").addEventListener("click", () => { $("#buy-user").value = randomUser(); });
  $("#buy-form").addEventListener("submit", buy);
  let resizeTimer = 0;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => { renderRates(); renderInstances(); renderVouchers(); }, 100);
  });
  pollLoop();
}

start();

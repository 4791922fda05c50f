// Small canvas charts for the dashboard: time series as lines, no library.
//
//   drawTimeChart(canvas, {
//     series: [{name, color, points: [[tMs, value], ...], width, fill, dash}],
//     tMin, tMax,          // the time window (ms, same clock as the points)
//     yMax,                // optional: at least this high
//     yFormat,             // optional: value -> tick label
//     empty,               // optional: text shown when there is nothing to draw
//   })
//
// The canvas is sized from its CSS box and the device pixel ratio on every
// call, so the charts stay sharp and follow the layout.

const AXIS_COLOR = "#94a3b8";
const GRID_COLOR = "#e2e8f0";
const TEXT_COLOR = "#64748b";
const FONT = "11px system-ui, -apple-system, 'Segoe UI', 'DejaVu Sans', sans-serif";

// "Nice" tick step for a range: 1, 2 or 5 times a power of ten.
export function niceStep(range, ticks) {
  if (!(range > 0)) return 1;
  const raw = range / Math.max(1, ticks);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  const f = raw / p;
  const m = f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10;
  return m * p;
}

export function formatCount(v) {
  const a = Math.abs(v);
  if (a >= 1e6) return (v / 1e6).toFixed(a >= 1e7 ? 0 : 1).replace(/\.0$/, "") + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(a >= 1e5 ? 0 : 1).replace(/\.0$/, "") + "k";
  if (Number.isInteger(v)) return String(v);
  return v.toFixed(a < 10 ? 1 : 0);
}

function prepare(canvas) {
  const dpr = window.devicePixelRatio || 1;
  const rect = canvas.getBoundingClientRect();
  const w = Math.max(50, Math.round(rect.width));
  const h = Math.max(40, Math.round(rect.height));
  if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
    canvas.width = Math.round(w * dpr);
    canvas.height = Math.round(h * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  return { ctx, w, h };
}

export function drawTimeChart(canvas, opts) {
  const { ctx, w, h } = prepare(canvas);
  const series = (opts.series || []).filter((s) => s.points && s.points.length);
  const tMax = opts.tMax;
  const tMin = opts.tMin;
  const yFormat = opts.yFormat || formatCount;

  let yMax = opts.yMax || 0;
  for (const s of series) {
    for (const [t, v] of s.points) {
      if (t >= tMin && v > yMax) yMax = v;
    }
  }
  if (!(yMax > 0)) yMax = 1;
  const step = niceStep(yMax, 4);
  yMax = Math.ceil(yMax / step - 1e-9) * step;

  ctx.font = FONT;
  let labelW = 0;
  for (let v = 0; v <= yMax + 1e-9; v += step) labelW = Math.max(labelW, ctx.measureText(yFormat(v)).width);
  const pad = { l: Math.ceil(labelW) + 10, r: 8, t: 8, b: 20 };
  const pw = w - pad.l - pad.r;
  const ph = h - pad.t - pad.b;
  const x = (t) => pad.l + ((t - tMin) / (tMax - tMin)) * pw;
  const y = (v) => pad.t + ph - (v / yMax) * ph;

  // Horizontal grid and y labels.
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  ctx.lineWidth = 1;
  for (let v = 0; v <= yMax + 1e-9; v += step) {
    const yy = Math.round(y(v)) + 0.5;
    ctx.strokeStyle = v === 0 ? AXIS_COLOR : GRID_COLOR;
    ctx.beginPath();
    ctx.moveTo(pad.l, yy);
    ctx.lineTo(w - pad.r, yy);
    ctx.stroke();
    ctx.fillStyle = TEXT_COLOR;
    ctx.fillText(yFormat(v), pad.l - 6, yy);
  }

  // Time labels: seconds before now.
  const spanS = (tMax - tMin) / 1000;
  const tStep = niceStep(spanS, Math.max(2, Math.floor(pw / 90)));
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (let s = 0; s <= spanS + 1e-9; s += tStep) {
    const xx = x(tMax - s * 1000);
    if (xx < pad.l - 1) break;
    ctx.fillStyle = TEXT_COLOR;
    ctx.fillText(s === 0 ? "now" : `-${formatCount(s)}s`, Math.min(Math.max(xx, pad.l + 12), w - pad.r - 12), pad.t + ph + 5);
    ctx.strokeStyle = GRID_COLOR;
    ctx.beginPath();
    ctx.moveTo(Math.round(xx) + 0.5, pad.t + ph);
    ctx.lineTo(Math.round(xx) + 0.5, pad.t + ph + 3);
    ctx.stroke();
  }

  if (!series.length) {
    ctx.fillStyle = TEXT_COLOR;
    ctx.textAlign = "center";
    ctx.textBaseline = "middle";
    ctx.fillText(opts.empty || "waiting for data…", pad.l + pw / 2, pad.t + ph / 2);
    return;
  }

  ctx.save();
  ctx.beginPath();
  ctx.rect(pad.l, pad.t - 2, pw + 2, ph + 4);
  ctx.clip();
  for (const s of series) {
    const pts = s.points.filter(([t]) => t >= tMin - 5000);
    if (!pts.length) continue;
    if (s.fill) {
      ctx.beginPath();
      ctx.moveTo(x(pts[0][0]), y(0));
      for (const [t, v] of pts) ctx.lineTo(x(t), y(v));
      ctx.lineTo(x(pts[pts.length - 1][0]), y(0));
      ctx.closePath();
      ctx.fillStyle = s.fill;
      ctx.fill();
    }
    ctx.beginPath();
    pts.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
    ctx.strokeStyle = s.color;
    ctx.lineWidth = s.width || 2;
    ctx.lineJoin = "round";
    ctx.setLineDash(s.dash || []);
    ctx.stroke();
    ctx.setLineDash([]);
    // The latest value as a dot.
    const [lt, lv] = pts[pts.length - 1];
    ctx.beginPath();
    ctx.arc(x(lt), y(lv), (s.width || 2) + 1, 0, Math.PI * 2);
    ctx.fillStyle = s.color;
    ctx.fill();
  }
  ctx.restore();
}

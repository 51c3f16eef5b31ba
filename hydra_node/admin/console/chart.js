// A small SVG line chart: time on x, one or more series on y, min/max labels and a legend.
const NS = 'http://www.w3.org/2000/svg';
export const PALETTE = ['#1f5fbf', '#c2410c', '#15803d', '#7e22ce', '#a16207', '#0e7490', '#be185d', '#4d7c0f'];

function s(tag, attrs, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

function fmt(v) { return Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) >= 10 ? v.toFixed(1) : v.toFixed(2); }

// series: [{name, points: [[ts, value|null], ...]}]; returns a <figure>.
export function lineChart(title, series, opts = {}) {
  const W = 360, H = opts.height || 120, L = 40, R = 6, T = 8, B = 18;
  const fig = document.createElement('figure');
  fig.className = 'chart';
  const all = series.flatMap((sr) => sr.points.filter((p) => p[1] !== null && p[1] !== undefined));
  const svg = s('svg', { viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': title, preserveAspectRatio: 'none' });
  const cap = document.createElement('figcaption');
  cap.textContent = title + (opts.unit ? ` (${opts.unit})` : '');
  if (!all.length) {
    svg.append(s('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'muted' }, 'no data yet'));
    fig.append(cap, svg);
    return fig;
  }
  const times = series.flatMap((sr) => sr.points.map((p) => p[0]));   // the whole window, gaps included
  const t0 = Math.min(...times), t1 = Math.max(...times);
  let v0 = Math.min(0, ...all.map((p) => p[1])), v1 = Math.max(...all.map((p) => p[1]));
  if (v1 === v0) v1 = v0 + 1;
  const x = (t) => L + (t1 === t0 ? (W - L - R) : ((t - t0) / (t1 - t0)) * (W - L - R));
  const y = (v) => T + (1 - (v - v0) / (v1 - v0)) * (H - T - B);
  svg.append(s('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' }),
             s('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }),
             s('text', { x: L - 4, y: T + 8, 'text-anchor': 'end', class: 'tick' }, fmt(v1)),
             s('text', { x: L - 4, y: H - B, 'text-anchor': 'end', class: 'tick' }, fmt(v0)),
             s('text', { x: L, y: H - 4, class: 'tick' }, new Date(t0 * 1000).toLocaleTimeString([], { hour12: false })),
             s('text', { x: W - R, y: H - 4, 'text-anchor': 'end', class: 'tick' }, new Date(t1 * 1000).toLocaleTimeString([], { hour12: false })));
  const legend = document.createElement('ul');
  legend.className = 'legend';
  series.forEach((sr, i) => {
    const color = sr.color || PALETTE[i % PALETTE.length];
    let d = '', pen = false;
    for (const [t, v] of sr.points) {
      if (v === null || v === undefined) { pen = false; continue; }
      d += (pen ? 'L' : 'M') + x(t).toFixed(1) + ' ' + y(v).toFixed(1);
      pen = true;
    }
    const path = s('path', { d, fill: 'none', stroke: color, 'stroke-width': 1.6, 'vector-effect': 'non-scaling-stroke' });
    path.append(s('title', {}, sr.name));
    svg.append(path);
    sr.points.forEach(([t, v], i) => {   // a point with no neighbour draws no line: mark it
      const gap = (j) => j < 0 || j >= sr.points.length || sr.points[j][1] === null || sr.points[j][1] === undefined;
      if (v !== null && v !== undefined && gap(i - 1) && gap(i + 1)) svg.append(s('circle', { cx: x(t), cy: y(v), r: 2.5, fill: color }));
    });
    const last = [...sr.points].reverse().find((p) => p[1] !== null && p[1] !== undefined);
    const li = document.createElement('li');
    const sw = document.createElement('span');
    sw.className = 'swatch';
    sw.style.background = color;
    li.append(sw, `${sr.name}${last ? ': ' + fmt(last[1]) : ''}`);
    legend.append(li);
  });
  fig.append(cap, svg, legend);
  return fig;
}

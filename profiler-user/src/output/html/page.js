'use strict';
// report.html: renders the JSON in #data. Plain DOM, no libraries, nothing
// fetched. Off-screen parts (function rows, flame graphs) render on demand.
const D = JSON.parse(document.getElementById('data').textContent);
const $ = (id) => document.getElementById(id);
const ESC = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => ESC[c]);
function ns(v) {
  if (v == null) return '';
  if (v < 1e3) return v + ' ns';
  if (v < 1e6) return (v / 1e3).toFixed(1) + ' µs';
  if (v < 1e9) return (v / 1e6).toFixed(2) + ' ms';
  return (v / 1e9).toFixed(2) + ' s';
}
const pct = (a, b) => (b > 0 ? (100 * a) / b : 0);
const params = () => new URLSearchParams(location.hash.slice(1));
const DJ = D.dispatches;
const T = Math.max(D.duration_ns, 1);

// Sorting a <table class="sortable">: header clicks call onSort(key, desc).
function sortable(table, onSort, initial) {
  const ths = table.querySelectorAll('th[data-k]');
  const mark = (k, desc) => ths.forEach((th) => {
    th.classList.toggle('asc', th.dataset.k === k && !desc);
    th.classList.toggle('desc', th.dataset.k === k && desc);
  });
  let cur = initial;
  mark(cur.k, cur.desc);
  ths.forEach((th) => th.addEventListener('click', () => {
    const k = th.dataset.k;
    const desc = k === cur.k ? !cur.desc : th.classList.contains('num');
    cur = { k, desc };
    mark(k, desc);
    onSort(k, desc);
  }));
  return (k, desc) => { cur = { k, desc }; mark(k, desc); onSort(k, desc); };
}
const cmp = (a, b) => (a < b ? -1 : a > b ? 1 : 0);

// ---- summary -------------------------------------------------------------
function summary() {
  $('facts').innerHTML = D.summary.map(([k, v]) => '<dt>' + esc(k) + '</dt><dd>' + esc(v) + '</dd>').join('');
  $('warnings').innerHTML = D.warnings.map((w) => '<li>' + esc(w) + '</li>').join('');
  $('notes').textContent = D.notes.join('\n');
}

// ---- slow dispatch groups ------------------------------------------------
const groups = DJ ? DJ.groups.map((g, i) => Object.assign({ rank: i, tree: D.group_trees[i] || [] }, g)) : [];
const byKey = new Map();
if (DJ) for (const s of DJ.slow) { if (!byKey.has(s.key)) byKey.set(s.key, []); byKey.get(s.key).push(s); }
const BUCKETS = [[42, 'frozen'], [24, 'high'], [9, 'middle'], [3, 'normal'], [0, 'best']];
const bucket = (frames) => BUCKETS.find(([n]) => frames >= n)[1];
let groupOrder = groups.slice();
let openKey = null;

// The first rows at once, the rest in chunks after the page is up.
const GROUP_CHUNK = 150;
let groupRender = 0;
function renderGroups() {
  const body = $('groups').tBodies[0];
  const gen = ++groupRender;
  body.innerHTML = groupRows(0, GROUP_CHUNK);
  const more = (from) => {
    if (gen !== groupRender || from >= groupOrder.length) return;
    body.insertAdjacentHTML('beforeend', groupRows(from, from + GROUP_CHUNK * 4));
    setTimeout(() => more(from + GROUP_CHUNK * 4), 0);
  };
  setTimeout(() => more(GROUP_CHUNK), 0);
}
function groupRows(from, to) {
  return groupOrder.slice(from, to).map((g) =>
    '<tr data-rank="' + g.rank + '"' + (g.key === openKey ? ' class="open"' : '') + '><td class="key">' + esc(g.key) +
    '</td><td class="num">' + g.count + '</td><td class="num">' + ns(g.total_ns) + '</td><td class="num">' + ns(g.max_ns) +
    '</td><td class="num">' + ns(g.p95_ns) + '</td><td class="verdict">' + esc(g.verdict) + '</td></tr>').join('');
}
function sortGroups(k, desc) {
  groupOrder.sort((a, b) => (desc ? -1 : 1) * cmp(a[k], b[k]) || a.rank - b.rank);
  renderGroups();
}
function setupGroups() {
  if (!DJ) return;
  $('groups-section').hidden = false;
  const slowCount = groups.reduce((n, g) => n + g.count, 0);
  $('groups-note').textContent = DJ.dispatches + ' dispatches on thread ' + DJ.thread.tid + ' (' + DJ.thread.name + '); ' +
    slowCount + ' slow (>= ' + ns(DJ.threshold_ns) + ') in ' + groups.length + ' groups; p50 ' + ns(DJ.p50_ns) +
    ', p95 ' + ns(DJ.p95_ns) + ', p99 ' + ns(DJ.p99_ns) + '. Rule: ' + DJ.rule + '. Click a group to open it.';
  const p = params();
  const sort = sortable($('groups'), sortGroups, { k: 'total_ns', desc: true });
  const gs = p.get('gsort');
  if (['count', 'total', 'max', 'p95'].includes(gs)) sort(gs === 'count' ? 'count' : gs + '_ns', true);
  else renderGroups();
  $('groups').tBodies[0].addEventListener('click', (e) => {
    const tr = e.target.closest('tr');
    if (tr) openGroup(groups[+tr.dataset.rank], true);
  });
}

// The group's worst instance: the longest of its kept slow dispatches,
// else (all details dropped) its worst tree alone.
function worstOf(g) {
  const list = byKey.get(g.key) || [];
  return list.reduce((w, s) => (!w || s.duration_ns > w.duration_ns ? s : w), null);
}

function openGroup(g, user) {
  if (!g) return;
  openKey = g.key;
  document.querySelectorAll('#groups tr.open').forEach((tr) => tr.classList.remove('open'));
  const tr = document.querySelector('#groups tr[data-rank="' + g.rank + '"]');
  if (tr) tr.classList.add('open');
  const det = $('detail');
  det.hidden = false;
  det.dataset.key = g.key;
  const inst = byKey.get(g.key) || [];
  const worst = worstOf(g);
  det.innerHTML = '<h3>[' + esc(g.key) + ']</h3><p>count ' + g.count + ', total ' + ns(g.total_ns) + ', max ' + ns(g.max_ns) +
    ', p95 ' + ns(g.p95_ns) + '</p><p class="verdict"><b>Verdict:</b> ' + esc(g.verdict) + '</p>' +
    '<h3>Instances on the session timeline</h3>' + strip(inst, worst) +
    '<div id="instance"></div>';
  det.querySelector('.strip').addEventListener('click', (e) => {
    const r = e.target.closest('rect[data-i]');
    if (r) showInstance(g, inst[+r.dataset.i], worst);
  });
  showInstance(g, worst, worst);
  if (user) {
    history.replaceState(null, '', '#group=' + encodeURIComponent(g.key));
    det.scrollIntoView({ block: 'nearest' });
  }
}

function strip(inst, worst) {
  const rects = inst.map((s, i) => '<rect data-i="' + i + '" class="' + (s === worst ? 'worst' : 'inst') + '" x="' +
    (1000 * s.start_ns / T).toFixed(2) + '" y="2" width="' + Math.max(1000 * s.duration_ns / T, 1.5).toFixed(2) +
    '" height="16"><title>#' + s.index + ' at +' + ns(s.start_ns) + ': ' + ns(s.duration_ns) + '</title></rect>').join('');
  return '<svg class="strip" viewBox="0 0 1000 20" preserveAspectRatio="none">' + rects + '</svg>';
}

function showInstance(g, s, worst) {
  const box = $('instance');
  const tree = s ? s.tree : g.tree;
  let h = '<h3>' + (s === worst ? 'Worst instance' : 'Instance') + (s ? ' #' + s.index + ' at +' + ns(s.start_ns) + ': ' + ns(s.duration_ns) : ' (details not kept)') + '</h3>';
  if (s) {
    const d = Math.max(s.duration_ns, 1);
    h += '<div class="split" title="on-CPU / blocked / runnable"><div class="oncpu" style="width:' + pct(s.on_cpu_ns, d) + '%"></div><div class="blocked" style="width:' +
      pct(s.blocked_ns, d) + '%"></div><div class="runnable" style="width:' + pct(s.runnable_ns, d) + '%"></div></div>' +
      '<p>on-CPU ' + ns(s.on_cpu_ns) + ', blocked ' + ns(s.blocked_ns) + ', runnable ' + ns(s.runnable_ns) + '; ' + s.samples +
      ' samples; ' + s.dropped_frames + ' frames dropped' + (s.truncated ? '; <b>truncated</b> (record buffer full)' : '') + '</p>' +
      (s.verdict !== g.verdict ? '<p><b>Verdict:</b> ' + esc(s.verdict) + '</p>' : '');
  }
  h += '<div class="legend"><span><i class="oncpu"></i>traced call (exact wall time; on-CPU unless a blocked frame or the split says otherwise)</span><span><i class="sampled"></i>sampled frame (~, estimated)</span>' +
    '<span><i class="blocked"></i>blocked (off-CPU)</span><span><i class="runnable"></i>runnable (waiting for a CPU)</span>' +
    (tree.some((n) => n.kind === 'waker') ? '<span><i class="waker"></i>waker (who ended the blocked time; its samples meanwhile)</span>' : '') + '</div>';
  h += flameChart(tree);
  if (s && s.blocking_stacks && s.blocking_stacks.length) {
    h += '<h3>Where it blocked</h3><pre>' + s.blocking_stacks.map((b) => ns(b.ns) + '  ' + esc(b.stack.join(' <- '))).join('\n') + '</pre>';
  }
  if (s && s.wakers && s.wakers.length) {
    h += '<h3>Who woke it</h3><table class="wakers"><thead><tr><th>waker</th><th>kind</th><th class="num">blocked</th><th class="num">waker on-CPU</th><th>waker stack</th></tr></thead><tbody>' +
      s.wakers.map((w) => '<tr><td>' + (w.comm ? esc(w.comm) + ' (tid ' + w.tid + ', pid ' + w.pid + ')' : 'interrupt') + '</td><td>' + esc(w.kind) +
        (w.label ? ', ' + esc(w.label) : '') + (w.function ? ' in ' + esc(w.function) : '') + '</td><td class="num">' +
        ns(w.blocked_ns) + '</td><td class="num">' + ns(w.waker_on_cpu_ns) + '</td><td>' + esc((w.stack || []).join(' <- ')) + '</td></tr>').join('') +
      '</tbody></table>';
  }
  box.innerHTML = h;
}

// A time-ordered flame chart: children laid out in call order from their
// parent's start, width = inclusive time.
// A traced node counts calls; a sampled leaf samples, a blocked one waits.
function count(n) {
  if (n.kind === 'traced') return n.calls + 'x, ';
  if (!n.calls || n.kind === 'waker') return '';
  const one = n.kind === 'sampled' ? 'sample' : 'wait';
  return n.calls + ' ' + one + (n.calls === 1 ? '' : 's') + ', ';
}

function flameChart(tree) {
  if (!tree.length) return '<p>no tree</p>';
  const total = Math.max(tree[0].total_ns, 1);
  const cursor = [0];
  let maxDepth = 0;
  const parts = [];
  for (const n of tree) {
    const x = cursor[n.depth] || 0;
    cursor[n.depth] = x + n.total_ns;
    cursor[n.depth + 1] = x;
    cursor.length = n.depth + 2;
    const w = pct(n.total_ns, total);
    if (w < 0.05) continue;
    maxDepth = Math.max(maxDepth, n.depth);
    const cls = n.kind === 'traced' ? 'oncpu' : n.kind;
    const hue = n.kind === 'blocked' ? '' : ';background-color:hsl(' + (20 + (hash(n.name) % 30)) + ',85%,' + (58 + (hash(n.name) % 12)) + '%)';
    parts.push('<div class="fc ' + cls + '" data-kind="' + n.kind + '" style="left:' + pct(x, total).toFixed(3) + '%;width:' + w.toFixed(3) +
      '%;top:' + n.depth * 18 + 'px' + (n.kind === 'traced' ? hue : '') + '" title="' + esc(n.name + ' (' + n.kind + '): ' + count(n) + 'total ' +
      ns(n.total_ns) + ', self ' + ns(n.self_ns)) + '">' + esc(n.name) + '</div>');
  }
  return '<div class="fchart" style="height:' + (maxDepth + 1) * 18 + 'px">' + parts.join('') + '</div>';
}
function hash(s) {
  let h = 0;
  for (let i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) >>> 0;
  return h;
}

// ---- session timeline ----------------------------------------------------
function timeline() {
  const lanes = [];
  const rect = (cls, start, dur, title, extra) => '<rect class="' + cls + '" x="' + (1000 * start / T).toFixed(2) + '" y="2" width="' +
    Math.max(1000 * dur / T, 1).toFixed(2) + '" height="16"' + (extra || '') + '><title>' + esc(title) + '</title></rect>';
  if (D.stages) {
    D.stages.scenarios.forEach((sc, i) => {
      const root = sc.stages[0];
      const starts = D.stage_runs[i] || [];
      if (!root) return;
      lanes.push(['stage ' + sc.name, starts.map((st, r) => rect('stage', st, root.per_run_ns[r] || 0, sc.name + ' run ' + (r + 1) + ': ' + ns(root.per_run_ns[r]))).join('')]);
    });
  }
  if (DJ) {
    lanes.push(['slow dispatches', DJ.slow.map((s) => rect('b-' + bucket(s.dropped_frames), s.start_ns, s.duration_ns,
      '#' + s.index + ' [' + s.key + '] ' + ns(s.duration_ns) + ', ' + s.dropped_frames + ' frames dropped', ' data-key="' + esc(s.key) + '"')).join('')]);
    lanes.push(['hangs', DJ.hangs.map((h) => rect('hang', h.start_ns, h.duration_ns == null ? T - h.start_ns : h.duration_ns,
      'hang #' + h.index + ': ' + (h.duration_ns == null ? 'still running at the end' : ns(h.duration_ns)))).join('')]);
  }
  if (!lanes.length) return;
  $('timeline-section').hidden = false;
  const f = DJ ? DJ.frames : null;
  const legend = f ? '<div class="legend">frames dropped per dispatch: ' + [['best', '<3', f.best], ['normal', '>=3', f.normal], ['middle', '>=9', f.middle],
    ['high', '>=24', f.high], ['frozen', '>=42', f.frozen]].map(([c, l, n]) => '<span><svg width="12" height="12"><rect class="b-' + c + '" width="12" height="12"/></svg> ' +
    c + ' (' + l + '): ' + n + '</span>').join('') + '</div>' : '';
  $('timeline').innerHTML = '<div class="tl">' + lanes.map(([name, rects]) => '<span class="label">' + esc(name) +
    '</span><svg class="lane" viewBox="0 0 1000 20" preserveAspectRatio="none">' + rects + '</svg>').join('') +
    '<span class="label"></span><span class="label">0 … ' + ns(D.duration_ns) + '</span></div>' + legend;
  $('timeline').addEventListener('click', (e) => {
    const r = e.target.closest('rect[data-key]');
    if (r) openGroup(groups.find((g) => g.key === r.dataset.key), true);
  });
}

// ---- function table (virtual: only the rows in view are in the DOM) -----
const F = D.functions;
const FCOL = { name: 0, binary: 1, calls: 2, total: 3, self: 4, min: 5, avg: 6, max: 7 };
const ROW = 22;
let fview = [];
let fsort = { k: 'total', desc: true };
function fapply() {
  const q = $('fsearch').value.toLowerCase();
  fview = [];
  for (let i = 0; i < F.length; i++) if (!q || F[i][0].toLowerCase().includes(q) || F[i][1].toLowerCase().includes(q)) fview.push(i);
  const c = FCOL[fsort.k];
  const sign = fsort.desc ? -1 : 1;
  fview.sort((a, b) => sign * cmp(F[a][c], F[b][c]) || cmp(F[a][0], F[b][0]));
  $('fcount').textContent = fview.length + ' of ' + F.length + ' functions';
  $('fscroll').scrollTop = 0;
  frender();
}
function frender() {
  const sc = $('fscroll');
  const first = Math.max(0, Math.floor(sc.scrollTop / ROW) - 5);
  const n = Math.ceil((sc.clientHeight || 420) / ROW) + 10;
  const rows = fview.slice(first, first + n).map((i) => {
    const f = F[i];
    return '<tr class="frow" data-calls="' + f[2] + '" data-total="' + f[3] + '"><td class="fname" title="' + esc(f[0]) + '">' + esc(f[0]) +
      '</td><td title="' + esc(f[1]) + '">' + esc(f[1].split('/').pop()) + '</td><td class="num"' + (f[8] ? ' title="and ' + f[8] + ' unfinished at the end">' + f[2] + ' (+' + f[8] + ')' : '>' + f[2]) +
      '</td><td class="num">' + ns(f[3]) + '</td><td class="num">' + ns(f[4]) + '</td><td class="num">' + ns(f[5]) + '</td><td class="num">' +
      ns(f[6]) + '</td><td class="num">' + ns(f[7]) + '</td></tr>';
  });
  const below = Math.max(0, fview.length - first - rows.length);
  $('functions').tBodies[0].innerHTML = '<tr style="height:' + first * ROW + 'px"></tr>' + rows.join('') + '<tr style="height:' + below * ROW + 'px"></tr>';
}
function setupFunctions() {
  if (!F.length) return;
  $('functions-section').hidden = false;
  const s = params().get('sort');
  if (s && s in FCOL) fsort = { k: s, desc: s !== 'name' && s !== 'binary' };
  const sort = sortable($('functions'), (k, desc) => { fsort = { k, desc }; fapply(); }, fsort);
  let pending = false;
  $('fscroll').addEventListener('scroll', () => {
    if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; frender(); }); }
  });
  $('fsearch').addEventListener('input', fapply);
  fapply();
  return sort;
}

// ---- flame graphs (inferno's SVG in a frame, loaded when scrolled to) ----
let flameShown = null;
function showFlame(id) {
  const f = D.flames.find((x) => x.id === id);
  if (!f) return;
  flameShown = id;
  document.querySelectorAll('#flame-tabs button').forEach((b) => b.classList.toggle('on', b.dataset.id === id));
  const frame = document.createElement('iframe');
  const m = /height="(\d+)"/.exec(f.svg);
  frame.style.height = (m ? +m[1] + 8 : 400) + 'px';
  frame.title = f.title;
  frame.src = URL.createObjectURL(new Blob([f.svg], { type: 'image/svg+xml' }));
  $('flame-frame').replaceChildren(frame);
}
function setupFlames() {
  if (!D.flames.length) return;
  $('flames-section').hidden = false;
  const names = { wall: 'wall-clock', cpu: 'CPU', offcpu: 'off-CPU' };
  $('flame-tabs').innerHTML = D.flames.map((f) => '<button data-id="' + f.id + '" title="' + esc(f.title) + '">' + (names[f.id] || f.id) + '</button>').join('');
  $('flame-tabs').addEventListener('click', (e) => { const b = e.target.closest('button'); if (b) showFlame(b.dataset.id); });
  const first = D.flames[0].id;
  if ('IntersectionObserver' in window) {
    const io = new IntersectionObserver((es) => {
      if (es.some((e) => e.isIntersecting)) { io.disconnect(); if (!flameShown) showFlame(first); }
    });
    io.observe($('flames-section'));
  } else showFlame(first);
}

// ---- stages, with a bar per run ------------------------------------------
function stages() {
  if (!D.stages || !D.stages.scenarios.length) return;
  $('stages-section').hidden = false;
  $('stages').innerHTML = D.stages.scenarios.map((sc) => {
    const max = Math.max(1, ...sc.stages.flatMap((s) => s.per_run_ns.map((v) => v || 0)));
    return '<h3>' + esc(sc.name) + ': ' + sc.runs + ' of ' + sc.runs_wanted + ' runs' + (sc.incomplete_run ? ' (one incomplete, not counted)' : '') + '</h3>' +
      '<table><thead><tr><th>stage</th><th class="num">avg</th><th class="num">min</th><th class="num">max</th><th>per run</th></tr></thead><tbody>' +
      sc.stages.map((s) => '<tr><td style="padding-left:' + (6 + 14 * s.depth) + 'px">' + esc(s.name) + '</td><td class="num">' +
        (s.duration_ns ? ns(s.duration_ns.avg) : '') + '</td><td class="num">' + (s.duration_ns ? ns(s.duration_ns.min) : '') + '</td><td class="num">' +
        (s.duration_ns ? ns(s.duration_ns.max) : '') + '</td><td><div class="runs">' + s.per_run_ns.map((v, r) => v == null
          ? '<div class="missing" title="run ' + (r + 1) + ': missing"></div>'
          : '<div style="height:' + Math.max(pct(v, max), 3).toFixed(1) + '%" title="run ' + (r + 1) + ': ' + ns(v) + '"></div>').join('') +
        '</div></td></tr>').join('') + '</tbody></table>' +
      (sc.overlaps.length ? '<p>Overlaps: ' + sc.overlaps.map((o) => esc(o.stage + ' starts inside ' + o.starts_inside + ' (' + o.count + 'x)')).join('; ') + '</p>' : '');
  }).join('');
}

// ---- the URL fragment: #group=KEY, #sort=calls, #gsort=max --------------
let sortFunctions = null;
function fromHash() {
  const p = params();
  const key = p.get('group');
  if (key != null) openGroup(groups.find((g) => g.key === key), false);
  const s = p.get('sort');
  if (s && s in FCOL && sortFunctions && s !== fsort.k) sortFunctions(s, s !== 'name' && s !== 'binary');
}

summary();
setupGroups();
timeline();
sortFunctions = setupFunctions();
setupFlames();
stages();
fromHash();
window.addEventListener('hashchange', fromHash);
void document.body.offsetHeight; // style and layout count in the load time
const loadMs = performance.now();
document.body.dataset.loadMs = loadMs.toFixed(1);
$('footer').textContent = 'profiler report; page ready ' + loadMs.toFixed(0) + ' ms after it began loading.';

// prerender-ray admin console. Plain DOM, no dependencies, no inline script or style (the page's CSP
// allows only this file). Every value from the API is written with textContent, never as HTML.
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const SVG = 'http://www.w3.org/2000/svg';
  const REFRESH_MS = 10000;
  const state = { session: null, view: 'overview', timer: null, explained: null, devices: null };

  // ------------------------------------------------------------------------------------ helpers

  function el(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === 'class') node.className = v;
      else if (k === 'text') node.textContent = v;
      else if (k.startsWith('data-')) node.setAttribute(k, v);
      else if (k === 'onclick') node.addEventListener('click', v);
      else node[k] = v;
    }
    for (const c of children) if (c !== null && c !== undefined) node.append(c);
    return node;
  }

  function fmtNum(n) { return n === null || n === undefined ? '-' : Number(n).toLocaleString('en-US'); }

  function fmtTime(ms) {
    if (ms === null || ms === undefined) return '-';
    return new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
  }

  function fmtAgo(ms) {
    if (ms === null || ms === undefined) return '-';
    const s = Math.round(Math.abs(ms) / 1000);
    const text = s < 120 ? `${s}s` : s < 7200 ? `${Math.round(s / 60)}m` : s < 172800 ? `${Math.round(s / 3600)}h`
      : `${Math.round(s / 86400)}d`;
    return ms >= 0 ? `in ${text}` : `${text} ago`;
  }

  function say(text, isError) {
    const m = $('message');
    m.textContent = text || '';
    m.hidden = !text;
    m.className = isError ? 'error' : '';
  }

  async function api(path, options) {
    const opts = options || {};
    const init = { method: opts.method || 'GET', credentials: 'same-origin', cache: 'no-store',
      headers: { 'accept': 'application/json', 'x-prerender-console': '1' } };
    if (opts.body !== undefined) {
      init.headers['content-type'] = 'application/json';
      init.body = JSON.stringify(opts.body);
    }
    let response;
    try {
      response = await fetch(path, init);
    } catch (e) {
      return { status: 0, ok: false, data: { error: `network error: ${e.message}` } };
    }
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    if (response.status === 401 && path !== 'login') showLogin();
    if (response.status === 429) {
      const wait = response.headers.get('retry-after') || '1';
      return { status: 429, ok: false, data: { error: `busy, retry in ${wait}s` } };
    }
    return { status: response.status, ok: response.ok, data: data || {} };
  }

  function errorOf(r) { return (r.data && r.data.error) || `HTTP ${r.status}`; }

  // -------------------------------------------------------------------------------- sessions

  function showLogin() {
    state.session = null;
    stopTimer();
    $('tabs').hidden = true;
    $('who').hidden = true;
    for (const v of ['overview', 'queue', 'explain']) $(`view-${v}`).hidden = true;
    $('view-login').hidden = false;
    $('login-username').focus();
  }

  async function loadSession() {
    const r = await api('session');
    if (!r.ok) { say(errorOf(r), true); return; }
    $('node-name').textContent = r.data.node || '';
    if (!r.data.authenticated) { showLogin(); return; }
    if (!r.data.viewer) {
      showLogin();
      $('login-error').textContent = `${r.data.username} has neither the viewer nor the admin role`;
      return;
    }
    state.session = r.data;
    document.body.classList.toggle('viewer', !r.data.admin);
    $('who-name').textContent = `${r.data.username} (${r.data.admin ? 'admin' : 'viewer'}, ${r.data.via})`;
    $('who').hidden = false;
    $('logout').hidden = r.data.via === 'loopback' || r.data.via === 'basic';
    $('tabs').hidden = false;
    $('view-login').hidden = true;
    loadDevices();
    show(state.view);
  }

  async function login(event) {
    event.preventDefault();
    $('login-error').textContent = '';
    const r = await api('login', { method: 'POST',
      body: { username: $('login-username').value, password: $('login-password').value } });
    $('login-password').value = '';
    if (!r.ok) { $('login-error').textContent = errorOf(r); return; }
    await loadSession();
  }

  async function logout() {
    await api('logout', { method: 'POST', body: {} });
    showLogin();
  }

  async function loadDevices() {
    if (state.devices) return;
    const r = await api('config');
    if (!r.ok || !r.data.config) return;
    const supported = r.data.config.device_types.supported;
    state.devices = supported;
    const select = $('explain-device');
    select.replaceChildren(el('option', { value: '', text: `default (${supported[0]})` }),
      ...supported.map((d) => el('option', { value: d, text: d })));
  }

  // ------------------------------------------------------------------------------------ views

  function show(view) {
    state.view = view;
    for (const v of ['overview', 'queue', 'explain', 'config']) {
      $(`view-${v}`).hidden = v !== view;
      $(`tab-${v}`).setAttribute('aria-current', v === view ? 'page' : 'false');
    }
    stopTimer();
    if (view === 'overview') { loadOverview(); state.timer = setInterval(loadOverview, REFRESH_MS); }
    if (view === 'queue') loadQueue();
    if (view === 'config') loadConfig();
  }

  function stopTimer() { if (state.timer) { clearInterval(state.timer); state.timer = null; } }

  function tile(label, value, id) {
    return el('div', { class: 'tile', 'data-tile': id || label },
      el('div', { class: 'label', text: label }), el('div', { class: 'value', text: value }));
  }

  // overview ------------------------------------------------------------------------------------

  async function loadOverview() {
    if (!state.session) return;
    const r = await api('overview');
    if (!r.ok) { if (r.status !== 401) say(`overview: ${errorOf(r)}`, true); return; }
    say('');
    const o = r.data;
    $('overview-generated').textContent = `as of ${fmtTime(o.generatedAt)} from ${o.node}`;
    const cluster = o.control.cluster;
    $('cluster-intent').textContent = cluster && cluster.paused === true ? `paused by ${cluster.updatedBy}`
      : cluster && cluster.paused === false ? 'running (explicit)' : 'running';
    const b = o.backlog;
    const counts = o.counts || {};
    $('tiles').replaceChildren(
      tile('Targets', fmtNum(counts.targets), 'targets'), tile('Cached pages', fmtNum(counts.pages), 'pages'),
      tile('Due now', fmtNum(b.due), 'due'), tile('In flight', fmtNum(b.inFlight), 'inFlight'),
      tile('Unclaimed', fmtNum(b.unclaimed), 'unclaimed'), tile('Due next 60 min', fmtNum(b.next60m), 'next60m'),
      tile('Due next 24 h', fmtNum(b.next24h), 'next24h'), tile('Rows held', fmtNum(b.held), 'held'));
    if (b.partial) say(`Not every node answered: ${b.unanswered.join(', ')} (their numbers are missing)`, true);
    drawHistogram($('histogram'), b.histogram);
    const body = $('nodes').tBodies[0];
    body.replaceChildren(...o.nodes.map(nodeRow));
  }

  function nodeRow(n) {
    const live = n.live || {};
    const intent = n.override ? `${n.override.paused === true ? 'paused' : 'run'} (node, by ${n.override.updatedBy})`
      : `${n.intent.paused ? 'paused' : 'running'} (${n.intent.source})`;
    const statusCell = el('td', { class: `status status-${n.status}`, text: n.status || '-' });
    statusCell.title = n.statusChangedTime ? `changed ${fmtAgo(-n.statusAgeMs)}` : '';
    const liveCell = el('td', { class: n.stale ? 'stale' : '',
      text: n.live ? `${live.status} (${live.phase})${n.stale ? ' - stale' : ''}` : 'no answer' });
    liveCell.title = n.staleReason || '';
    const rec = n.reconcile && n.reconcile.lastRun;
    const recText = n.reconcile ? (n.reconcile.running ? 'running' : rec
      ? `${fmtTime(rec.finishedAt)}: ${fmtNum(rec.restored)} restored of ${fmtNum(rec.missing)} missing` : 'never') : '-';
    const actions = el('div', { class: 'actions' },
      el('button', { type: 'button', 'data-action': 'pause', text: 'Pause', onclick: () => setPause(n.name, true) }),
      el('button', { type: 'button', 'data-action': 'run', text: 'Force run', onclick: () => setPause(n.name, false) }),
      el('button', { type: 'button', 'data-action': 'inherit', text: 'Inherit',
        disabled: !n.override, onclick: () => setPause(n.name, null) }));
    const name = el('td', {}, el('strong', { text: n.name }), n.isThisNode ? el('span', { class: 'muted', text: ' (this node)' }) : null);
    return el('tr', { 'data-node': n.name }, name, statusCell, liveCell, el('td', { class: 'intent', text: intent }),
      el('td', { class: 'num', text: fmtNum(live.due) }), el('td', { class: 'num', text: fmtNum(live.inFlight) }),
      el('td', { class: 'num', text: fmtNum(live.held) }), el('td', { text: recText }),
      el('td', { class: 'admin-only' }, actions));
  }

  function drawHistogram(host, hist) {
    const bins = [hist.overdue || 0, ...(hist.bins || [])];
    const width = Math.max(400, Math.round(host.clientWidth) - 16), height = 180, top = 12, bottom = 22, left = 4;
    const slot = (width - left) / bins.length;
    const max = Math.max(1, ...bins);
    const svg = document.createElementNS(SVG, 'svg');
    svg.setAttribute('viewBox', `0 0 ${width} ${height}`);
    svg.setAttribute('role', 'img');
    svg.setAttribute('aria-label', 'due times: overdue, then each hour of the next 24 hours');
    bins.forEach((count, i) => {
      const h = count === 0 ? 0 : Math.max(1, (height - top - bottom) * count / max);
      const rect = document.createElementNS(SVG, 'rect');
      rect.setAttribute('x', String(left + i * slot + 1));
      rect.setAttribute('y', String(height - bottom - h));
      rect.setAttribute('width', String(Math.max(1, slot - 2)));
      rect.setAttribute('height', String(h));
      rect.setAttribute('class', i === 0 ? 'bar overdue' : 'bar');
      const title = document.createElementNS(SVG, 'title');
      title.textContent = i === 0 ? `overdue: ${count}` : `hour +${i}: ${count}`;
      rect.append(title);
      svg.append(rect);
      if (i === 0 || i % 3 === 0) {
        const label = document.createElementNS(SVG, 'text');
        label.setAttribute('x', String(left + i * slot + slot / 2));
        label.setAttribute('y', String(height - 6));
        label.setAttribute('text-anchor', 'middle');
        label.textContent = i === 0 ? 'due' : `+${i}h`;
        svg.append(label);
      }
      if (count > 0) {
        const value = document.createElementNS(SVG, 'text');
        value.setAttribute('x', String(left + i * slot + slot / 2));
        value.setAttribute('y', String(height - bottom - h - 2));
        value.setAttribute('text-anchor', 'middle');
        value.textContent = String(count);
        svg.append(value);
      }
    });
    host.replaceChildren(svg);
  }

  async function setPause(scope, paused) {
    const r = await api('queue', { method: 'POST', body: { scope, paused } });
    if (!r.ok) { say(`pause ${scope}: ${errorOf(r)}`, true); return; }
    const word = paused === true ? 'paused' : paused === false ? 'forced to run' : 'inheriting the cluster';
    const text = `${scope}: ${word} (applied on ${r.data.appliedOn}; other nodes within `
      + `${Math.round(r.data.appliesRemotelyWithinMs / 1000)}s)`;
    await loadOverview();
    say(text);
  }

  // queue ----------------------------------------------------------------------------------------

  async function loadQueue() {
    const r = await api('queue-state?scope=cluster');
    if (!r.ok && r.status !== 503) { say(`queue-state: ${errorOf(r)}`, true); return; }
    const q = r.data;
    const now = q.now || {}, coming = q.coming || {};
    $('queue-generated').textContent = `as of ${fmtTime(q.generatedAt)}; ${q.complete ? 'every node answered'
      : `incomplete: ${[...(q.unanswered || []), ...(q.notLive || [])].join(', ')}`}`;
    $('queue-tiles').replaceChildren(
      tile('Due', fmtNum(now.due), 'q-due'), tile('Due (sitemap)', fmtNum(now.dueSitemap)),
      tile('Due (discovered)', fmtNum(now.dueDiscovered)), tile('In flight', fmtNum(now.inFlight)),
      tile('Unclaimed', fmtNum(now.unclaimed)), tile('Next 15 min', fmtNum(coming.next15m)),
      tile('Next 24 h', fmtNum(coming.next24h)), tile('Exact', q.trust && q.trust.exact ? 'yes' : 'no'));
    const rows = Object.entries(q.nodes || {}).map(([name, n]) => el('tr', { 'data-node': name },
      el('td', { text: name }), el('td', { text: n.answered ? 'yes' : 'no' }), el('td', { text: n.phase || '-' }),
      el('td', { class: `status-${n.status}`, text: n.status || '-' }),
      el('td', { text: n.exact === undefined || n.exact === null ? '-' : n.exact ? 'yes' : 'no' }),
      el('td', { text: n.error || '' })));
    $('queue-nodes').tBodies[0].replaceChildren(...rows);
  }

  // config ---------------------------------------------------------------------------------------

  async function loadConfig() {
    const r = await api('config');
    if (!r.ok) { say(`config: ${errorOf(r)}`, true); return; }
    const c = r.data;
    const ov = c.overrides;
    $('config-generated').textContent = `effective config of ${c.node}`;
    $('config-live').textContent = ov.enabled
      ? `Changed on every node without a restart: ${ov.livePaths.join(', ')}. Everything else: edit the file and restart.`
      : 'Live overrides are disabled (management.overrides.enabled: false).';
    const select = $('override-path');
    if (select.options.length !== ov.livePaths.length) {
      select.replaceChildren(...ov.livePaths.map((p) => el('option', { value: p, text: p })));
    }
    $('overrides').tBodies[0].replaceChildren(...ov.rows.map((row) => el('tr', { 'data-override': row.path },
      el('td', { text: row.path }), el('td', {}, el('code', { text: JSON.stringify(row.value) })),
      el('td', { text: row.updatedBy || '-' }), el('td', { text: fmtTime(row.updatedTime) }),
      el('td', { text: row.note || '' }),
      el('td', { class: 'admin-only' }, el('button', { type: 'button', 'data-action': 'clear', text: 'Clear',
        onclick: () => sendOverride({ clear: [row.path] }) })))));
    $('config-warnings').replaceChildren(...c.warnings.map((w) => el('li', { text: `${w.key}: ${w.message}` })));
  }

  async function sendOverride(body) {
    const r = await api('config-override', { method: 'POST', body });
    const out = $('override-result');
    out.hidden = false;
    out.textContent = JSON.stringify(r.data, null, 2);
    if (r.ok && r.data.applied) say(`written: ${r.data.changes.map((x) => x.path).join(', ') || 'no change'}`);
    else if (!r.ok) say(`config-override: ${errorOf(r)}`, true);
    else say('dry run: nothing written');
    loadConfig();
  }

  function overrideFromForm(dryRun) {
    let value;
    try {
      value = JSON.parse($('override-value').value);
    } catch (e) {
      say(`the value is not JSON: ${e.message}`, true);
      return;
    }
    const entry = { path: $('override-path').value, value };
    const note = $('override-note').value.trim();
    if (note) entry.note = note;
    sendOverride({ set: [entry], dryRun });
  }

  // explain --------------------------------------------------------------------------------------

  function fact(dl, label, value, id) {
    dl.append(el('dt', { text: label }), el('dd', { text: value, 'data-fact': id || label }));
  }

  async function explain(event) {
    if (event) event.preventDefault();
    $('explain-error').textContent = '';
    const body = { url: $('explain-url').value.trim() };
    if ($('explain-device').value) body.deviceType = $('explain-device').value;
    const r = await api('explain', { method: 'POST', body });
    if (!r.ok) { $('explain-result').hidden = true; $('explain-error').textContent = errorOf(r); return; }
    state.explained = body;
    renderExplain(r.data);
  }

  function renderExplain(x) {
    const dl = $('explain-facts');
    dl.replaceChildren();
    const route = x.ingress.route;
    fact(dl, 'Canonical URL', x.resolved.canonicalUrl, 'canonicalUrl');
    fact(dl, 'Cache key', x.resolved.cacheKey, 'cacheKey');
    fact(dl, 'Device', `${x.resolved.deviceType}${x.resolved.deviceTypeFellBack ? ' (fell back)' : ''}`, 'device');
    fact(dl, 'Route', `${x.ingress.routeClass}${route ? ` - ${route.match} ${route.path} (${route.source})` : ''}`, 'route');
    fact(dl, 'Query allowlist', `${x.allowlist.used.join(', ') || '(none)'} from ${x.allowlist.source}`, 'allowlist');
    fact(dl, 'Key under the global allowlist', `${x.underGlobalAllowlist.cacheKey}${x.underGlobalAllowlist.differs
      ? ' - DIFFERS (route problem?)' : ' - same'}`, 'globalKey');
    const el_ = x.eligibility;
    fact(dl, 'Eligible', `${el_.prerendered ? 'prerendered' : 'not prerendered'}${el_.excludedByPattern
      ? `, excluded by ${el_.excludedByPattern}` : ''}${el_.domainAllowed ? '' : ', host not in domains'}`, 'eligible');
    const t = x.rows.renderTarget;
    fact(dl, 'Target', t ? `${t.state || 'active'}; sitemap ${t.sitemapUrl || '-'}; interval ${fmtNum(t.renderInterval)} ms`
      : 'none', 'target');
    const s = x.rows.renderSchedule;
    fact(dl, 'Schedule', s ? `next render ${fmtTime(s.nextRenderTime)} (${fmtAgo(s.dueInMs)})${s.leased ? ', rendering now' : ''}`
      : 'no row', 'schedule');
    const res = x.residency;
    fact(dl, 'Schedule owner', `${res.scheduleOwnedBy}; read from ${res.scheduleSource}; ${res.scheduleAuthoritative
      ? 'authoritative' : `NOT authoritative${res.peerError ? `: ${res.peerError}` : ''}`}`, 'owner');
    const p = x.rows.prerenderedPage;
    fact(dl, 'Cached page', p ? `HTTP ${p.statusCode}, cached ${fmtTime(p.lastCached)}, expires ${fmtTime(p.expiresAt)} - ${p.fresh
      ? 'fresh' : p.inStaleWhileRevalidate ? 'stale (served while revalidating)' : 'expired'}` : 'none', 'page');
    const sup = x.rows.suppression;
    if (sup) fact(dl, 'Suppressed', `${sup.reason}, strike ${sup.strikes} of ${sup.maxStrikes}`, 'suppressed');
    fact(dl, 'Verdict', `would serve from ${x.verdict.wouldServe}; ${x.verdict.scheduled ? 'scheduled' : 'not scheduled'}; ${x.verdict.recurring
      ? 'recurring' : 'not recurring'}${x.verdict.reliable ? '' : '; some reads failed'}`, 'verdict');
    $('explain-raw').textContent = JSON.stringify(x, null, 2);
    $('explain-message').textContent = '';
    $('explain-result').hidden = false;
  }

  async function renderNow() {
    if (!state.explained) return;
    const r = await api('revalidate', { method: 'POST', body: state.explained });
    if (!r.ok) { $('explain-message').textContent = errorOf(r); return; }
    await explain();
    $('explain-message').textContent = `due now on ${r.data.scheduleOwnedBy} (${r.data.cacheKeys.length} key(s))`;
  }

  // ------------------------------------------------------------------------------------ wiring

  document.addEventListener('DOMContentLoaded', () => {
    $('login-form').addEventListener('submit', login);
    $('logout').addEventListener('click', logout);
    for (const b of document.querySelectorAll('.tab')) b.addEventListener('click', () => show(b.dataset.view));
    $('overview-refresh').addEventListener('click', loadOverview);
    $('queue-refresh').addEventListener('click', loadQueue);
    $('cluster-pause').addEventListener('click', () => setPause('all', true));
    $('cluster-resume').addEventListener('click', () => setPause('all', false));
    $('explain-form').addEventListener('submit', explain);
    $('config-refresh').addEventListener('click', loadConfig);
    $('override-dry').addEventListener('click', () => overrideFromForm(true));
    $('override-form').addEventListener('submit', (event) => { event.preventDefault(); overrideFromForm(false); });
    $('render-now').addEventListener('click', renderNow);
    loadSession();
  });
}());

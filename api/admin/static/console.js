// prerender-ray admin console. Plain DOM, no dependencies, no inline script or style (the page's CSP
// allows only this file). Every value from the API is written with textContent, never as HTML.
'use strict';

(function () {
  const $ = (id) => document.getElementById(id);
  const SVG = 'http://www.w3.org/2000/svg';
  const REFRESH_MS = 10000;
  const VIEWS = ['overview', 'queue', 'explain', 'sitemaps', 'pages', 'bots', 'config'];
  const state = { session: null, view: 'overview', timer: null, explained: null, devices: null,
    sitemap: null, pages: null };

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

  const BUSY_RETRIES = 4;

  function sleep(ms) { return new Promise((resolve) => setTimeout(resolve, ms)); }

  function retryAfterMs(response) {
    const s = Number(response.headers.get('retry-after'));
    return Number.isFinite(s) && s > 0 ? Math.min(s, 5) * 1000 : 1000;
  }

  // A read refused as busy (the replica's heavy-read slots are all taken, e.g. by the overview still
  // loading when a tab is switched) is asked again after Retry-After, a bounded number of times.
  async function send(path, init) {
    for (let attempt = 0; ; attempt += 1) {
      const response = await fetch(path, init);
      if (response.status !== 429 || init.method !== 'GET' || attempt >= BUSY_RETRIES) return response;
      await sleep(retryAfterMs(response));
    }
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
      response = await send(path, init);
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
    for (const v of VIEWS) $(`view-${v}`).hidden = true;
    forgetData();
    $('view-login').hidden = false;
    $('login-username').focus();
  }

  // What the last user saw must not linger in the page (hidden is not gone) for the next one.
  function forgetData() {
    for (const id of ['nodes', 'queue-nodes', 'sitemaps', 'sitemap-entries', 'pages', 'overrides', 'config-values',
      'explain-history', 'robots', 'bot-policies', 'bot-missed', 'bot-classes', 'bot-outcomes']) {
      $(id).tBodies[0].replaceChildren();
    }
    for (const id of ['explain-facts', 'sitemap-facts', 'tiles', 'queue-tiles', 'config-warnings', 'explain-reports',
      'page-view-reports']) $(id).replaceChildren();
    for (const id of ['explain-raw', 'page-view-text', 'override-result', 'bot-facts']) $(id).textContent = '';
    for (const id of ['explain-result', 'sitemap-detail', 'page-view']) $(id).hidden = true;
    state.sitemap = null;
    state.sitemapAsk = (state.sitemapAsk || 0) + 1;
    state.pages = null;
    state.explained = null;
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
    for (const v of VIEWS) {
      $(`view-${v}`).hidden = v !== view;
      $(`tab-${v}`).setAttribute('aria-current', v === view ? 'page' : 'false');
    }
    stopTimer();
    if (view === 'overview') { loadOverview(); state.timer = setInterval(loadOverview, REFRESH_MS); }
    if (view === 'queue') loadQueue();
    if (view === 'config') loadConfig();
    if (view === 'sitemaps') loadSitemaps();
    if (view === 'bots') loadBots();
    if (view === 'pages' && !state.pages) listPages();
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

  // A node's status is its render queue's (what the fleet reads), not the node's health: "empty" beside
  // a node holding pages read as "no pages", so every status says whose it is and what it means.
  const QUEUE_MEANS = { empty: 'nothing due', queued: 'jobs due', paused: 'claims refused', unready: 'not loaded yet' };

  function queueStatus(status) {
    if (!status) return '-';
    return `queue: ${status}${QUEUE_MEANS[status] ? ` \u2014 ${QUEUE_MEANS[status]}` : ''}`;
  }

  function nodeRow(n) {
    const live = n.live || {};
    const intent = n.override ? `${n.override.paused === true ? 'paused' : 'run'} (node, by ${n.override.updatedBy})`
      : `${n.intent.paused ? 'paused' : 'running'} (${n.intent.source})`;
    const statusCell = el('td', { class: `status status-${n.status}`, text: queueStatus(n.status) });
    statusCell.title = n.statusChangedTime ? `changed ${fmtAgo(-n.statusAgeMs)}` : '';
    const liveCell = el('td', { class: n.stale ? 'stale' : '',
      text: n.live ? `${queueStatus(live.status)} (${live.phase})${n.stale ? ' - stale' : ''}` : 'no answer' });
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
      el('td', { class: `status-${n.status}`, text: queueStatus(n.status) }),
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
    if (!ov.rows.length) {
      $('overrides').tBodies[0].append(el('tr', {}, el('td', { colSpan: 6, class: 'muted', text: 'No live override in force.' })));
    }
    $('config-warnings').replaceChildren(...c.warnings.map((w) => el('li', { text: `${w.key}: ${w.message}` })));
    const rows = [];
    flatten(c.config, '', rows);
    $('config-values').tBodies[0].replaceChildren(...rows.map(([path, value]) => el('tr', { 'data-option': path },
      el('td', { class: 'key', text: path }), el('td', {}, el('code', { text: shown(value) })))));
    filterConfig();
  }

  // Dotted snake_case paths, as the API sends them and as the README's config reference names them.
  // Lists stay one value (routes, users), shown as JSON.
  function flatten(value, path, out) {
    if (value !== null && typeof value === 'object' && !Array.isArray(value) && Object.keys(value).length) {
      for (const [k, v] of Object.entries(value)) flatten(v, path ? `${path}.${k}` : k, out);
    } else {
      out.push([path, value]);
    }
  }

  function shown(value) { return typeof value === 'string' && value !== '' ? value : JSON.stringify(value); }

  function filterConfig() {
    const needle = $('config-filter').value.trim().toLowerCase();
    for (const row of $('config-values').tBodies[0].rows) {
      row.hidden = needle !== '' && !row.textContent.toLowerCase().includes(needle);
    }
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

  // sitemaps -------------------------------------------------------------------------------------

  function runText(run) {
    if (!run) return 'never';
    const when = run.finishedAt ? `finished ${fmtTime(run.finishedAt)}` : run.startedAt ? `started ${fmtTime(run.startedAt)}` : '';
    return `${run.state || '?'}${run.trigger ? ` (${run.trigger})` : ''}${run.node ? ` on ${run.node}` : ''}`
      + `${when ? `, ${when}` : ''}${run.error ? ` - ${run.error}` : ''}`;
  }

  function progressText(run) {
    if (!run) return '-';
    return `${fmtNum(run.sitemapsProcessed)} of ${fmtNum(run.sitemapsDiscovered)} sitemaps; `
      + `${fmtNum(run.created)} created, ${fmtNum(run.updated)} updated, ${fmtNum(run.removed)} removed`;
  }

  async function loadSitemaps() {
    const r = await api('sitemaps');
    if (!r.ok) { if (r.status !== 401) say(`sitemaps: ${errorOf(r)}`, true); return; }
    const d = r.data;
    $('sitemaps-generated').textContent = `from ${d.node}; last refresh of all roots: ${runText(d.lastFullPass)}`;
    const open = state.sitemap && state.sitemap.url;
    $('sitemaps').tBodies[0].replaceChildren(...d.sitemaps.map((s) => el('tr',
      { 'data-sitemap': s.url, class: s.url === open ? 'selected' : '' },
      el('td', {}, el('button', { type: 'button', class: 'link', text: s.url, onclick: () => openSitemap(s.url, 0) })),
      el('td', { text: s.isIndex ? 'index' : 'urlset' }), el('td', { class: 'num', text: fmtNum(s.entryCount) }),
      el('td', { text: fmtTime(s.lastRefreshed) }), el('td', { class: 'run', text: runText(s.refresh) }),
      el('td', { text: progressText(s.refresh) }))));
    $('sitemaps-empty').hidden = d.sitemaps.length > 0;
    loadRobots();
  }

  // The stored robots.txt of each domain (never fetched from here), and the bots served although it
  // disallows them.
  async function loadRobots() {
    const r = await api('robots');
    if (!r.ok) { if (r.status !== 401) say(`robots: ${errorOf(r)}`, true); return; }
    const rows = r.data.domains || [];
    $('robots').tBodies[0].replaceChildren(...rows.map((d) => {
      const b = d.robots || {};
      const conflicts = (b.conflicts || []).map((c) => c.bot);
      const size = `${fmtNum(b.size)} bytes${b.truncated ? ' (cut)' : ''}`;
      const state = `${b.state || '?'}${b.status ? ` (${b.status})` : ''}${b.error ? ` - ${b.error}` : ''}`;
      return el('tr', {},
        el('td', { class: 'mono', text: d.domain }), el('td', { text: state }),
        el('td', { text: fmtTime(b.fetchedAt) }), el('td', { class: 'num', text: size }),
        el('td', { text: `${fmtNum((b.sitemaps || []).length)} walked, ${fmtNum(b.sitemapsIgnoredCount)} ignored` }),
        el('td', { text: conflicts.length ? conflicts.join(', ') : 'none' }),
        el('td', { text: signalsText(b.contentSignals) }));
    }));
    $('robots-empty').hidden = rows.length > 0;
  }

  // What a site declares (Content-Signal, Content-Usage) per class, and what the class is served there.
  function signalsText(s) {
    if (!s || !(s.classes || []).some((c) => c.declared)) return 'none declared';
    const parts = s.classes.filter((c) => c.declared).map((c) => `${c.signal}=${c.declared}: ${c.class} ${c.effective}`);
    return parts.join(', ') + (s.applyAsDefaults ? '' : ' (not applied)');
  }

  // bots ----------------------------------------------------------------------------------------

  // The policies in force and the pages bots asked for without a cached one: every ingress replica's
  // tallies of every node, merged by the route; the ones that did not answer are named.
  async function loadBots() {
    const r = await api('bots');
    if (!r.ok) { if (r.status !== 401) say(`bots: ${errorOf(r)}`, true); return; }
    const d = r.data;
    const missing = Object.entries(d.replicas || {}).filter(([, why]) => why).map(([name, why]) => `${name} (${why})`);
    $('bots-generated').textContent = `merged from ${fmtNum(d.answered)} of ${fmtNum(d.asked)} ingress replicas, `
      + `all nodes${missing.length ? `; not included: ${missing.join(', ')}` : ''}`;
    const p = d.policies;
    const rows = [...Object.entries(p.classes).map(([c, x]) => [c, `class ${c}`, x]),
      ...Object.entries(p.named).map(([n, x]) => [n, n, x])];
    $('bot-policies').tBodies[0].replaceChildren(...rows.map(([id, who, x]) => el('tr', { 'data-policy': id },
      el('td', { text: who }), el('td', { class: 'serve', text: x.serve === 'deny' ? `deny (${p.denyStatus})` : x.serve }),
      el('td', { text: x.discover ? 'yes' : 'no' }))));
    const v = d.verification || {};
    $('bot-facts').textContent = `A claim that fails verification is served as class ${p.failedClass}. Verification `
      + (v.enabled ? `on: ${fmtNum(v.cached)} answers cached, ${fmtNum(v.pending)} pending.` : 'off (bots.verify.enabled).')
      + (d.signatureAgents ? ` Web Bot Auth: ${fmtNum(d.signatureAgents)} signature agent(s) allowed.`
        : ' Web Bot Auth off (bots.webBotAuth.agents).');
    renderClasses(d.classes);
    const missed = Object.entries(d.missed || {}).flatMap(([c, urls]) => urls.map((m) => [c, m]));
    $('bot-missed').tBodies[0].replaceChildren(...missed.map(([c, m]) => el('tr', { 'data-class': c },
      el('td', { text: c }), el('td', { class: 'mono', text: m.url }), el('td', { class: 'num', text: fmtNum(m.count) }),
      el('td', { text: fmtTime(m.firstMs) }), el('td', { text: fmtTime(m.lastMs) }), el('td', { text: m.lastBot || '-' }))));
    $('bot-missed-empty').hidden = missed.length > 0;
  }

  // "verified 3, unchecked 2": the non-zero counts of a breakdown, in the route's order.
  function breakdown(counts) {
    const parts = Object.entries(counts || {}).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${fmtNum(n)}`);
    return parts.length ? parts.join(', ') : '-';
  }

  // Per class (class_stats.py, added up over the replicas): serves by verification state and method,
  // Markdown answers, misses; then every non-zero verification outcome, one row per reason.
  function renderClasses(classes) {
    const rows = Object.entries(classes || {});
    $('bot-classes').tBodies[0].replaceChildren(...rows.map(([c, x]) => el('tr', { 'data-bot-class': c },
      el('td', { text: c }), el('td', { class: 'num serves', text: fmtNum(x.serves) }),
      el('td', { class: 'verification', text: breakdown(x.verification) }),
      el('td', { class: 'method', text: breakdown(x.method) }),
      el('td', { class: 'num markdown', text: fmtNum(x.markdown) }),
      el('td', { class: 'num misses', text: fmtNum(x.misses) }))));
    const outcomes = rows.flatMap(([c, x]) => Object.entries(x.outcomes || {}).flatMap(([m, reasons]) =>
      Object.entries(reasons || {}).filter(([, n]) => n > 0).map(([why, n]) => [c, m, why, n])));
    $('bot-outcomes').tBodies[0].replaceChildren(...outcomes.map(([c, m, why, n]) => el('tr',
      { 'data-outcome': `${c}/${m}/${why}` }, el('td', { text: c }), el('td', { text: m }),
      el('td', { text: why }), el('td', { class: 'num', text: fmtNum(n) }))));
    $('bot-outcomes-empty').hidden = outcomes.length > 0;
  }

  async function openSitemap(url, offset) {
    $('sitemap-error').textContent = '';
    const ask = state.sitemapAsk = (state.sitemapAsk || 0) + 1;
    const r = await api('sitemap', { method: 'POST', body: { url, offset } });
    if (ask !== state.sitemapAsk) return;  // a newer one was asked for meanwhile
    if (!r.ok) { if (r.status !== 401) $('sitemap-error').textContent = `${url}: ${errorOf(r)}`; return; }
    const d = r.data;
    state.sitemap = { url, offset: d.offset, limit: d.limit, nextOffset: d.nextOffset };
    for (const row of $('sitemaps').tBodies[0].rows) row.classList.toggle('selected', row.dataset.sitemap === url);
    const s = d.sitemap;
    $('sitemap-url').textContent = url;
    const dl = $('sitemap-facts');
    dl.replaceChildren();
    fact(dl, 'Kind', s.isIndex ? 'sitemap index' : 'urlset', 'kind');
    fact(dl, 'Entries', fmtNum(s.entryCount), 'entryCount');
    if (s.parentUrl) fact(dl, 'Listed in', s.parentUrl, 'parent');
    if (s.finalUrl && s.finalUrl !== url) fact(dl, 'Fetched from', s.finalUrl, 'finalUrl');
    fact(dl, 'Last refreshed', fmtTime(s.lastRefreshed), 'lastRefreshed');
    fact(dl, 'Size', `${fmtNum(s.bytes)} bytes${s.compressed ? ' (compressed)' : ''}`, 'bytes');
    fact(dl, 'Render targets', d.targetCount ? fmtNum(d.targetCount.count) : s.isIndex ? '- (an index lists sitemaps)' : 'unknown',
      'targetCount');
    fact(dl, 'Last run', runText(d.refresh), 'run');
    if (d.refresh) fact(dl, 'Progress', progressText(d.refresh), 'progress');
    if (d.degraded) fact(dl, 'Incomplete', d.degraded.join('; '), 'degraded');
    $('sitemap-entries').tBodies[0].replaceChildren(...d.entries.map((e, i) => {
      const st = s.isIndex ? 'sitemap' : e.state || 'unknown';
      const loc = s.isIndex && typeof e.loc === 'string'
        ? el('button', { type: 'button', class: 'link', text: e.loc, onclick: () => openSitemap(e.loc, 0) })
        : el('span', { class: 'mono', text: e.loc === null || e.loc === undefined ? '(no loc)' : String(e.loc) });
      return el('tr', { 'data-entry': String(d.offset + i) },
        el('td', { class: 'num', text: fmtNum(d.offset + i + 1) }), el('td', {}, loc),
        el('td', { class: `state state-${st.replace(/ /g, '-')}`, text: s.isIndex ? 'child sitemap' : e.state || 'unknown' }),
        el('td', { text: e.nextRenderTime ? `${e.stateDetail || ''}; first render due ${fmtAgo(e.nextRenderTime - Date.now())}`
          : e.stateDetail || '' }), el('td', { text: e.lastmod || '' }),
        el('td', { text: e.changefreq || '' }), el('td', { text: e.priority === null || e.priority === undefined ? '' : String(e.priority) }));
    }));
    const last = d.offset + d.entries.length;
    $('sitemap-range').textContent = d.entries.length
      ? `entries ${fmtNum(d.offset + 1)}-${fmtNum(last)} of ${fmtNum(s.entryCount)}` : `no entries from ${fmtNum(d.offset + 1)}`;
    $('sitemap-prev').disabled = d.offset === 0;
    $('sitemap-next').disabled = d.nextOffset === null || d.nextOffset === undefined;
    $('sitemap-detail').hidden = false;
  }

  function pageSitemap(step) {
    const s = state.sitemap;
    if (!s) return;
    if (step > 0 && s.nextOffset !== null && s.nextOffset !== undefined) openSitemap(s.url, s.nextOffset);
    if (step < 0) openSitemap(s.url, Math.max(0, s.offset - s.limit));
  }

  // pages ----------------------------------------------------------------------------------------

  function freshness(p) {
    if (p.error) return ['unreadable', 'expired'];
    return p.fresh ? ['fresh', 'fresh'] : p.inStaleWhileRevalidate ? ['stale (served while revalidating)', 'stale']
      : ['expired', 'expired'];
  }

  function listPages(event) {
    if (event) event.preventDefault();
    state.pages = { prefix: $('pages-prefix').value, cursor: null, nextCursor: null, shown: 0 };
    $('pages-next').disabled = true;
    loadPages();
  }

  async function loadPages() {
    const p = state.pages;
    $('pages-error').textContent = '';
    const q = new URLSearchParams({ prefix: p.prefix });
    if (p.cursor) q.set('cursor', p.cursor);
    const r = await api(`pages?${q}`);
    if (state.pages !== p) return;  // a newer listing was asked for meanwhile
    if (!r.ok) { if (r.status !== 401) $('pages-error').textContent = errorOf(r); return; }
    const d = r.data;
    const first = p.shown;
    p.shown += d.pages.length;
    p.nextCursor = d.nextCursor;
    $('pages-next').disabled = !d.nextCursor;
    const range = p.shown === first + 1 ? `page ${fmtNum(p.shown)}` : `pages ${fmtNum(first + 1)}-${fmtNum(p.shown)}`;
    const where = `under "${d.prefix || '(any)'}" on ${d.node}`;
    $('pages-summary').textContent = d.pages.length
      ? `${range} ${where}${d.truncated ? ', more follow' : ''}; ${fmtNum(d.total)} cached pages on this node in all`
      : `no cached page ${where}`;
    $('pages').tBodies[0].replaceChildren(...d.pages.map((pg) => {
      const [word, cls] = freshness(pg);
      return el('tr', { 'data-page': pg.cacheKey },
        el('td', { class: 'key', text: pg.cacheKey }), el('td', { text: pg.deviceType || '-' }),
        el('td', { class: 'num', text: pg.statusCode === undefined ? '-' : String(pg.statusCode) }),
        el('td', { text: fmtTime(pg.lastCached) }), el('td', { text: fmtTime(pg.expiresAt) }),
        el('td', { class: cls, text: pg.error ? `${word}: ${pg.error}` : word }),
        el('td', { class: 'num', text: pg.bytes === undefined ? '-' : `${fmtNum(pg.bytes)} B` }),
        el('td', {}, el('button', { type: 'button', 'data-action': 'view', text: 'View HTML',
          onclick: () => viewPage(pg.cacheKey) })));
    }));
  }

  function nextPages() {
    const p = state.pages;
    if (!p || !p.nextCursor) return;
    // a new object per request, so that an answer to an older one is recognised and dropped
    state.pages = { ...p, cursor: p.nextCursor, nextCursor: null };
    $('pages-next').disabled = true;
    loadPages();
  }

  // The stored body comes back as text/plain and goes into a <pre> as textContent: origin-influenced
  // markup must never be parsed as HTML in a page that holds an admin session.
  async function viewPage(key) {
    $('pages-error').textContent = '';
    let response;
    try {
      response = await send(`page-content?${new URLSearchParams({ cacheKey: key })}`, { method: 'GET',
        credentials: 'same-origin', cache: 'no-store',
        headers: { 'accept': 'text/plain, application/json', 'x-prerender-console': '1' } });
    } catch (e) {
      $('pages-error').textContent = `network error: ${e.message}`;
      return;
    }
    if (response.status === 401) { showLogin(); return; }
    if (!response.ok) {
      let data = null;
      try { data = await response.json(); } catch (e) { data = null; }
      $('pages-error').textContent = `${key}: ${(data && data.error) || `HTTP ${response.status}`}`;
      return;
    }
    const text = await response.text();
    $('page-view-key').textContent = key;
    const status = response.headers.get('x-page-status-code');
    $('page-view-status').textContent = `(stored HTTP ${status || '?'}, ${fmtNum(text.length)} characters)`;
    $('page-view-text').textContent = text;
    $('page-view').hidden = false;
    $('page-view').scrollIntoView();
    loadReports(key, $('page-view-reports'));
  }

  // diagnostics ----------------------------------------------------------------------------------

  function fmtMs(ms) { return ms === null || ms === undefined ? '-' : `${fmtNum(ms)} ms`; }

  function cell(v) { return v === null || v === undefined ? '-' : fmtNum(v); }

  function renderHistory(entries) {
    const rows = (entries || []).map((e) => el('tr', { 'data-history': String(e.at) },
      el('td', { text: fmtTime(e.at) }), el('td', { class: 'num', text: fmtMs(e.renderMs) }),
      el('td', { text: `${e.outcome || '-'}${e.reason ? ` (${e.reason})` : ''}` }),
      el('td', { text: e.verdict || '-' }),
      el('td', { class: 'num', text: e.statusCode === undefined ? '-' : String(e.statusCode) }),
      el('td', { class: 'num', text: cell(e.errors) }), el('td', { class: 'num', text: cell(e.blocked) }),
      el('td', { class: 'num', text: cell(e.failed) }), el('td', { class: 'num', text: cell(e.chars) }),
      el('td', { class: 'mono', text: e.worker || '-' })));
    $('explain-history').tBodies[0].replaceChildren(...rows);
    $('explain-history').hidden = !rows.length;
    $('explain-history-empty').hidden = rows.length > 0;
  }

  function listOf(title, items, line, cls) {
    if (!Array.isArray(items) || !items.length) return null;
    return [el('h4', { text: `${title} (${fmtNum(items.length)})` }),
      el('ul', { 'data-list': title }, ...items.map((it) => el('li', { class: cls ? cls(it) : '', text: line(it) })))];
  }

  function offset(ms) { return ms === null || ms === undefined ? '' : `+${fmtNum(ms)} ms `; }

  const BASE64 = /^[A-Za-z0-9+/]+={0,2}$/;

  // Every string here came from the origin's page (console text, URLs, exception messages): text
  // nodes only. The screenshot is a data: URL of base64 the server checked to be a JPEG.
  function reportBlock(r) {
    const size = r.chars === null || r.chars === undefined ? 'size not reported' : `${fmtNum(r.chars)} characters serialized`;
    const box = el('div', { class: 'report', 'data-report': String(r.at) },
      el('h3', { text: `Diagnostics of ${fmtTime(r.at)}: ${r.outcome || '-'}${r.statusCode ? `, HTTP ${r.statusCode}` : ''}, `
        + `${fmtMs(r.renderMs)}, ${size}${r.worker ? `, worker ${r.worker}` : ''}` }));
    const parts = [
      listOf('Console', r.console, (c) => `${offset(c.at)}${c.level}: ${c.text}`,
        (c) => (c.level === 'error' ? 'level-error' : 'level-warning')),
      listOf('Uncaught exceptions', r.exceptions, (x) => `${offset(x.at)}${x.message}`, () => 'level-error'),
      listOf('Failed requests', r.failedRequests, (f) => `${f.type ? `[${f.type}] ` : ''}${f.url}: ${f.error}`),
      listOf('Blocked requests', r.blockedRequests, (b) => b.url),
      listOf('Settle timeline', r.timeline, (t) => `${offset(t.at)}${t.event}${t.detail ? `: ${t.detail}` : ''}`),
    ];
    for (const p of parts) if (p) box.append(...p);
    if (!parts.some((p) => p)) box.append(el('p', { class: 'muted', text: 'No console errors or warnings, exceptions, failed or blocked requests.' }));
    const left = Object.entries(r.truncated || {}).filter(([, n]) => n > 0).map(([k, n]) => `${k} ${fmtNum(n)}`);
    if (left.length) box.append(el('p', { class: 'muted', text: `Left out (past the bounds): ${left.join(', ')}` }));
    const shot = r.screenshot;
    if (shot && typeof shot.data === 'string' && shot.type === 'image/jpeg' && BASE64.test(shot.data)) {
      box.append(el('h4', { text: `Screenshot (${fmtNum(shot.width)} x ${fmtNum(shot.height)} px)` }),
        el('img', { src: `data:image/jpeg;base64,${shot.data}`, alt: `the page as rendered at ${fmtTime(r.at)}` }));
    } else if (shot) {
      box.append(el('p', { class: 'muted', text: `Screenshot ${fmtNum(shot.width)} x ${fmtNum(shot.height)} px` }));
    }
    return box;
  }

  async function loadReports(key, box) {
    box.replaceChildren();
    box.dataset.key = key;
    const r = await api(`diagnostics?${new URLSearchParams({ cacheKey: key })}`);
    if (box.dataset.key !== key) return;  // another key was asked for meanwhile
    if (!r.ok) { if (r.status !== 401) box.append(el('p', { class: 'error', text: errorOf(r) })); return; }
    const reports = Array.isArray(r.data.reports) ? r.data.reports : [];
    if (!reports.length) {
      box.append(el('p', { class: 'muted', text: 'No diagnostics report of this key on this node (Render with diagnostics from the explainer).' }));
      return;
    }
    box.replaceChildren(...reports.map(reportBlock));
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

  function sizes(m) {
    return m ? `${fmtNum(m.textChars)} text characters, ${fmtNum(m.links)} links, ${fmtNum(m.bytes)} bytes` : '?';
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
    fact(dl, 'Cached page', p ? `HTTP ${p.statusCode}${p.location ? ` to ${p.location}` : ''}, cached ${fmtTime(p.lastCached)}, expires ${fmtTime(p.expiresAt)} - ${p.fresh
      ? 'fresh' : p.inStaleWhileRevalidate ? 'stale (served while revalidating)' : 'expired'}` : 'none', 'page');
    if (p && p.measure) fact(dl, 'Cached page size', `${sizes(p.measure)}${p.suspect ? ` (stored as ${p.suspect}: no good page to keep)` : ''}`, 'pageSize');
    const rf = x.rows.refusedRender;
    if (rf) fact(dl, 'Last refused render', `${rf.otherDevice ? `${rf.cacheKey}: ` : ''}${rf.why} at ${fmtTime(rf.at)} (${fmtNum(rf.count)} in a row): new ${sizes(rf.new)}; stored ${rf.stored
      ? sizes(rf.stored) : 'size not measured'}`, 'refused');
    const sup = x.rows.suppression;
    if (sup) fact(dl, 'Suppressed', `${sup.reason}, strike ${sup.strikes} of ${sup.maxStrikes}`, 'suppressed');
    fact(dl, 'Verdict', `would serve from ${x.verdict.wouldServe}${x.verdict.servedStatus ? ` (HTTP ${x.verdict.servedStatus})` : ''}; ${x.verdict.scheduled ? 'scheduled' : 'not scheduled'}; ${x.verdict.recurring
      ? 'recurring' : 'not recurring'}${x.verdict.reliable ? '' : '; some reads failed'}`, 'verdict');
    renderHistory(x.renderHistory);
    if (Array.isArray(x.diagnostics) && x.diagnostics.length) loadReports(x.resolved.cacheKey, $('explain-reports'));
    else { $('explain-reports').replaceChildren(); $('explain-reports').dataset.key = ''; }
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

  async function renderDiagnose() {
    if (!state.explained) return;
    const r = await api('diagnose', { method: 'POST', body: state.explained });
    if (!r.ok) { $('explain-message').textContent = errorOf(r); return; }
    await explain();
    $('explain-message').textContent = `due now on ${r.data.scheduleOwnedBy} with diagnostics${r.data.renderInFlight
      ? ' (after the render in flight)' : ''}; explain again once it rendered`;
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
    $('config-filter').addEventListener('input', filterConfig);
    $('sitemaps-refresh').addEventListener('click', loadSitemaps);
    $('bots-refresh').addEventListener('click', loadBots);
    $('sitemap-prev').addEventListener('click', () => pageSitemap(-1));
    $('sitemap-next').addEventListener('click', () => pageSitemap(1));
    $('pages-form').addEventListener('submit', listPages);
    $('pages-next').addEventListener('click', nextPages);
    $('page-view-close').addEventListener('click', () => {
      $('page-view').hidden = true;
      $('page-view-text').textContent = '';
      $('page-view-reports').replaceChildren();
    });
    $('override-dry').addEventListener('click', () => overrideFromForm(true));
    $('override-form').addEventListener('submit', (event) => { event.preventDefault(); overrideFromForm(false); });
    $('render-now').addEventListener('click', renderNow);
    $('render-diagnose').addEventListener('click', renderDiagnose);
    loadSession();
  });
}());

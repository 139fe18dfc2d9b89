"""The scripts a render runs in the page: the settle counters installed before any page script, the
settle check that serializes the document (open shadow roots as declarative shadow DOM), and the
scroll step that makes lazy sections load."""

from __future__ import annotations

# Executable script types (HTML's JavaScript MIME type essences, modules, import maps and speculation
# rules); data blocks such as application/ld+json stay.
SCRIPT_TYPES = [
    "",
    "module",
    "importmap",
    "speculationrules",
    "application/ecmascript",
    "application/javascript",
    "application/x-ecmascript",
    "application/x-javascript",
    "text/ecmascript",
    "text/javascript",
    "text/javascript1.0",
    "text/javascript1.1",
    "text/javascript1.2",
    "text/javascript1.3",
    "text/javascript1.4",
    "text/javascript1.5",
    "text/jscript",
    "text/livescript",
    "text/x-ecmascript",
    "text/x-javascript",
]

# Runs before any page script (every document of a tab): counts the page's pending short timers,
# fetch/XHR requests and inserted scripts, stylesheets and frames still loading, so settling sees work
# the moment the page starts it (a debounce, a fetch chained on another, a lazy chunk) instead of
# waiting out a long quiet window. The page's own functions are wrapped, not changed.
INIT_JS = """(() => {
  if (window.__prerenderSettle) return;
  const st = window.__prerenderSettle = {timers: new Map(), fetches: new Map(), next: 0};
  const setT = window.setTimeout, clearT = window.clearTimeout;
  window.setTimeout = function (fn, delay, ...args) {
    const ms = Number(delay) || 0;
    if (typeof fn !== 'function' || ms > %(timer_ms)d) return setT.call(this, fn, delay, ...args);
    let id;
    const wrapped = function () { st.timers.delete(id); return fn.apply(this, arguments); };
    id = setT.call(this, wrapped, delay, ...args);
    st.timers.set(id, performance.now() + ms);
    return id;
  };
  window.clearTimeout = function (id) { st.timers.delete(id); return clearT.call(this, id); };
  const start = () => {
    const id = ++st.next;
    st.fetches.set(id, performance.now());
    return () => st.fetches.delete(id);
  };
  if (window.fetch) {
    const f = window.fetch;
    window.fetch = function () {
      const done = start();
      try { const p = f.apply(this, arguments); p.then(done, done); return p; } catch (e) { done(); throw e; }
    };
  }
  const send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.send = function () {
    const done = start();
    this.addEventListener('loadend', done, {once: true});
    try { return send.apply(this, arguments); } catch (e) { done(); throw e; }
  };
  // scripts, stylesheets and frames a script inserts: pending until they load or fail
  const watch = el => {
    const loads = (el.tagName === 'SCRIPT' && el.src) || el.tagName === 'IFRAME'
      || (el.tagName === 'LINK' && /\\bstylesheet\\b/i.test(el.rel || '') && el.href);
    if (!loads) return;
    const done = start();
    el.addEventListener('load', done, {once: true});
    el.addEventListener('error', done, {once: true});
  };
  // what lazy content waits for: a page that observes intersections or listens to scrolling (auto scroll)
  st.lazy = 0;
  if (window.IntersectionObserver) {
    const observe = IntersectionObserver.prototype.observe;
    IntersectionObserver.prototype.observe = function () { st.lazy++; return observe.apply(this, arguments); };
  }
  const listen = EventTarget.prototype.addEventListener;
  EventTarget.prototype.addEventListener = function (type) {
    if ((type === 'scroll' || type === 'wheel') && (this === window || this === document)) st.lazy++;
    return listen.apply(this, arguments);
  };
  new MutationObserver(records => {
    for (const r of records) for (const n of r.addedNodes) if (n.nodeType === 1) {
      watch(n);
      if (n.firstElementChild) {
        n.querySelectorAll('script[src], link[rel~="stylesheet" i], iframe').forEach(watch);
      }
    }
  }).observe(document, {childList: true, subtree: true});
})()"""

# After network quiet: waits for the main thread to be idle, then reports what is still pending and,
# when nothing is, what the page says about itself and its serialization: a clone of the document
# without executable scripts (the live page is left alone, in case it turns out not to be settled).
CHECK_JS = """([scriptTypes, maxChars, longMs, ignoreTimers, maxShadowRoots, maxShadowDepth]) => new Promise(resolve => {
  const check = () => {
    const st = window.__prerenderSettle, now = performance.now();
    let timer = 0;
    if (st) for (const due of st.timers.values()) timer = Math.max(timer, due - now);
    const out = {
      complete: document.readyState === 'complete',
      ready: ('prerenderReady' in window) ? window.prerenderReady === true : null,
      timer: Math.max(0, timer),
      fetches: st ? Array.from(st.fetches.values()).filter(t => now - t < longMs).length : 0,
      doc: null,
    };
    const settled = out.ready === true
      || (out.ready === null && out.complete && !out.fetches && (!out.timer || ignoreTimers));
    if (settled) out.doc = describe();
    resolve(out);
  };
  const describe = () => {
    const all = (root, s) => Array.from(root.querySelectorAll(s));
    const robots = all(document, 'meta[name]')
      .filter(m => /^(robots|googlebot)$/i.test(m.getAttribute('name').trim()))
      .map(m => m.getAttribute('content') || '');
    const link = document.querySelector('link[rel~="canonical" i][href]');
    const statusMeta = document.querySelector('meta[name="prerender-status-code" i]');
    const loc = all(document, 'meta[name="prerender-header" i]').map(m => m.getAttribute('content') || '')
      .find(c => /^\\s*location\\s*:/i.test(c));
    let location = null;
    try { if (loc) location = new URL(loc.replace(/^\\s*location\\s*:/i, '').trim(), document.baseURI).href; }
    catch (e) { location = null; }
    const root = document.documentElement.cloneNode(true);
    const fragments = [root];
    // Open shadow roots become declarative shadow DOM (outerHTML drops them), their constructed
    // stylesheets as <style>; closed roots are out of a page script's reach and stay out. Bounded:
    // past maxShadowRoots, or maxShadowDepth roots deep, the rest keep their light DOM only.
    let roots = 0;
    const shadows = (live, copy, depth) => {
      const a = document.createTreeWalker(live, NodeFilter.SHOW_ELEMENT);
      const b = document.createTreeWalker(copy, NodeFilter.SHOW_ELEMENT);
      const pairs = [];
      for (let x = a.nextNode(), y = b.nextNode(); x && y; x = a.nextNode(), y = b.nextNode()) {
        const sr = x.shadowRoot;
        if (sr && sr.mode === 'open' && roots < maxShadowRoots && depth < maxShadowDepth) {
          roots++;
          pairs.push([sr, y]);
        }
      }
      for (const [sr, host] of pairs) {  // after the walk: a template inserted during it would shift it
        const t = document.createElement('template');
        t.setAttribute('shadowrootmode', 'open');
        if (sr.delegatesFocus) t.setAttribute('shadowrootdelegatesfocus', '');
        for (const n of sr.childNodes) t.content.appendChild(n.cloneNode(true));
        shadows(sr, t.content, depth + 1);
        for (const sheet of Array.from(sr.adoptedStyleSheets || []).reverse()) {
          try {
            const style = document.createElement('style');
            style.textContent = Array.from(sheet.cssRules, r => r.cssText).join('\\n');
            t.content.insertBefore(style, t.content.firstChild);
          } catch (e) { /* a sheet whose rules cannot be read */ }
        }
        fragments.push(t.content);
        host.insertBefore(t, host.firstChild);
      }
    };
    shadows(document.documentElement, root, 0);
    const types = new Set(scriptTypes);
    const preloads = 'link[rel~="modulepreload" i], link[rel~="preload" i][as="script" i]';
    for (const f of fragments) {
      for (const s of all(f, 'script')) {
        const t = (s.getAttribute('type') || '').split(';')[0].trim().toLowerCase();
        if (!s.hasAttribute('type') || types.has(t)) s.remove();
      }
      for (const l of all(f, preloads)) l.remove();
    }
    const doctype = document.doctype ? new XMLSerializer().serializeToString(document.doctype) : '';
    const html = doctype + root.outerHTML;
    return {
      url: window.location.href, robots, canonical: link ? link.href : null,
      statusMeta: statusMeta ? statusMeta.getAttribute('content') : null, location,
      chars: html.length, html: html.length <= maxChars ? html : null,
    };
  };
  if (window.requestIdleCallback) requestIdleCallback(check, {timeout: 250}); else setTimeout(check, 0);
})"""


# One scroll step: a screen down, then two frames (intersection callbacks run) or 100 ms, whichever
# comes first. In auto mode the first step does nothing on a page that watches neither scrolling nor
# intersections, or that fits the screen (null).
SCROLL_JS = """([auto]) => new Promise(resolve => {
  const el = document.scrollingElement || document.documentElement;
  const height = () => Math.max(el ? el.scrollHeight : 0, document.body ? document.body.scrollHeight : 0);
  const vh = window.innerHeight || 800;
  const st = window.__prerenderSettle;
  if (auto && (!(st && st.lazy) || height() <= vh + 1)) { resolve(null); return; }
  window.scrollBy(0, vh);
  let done = false;
  const fin = () => {
    if (done) return;
    done = true;
    const h = height();
    resolve({y: Math.round(window.scrollY), height: h, bottom: window.scrollY + vh >= h - 2,
             pending: st ? st.fetches.size : 0});
  };
  requestAnimationFrame(() => requestAnimationFrame(fin));
  setTimeout(fin, 100);
})"""

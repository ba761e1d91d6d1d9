// coordd console: a client of coordd's public REST API (/v1/) and nothing
// else. No framework and no build step: this file is the source.
//
// Views are functions of (params, signal) that render into <main>; a route
// change aborts the previous view's signal, which ends its polls and
// streams. Streams (election observe, config watch) resume from the last
// revision they saw after a reconnect. Text from the API is only ever set
// as text (never as HTML).

const main = document.getElementById('main');
const live = document.getElementById('live');
const signinButton = document.getElementById('signin');
const whoami = document.getElementById('whoami');

// The API is beside /ui/, wherever a proxy has put coordd: /coordd/ui/ →
// /coordd/v1/.
const base = location.pathname.replace(/ui\/[^]*$/, '');
const tokenKey = 'coordd.token';

// ---------- small helpers ----------

/** h builds an element: h('a', {href: '#/'}, 'text', child, [more]). */
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'class') el.className = v;
    else if (k === 'value') el.value = v;
    else if (k === 'style') el.style.cssText = v; // through the CSSOM: the CSP refuses style attributes
    else el.setAttribute(k, v === true ? '' : v);
  }
  el.append(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false).map((c) => (c instanceof Node ? c : String(c))));
  return el;
}

const sleep = (ms, signal) => new Promise((resolve) => {
  const t = setTimeout(resolve, ms);
  signal?.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

/** path turns a name with slashes into URL path segments, each escaped. */
const path = (name) => name.split('/').map(encodeURIComponent).join('/');
const q = (params) => new URLSearchParams(Object.entries(params).filter(([, v]) => v !== undefined && v !== '' && v !== null)).toString();

function ago(ts) {
  if (!ts) return '';
  const s = Math.round((Date.now() - Date.parse(ts)) / 1000);
  if (s < 0) return 'just now';
  if (s < 60) return `${s}s ago`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s ago`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m ago`;
  return `${Math.floor(s / 86400)}d ago`;
}
const when = (ts) => (ts ? h('time', { datetime: ts, title: new Date(ts).toLocaleString() }, ago(ts)) : '');

function bytes(n) {
  n = Number(n || 0);
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i ? 1 : 0)} ${units[i]}`;
}

/** pretty shows a config value: JSON indented, anything else as given. */
function pretty(value) {
  if (value === undefined || value === null) return '';
  try {
    const v = JSON.parse(value);
    if (typeof v === 'object' && v !== null) return JSON.stringify(v, null, 2);
  } catch { /* not JSON: YAML or plain text, shown as stored */ }
  return value;
}

const seconds = (d) => (d ? Number.parseFloat(d) : 0); // "30s" → 30

// ---------- the API ----------

/** APIError is a REST error: {"error":{code, status, reason, message, details}}. */
class APIError extends Error {
  constructor(status, body) {
    const e = body?.error || body;
    super(e?.message || `HTTP ${status}`);
    this.status = status;
    this.code = e?.status || '';
    this.reason = e?.reason || '';
  }
}

function headers(json) {
  const hd = {};
  const tok = sessionStorage.getItem(tokenKey);
  if (tok) hd.Authorization = `Bearer ${tok}`;
  if (json) hd['Content-Type'] = 'application/json';
  return hd;
}

async function api(route, { method = 'GET', body, signal } = {}) {
  const resp = await fetch(base + route, { method, headers: headers(body !== undefined), body: body === undefined ? undefined : JSON.stringify(body), signal });
  const text = await resp.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { message: text.trim() }; }
  if (!resp.ok) throw new APIError(resp.status, data);
  return data;
}

/** metrics reads coordd's gauges from /metrics (Prometheus text). */
async function metrics(signal) {
  const resp = await fetch(`${base}metrics`, { headers: headers(), signal });
  if (!resp.ok) {
    let body = null;
    try { body = await resp.json(); } catch { /* not JSON */ }
    throw new APIError(resp.status, body);
  }
  const out = {};
  for (const line of (await resp.text()).split('\n')) {
    const m = /^(coordd_[a-z_]+)(\{[^}]*\})? ([0-9.e+-]+)$/.exec(line);
    if (m && !m[2]) out[m[1]] = Number(m[3]);
  }
  return out;
}

/**
 * follow reads a streaming REST endpoint (one JSON object per line) until
 * signal ends, reconnecting with backoff. url() is asked again before every
 * reconnect, so it can resume from the last revision seen. A refusal that
 * retrying cannot mend (401, 403, 404, 400) ends it.
 */
async function follow(url, onResult, signal, onState) {
  let delay = 500;
  while (!signal.aborted) {
    try {
      const resp = await fetch(base + url(), { headers: headers(), signal });
      if (!resp.ok) {
        let body = null;
        try { body = await resp.json(); } catch { /* not JSON */ }
        // A stream that fails before its first message answers {"error": {...}}.
        throw new APIError(resp.status, body);
      }
      onState('live');
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
          const line = buf.slice(0, i).trim();
          buf = buf.slice(i + 1);
          if (!line) continue;
          const msg = JSON.parse(line);
          if (msg.error) throw new APIError(msg.error.code || 500, msg);
          delay = 500;
          onResult(msg.result);
        }
      }
    } catch (e) {
      if (signal.aborted) return;
      if ([400, 401, 403, 404].includes(e.status)) { onState('error', e); return; }
      onState('reconnecting', e);
    }
    await sleep(delay, signal);
    delay = Math.min(delay * 2, 5000);
  }
}

/**
 * poll runs fn now and every ms while the view lives and the tab shows. A
 * failure is shown in the area `into` (else logged) and tried again at the
 * next turn.
 */
function poll(fn, ms, signal, into) {
  let timer;
  const run = async () => {
    if (signal.aborted) return;
    if (!document.hidden) {
      try {
        await fn();
        if (into) setLive('polling');
      } catch (e) {
        if (signal.aborted) return;
        if (into) into.fail(e); else console.warn(e);
      }
    }
    if (!signal.aborted) timer = setTimeout(run, ms);
  };
  signal.addEventListener('abort', () => clearTimeout(timer), { once: true });
  run();
}

const sentence = (m) => (/[.!?]$/.test(m) ? m : `${m}.`);

/** errorBox says what went wrong in the user's words; 401 offers sign-in. */
function errorBox(e) {
  if (e.status === 401) {
    return h('div', { class: 'error', role: 'alert' },
      h('strong', {}, 'Sign in needed. '), `coordd asks for a bearer token: ${e.message}. `,
      h('button', { type: 'button', onclick: signIn }, 'Sign in'));
  }
  if (e.status === 403) {
    return h('div', { class: 'error', role: 'alert' }, h('strong', {}, 'Not allowed. '), sentence(e.message), ' Ask an operator to extend your policy, or sign in as another principal.');
  }
  const reason = e.reason ? ` (${e.reason})` : '';
  return h('div', { class: 'error', role: 'alert' }, h('strong', {}, 'Error: '), sentence(`${e.message}${reason}`));
}

/**
 * setLive says how fresh the view is: a live stream, or for views that poll
 * the time of the last answer (the view refreshes itself every few seconds).
 */
function setLive(state, e) {
  live.className = state === 'reconnecting' || state === 'error' ? 'bad' : '';
  const at = new Date().toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
  live.textContent = { live: '● live', reconnecting: `○ reconnecting… ${e?.message || ''}`, error: `○ stopped: ${e?.message || ''}`, polling: `● updated ${at}` }[state] || '';
  live.title = state === 'polling' ? 'This page asks coordd again every few seconds.' : '';
}

/**
 * area is a region of a view that is re-rendered from data; it skips the
 * render when the data did not change, so focus and scroll stay put.
 */
function area(props) {
  // Until its first answer an area says it is loading: no view paints blank.
  const el = h('div', props || {}, h('p', { class: 'muted loading', role: 'status' }, 'Loading…'));
  let last = null;
  el.show = (data, render) => {
    const key = JSON.stringify(data);
    if (key === last) return;
    last = key;
    // A render may leave out a part with null (no next page): not a child.
    el.replaceChildren(...[render(data)].flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  };
  el.fail = (e) => { last = null; el.replaceChildren(errorBox(e)); };
  return el;
}

/** confirm shows a modal dialog; resolves true when the user confirms. */
function confirmDialog(title, body, confirmLabel, { danger = true, extra } = {}) {
  return new Promise((resolve) => {
    const ok = h('button', { type: 'submit', class: danger ? 'danger' : 'primary', value: 'ok' }, confirmLabel);
    const dlg = h('dialog', { 'aria-labelledby': 'dlg-title' },
      h('form', { method: 'dialog' },
        h('h2', { id: 'dlg-title' }, title), body, extra || null,
        h('div', { class: 'actions' }, ok, h('button', { type: 'submit', value: 'cancel' }, 'Cancel'))));
    dlg.addEventListener('close', () => { dlg.remove(); resolve(dlg.returnValue === 'ok'); });
    document.body.append(dlg);
    dlg.showModal();
    ok.focus();
  });
}

function table(cols, rows, empty) {
  if (!rows.length) return h('p', { class: 'muted' }, empty);
  return h('div', { class: 'scroll' }, h('table', {},
    h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col', class: c.cls }, c.title)))),
    h('tbody', {}, rows.map((r) => h('tr', {}, cols.map((c) => h('td', { class: c.cls }, c.cell(r))))))));
}

// ---------- sign-in ----------

async function signIn() {
  const input = h('input', { type: 'password', autocomplete: 'off', 'aria-label': 'Bearer token', size: 40 });
  const body = h('div', {},
    h('p', {}, 'Paste the bearer token coordd gave your principal (the same as coordctl --token). It is kept in this tab only (sessionStorage) and sent only to this coordd.'),
    h('label', {}, 'Token', input));
  const dlg = confirmDialog('Sign in', body, 'Sign in', { danger: false });
  input.focus();
  if (await dlg) {
    if (input.value.trim()) sessionStorage.setItem(tokenKey, input.value.trim());
    else sessionStorage.removeItem(tokenKey);
    updateSignin();
    route();
  }
}

function updateSignin() {
  const signedIn = !!sessionStorage.getItem(tokenKey);
  signinButton.textContent = signedIn ? 'Sign out' : 'Sign in';
  signinButton.onclick = signedIn ? () => { sessionStorage.removeItem(tokenKey); updateSignin(); route(); } : signIn;
  whoami.textContent = '';
  // Name the principal coordd sees (or say that no policy is in force).
  api('v1/cluster:whoami').then((me) => {
    whoami.textContent = me.policy ? `signed in as ${me.principal}` : 'open: no policy';
    whoami.title = me.policy ? `groups: ${me.groups.join(', ') || 'none'}` : 'coordd runs without a policy: anyone who reaches it may do anything';
  }, (e) => { whoami.textContent = e.status === 401 ? 'not signed in' : ''; });
}

// ---------- views ----------

async function overview(_p, signal) {
  const cluster = area();
  const counts = area();
  main.replaceChildren(h('h1', { tabindex: '-1' }, 'Overview'), counts,
    h('h2', {}, 'Last half hour'), trendsArea('v1/trends', signal, 'The first sample is taken 10 s after the member starts.'), cluster);
  poll(async () => {
    try {
      const m = await metrics(signal);
      counts.show(m, () => h('div', { class: 'cards' }, [
        ['coordd_sessions', 'sessions', '#/sessions'], ['coordd_locks_held', 'locks held', '#/locks'],
        ['coordd_lock_waiters', 'waiters', '#/locks'], ['coordd_elections_with_leader', 'elections led', '#/elections'],
        ['coordd_election_candidates_waiting', 'candidates waiting', '#/elections'], ['coordd_config_namespaces', 'namespaces', '#/config'],
        ['coordd_config_watchers', 'config subscriptions', '#/config'],
      ].map(([k, l, href]) => h('a', { class: 'card', href }, h('div', { class: 'n', 'data-metric': k }, m[k] ?? '–'), h('div', { class: 'l' }, l)))));
    } catch (e) { if (!signal.aborted) counts.fail(e); }
    try {
      const st = await api('v1/cluster:status', { signal });
      cluster.show(st, renderCluster);
      setLive('polling');
    } catch (e) { if (!signal.aborted) cluster.fail(e); }
  }, 3000, signal);
}

function renderCluster(st) {
  const quota = Number(st.quotaBackendBytes || 0);
  const sizeBar = (used) => {
    if (!quota) return bytes(used);
    const pct = Math.min(100, (100 * Number(used)) / quota);
    return h('div', {}, `${bytes(used)} of ${bytes(quota)}`,
      h('div', { class: `bar ${pct > 80 ? 'bad' : pct > 60 ? 'warn' : ''}`, role: 'img', 'aria-label': `${pct.toFixed(0)}% of the quota` }, h('span', { style: `width:${pct}%` })));
  };
  return [
    h('h2', {}, 'Cluster'),
    h('p', {}, `cluster ${st.clusterId} · coordd ${st.coorddVersion || '(version unknown)'} · etcd ${st.etcdVersion} · revision ${st.revision} · raft term ${st.raftTerm}`),
    st.alarms.length ? h('div', { class: 'error', role: 'alert' }, h('strong', {}, 'Alarms: '), st.alarms.map((a) => `${a.type} on ${a.memberId}`).join(', '), '. Writes other than releases are refused until an operator frees space and disarms (coordctl cluster alarms disarm).') : h('p', {}, h('span', { class: 'badge ok' }, 'no alarms')),
    h('h2', {}, 'Members'),
    table([
      { title: 'Name', cell: (m) => [m.name || '(not started)', ' ', h('code', { class: 'muted' }, m.id)] },
      { title: 'Role', cell: (m) => h('span', { class: `badge ${m.isLeader ? 'ok' : ''}` }, m.isLeader ? 'leader' : m.isLearner ? 'learner' : 'follower') },
      { title: 'Health', cell: (m) => (!m.health ? h('span', { class: 'badge warn' }, 'never started') : m.health.stale ? h('span', { class: 'badge bad', title: m.health.error }, `down: ${m.health.error}`) : h('span', { class: 'badge ok' }, 'healthy')) },
      { title: 'Raft term', cls: 'num', cell: (m) => m.health?.raftTerm ?? '' },
      { title: 'Raft index / applied', cls: 'num hide-narrow', cell: (m) => (m.health ? `${m.health.raftIndex} / ${m.health.raftAppliedIndex}` : '') },
      { title: 'Database (vs quota)', cell: (m) => (m.health ? sizeBar(m.health.dbSizeBytes) : '') },
      { title: 'In use', cls: 'num hide-narrow', cell: (m) => (m.health ? bytes(m.health.dbSizeInUseBytes) : '') },
      { title: 'Versions', cls: 'hide-narrow', cell: (m) => (m.health ? `coordd ${m.health.coorddVersion || '?'}, etcd ${m.health.etcdVersion}` : '') },
      { title: 'Peer URLs', cls: 'hide-narrow', cell: (m) => m.peerUrls.join(' ') },
    ], st.members, 'No members (an external etcd that hides its members).'),
  ];
}

async function sessions(p, signal) {
  const list = area();
  const pageToken = p.query.get('page') || '';
  main.replaceChildren(h('h1', { tabindex: '-1' }, 'Sessions'),
    h('p', { class: 'muted' }, 'Every live session: who created it, where, its time to live and what it holds. Open one to close it.'), list);
  // Time left counts down between reads; every read resets each session's
  // deadline (a keep-alive moves it), without re-rendering the table.
  const deadlines = new Map(); // session id -> deadline (ms)
  const cells = new Map(); // session id -> its time-left cell
  const tick = () => {
    for (const [id, cell] of cells) {
      if (!cell.isConnected) { cells.delete(id); continue; }
      cell.textContent = `${Math.max(0, Math.round(((deadlines.get(id) || 0) - Date.now()) / 1000))}s`;
    }
  };
  const left = (x) => {
    const cell = h('span', { class: 'num', 'data-left': '' });
    cells.set(x.id, cell);
    return cell;
  };
  const t = setInterval(tick, 1000);
  signal.addEventListener('abort', () => clearInterval(t), { once: true });
  const holds = (s) => {
    const items = [...s.locks.map((n) => ['locks', n]), ...s.elections.map((n) => ['elections', n])];
    if (items.length === 0) return h('span', { class: 'muted' }, 'nothing');
    return [...items.slice(0, 3).flatMap(([k, n], i) => [i ? ', ' : '', h('a', { href: `#/${k}/${path(n)}` }, n)]),
      items.length > 3 ? h('a', { href: `#/sessions/${s.id}` }, ` +${items.length - 3} more`) : ''];
  };
  poll(async () => {
    // A page of 100, each with its time left and holdings (one lease read
    // per session on the server).
    const page = await api(`v1/sessions?${q({ pageSize: 100, pageToken, detailed: true })}`, { signal });
    for (const x of page.sessions) deadlines.set(x.id, Date.now() + seconds(x.remainingTtl) * 1000);
    // Re-render when the sessions or what they hold change, not when only
    // their time left does (it counts down by itself).
    const shown = page.sessions.map(({ remainingTtl, ...rest }) => rest);
    list.show({ shown, next: page.nextPageToken }, () => [
      table([
        { title: 'Session', cell: (x) => h('a', { href: `#/sessions/${x.id}` }, h('code', {}, x.id)) },
        { title: 'Owner', cell: (x) => x.owner },
        { title: 'Host', cls: 'hide-narrow', cell: (x) => x.hostname },
        { title: 'Labels', cls: 'hide-narrow', cell: (x) => Object.entries(x.labels).map(([k, v]) => h('span', { class: 'badge' }, `${k}=${v}`)) },
        { title: 'Principal', cls: 'hide-narrow', cell: (x) => x.principal },
        { title: 'TTL', cls: 'num', cell: (x) => x.ttl },
        { title: 'Time left', cls: 'num', cell: left },
        { title: 'Holds and waits', cell: holds },
        { title: 'Created', cls: 'hide-narrow', cell: (x) => when(x.createTime) },
      ], page.sessions, 'No live sessions.'),
      h('p', {}, pageToken ? h('a', { href: '#/sessions' }, '← First page') : '', pageToken && page.nextPageToken ? ' · ' : '',
        page.nextPageToken ? h('a', { href: `#/sessions?${q({ page: page.nextPageToken })}` }, 'Next page →') : ''),
    ]);
    tick();
  }, 3000, signal, list);
}

async function sessionView(p, signal) {
  const id = p.rest;
  const info = area();
  const holds = area();
  const countdown = h('span', { class: 'num', 'data-remaining': '' });
  let deadline = 0;
  const tick = () => { countdown.textContent = deadline ? `${Math.max(0, Math.round((deadline - Date.now()) / 1000))}s left` : ''; };
  const t = setInterval(tick, 1000);
  signal.addEventListener('abort', () => clearInterval(t), { once: true });
  const close = h('button', {
    type: 'button', class: 'danger', onclick: async () => {
      if (!await confirmDialog(`Close session ${id}?`, h('p', {}, 'Every lock and leadership it holds is put to its holder first (its client stops and lets go, or at most its TTL passes), then the session ends with every campaign and wait. This cannot be undone.'), 'Close session')) return;
      try { await api(`v1/sessions/${encodeURIComponent(id)}`, { method: 'DELETE' }); location.hash = '#/sessions'; } catch (e) { info.fail(e); }
    },
  }, 'Close session…');
  main.replaceChildren(h('p', {}, h('a', { href: '#/sessions' }, '← Sessions')), h('h1', { tabindex: '-1' }, `Session ${id}`), info, h('div', { class: 'actions' }, close), h('h2', {}, 'Holds and waits'), holds);
  poll(async () => {
    try {
      const { session: s } = await api(`v1/sessions/${encodeURIComponent(id)}`, { signal });
      deadline = Date.now() + seconds(s.remainingTtl) * 1000;
      tick();
      info.show(s, () => h('div', { class: 'scroll' }, h('table', {}, h('tbody', {},
        [['Owner', s.owner], ['Host', s.hostname], ['Principal', s.principal || '(none)'], ['TTL', s.ttl], ['Time to live', countdown],
          ['Labels', Object.entries(s.labels).map(([k, v]) => h('span', { class: 'badge' }, `${k}=${v}`))], ['Created', when(s.createTime)]]
          .map(([k, v]) => h('tr', {}, h('th', { scope: 'row' }, k), h('td', {}, v)))))));
      const rows = [];
      for (const name of s.locks || []) {
        const d = await api(`v1/locks/${path(name)}?${q({ pageSize: 1000 })}`, { signal });
        for (const e of d.holders.filter((x) => x.sessionId === id)) rows.push({ kind: 'lock', name, state: e.read ? 'holds (read)' : 'holds', token: e.token, since: e.grantTime });
        for (const e of d.waiters.filter((x) => x.sessionId === id)) rows.push({ kind: 'lock', name, state: `waits (${d.waiters.indexOf(e) + 1} in line)`, token: e.token, since: e.enqueueTime });
      }
      for (const name of s.elections || []) {
        const l = await api(`v1/elections:leader?${q({ name })}`, { signal }).catch(() => null);
        const leads = l?.leader?.sessionId === id;
        rows.push({ kind: 'election', name, state: leads ? 'leads' : 'campaigns', token: leads ? l.leader.term : '', since: leads ? l.leader.since : '' });
      }
      holds.show(rows, () => table([
        { title: 'Kind', cell: (r) => r.kind },
        { title: 'Name', cell: (r) => h('a', { href: `#/${r.kind === 'lock' ? 'locks' : 'elections'}/${path(r.name)}` }, r.name) },
        { title: 'State', cell: (r) => r.state },
        { title: 'Token / term', cls: 'num', cell: (r) => r.token },
        { title: 'Since', cell: (r) => when(r.since) },
      ], rows, 'It holds no lock and takes part in no election.'));
      setLive('polling');
    } catch (e) { if (!signal.aborted) { deadline = 0; info.fail(e); } }
  }, 2000, signal);
}

/** names is a browsable list of lock or election names under a prefix. */
function names(kind, p, signal) {
  const prefix = p.query.get('prefix') || '';
  const list = area();
  const input = h('input', { type: 'search', name: 'prefix', value: prefix, placeholder: 'orders/', 'aria-label': 'Name prefix' });
  const form = h('form', { class: 'inline', role: 'search', onsubmit: (ev) => { ev.preventDefault(); location.hash = `#/${kind}?${q({ prefix: input.value })}`; } },
    h('label', {}, 'Prefix', input), h('button', { type: 'submit' }, 'Browse'));
  const title = kind === 'locks' ? 'Locks' : 'Elections';
  main.replaceChildren(h('h1', { tabindex: '-1' }, title), form, list);
  let pageToken = p.query.get('page') || '';
  poll(async () => {
    const page = await api(`v1/${kind}?${q({ prefix, pageSize: 100, pageToken })}`, { signal });
    list.show(page, () => [
      table([{ title: 'Name', cell: (n) => h('a', { href: `#/${kind}/${path(n)}` }, n) }], page.names,
        kind === 'locks' ? 'No lock is held or waited for under this prefix.' : 'No election has a leader or candidates under this prefix.'),
      page.nextPageToken ? h('p', {}, h('a', { href: `#/${kind}?${q({ prefix, page: page.nextPageToken })}` }, 'Next page →')) : null,
    ]);
  }, 3000, signal, list);
}

const historyNames = {
  HISTORY_EVENT_TYPE_GRANTED: 'granted', HISTORY_EVENT_TYPE_RELEASED: 'released', HISTORY_EVENT_TYPE_EXPIRED: 'expired',
  HISTORY_EVENT_TYPE_SESSION_CLOSED: 'session closed', HISTORY_EVENT_TYPE_ELECTED: 'elected', HISTORY_EVENT_TYPE_RESIGNED: 'resigned',
  HISTORY_EVENT_TYPE_REMOVED: 'removed', HISTORY_EVENT_TYPE_GAP: 'not recorded',
};

/**
 * historyArea is a lock's or election's grant history, newest first: who
 * held it, with which token, and why each grant ended. It asks again
 * every 5 s (events are recorded a moment after they happen).
 */
function historyArea(kind, name, signal) {
  const el = area({ class: 'history' });
  const load = async () => {
    try {
      const r = await api(`v1/${kind}:history?${q({ name, newestFirst: true, pageSize: 50 })}`, { signal });
      el.show(r.events || [], (evs) => table([
        { title: 'When', cell: (e) => when(e.time) },
        { title: 'Event', cell: (e) => h('span', { 'data-type': e.type }, historyNames[e.type] || e.type) },
        { title: kind === 'locks' ? 'Token' : 'Term', cls: 'num', cell: (e) => (e.token && e.token !== '0' ? h('code', {}, e.token) : '') },
        { title: 'Owner', cell: (e) => [e.owner || '', e.hostname ? h('span', { class: 'muted' }, ` @ ${e.hostname}`) : ''] },
        { title: 'Session', cls: 'hide-narrow', cell: (e) => (e.sessionId ? h('code', {}, e.sessionId) : '') },
        { title: 'Detail', cell: (e) => (e.type === 'HISTORY_EVENT_TYPE_GAP' ? `revisions ${e.fromRevision}–${e.revision}: ${e.reason}`
          : [e.reason || '', e.held ? ` · held ${e.held}` : '', e.handedFrom && e.handedFrom !== '0' ? `handed over from ${e.handedFrom}` : '',
            e.waited ? ` · waited ${e.waited}` : ''].filter(Boolean).join('')) },
      ], evs, 'Nothing recorded yet (kept 7 days by default).'));
    } catch (e) { if (!signal.aborted) el.fail(e); }
  };
  poll(load, 5000, signal);
  return el;
}

// ---------- charts ----------

/** svg builds an SVG element, as h builds HTML ones. */
function svg(tag, attrs, ...children) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  el.append(...children.flat(Infinity).filter((c) => c !== null && c !== undefined).map((c) => (c instanceof Node ? c : String(c))));
  return el;
}

const round = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2).replace(/\.?0+$/, '') || '0');

/**
 * chart draws one series of a TrendService answer: a line over the
 * samples (the newest at the right edge), its latest value and its peak,
 * and how far back it goes. Text for screen readers says the same.
 */
function chart(series, interval) {
  const pts = series.points.map((v, i) => (series.valid?.[i] === false ? null : Number(v)));
  const shown = pts.filter((v) => v !== null);
  const unit = series.unit === 'per second' ? '/s' : series.unit === 'per sample' ? ` per ${interval}s` : '';
  const last = shown.length ? shown[shown.length - 1] : null;
  const peak = shown.length ? Math.max(...shown) : 0;
  const span = pts.length * interval; // seconds
  const back = span < 90 ? `${Math.round(span)} s` : `${Math.round(span / 60)} min`;
  const W = 300, H = 70, top = Math.max(peak, 1);
  const x = (i) => (pts.length < 2 ? W : (i * W) / (pts.length - 1));
  const y = (v) => H - (v / top) * (H - 4) - 2;
  const line = pts.map((v, i) => (v === null ? null : `${x(i).toFixed(1)},${y(v).toFixed(1)}`)).filter(Boolean).join(' ');
  const label = `${series.name}: ${last === null ? 'no value' : `now ${round(last)}${unit}`}, peak ${round(peak)}${unit} over the last ${back}`;
  return h('figure', { class: 'chart', 'data-series': series.name },
    h('figcaption', {}, h('span', {}, series.name), h('strong', {}, last === null ? '–' : `${round(last)}${unit}`)),
    svg('svg', { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': label },
      svg('title', {}, label),
      svg('line', { x1: 0, y1: H - 0.5, x2: W, y2: H - 0.5, class: 'axis' }),
      line ? svg('polyline', { points: line, class: 'trend' }) : null),
    h('div', { class: 'chart-foot muted' }, h('span', {}, `${back} ago`), h('span', {}, `peak ${round(peak)}${unit}`), h('span', {}, 'now')));
}

/**
 * trendsArea shows a TrendService answer as charts, read again every
 * sample (10 s); the figures are the answering member's memory of the
 * last half hour.
 */
function trendsArea(route, signal, idle = 'No activity in the last half hour on this member.') {
  const el = area({ class: 'trends' });
  (async () => {
    while (!signal.aborted) {
      let interval = 10;
      try {
        const r = await api(route, { signal });
        const t = r.trends || {};
        interval = parseFloat(t.interval) || 10;
        el.show(t, () => (!t.tracked || !(t.series || []).length
          ? h('p', { class: 'muted' }, idle)
          : h('div', { class: 'charts' }, t.series.map((s) => chart(s, interval)))));
      } catch (e) { if (!signal.aborted) el.fail(e); }
      await sleep(Math.max(1000, interval * 1000), signal); // a new sample, not sooner
    }
  })();
  return el;
}

async function lockView(p, signal) {
  const name = p.rest;
  const state = area();
  main.replaceChildren(h('p', {}, h('a', { href: '#/locks' }, '← Locks')), h('h1', { tabindex: '-1' }, name), state,
    h('h2', {}, 'Last half hour'), trendsArea(`v1/locks:trends?${q({ name })}`, signal),
    h('h2', {}, 'History, newest first'), historyArea('locks', name, signal));
  const release = async (e) => {
    const ok = await confirmDialog(`Release ${name}?`, h('div', {},
      h('p', {}, `This takes the lock from session ${e.sessionId} (${e.owner || 'no owner'}), token ${e.token}. The holder is asked first: its client stops its work under the lock and lets go, and only then is the next waiter granted it. A holder that does not answer (stuck, cut off, or a REST client) loses it after at most its session's TTL; from then on its fenced writes with token ${e.token} are refused, but a holder that does not check its token may still act.`)), 'Release');
    if (!ok) return;
    // From outside (no session named): the server asks the holder first.
    try { await api('v1/locks:release', { method: 'POST', body: { name, token: e.token } }); } catch (err) { state.fail(err); }
  };
  const entry = (holder) => [
    { title: holder ? 'Holder' : 'Position', cell: (e) => (holder ? h('a', { href: `#/sessions/${e.sessionId}` }, h('code', {}, e.sessionId)) : String(e.pos)) },
    ...(holder ? [] : [{ title: 'Session', cell: (e) => h('a', { href: `#/sessions/${e.sessionId}` }, h('code', {}, e.sessionId)) }]),
    { title: 'Owner', cell: (e) => [e.owner, e.hostname ? h('span', { class: 'muted' }, ` @ ${e.hostname}`) : ''] },
    { title: 'Mode', cell: (e) => (e.read ? 'read' : 'write') },
    { title: 'Token', cls: 'num', cell: (e) => h('code', {}, e.token) },
    { title: holder ? 'Held since' : 'Waiting since', cell: (e) => [when(holder ? e.grantTime : e.enqueueTime), e.revokingSince ? h('span', { class: 'muted' }, ' — release asked, the holder has until ', when(e.revokingUntil)) : ''] },
    { title: 'Metadata', cls: 'hide-narrow', cell: (e) => e.metadata },
    ...(holder ? [{ title: '', cell: (e) => h('button', { type: 'button', class: 'danger', onclick: () => release(e) }, 'Release…') }] : []),
  ];
  // A crowded lock comes in pages of 100: the first live, the others
  // (#/locks/NAME?page=TOKEN&from=N) read every 2 s.
  const pageToken = p.query.get('page') || '';
  const from = Number(p.query.get('from')) || 0; // waiters on the pages before
  const render = (d) => {
    const { revision, ...shown } = d;
    const holders = d.holderCount ?? d.holders.length;
    const waiters = d.waiterCount ?? d.waiters.length;
    const next = d.nextPageToken ? h('p', {}, h('a', { href: `#/locks/${path(name)}?${q({ page: d.nextPageToken, from: from + d.waiters.length })}` }, 'Next page →')) : null;
    state.show(shown, () => [
      h('p', {}, d.limit > 1 ? `semaphore of ${d.limit}` : 'mutex (or read/write lock)', d.delayedUntil && Date.parse(d.delayedUntil) > Date.now() ? h('span', { class: 'badge warn' }, ` lock-delay until ${new Date(d.delayedUntil).toLocaleTimeString()}`) : ''),
      h('h2', {}, `Holders (${holders})`),
      table(entry(true), d.holders, pageToken ? 'No holder on this page.' : 'Nobody holds it.'),
      h('h2', {}, `Waiters, in the order they will be granted (${waiters})`),
      table(entry(false), d.waiters.map((w, i) => ({ ...w, pos: from + i + 1 })), pageToken ? 'No waiter on this page.' : 'Nobody waits.'),
      d.waiters.length < waiters ? h('p', { class: 'muted' }, `Waiters ${from + 1}–${from + d.waiters.length} of ${waiters}.`) : null,
      next,
    ]);
  };
  if (pageToken) {
    poll(async () => {
      try { render(await api(`v1/locks/${path(name)}?${q({ pageSize: 100, pageToken })}`, { signal })); setLive('polling'); } catch (e) { if (!signal.aborted) state.fail(e); }
    }, 2000, signal);
    return;
  }
  // Live: the server sends the lock again after every change of it.
  follow(() => `v1/locks:watch?${q({ name, pageSize: 100 })}`, (r) => render(r.lock), signal,
    (s, e) => { setLive(s, e); if (s === 'error') state.fail(e); });
}

const eventNames = {
  ELECTION_EVENT_TYPE_ELECTED: 'elected', ELECTION_EVENT_TYPE_PROCLAIMED: 'proclaimed', ELECTION_EVENT_TYPE_RESIGNED: 'resigned',
  ELECTION_EVENT_TYPE_EXPIRED: 'expired (session ended)', ELECTION_EVENT_TYPE_VACANT: 'vacant',
  ELECTION_EVENT_TYPE_PREEMPT_REQUESTED: 'asked to step down',
};

// ---------- barriers ----------

function barriers() {
  const name = h('input', { type: 'text', 'aria-label': 'Barrier name', placeholder: 'jobs/nightly', size: 30, required: true });
  main.replaceChildren(h('h1', { tabindex: '-1' }, 'Barriers'),
    h('p', { class: 'muted' }, 'A barrier opens when its count of participants has entered (or someone opens it); a double barrier also lets them leave together. Participants are bound to their sessions: one that ends leaves. coordd keeps no list of barriers: name one to watch it.'),
    h('form', { class: 'inline', onsubmit: (ev) => { ev.preventDefault(); location.hash = `#/barriers/${path(name.value.trim())}`; } },
      h('label', {}, 'Barrier', name), h('button', { type: 'submit', class: 'primary' }, 'Show')));
}

async function barrierView(p, signal) {
  const name = p.rest;
  const view = area();
  const open = h('button', {
    type: 'button', class: 'danger', onclick: async () => {
      if (!await confirmDialog(`Open ${name} now?`, h('p', {}, 'Every participant waiting to enter goes on at once, however many have entered.'), 'Open')) return;
      try { await api('v1/barriers:open', { method: 'POST', body: { name } }); } catch (e) { view.fail(e); }
    },
  }, 'Open it now…');
  main.replaceChildren(h('p', {}, h('a', { href: '#/barriers' }, '← Barriers')), h('h1', { tabindex: '-1' }, name), view, h('div', { class: 'actions' }, open));
  poll(async () => {
    const b = await api(`v1/barriers/${path(name)}`, { signal });
    open.disabled = b.open;
    view.show(b, () => [
      h('p', {}, b.open ? h('span', { class: 'badge ok' }, 'open') : h('span', { class: 'badge warn' }, 'closed'),
        ` · ${b.participantCount || b.participants.length} participant${(b.participantCount || b.participants.length) === 1 ? '' : 's'} in · revision ${b.revision}`,
        b.nextPageToken ? ` · the first ${b.participants.length} listed` : ''),
      table([
        { title: 'Participant', cell: (x) => h('code', {}, x.participant) },
        { title: 'Session', cell: (x) => h('a', { href: `#/sessions/${x.sessionId}` }, h('code', {}, x.sessionId)) },
        { title: 'Count it waits for', cls: 'num', cell: (x) => String(x.count) },
        { title: 'Entered', cell: (x) => when(x.entered) },
      ], b.participants, 'Nobody has entered.'),
    ]);
  }, 1000, signal, view);
}

async function electionView(p, signal) {
  const name = p.rest;
  const leader = area();
  const candidates = area();
  const timeline = h('ol', { class: 'timeline', 'aria-live': 'polite', reversed: true });
  main.replaceChildren(h('p', {}, h('a', { href: '#/elections' }, '← Elections')), h('h1', { tabindex: '-1' }, name),
    h('h2', {}, 'Leader'), leader, h('h2', {}, 'Candidates, in the order they would lead (priority, then arrival)'), candidates,
    h('h2', {}, 'Last half hour'), trendsArea(`v1/elections:trends?${q({ name })}`, signal), h('h2', {}, 'Timeline (live)'), timeline,
    h('h2', {}, 'Leaders, newest first'), historyArea('elections', name, signal));
  let current = null; // the leader shown, whose term a hand-over names
  let asked = null; // a preemption request in force: who asked
  const showLeader = (l) => {
    if (!l || (current && l.term !== current.term)) asked = null;
    current = l || null;
    leader.show(current, () => (!l ? h('p', { class: 'muted' }, 'Nobody leads.') : h('div', { class: 'scroll' }, h('table', {}, h('tbody', {},
      [['Term', h('code', {}, l.term)], ['Priority', String(l.priority || 0)], ['Value', h('pre', {}, pretty(l.value))], ['Owner', [l.owner, l.hostname ? ` @ ${l.hostname}` : '']],
        ['Session', h('a', { href: `#/sessions/${l.sessionId}` }, h('code', {}, l.sessionId))], ['Since', when(l.since)], ['Proclamations', l.proclaims],
        ...(asked ? [['Asked to step down by', [h('code', {}, asked.sessionId), ` (priority ${asked.priority || 0})`]]] : [])]
        .map(([k, v]) => h('tr', {}, h('th', { scope: 'row' }, k), h('td', {}, v))))))));
  };
  // Hand the seat to candidate x in one commit: a new term, no vacancy.
  const handOver = async (x) => {
    if (!current) return;
    if (!await confirmDialog(`Hand ${name} over to ${x.owner || x.sessionId}?`,
      h('p', {}, `Term ${current.term} ends, and this candidate leads at once with a new term. The leader is told it no longer leads.`), 'Hand over')) return;
    try {
      await api('v1/elections:transfer', { method: 'POST', body: { name, term: current.term, successorSessionId: x.sessionId, successorRequestId: x.requestId } });
    } catch (e) { candidates.fail(e); }
  };
  const loadCandidates = async () => {
    try {
      const c = await api(`v1/elections:candidates?${q({ name })}`, { signal });
      candidates.show(c.candidates, (cs) => table([
        { title: '#', cls: 'num', cell: (x) => String(cs.indexOf(x) + 1) },
        { title: 'Priority', cls: 'num', cell: (x) => String(x.priority || 0) },
        { title: 'Owner', cell: (x) => [x.owner, x.hostname ? ` @ ${x.hostname}` : ''] },
        { title: 'Session', cell: (x) => h('a', { href: `#/sessions/${x.sessionId}` }, h('code', {}, x.sessionId)) },
        { title: 'Value', cell: (x) => x.value },
        { title: 'Waiting since', cell: (x) => when(x.enqueueTime) },
        { title: '', cell: (x) => h('button', { type: 'button', disabled: !current, onclick: () => handOver(x) }, 'Hand over…') },
      ], cs, 'Nobody else campaigns.'));
    } catch (e) { if (!signal.aborted) candidates.fail(e); }
  };
  poll(loadCandidates, 3000, signal);
  let from = 0;
  follow(() => `v1/elections:observe?${q({ name, fromRevision: from ? from + 1 : '' })}`, (r) => {
    for (const ev of r.events) {
      // ELECTED, PROCLAIMED and PREEMPT_REQUESTED name the leader;
      // RESIGNED, EXPIRED and VACANT leave nobody (an ELECTED follows in
      // the same revision when a candidate takes over).
      if (ev.type === 'ELECTION_EVENT_TYPE_PREEMPT_REQUESTED') asked = ev.by;
      const named = ['ELECTION_EVENT_TYPE_ELECTED', 'ELECTION_EVENT_TYPE_PROCLAIMED', 'ELECTION_EVENT_TYPE_PREEMPT_REQUESTED'].includes(ev.type);
      showLeader(named ? ev.leader : null);
      const l = ev.leader;
      timeline.prepend(h('li', { 'data-type': eventNames[ev.type] || ev.type },
        h('strong', {}, eventNames[ev.type] || ev.type), l ? ` · term ${l.term} · ${l.owner || l.sessionId}${l.value ? ` · ${l.value}` : ''}` : '',
        h('span', { class: 'muted' }, ` · revision ${ev.revision} · ${ev.current ? 'state when the page opened' : `seen ${new Date().toLocaleTimeString()}`}`)));
    }
    from = Math.max(from, Number(r.revision));
    loadCandidates();
  }, signal, (s, e) => { setLive(s, e); if (s === 'error') leader.fail(e); });
}

// ---------- config ----------

async function namespaces(p, signal) {
  const prefix = p.query.get('prefix') || '';
  const list = area();
  const input = h('input', { type: 'search', value: prefix, placeholder: 'payments/', 'aria-label': 'Namespace prefix' });
  const ns = h('input', { type: 'text', placeholder: 'payments/prod', 'aria-label': 'New namespace', pattern: '[A-Za-z0-9._\\-]+(/[A-Za-z0-9._\\-]+)*' });
  main.replaceChildren(h('h1', { tabindex: '-1' }, 'Config'),
    h('form', { class: 'inline', role: 'search', onsubmit: (ev) => { ev.preventDefault(); location.hash = `#/config?${q({ prefix: input.value })}`; } },
      h('label', {}, 'Prefix', input), h('button', { type: 'submit' }, 'Browse')),
    list,
    h('form', { class: 'inline', onsubmit: (ev) => { ev.preventDefault(); if (ns.value) location.hash = `#/config/${path(ns.value)}?tab=publish`; } },
      h('label', {}, 'Open or start a namespace', ns), h('button', { type: 'submit' }, 'Open')));
  const pageToken = p.query.get('page') || '';
  poll(async () => {
    const page = await api(`v1/config:namespaces?${q({ prefix, pageSize: 100, pageToken })}`, { signal });
    list.show(page, () => [
      table([{ title: 'Namespace', cell: (n) => h('a', { href: `#/config/${path(n)}` }, n) }], page.namespaces, 'No namespace has content under this prefix.'),
      page.nextPageToken ? h('p', {}, h('a', { href: `#/config?${q({ prefix, page: page.nextPageToken })}` }, 'Next page →')) : null,
    ]);
  }, 5000, signal, list);
}

// secretBadge stands for a secret's value, which the console never shows.
const secretBadge = () => h('span', { class: 'badge secret', title: 'A secret: stored encrypted; its value is never shown here' }, 'secret');

function diffTable(changes, empty = 'No key changed.') {
  const value = (c, v, missing) => {
    if (v === undefined) return h('span', { class: 'muted' }, missing);
    return c.secret ? secretBadge() : h('pre', {}, pretty(v));
  };
  return h('div', { class: 'diff' }, table([
    { title: 'Key', cell: (c) => h('code', {}, c.key) },
    { title: 'Before', cls: 'old', cell: (c) => value(c, c.oldValue, '(absent)') },
    { title: 'After', cls: 'new', cell: (c) => value(c, c.newValue, '(deleted)') },
  ], changes, empty));
}

const tabs = ['snapshot', 'history', 'diff', 'publish', 'proposals', 'gray', 'schema', 'status'];

async function namespaceView(p, signal) {
  const ns = p.rest;
  const tab = tabs.includes(p.query.get('tab')) ? p.query.get('tab') : 'snapshot';
  const body = h('div', {});
  main.replaceChildren(h('p', {}, h('a', { href: '#/config' }, '← Config')), h('h1', { tabindex: '-1' }, ns),
    trendsArea(`v1/config:trends?${q({ namespace: ns })}`, signal, 'No release and no subscriber on this member in the last half hour.'),
    h('nav', { class: 'tabs', 'aria-label': 'Namespace' }, tabs.map((t) => h('a', { href: `#/config/${path(ns)}?tab=${t}`, 'aria-current': t === tab ? 'page' : undefined }, t[0].toUpperCase() + t.slice(1)))),
    body);
  await configTabs[tab](ns, p, body, signal);
}

const configTabs = {
  async snapshot(ns, _p, body, signal) {
    const view = area();
    body.replaceChildren(view);
    let snap = null;
    let from = 0;
    const render = () => view.show(snap, (s) => [
      h('p', {}, `release ${s.release} · ${s.entries.length} keys · revision ${s.changedRevision}`),
      s.inherits ? h('p', {}, 'Inherits from ', h('a', { href: `#/config/${path(s.inherits)}` }, s.inherits), ': its keys show here unless this namespace has its own; a release there reaches this namespace as one release.') : null,
      table([
        { title: 'Key', cell: (e) => h('code', {}, e.key) },
        { title: 'Value', cell: (e) => (e.secret ? secretBadge() : h('pre', {}, pretty(e.value))) },
        ...(s.inherits ? [{ title: 'From', cell: (e) => (e.inherited ? h('span', { class: 'badge', title: `inherited from ${s.inherits}` }, s.inherits) : h('span', { class: 'muted' }, 'own')) }] : []),
      ], s.entries, 'The namespace is empty.'),
    ]);
    follow(() => `v1/config:watch?${q({ namespaces: ns, fromRevision: from || '' })}`, (r) => {
      if (r.type === 'WATCH_EVENT_TYPE_SNAPSHOT') {
        snap = r.snapshots[0];
      } else if (r.type === 'WATCH_EVENT_TYPE_CHANGE' && snap) {
        const m = new Map(snap.entries.map((e) => [e.key, e]));
        for (const c of r.release.changes) {
          if (c.newValue === undefined) m.delete(c.key); else m.set(c.key, { key: c.key, value: c.newValue, secret: c.secret, inherited: m.get(c.key)?.inherited });
        }
        snap = { ...snap, release: r.release.number, changedRevision: r.release.revision, entries: [...m.values()].sort((a, b) => (a.key < b.key ? -1 : 1)) };
        if (snap.inherits) {
          // Where each value now comes from (an own key deleted brings the
          // shared one back): read it, at this release or later.
          const at = Number(r.revision);
          api(`v1/config:snapshot?${q({ namespace: ns })}`, { signal }).then((x) => {
            if (Number(x.snapshot.changedRevision) >= at && Number(x.snapshot.changedRevision) >= Number(snap.changedRevision)) { snap = x.snapshot; render(); }
          }, () => {});
        }
      }
      from = Math.max(from, Number(r.revision));
      if (snap) render();
    }, signal, (s, e) => { setLive(s, e); if (s === 'error') view.fail(e); });
  },

  async history(ns, _p, body, signal) {
    const view = area();
    body.replaceChildren(view);
    const rollback = async (rel, current) => {
      let changes = [];
      try { changes = (await api(`v1/config:diff?${q({ namespace: ns, fromRelease: current.number, toRelease: rel.number })}`)).changes; } catch (e) { view.fail(e); return; }
      const message = h('input', { type: 'text', value: `roll back to release ${rel.number}`, size: 40 });
      const ok = await confirmDialog(`Roll ${ns} back to release ${rel.number}?`,
        h('div', {}, h('p', {}, `A new release is published with release ${rel.number}'s content. What changes from the current release ${current.number}:`), diffTable(changes, 'Nothing: the content is already the same.')),
        'Roll back', { extra: h('label', {}, 'Message', message) });
      if (!ok) return;
      try {
        await api('v1/config:rollback', { method: 'POST', body: { namespace: ns, toRelease: rel.number, expectedRevision: current.revision, message: message.value } });
      } catch (e) { view.fail(e); }
    };
    poll(async () => {
      const r = await api(`v1/config:releases?${q({ namespace: ns, pageSize: 100 })}`, { signal });
      view.show(r.releases, (rels) => {
        let a = rels[1]?.number || '0';
        let b = rels[0]?.number || '0';
        return [
          table([
            { title: 'Release', cls: 'num', cell: (x) => h('strong', {}, x.number) },
            { title: 'When', cell: (x) => when(x.time) },
            { title: 'Author', cell: (x) => x.author },
            { title: 'Message', cell: (x) => [x.message, x.rollbackOf !== '0' ? h('span', { class: 'badge' }, `rollback to ${x.rollbackOf}`) : '', x.approvedBy ? h('span', { class: 'badge ok' }, `proposal ${x.proposal} by ${x.proposedBy}, approved by ${x.approvedBy}`) : ''] },
            { title: 'Keys', cls: 'num', cell: (x) => String(x.changes.length) },
            { title: 'Compare', cell: (x) => h('span', {}, h('label', { class: 'check' }, h('input', { type: 'radio', name: 'a', value: x.number, checked: x.number === a, onchange: () => { a = x.number; } }), 'from'), ' ', h('label', { class: 'check' }, h('input', { type: 'radio', name: 'b', value: x.number, checked: x.number === b, onchange: () => { b = x.number; } }), 'to')) },
            { title: '', cell: (x) => (x === rels[0] ? h('span', { class: 'badge ok' }, 'current') : h('button', { type: 'button', onclick: () => rollback(x, rels[0]) }, 'Roll back to this…')) },
          ], rels, 'No releases yet.'),
          rels.length ? h('div', { class: 'actions' }, h('button', { type: 'button', class: 'primary', onclick: () => { location.hash = `#/config/${path(ns)}?${q({ tab: 'diff', from: a, to: b })}`; } }, 'Compare selected')) : null,
        ];
      });
    }, 3000, signal, view);
  },

  async diff(ns, p, body, signal) {
    const from = p.query.get('from') || '0';
    const to = p.query.get('to') || '';
    const a = h('input', { type: 'number', min: 0, value: from, 'aria-label': 'From release', size: 6 });
    const b = h('input', { type: 'number', min: 0, value: to, 'aria-label': 'To release', size: 6 });
    const view = area();
    body.replaceChildren(h('form', { class: 'inline', onsubmit: (ev) => { ev.preventDefault(); location.hash = `#/config/${path(ns)}?${q({ tab: 'diff', from: a.value, to: b.value })}`; } },
      h('label', {}, 'From release (0: empty)', a), h('label', {}, 'To release', b), h('button', { type: 'submit' }, 'Compare')), view);
    if (!to) { view.replaceChildren(h('p', { class: 'muted' }, 'Pick two releases (or compare from the History tab).')); return; }
    try {
      const d = await api(`v1/config:diff?${q({ namespace: ns, fromRelease: from, toRelease: to })}`, { signal });
      view.show(d, () => [h('p', {}, `From release ${from} to release ${to}:`), diffTable(d.changes)]);
    } catch (e) { if (!signal.aborted) view.fail(e); }
  },

  async publish(ns, _p, body, signal) {
    let snap = { entries: [], changedRevision: '0', release: '0' };
    let gated = false;
    try {
      snap = (await api(`v1/config:snapshot?${q({ namespace: ns })}`, { signal })).snapshot;
      gated = (await api(`v1/config:approval?${q({ namespace: ns })}`, { signal })).policy?.required === true;
    } catch (e) { body.replaceChildren(errorBox(e)); return; }
    const existing = new Map(snap.entries.map((e) => [e.key, e.value]));
    const secrets = new Set(snap.entries.filter((e) => e.secret).map((e) => e.key));
    const rows = h('tbody', {});
    const preview = h('div', { 'aria-live': 'polite' });
    const author = h('input', { type: 'text', 'aria-label': 'Author', placeholder: 'you' });
    const message = h('input', { type: 'text', 'aria-label': 'Message', placeholder: 'why', size: 40 });
    const publishButton = h('button', { type: 'button', class: 'primary', disabled: true }, gated ? 'Propose' : 'Publish');
    let previewed = null;
    const mutations = () => [...rows.children].map((tr) => {
      const [key, value, secret, del] = tr.querySelectorAll('input, textarea');
      return { key: key.value.trim(), value: value.value, secret: secret.checked, delete: del.checked };
    }).filter((m) => m.key);
    const changed = () => { previewed = null; publishButton.disabled = true; };
    const keys = h('datalist', { id: 'ns-keys' }, [...existing.keys()].map((k) => h('option', { value: k })));
    const addRow = () => {
      const value = h('textarea', { 'aria-label': 'Value', rows: 2, oninput: changed });
      const secret = h('input', { type: 'checkbox', 'aria-label': 'Store the value as a secret', onchange: changed });
      const key = h('input', {
        type: 'text', list: 'ns-keys', 'aria-label': 'Key', oninput: changed,
        onchange: () => {
          if (secrets.has(key.value)) { secret.checked = true; secret.disabled = true; return; } // a secret stays one; its value is never shown
          secret.disabled = false;
          if (existing.has(key.value) && !value.value) value.value = pretty(existing.get(key.value));
        },
      });
      const del = h('input', { type: 'checkbox', 'aria-label': 'Delete this key', onchange: changed });
      rows.append(h('tr', {}, h('td', {}, key), h('td', {}, value), h('td', {}, h('label', { class: 'check' }, secret, 'secret'), ' ', h('label', { class: 'check' }, del, 'delete'))));
      key.focus();
    };
    const send = async (dryRun) => {
      const body = { namespace: ns, mutations: mutations(), author: author.value, message: message.value, dryRun, expectedRevision: snap.changedRevision };
      const r = await api('v1/config:publish', { method: 'POST', body });
      return r.release;
    };
    const previewButton = h('button', {
      type: 'button', onclick: async () => {
        try {
          const rel = await send(true);
          previewed = JSON.stringify(mutations());
          publishButton.disabled = rel.changes.length === 0;
          preview.replaceChildren(h('h2', {}, `Preview: release ${rel.number} would change`), diffTable(rel.changes, 'Nothing would change.'));
        } catch (e) { preview.replaceChildren(errorBox(e)); }
      },
    }, 'Preview (dry run)');
    publishButton.addEventListener('click', async () => {
      if (previewed !== JSON.stringify(mutations())) { changed(); return; }
      try {
        if (gated) {
          await api('v1/config:propose', { method: 'POST', body: { namespace: ns, mutations: mutations(), author: author.value, message: message.value, expectedRevision: snap.changedRevision } });
          location.hash = `#/config/${path(ns)}?${q({ tab: 'proposals' })}`;
          return;
        }
        await send(false);
        location.hash = `#/config/${path(ns)}?${q({ tab: 'history' })}`;
      } catch (e) { preview.replaceChildren(errorBox(e)); }
    });
    body.replaceChildren(
      gated ? h('p', { class: 'badge warn' }, 'This namespace requires approval: your change becomes a proposal that someone else approves.') : '',
      h('p', { class: 'muted' }, `Publishing makes one release of every change below, atomically, checked against the namespace's schema. Values are stored as typed: JSON text is that JSON value, anything else a string. A secret is stored encrypted and never shown again here. Based on release ${snap.release}; if someone publishes first, publishing is refused and you preview again.`),
      keys,
      h('div', { class: 'scroll' }, h('table', {}, h('thead', {}, h('tr', {}, h('th', {}, 'Key'), h('th', {}, 'Value'), h('th', {}, ''))), rows)),
      h('div', { class: 'actions' }, h('button', { type: 'button', onclick: addRow }, 'Add a key')),
      h('div', { class: 'inline' }, h('label', {}, 'Author', author), h('label', {}, 'Message', message)),
      h('div', { class: 'actions' }, previewButton, publishButton),
      preview);
    addRow();
  },

  async proposals(ns, _p, body, signal) {
    const view = area();
    const policy = h('p', {});
    body.replaceChildren(policy, view);
    const decide = async (x, verb) => {
      const message = h('input', { type: 'text', size: 40 });
      const author = h('input', { type: 'text', size: 20, placeholder: 'without sign-in: your name' });
      const ok = await confirmDialog(`${verb[0].toUpperCase() + verb.slice(1)} proposal ${x.number} of ${ns}?`,
        h('div', {}, h('p', {}, `Proposed by ${x.proposer} on release ${x.baseRelease}: ${x.message || ''}`), diffTable(x.changes)),
        verb[0].toUpperCase() + verb.slice(1), { danger: verb !== 'approve', extra: h('div', { class: 'inline' }, h('label', {}, 'Message', message), h('label', {}, 'Author', author)) });
      if (!ok) return;
      try {
        await api(`v1/config:${verb}`, { method: 'POST', body: { namespace: ns, number: x.number, message: message.value, author: author.value } });
      } catch (e) { view.fail(e); }
    };
    const state = (s) => s.replace('PROPOSAL_STATE_', '');
    poll(async () => {
      const a = await api(`v1/config:approval?${q({ namespace: ns })}`, { signal });
      policy.replaceChildren(a.policy?.required
        ? h('span', { class: 'badge warn' }, `Approval required: every release is a proposal someone other than its proposer approves; proposals expire after ${a.policy.proposalTtl}`)
        : h('span', { class: 'muted' }, 'No approval required: proposals are optional here.'));
      const r = await api(`v1/config:proposals?${q({ namespace: ns, pageSize: 100 })}`, { signal });
      view.show(r.proposals, (ps) => table([
        { title: 'Proposal', cls: 'num', cell: (x) => h('strong', {}, x.number) },
        { title: 'State', cell: (x) => h('span', { class: `badge ${state(x.state) === 'PENDING' ? 'warn' : state(x.state) === 'APPROVED' ? 'ok' : ''}` }, state(x.state).toLowerCase()) },
        { title: 'Proposer', cell: (x) => x.proposer },
        { title: 'On release', cls: 'num', cell: (x) => x.baseRelease },
        { title: 'Changes', cell: (x) => diffTable(x.changes) },
        { title: 'Message', cell: (x) => x.message },
        { title: 'Decided', cell: (x) => (x.decidedBy ? `${x.decidedBy}${x.release !== '0' ? ` → release ${x.release}` : ''}${x.decision ? `: ${x.decision}` : ''}` : `expires ${when(x.expireTime)}`) },
        { title: '', cell: (x) => (state(x.state) === 'PENDING' ? h('span', {}, h('button', { type: 'button', class: 'primary', onclick: () => decide(x, 'approve') }, 'Approve…'), ' ', h('button', { type: 'button', onclick: () => decide(x, 'reject') }, 'Reject…')) : '') },
      ], ps, 'No proposals.'));
    }, 3000, signal, view);
  },

  async schema(ns, _p, body, signal) {
    const view = area();
    const text = h('textarea', { rows: 12, 'aria-label': 'JSON Schema' });
    const save = h('button', {
      type: 'button', class: 'primary', onclick: async () => {
        const ok = await confirmDialog(`Set ${ns}'s schema?`, h('p', {}, text.value.trim() ? 'Every later publish must satisfy it; the current content is checked first.' : 'An empty schema removes it: any value will be accepted.'), 'Save schema', { danger: false });
        if (!ok) return;
        try { await api('v1/config:setSchema', { method: 'POST', body: { namespace: ns, schema: text.value } }); view.replaceChildren(h('p', { class: 'note' }, 'Saved.')); } catch (e) { view.fail(e); }
      },
    }, 'Save schema…');
    body.replaceChildren(view, h('h2', {}, 'Edit'), text, h('div', { class: 'actions' }, save));
    try {
      const s = await api(`v1/config:schema?${q({ namespace: ns })}`, { signal });
      text.value = pretty(s.schema);
      view.show(s.schema, () => (s.schema ? h('pre', {}, pretty(s.schema)) : h('p', { class: 'muted' }, 'No schema: any value is accepted.')));
    } catch (e) { if (!signal.aborted) view.fail(e); }
  },

  async gray(ns, _p, body, signal) {
    const running = area();
    const history = area();
    const create = h('div', {});
    body.replaceChildren(
      h('p', { class: 'muted' }, 'A gray (canary) release gives some keys other values for the instances a selector picks (by instance id, labels, or a percentage), on top of the normal content. Watch the Status tab, then promote it (everyone gets it, as the next release) or abandon it.'),
      h('h2', {}, 'Running'), running, create, h('h2', {}, 'Gray history'), history);
    const who = (sel) => [
      sel.instances.length ? `instances ${sel.instances.join(', ')}` : '',
      Object.keys(sel.labels).length ? `labels ${Object.entries(sel.labels).map(([k, v]) => `${k}=${v}`).join(',')}` : '',
      sel.percent ? `${sel.percent}% of instances` : '',
    ].filter(Boolean).join('; or ');
    const act = async (what, g) => {
      const verb = what === 'promote' ? 'Promote' : 'Abandon';
      const text = what === 'promote'
        ? `Gray release ${g.number}'s overrides become the next release, for every instance, in one step; the instances that run it see no change. Everyone else gets:`
        : `Gray release ${g.number} ends; the instances it picked (${who(g.selector)}) return to the normal content.`;
      if (!await confirmDialog(`${verb} gray release ${g.number}?`, h('div', {}, h('p', {}, text), what === 'promote' ? diffTable(g.changes) : null), verb, { danger: what === 'abandon' })) return;
      try {
        await api(`v1/config:${what}Gray`, { method: 'POST', body: { namespace: ns, expectedGray: g.number } });
        refresh();
      } catch (e) { running.fail(e); }
    };
    const form = () => {
      const instances = h('input', { type: 'text', 'aria-label': 'Instances', placeholder: 'web-1, web-2', size: 30 });
      const labels = h('input', { type: 'text', 'aria-label': 'Labels', placeholder: 'zone=eu', size: 20 });
      const percent = h('input', { type: 'number', min: 0, max: 100, value: 0, 'aria-label': 'Percent' });
      const overrides = h('textarea', { rows: 4, cols: 50, 'aria-label': 'Overrides', placeholder: 'key=value, one per line; -key deletes it' });
      const author = h('input', { type: 'text', 'aria-label': 'Author', placeholder: 'you' });
      const message = h('input', { type: 'text', 'aria-label': 'Message', placeholder: 'why', size: 40 });
      const out = h('div', { 'aria-live': 'polite' });
      const request = (dryRun) => ({
        namespace: ns, dryRun, author: author.value, message: message.value,
        selector: {
          instances: instances.value.split(',').map((x) => x.trim()).filter(Boolean),
          labels: Object.fromEntries(labels.value.split(',').map((x) => x.trim()).filter(Boolean).map((x) => [x.split('=')[0], x.split('=').slice(1).join('=')])),
          percent: Number(percent.value) || 0,
        },
        overrides: overrides.value.split('\n').map((l) => l.trim()).filter(Boolean)
          .map((l) => (l.startsWith('-') ? { key: l.slice(1).trim(), delete: true } : { key: l.split('=')[0].trim(), value: l.split('=').slice(1).join('=') })),
      });
      const send = async (dryRun) => {
        try {
          const { gray: g } = await api('v1/config:createGray', { method: 'POST', body: request(dryRun) });
          out.replaceChildren(h('p', {}, dryRun ? `Preview: gray release ${g.number} would give ${who(g.selector)}:` : `Gray release ${g.number} runs.`), diffTable(g.changes, 'No change.'));
          if (!dryRun) refresh();
        } catch (e) { out.replaceChildren(errorBox(e)); }
      };
      return h('form', { class: 'stack', onsubmit: (ev) => ev.preventDefault() },
        h('h2', {}, 'Start a gray release'),
        h('label', {}, 'Instances ', instances), h('label', {}, 'Labels (all must match) ', labels), h('label', {}, 'Percent ', percent),
        h('label', {}, 'Overrides ', overrides), h('label', {}, 'Author ', author), h('label', {}, 'Message ', message),
        h('div', { class: 'actions' }, h('button', { type: 'button', onclick: () => send(true) }, 'Preview (dry run)'), h('button', { type: 'button', class: 'primary', onclick: () => send(false) }, 'Start')),
        out);
    };
    let formShown = false;
    const refresh = async () => {
      try {
        const { gray: g } = await api(`v1/config:gray?${q({ namespace: ns })}`, { signal });
        formShown = false;
        create.replaceChildren();
        running.show(g, () => [
          h('p', {}, `Gray release ${g.number}, over release ${g.baseRelease}, for ${who(g.selector)} · ${g.author || 'no author'} · `, when(g.time), g.message ? ` · ${g.message}` : ''),
          table([
            { title: 'Key', cell: (m) => h('code', {}, m.key) },
            { title: 'Gray value', cell: (m) => (m.delete ? h('span', { class: 'muted' }, '(deleted)') : h('pre', {}, pretty(m.value))) },
          ], g.overrides, 'No overrides.'),
          h('div', { class: 'actions' },
            h('button', { type: 'button', class: 'primary', onclick: () => act('promote', g) }, 'Promote…'),
            h('button', { type: 'button', class: 'danger', onclick: () => act('abandon', g) }, 'Abandon…')),
        ]);
      } catch (e) {
        if (e.status !== 404) { running.fail(e); return; }
        running.show(null, () => h('p', { class: 'muted' }, 'No gray release runs.'));
        if (!formShown) { formShown = true; create.replaceChildren(form()); }
      }
      const hs = await api(`v1/config:grayReleases?${q({ namespace: ns })}`, { signal });
      history.show(hs.grays, (gs) => table([
        { title: 'Gray', cls: 'num', cell: (g) => g.number },
        { title: 'Action', cell: (g) => g.action.replace('GRAY_ACTION_', '').toLowerCase() + (g.promotedTo !== '0' ? ` → release ${g.promotedTo}` : '') },
        { title: 'Over release', cls: 'num', cell: (g) => g.baseRelease },
        { title: 'For', cell: (g) => who(g.selector) },
        { title: 'Overrides', cell: (g) => g.overrides.map((m) => h('code', {}, m.delete ? `-${m.key}` : `${m.key}=${m.value}`)).flatMap((x, i) => (i ? [' ', x] : [x])) },
        { title: 'Author', cls: 'hide-narrow', cell: (g) => g.author },
        { title: 'When', cell: (g) => when(g.time) },
        { title: 'Message', cls: 'hide-narrow', cell: (g) => g.message },
      ], gs, 'No gray release yet.'));
    };
    poll(refresh, 3000, signal, history);
  },

  async status(ns, _p, body, signal) {
    const view = area();
    body.replaceChildren(h('p', { class: 'muted' }, 'What each instance that reports (the SDK does, after its callbacks) runs, and what it rejected and why.'), view);
    poll(async () => {
      const s = await api(`v1/config:status?${q({ namespace: ns })}`, { signal });
      view.show(s, () => [
        h('p', {}, s.applied.map((c) => h('span', { class: 'badge ok' }, `release ${c.release}: ${c.instances} running`)), ' ',
          s.rejected.map((c) => h('span', { class: 'badge bad' }, `release ${c.release}: ${c.instances} rejected`)), ' ',
          s.appliedGray.map((c) => h('span', { class: 'badge warn' }, `gray ${c.release}: ${c.instances} running`)), ' ',
          s.rejectedGray.map((c) => h('span', { class: 'badge bad' }, `gray ${c.release}: ${c.instances} rejected`))),
        table([
          { title: 'Instance', cell: (i) => h('code', {}, i.instance) },
          { title: 'Labels', cls: 'hide-narrow', cell: (i) => Object.entries(i.labels).map(([k, v]) => h('span', { class: 'badge' }, `${k}=${v}`)) },
          { title: 'Runs release', cls: 'num', cell: (i) => (i.appliedGray !== '0' ? `${i.appliedRelease} + gray ${i.appliedGray}` : i.appliedRelease) },
          { title: 'Rejected', cell: (i) => (i.rejectedRelease !== '0' ? h('span', { class: 'badge bad' }, `release ${i.rejectedRelease}${i.rejectedGray !== '0' ? ` + gray ${i.rejectedGray}` : ''}: ${i.reason}`) : '') },
          { title: 'Reported', cell: (i) => when(i.reportTime) },
        ], s.instances, 'No instance has reported for this namespace.'),
      ]);
    }, 3000, signal, view);
  },
};

// ---------- routing ----------

const routes = [
  [/^$/, overview, 'overview'],
  [/^sessions$/, sessions, 'sessions'],
  [/^sessions\/(.+)$/, sessionView, 'sessions'],
  [/^locks$/, (p, s) => names('locks', p, s), 'locks'],
  [/^locks\/(.+)$/, lockView, 'locks'],
  [/^elections$/, (p, s) => names('elections', p, s), 'elections'],
  [/^elections\/(.+)$/, electionView, 'elections'],
  [/^barriers$/, barriers, 'barriers'],
  [/^barriers\/(.+)$/, barrierView, 'barriers'],
  [/^config$/, namespaces, 'config'],
  [/^config\/(.+)$/, namespaceView, 'config'],
];

let current = null;

function route() {
  current?.abort();
  current = new AbortController();
  const raw = location.hash.replace(/^#\/?/, '');
  const [p, query = ''] = raw.split('?');
  setLive('');
  for (const [re, view, section] of routes) {
    const m = re.exec(p);
    if (!m) continue;
    for (const a of document.querySelectorAll('nav a[data-section]')) {
      if (a.dataset.section === section) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    const rest = m[1] ? m[1].split('/').map(decodeURIComponent).join('/') : '';
    Promise.resolve(view({ rest, query: new URLSearchParams(query) }, current.signal)).catch((e) => main.replaceChildren(errorBox(e)));
    main.querySelector('h1')?.focus({ preventScroll: true });
    document.title = `${main.querySelector('h1')?.textContent || 'coordd'} · coordd console`;
    return;
  }
  main.replaceChildren(h('h1', {}, 'Not found'), h('p', {}, 'No such page. ', h('a', { href: '#/' }, 'Go to the overview.')));
}

// Relative times ("3s ago") move on by themselves, between data changes too.
setInterval(() => {
  for (const t of document.querySelectorAll('time[datetime]')) t.textContent = ago(t.dateTime);
}, 1000);

window.addEventListener('hashchange', route);
updateSignin();
route();

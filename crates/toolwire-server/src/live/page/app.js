// toolwire's live conversation view. Plain JS, no dependencies, written
// against ../PROTOCOL.md (REST tree routes + WebSocket). Every piece of
// data reaches the DOM as text (textContent / text nodes), never as HTML.
'use strict';

(() => {
  const KEY_STORAGE = 'toolwire.apiKey';
  // A long conversation is drawn from its end, WINDOW messages at a time
  // (more as the reader scrolls up), and its messages are fetched BATCH to
  // a request: 10,000 tool calls are neither 10,000 requests nor 10,000
  // cards in the page at once.
  const WINDOW = 100;
  const BATCH = 100;
  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------- state

  const S = {
    conversations: [],
    convId: null,
    tree: null, // the Tree, without its nodes (those are in `nodes`)
    nodes: new Map(), // id -> Node (children kept up to date)
    order: [], // node ids in creation order
    views: new Map(), // id -> MessageView (content_blocks)
    loading: new Set(), // ids whose MessageView is being fetched
    shown: WINDOW, // how many messages of the branch are drawn, counted from its end
    running: false,
    runId: null,
    liveText: '',
    liveReasoning: '',
    tools: new Map(), // tool_call_id -> card state
    liveTools: [], // tool_call_ids of the running step not yet stored in a node
    pending: new Map(), // tool_call_id -> approval request
    lastSeq: null, // the highest seq seen
    floor: null, // frames at or below this seq were had already (snapshot, or the `after` of a reconnect)
    ws: null,
    wsGen: 0,
    retries: 0,
    retryTimer: null,
    editing: null, // id of the message being edited
    note: '', // why the last turn stopped, when worth saying
    sending: false,
    attachments: [], // images for the next message: {name, type, size, data (base64)}
    models: [], // the models there are ({name, provider, model, …})
    model: null, // the model this conversation's turns use
  };
  const cardEls = new Map(); // card key -> the card's element (kept across renders)
  // A card's key is its tool_call_id, except for an older call whose id a
  // later call reused (some models and scripts number calls per step): it
  // keeps its card under "message id/tool_call_id".
  const owners = new Map(); // tool_call_id -> id of the newest stored message calling it
  const aliases = new Map(); // message id + "\n" + tool_call_id -> card key of a retired call
  const stoppedRuns = new Set(); // run ids whose stop came (maybe before their POST answered)

  // ---------------------------------------------------------------- DOM helpers

  /** An element with properties/attributes and children (strings become text nodes). */
  function el(tag, props, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') e.className = v;
      else if (k === 'text') e.textContent = v;
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else if (k === 'dataset') Object.assign(e.dataset, v);
      else if (k in e && typeof v !== 'string') e[k] = v;
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      e.append(typeof c === 'string' ? document.createTextNode(c) : c);
    }
    return e;
  }

  function showError(message) {
    $('error-text').textContent = message;
    $('error').hidden = false;
  }
  function clearError() {
    $('error').hidden = true;
    $('error-text').textContent = '';
  }

  function fmtCost(c) {
    if (typeof c !== 'number') return '';
    return '$' + (c > 0 && c < 1 ? c.toFixed(4) : c.toFixed(2));
  }
  function fmtTime(t) {
    if (!t) return '';
    const d = new Date(t);
    if (isNaN(d)) return '';
    const now = new Date();
    return d.toDateString() === now.toDateString()
      ? d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit' })
      : d.toLocaleDateString();
  }
  function valueText(v) {
    if (typeof v === 'string') return v;
    try { return JSON.stringify(v, null, 2); } catch { return String(v); }
  }

  // ---------------------------------------------------------------- REST

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  function apiKey() {
    try { return localStorage.getItem(KEY_STORAGE) || ''; } catch { return ''; }
  }

  async function api(method, path, body) {
    const headers = { Accept: 'application/json' };
    const key = apiKey();
    if (key) headers.Authorization = 'Bearer ' + key;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    let res;
    try {
      res = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    } catch (e) {
      throw new ApiError(0, 'NETWORK', 'Could not reach the server (' + e.message + ')');
    }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (!res.ok) {
      // The server's error body: {"code", "message", "detail"}, possibly
      // wrapped as {"error": {...}}.
      const err = (data && typeof data.error === 'object' && data.error) || data || {};
      const code = err.code || String(res.status);
      const message = err.message || err.detail || text || res.statusText;
      if (res.status === 401) openKeyDialog('The server wants an API key: ' + message);
      throw new ApiError(res.status, code, message);
    }
    return data;
  }
  const enc = encodeURIComponent;
  const convPath = (id) => '/v1/conversations/' + enc(id);

  function reportError(what, e) {
    showError(what + ': ' + (e && e.message ? e.message : String(e)) + (e && e.code && e.code !== 'NETWORK' ? ' (' + e.code + ')' : ''));
  }

  // ---------------------------------------------------------------- conversations

  async function loadConversations() {
    try {
      const data = await api('GET', '/v1/conversations');
      S.conversations = (data && data.conversations) || [];
    } catch (e) {
      reportError('Could not list the conversations', e);
    }
    renderConversations();
  }

  function renderConversations() {
    const list = $('conv-list');
    list.replaceChildren(
      ...S.conversations.map((c) =>
        el('li', {},
          el('button', {
            type: 'button',
            class: 'conv' + (c.id === S.convId ? ' active' : ''),
            'aria-current': c.id === S.convId ? 'page' : null,
            dataset: { id: c.id },
            title: c.id,
            onclick: () => navigate(c.id),
          },
          el('span', { class: 'conv-name', text: c.title || 'New conversation' }),
          el('span', { class: 'conv-meta', text: (c.forked_from ? 'fork · ' : '') + (c.agent_id ? 'agent · ' : '') + fmtTime(c.updated_at || c.created_at) })))));
    if (!S.conversations.length) list.append(el('li', { class: 'hint', text: 'No conversations yet.' }));
    const current = S.conversations.find((c) => c.id === S.convId);
    $('conv-title').textContent = S.convId ? (current && current.title) || 'New conversation' : '';
    document.title = current && current.title ? current.title + ' · toolwire' : 'toolwire';
  }

  async function newConversation() {
    try {
      const c = await api('POST', '/v1/conversations', {});
      S.conversations = [c, ...S.conversations.filter((x) => x.id !== c.id)];
      navigate(c.id);
      return c;
    } catch (e) {
      reportError('Could not create a conversation', e);
      return null;
    }
  }

  function navigate(id) {
    if (location.hash !== '#/c/' + id) location.hash = '#/c/' + id;
    else selectConversation(id);
  }

  function hashConversation() {
    const m = /^#\/c\/(.+)$/.exec(location.hash);
    return m ? decodeURIComponent(m[1]) : null;
  }

  async function selectConversation(id) {
    if (S.convId === id && S.ws) return;
    disconnect();
    Object.assign(S, {
      convId: id, tree: null, order: [], running: false, runId: null, liveText: '', liveReasoning: '',
      liveTools: [], lastSeq: null, floor: null, editing: null, sending: false, shown: WINDOW,
    });
    S.nodes = new Map();
    S.views = new Map();
    S.tools = new Map();
    S.pending = new Map();
    cardEls.clear();
    owners.clear();
    aliases.clear();
    clearError();
    renderConversations();
    renderAll();
    renderModelPicker();
    if (!id) return;
    $('composer').focus();
    loadModel(id);
    try {
      const tree = await api('GET', convPath(id) + '/tree');
      if (S.convId !== id) return;
      if (!S.tree) applyTree(tree); // the snapshot may have come first
      renderAll();
    } catch (e) {
      if (S.convId === id) reportError('Could not load the conversation', e);
      if (e.status === 404) return;
    }
    if (S.convId === id) connect();
  }

  // ---------------------------------------------------------------- the tree

  function applyTree(tree) {
    S.tree = {
      conversation_id: tree.conversation_id,
      root_id: tree.root_id,
      active_leaf: tree.active_leaf,
      total_cost: tree.total_cost,
      running: !!tree.running,
      last_seq: tree.last_seq,
    };
    S.nodes = new Map();
    S.order = [];
    for (const n of tree.nodes || []) {
      S.nodes.set(n.id, Object.assign({}, n, { children: [...(n.children || [])] }));
      S.order.push(n.id);
    }
    // A message's stored text and calls never change; what a node says
    // that its cached view does not (usage, cost, notifications) wins.
    for (const [id, v] of S.views) {
      const n = S.nodes.get(id);
      if (n) Object.assign(v, { usage: n.usage, cost: n.cost, status: n.status, notifications: n.notifications, model: n.model });
    }
    if (!tree.running && !S.running) S.liveTools = S.liveTools.filter((id) => S.pending.has(id));
  }

  /** Refetches the tree (after a turn, to pick up usage and cost). */
  async function refreshTree(tries = 4) {
    const id = S.convId;
    if (!id) return;
    try {
      const tree = await api('GET', convPath(id) + '/tree');
      if (S.convId !== id) return;
      // Older than what the socket already told: try again in a moment.
      if (S.lastSeq !== null && typeof tree.last_seq === 'number' && tree.last_seq < S.lastSeq) {
        if (tries > 0) setTimeout(() => refreshTree(tries - 1), 250);
        return;
      }
      applyTree(tree);
      renderAll();
    } catch (e) {
      if (S.convId === id) reportError('Could not reload the conversation', e);
    }
  }

  function branch() {
    const out = [];
    let id = S.tree && S.tree.active_leaf;
    const seen = new Set();
    while (id && S.nodes.has(id) && !seen.has(id)) {
      seen.add(id);
      out.push(id);
      id = S.nodes.get(id).parent_id;
    }
    return out.reverse();
  }

  /** The newest leaf under `id`: where a branch switched to goes on. */
  function leafUnder(id) {
    let n = S.nodes.get(id);
    while (n && n.children && n.children.length) n = S.nodes.get(n.children[n.children.length - 1]);
    return n ? n.id : id;
  }

  async function setActiveLeaf(id) {
    if (!S.convId) return;
    try {
      const tree = await api('PUT', convPath(S.convId) + '/active_leaf', { message_id: leafUnder(id) });
      applyTree(tree);
      S.editing = null;
      S.shown = WINDOW;
      renderAll();
    } catch (e) {
      reportError('Could not switch branches', e);
    }
  }

  // Messages loaded one by one are drawn together, once per frame.
  let branchQueued = false;
  function scheduleBranch() {
    if (branchQueued) return;
    branchQueued = true;
    requestAnimationFrame(() => {
      branchQueued = false;
      renderBranch();
      renderTree();
    });
  }

  /** Fetches the views of `ids` not had yet, BATCH to a request. */
  function fetchViews(ids) {
    if (!S.convId) return;
    const conv = S.convId;
    const missing = ids.filter((id) => !S.views.has(id) && !S.loading.has(id));
    for (let i = 0; i < missing.length; i += BATCH) {
      const batch = missing.slice(i, i + BATCH);
      for (const id of batch) S.loading.add(id);
      api('GET', convPath(conv) + '/messages?ids=' + batch.map(enc).join(','))
        .then((data) => {
          if (S.convId !== conv) return;
          for (const v of (data && data.messages) || []) S.views.set(v.id, v);
          scheduleBranch();
        })
        .catch((e) => { if (S.convId === conv) reportError('Could not load messages', e); })
        .finally(() => { for (const id of batch) S.loading.delete(id); });
    }
  }

  /** Draws WINDOW more of the branch's earlier messages. */
  function showEarlier() {
    S.shown += WINDOW;
    renderBranch();
  }
  // The "earlier messages" button loads them once it scrolls into view.
  const earlierSeen = typeof IntersectionObserver === 'function'
    ? new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) showEarlier();
    }, { root: null, rootMargin: '200px 0px 0px 0px' })
    : null;

  // ---------------------------------------------------------------- tool cards

  /** The card key of call `id` of stored message `mid`. */
  function cardKey(mid, id) {
    const alias = aliases.get(mid + '\n' + id);
    if (alias) return alias;
    const owner = owners.get(id);
    if (owner && owner !== mid) retire(id);
    owners.set(id, mid);
    return id;
  }

  /** Moves the stored call `id` (and its card) aside: a new call reuses the id. */
  function retire(id) {
    const owner = owners.get(id);
    if (!owner) return;
    const key = owner + '/' + id;
    aliases.set(owner + '\n' + id, key);
    const t = S.tools.get(id);
    if (t) {
      S.tools.set(key, Object.assign({}, t, { id: key }));
      S.tools.delete(id);
    }
    const e = cardEls.get(id);
    if (e) {
      cardEls.set(key, e);
      cardEls.delete(id);
      e.dataset.toolCallId = key;
    }
    owners.delete(id);
  }

  /** A frame about call `id`: if it announces a new call under the id of
   * a finished, stored one, that one is moved aside first. */
  function liveToolState(id, name, status) {
    const t = S.tools.get(id);
    if (t && owners.has(id) && (RANK[t.status] ?? 0) === 2 && (status === undefined || status === 'pending')) retire(id);
    return toolState(id, name);
  }

  function toolState(id, name) {
    let t = S.tools.get(id);
    if (!t) {
      t = { id, callId: id, name: name || '', status: 'pending', args: null, output: '', result: null, isError: false, title: null, kind: null };
      S.tools.set(id, t);
    } else if (name && !t.name) {
      t.name = name;
    }
    return t;
  }

  /** Calls shown in a stored message (the rest are shown as live). */
  function storedToolIds() {
    return new Set(owners.keys());
  }

  const STATUS_LABEL = {
    pending: 'pending',
    executing: 'running',
    in_progress: 'running',
    completed: 'done',
    failed: 'failed',
  };

  function contentText(content) {
    if (!Array.isArray(content)) return typeof content === 'string' ? content : '';
    return content
      .map((c) => (c.type === 'text' ? c.text : c.type === 'diff' ? 'diff of ' + c.path + '\n' + (c.new_text || '') : ''))
      .filter(Boolean)
      .join('\n');
  }

  function cardEl(id) {
    let e = cardEls.get(id);
    if (!e) {
      e = el('div', { class: 'tool-card', dataset: { toolCallId: id } },
        el('div', { class: 'tool-head' },
          el('span', { class: 'tool-icon', 'aria-hidden': 'true', text: '⚙' }),
          el('span', { class: 'tool-name' }),
          el('span', { class: 'tool-title' }),
          el('span', { class: 'tool-status' })),
        el('dl', { class: 'tool-args' }),
        el('div', { class: 'tool-approval', hidden: true },
          el('span', { text: 'This call needs your approval.' }),
          el('button', { type: 'button', class: 'approve primary', onclick: () => answerApproval(id, true) }, 'Approve'),
          el('button', { type: 'button', class: 'deny danger', onclick: () => answerApproval(id, false) }, 'Deny')),
        el('pre', { class: 'tool-output', hidden: true }),
        el('div', { class: 'tool-result', hidden: true },
          el('div', { class: 'label', text: 'Result' }),
          el('pre', { class: 'tool-result-text' }),
          el('div', { class: 'tool-images' })));
      cardEls.set(id, e);
    }
    updateCard(id);
    return e;
  }

  function updateCard(id) {
    const e = cardEls.get(id);
    const t = S.tools.get(id);
    if (!e || !t) return;
    const pending = t.callId === id && S.pending.has(id);
    const status = t.status || 'pending';
    e.dataset.status = status;
    e.dataset.approval = pending ? (t.answering ? 'answering' : 'pending') : '';
    e.querySelector('.tool-name').textContent = t.name || '…';
    e.querySelector('.tool-title').textContent = t.title && t.title !== t.name ? t.title : '';
    e.querySelector('.tool-status').textContent = pending && !t.answering ? 'awaiting approval' : STATUS_LABEL[status] || status;
    const args = e.querySelector('.tool-args');
    const entries = t.args && typeof t.args === 'object' && !Array.isArray(t.args) ? Object.entries(t.args) : t.args != null ? [['arguments', t.args]] : [];
    args.replaceChildren(...entries.flatMap(([k, v]) => [el('dt', { text: k }), el('dd', { text: valueText(v) })]));
    args.hidden = entries.length === 0;
    const approval = e.querySelector('.tool-approval');
    approval.hidden = !pending;
    for (const b of approval.querySelectorAll('button')) b.disabled = !!t.answering;
    const out = e.querySelector('.tool-output');
    out.textContent = t.output || '';
    out.hidden = !t.output || (t.result !== null && t.result === t.output);
    const res = e.querySelector('.tool-result');
    res.hidden = t.result === null || t.result === undefined;
    res.classList.toggle('is-error', !!t.isError);
    res.querySelector('.tool-result-text').textContent = t.result == null ? '' : String(t.result);
    // Drawn again only when the result's images change.
    const shown = res.querySelector('.tool-images');
    const images = t.images || [];
    const keys = images.map((i) => i.sha256).join(' ');
    if (shown.dataset.keys !== keys) {
      shown.dataset.keys = keys;
      shown.replaceChildren(...images.map(imageEl));
    }
  }

  function answerApproval(id, approve) {
    const t = S.tools.get(id);
    const callId = t ? t.callId : id;
    const frame = approve ? { type: 'approve', tool_call_id: callId } : { type: 'deny', tool_call_id: callId, reason: 'Denied by the user.' };
    if (!send(frame)) return;
    if (t) t.answering = true;
    updateCard(id);
  }

  // ---------------------------------------------------------------- rendering

  function renderAll() {
    renderConversations();
    renderBranch();
    renderLive();
    renderTree();
    renderComposer();
    const cost = S.tree && typeof S.tree.total_cost === 'number' ? fmtCost(S.tree.total_cost) : '';
    $('cost').textContent = cost ? 'cost ' + cost : '';
    $('empty').hidden = !!S.convId;
  }

  const ROLE_LABEL = { user: 'You', assistant: 'Assistant', tool: 'Tool', system: 'System' };

  function renderBranch() {
    const box = $('messages');
    const scroller = $('scroller');
    const atBottom = scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 60;
    // Away from the bottom, the first message in sight stays where it is
    // while messages are drawn above it.
    let anchor = null;
    if (!atBottom) {
      const top = scroller.getBoundingClientRect().top;
      for (const li of box.children) {
        const r = li.getBoundingClientRect();
        if (r.bottom > top && li.dataset.id) { anchor = { id: li.dataset.id, top: r.top }; break; }
      }
    }
    const all = branch();
    // A window never starts on a tool result: its call is drawn with it.
    let start = Math.max(0, all.length - S.shown);
    while (start > 0 && S.nodes.get(all[start]).role === 'tool') start -= 1;
    const ids = all.slice(start);
    fetchViews(ids);

    // Stored calls and results fill in the cards (history, or a turn that
    // ended while the socket was away).
    const onBranch = new Set();
    const current = new Map(); // tool_call_id -> card key of the latest call so far
    for (const id of ids) {
      const v = S.views.get(id);
      if (!v) continue;
      for (const b of v.content_blocks || []) {
        if (b.type === 'tool_use') {
          const key = cardKey(id, b.id);
          onBranch.add(b.id);
          current.set(b.id, key);
          const t = toolState(key, b.name);
          t.callId = b.id;
          if (t.args === null || typeof t.args !== 'object' || !Object.keys(t.args).length) t.args = b.arguments;
        } else if (b.type === 'tool_result') {
          const key = current.get(b.tool_use_id);
          if (!key) continue;
          const t = toolState(key);
          t.result = b.content;
          t.images = b.images || [];
          t.isError = !!b.is_error;
          t.status = b.is_error ? 'failed' : 'completed';
          if (key === b.tool_use_id) S.pending.delete(b.tool_use_id);
        }
      }
    }
    const items = [];
    if (earlierSeen) earlierSeen.disconnect();
    if (start > 0) {
      const more = el('button', { type: 'button', class: 'show-earlier', onclick: showEarlier },
        'Show earlier messages (' + start + ' more)');
      items.push(el('li', { class: 'earlier' }, more));
    }
    for (const id of ids) {
      const item = renderMessage(id, onBranch);
      if (item) items.push(item);
    }
    box.replaceChildren(...items);
    if (atBottom) {
      scroller.scrollTop = scroller.scrollHeight;
    } else if (anchor) {
      const li = box.querySelector('li[data-id="' + CSS.escape(anchor.id) + '"]');
      if (li) scroller.scrollTop += li.getBoundingClientRect().top - anchor.top;
    }
    // Scrolled up to, it draws more (at the bottom it is out of sight).
    if (start > 0 && earlierSeen) earlierSeen.observe(box.firstChild);
    renderLive();
  }

  // ---------------------------------------------------------------- images

  // A stored image by its hash (GET /v1/blobs/{sha256}): fetched with the
  // key, as every API call is (an <img src> could not send it), and shown
  // from an object URL. The bytes never change under their hash, so each
  // is fetched once per page.
  const blobUrls = new Map(); // sha256 -> Promise<object URL>

  function blobUrl(sha) {
    let url = blobUrls.get(sha);
    if (!url) {
      const headers = {};
      const key = apiKey();
      if (key) headers.Authorization = 'Bearer ' + key;
      url = fetch('/v1/blobs/' + encodeURIComponent(sha), { headers }).then((res) => {
        if (!res.ok) throw new Error('HTTP ' + res.status);
        return res.blob();
      }).then((b) => URL.createObjectURL(b));
      url.catch(() => blobUrls.delete(sha)); // tried again on the next draw
      blobUrls.set(sha, url);
    }
    return url;
  }

  function sizeText(n) {
    if (n < 1024) return n + ' B';
    if (n < 1024 * 1024) return Math.ceil(n / 1024) + ' KB';
    return (n / 1024 / 1024).toFixed(1) + ' MB';
  }

  /** An image block ({media_type, sha256, bytes_len}) as an <img>, its
   * description as the alt text (and shown should it fail to load). */
  function imageEl(ref) {
    const label = (ref.media_type || 'image') + ', ' + sizeText(ref.bytes_len || 0);
    const img = el('img', { class: 'msg-image', alt: 'image: ' + label, title: label + ' · sha256 ' + (ref.sha256 || '') });
    const box = el('figure', { class: 'image', dataset: { sha256: ref.sha256 || '' } }, img);
    blobUrl(ref.sha256).then((url) => { img.src = url; }, (e) => {
      box.replaceChildren(el('span', { class: 'image-missing', text: '[image: ' + label + ': ' + e.message + ']' }));
    });
    return box;
  }

  function renderMessage(id, onBranch) {
    const n = S.nodes.get(id);
    const v = S.views.get(id);
    const role = n.role;
    const blocks = v ? v.content_blocks || [] : null;
    const body = el('div', { class: 'msg-body' });
    if (!blocks) {
      body.append(el('div', { class: 'text loading', text: n.summary || '…' }));
    } else {
      for (const b of blocks) {
        if (b.type === 'text') {
          if (b.text) body.append(el('div', { class: 'text', text: b.text }));
        } else if (b.type === 'reasoning') {
          body.append(el('details', { class: 'reasoning' }, el('summary', { text: 'Reasoning' }), el('div', { class: 'reasoning-text', text: b.text || '' })));
        } else if (b.type === 'tool_use') {
          body.append(cardEl(cardKey(id, b.id)));
        } else if (b.type === 'image') {
          body.append(imageEl(b));
        } else if (b.type === 'tool_result') {
          if (!onBranch.has(b.tool_use_id)) {
            body.append(el('pre', { class: 'orphan-result', text: b.content || '' }));
            for (const i of b.images || []) body.append(imageEl(i));
          }
        } else if (b.type === 'notification') {
          body.append(el('div', { class: 'notification', dataset: { priority: b.priority || 'normal' } },
            el('span', { class: 'label', text: b.source || 'notification' }), ' ', b.text || ''));
        }
      }
    }
    // A tool node shows nothing of its own when its results are on cards.
    if (role === 'tool' && blocks && !body.childNodes.length) return null;

    const comp = compactionOf(n, blocks);
    if (comp) {
      const meta = 'covers ' + comp.covered + ' earlier message' + (comp.covered === 1 ? '' : 's') +
        (comp.tokens_before ? ' · about ' + comp.tokens_before + ' → ' + comp.tokens_after + ' tokens' : '');
      return el('li', { class: 'msg msg-compaction', dataset: { id, role: 'compaction' } },
        el('div', { class: 'msg-head' }, el('span', { class: 'role', text: 'Compacted' }), el('span', { class: 'meta', text: meta })),
        el('details', {}, el('summary', { text: 'Summary sent in place of those messages' }),
          el('div', { class: 'text', text: comp.summary !== undefined ? comp.summary : n.summary || '' })));
    }
    if (role === 'system') {
      return el('li', { class: 'msg msg-system', dataset: { id, role } },
        el('details', {}, el('summary', { text: 'System prompt' }), body));
    }

    const head = el('div', { class: 'msg-head' });
    const source = v && v.source === 'interjection' ? ' (interjection)' : '';
    head.append(el('span', { class: 'role', text: (ROLE_LABEL[role] || role) + source }));

    // ‹ 2/3 › between the versions of this message.
    const parent = n.parent_id && S.nodes.get(n.parent_id);
    const sibs = parent ? parent.children.filter((c) => S.nodes.get(c) && S.nodes.get(c).role === role) : [];
    const idx = sibs.indexOf(id);
    if (sibs.length > 1 && idx >= 0) {
      head.append(el('span', { class: 'siblings', role: 'group', 'aria-label': 'Versions of this message' },
        el('button', { type: 'button', class: 'sib-prev icon', title: 'Previous version', disabled: idx === 0 || S.running, onclick: () => setActiveLeaf(sibs[idx - 1]) }, '‹'),
        el('span', { class: 'sib-pos', text: idx + 1 + '/' + sibs.length }),
        el('button', { type: 'button', class: 'sib-next icon', title: 'Next version', disabled: idx === sibs.length - 1 || S.running, onclick: () => setActiveLeaf(sibs[idx + 1]) }, '›')));
    }
    const usage = n.usage;
    const meta = [];
    if (role === 'assistant' && n.model) meta.push(n.model);
    if (usage) {
      meta.push(usage.prompt_tokens + ' in · ' + usage.completion_tokens + ' out' + (usage.cached_tokens ? ' · ' + usage.cached_tokens + ' cached' : '') + (usage.cache_write_tokens ? ' · ' + usage.cache_write_tokens + ' cache written' : ''));
    }
    if (typeof n.cost === 'number') meta.push(fmtCost(n.cost));
    if (n.notifications) meta.push(n.notifications + ' notification' + (n.notifications > 1 ? 's' : ''));
    if (n.status === 'interrupted') meta.push('interrupted');
    if (meta.length) head.append(el('span', { class: 'meta', text: meta.join(' · ') }));
    head.append(el('span', { class: 'spacer' }));

    const actions = el('span', { class: 'actions' });
    if (role === 'user') {
      actions.append(el('button', { type: 'button', class: 'edit', disabled: S.running || !v, title: 'Edit this message: a new version, answered again', onclick: () => startEdit(id) }, 'Edit'));
    }
    if (role === 'assistant') {
      actions.append(el('button', { type: 'button', class: 'regenerate', disabled: S.running, title: 'Answer again: a new version of this answer', onclick: () => regenerate(id) }, 'Regenerate'));
      if (S.models.length > 1) {
        const pick = el('select', { class: 'regenerate-with', disabled: S.running, title: 'Answer again with another model: a new version by it', 'aria-label': 'Regenerate with another model' },
          el('option', { value: '' }, 'with…'),
          ...S.models.map((m) => el('option', { value: m.name }, m.name)));
        pick.addEventListener('change', () => { if (pick.value) regenerate(id, pick.value); });
        actions.append(pick);
      }
    }
    if (role === 'user' || role === 'assistant') {
      actions.append(el('button', { type: 'button', class: 'fork', title: 'A new conversation with the history up to here', onclick: () => fork(id) }, 'Fork'));
    }
    head.append(actions);

    const item = el('li', { class: 'msg msg-' + role, dataset: { id, role, status: n.status || '' } }, head);
    if (S.editing === id && v) {
      const text = blocks.filter((b) => b.type === 'text').map((b) => b.text).join('\n');
      const area = el('textarea', { class: 'edit-text', rows: Math.min(10, text.split('\n').length + 1) });
      area.value = text;
      const save = () => saveEdit(id, area.value);
      area.addEventListener('keydown', (ev) => {
        if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); save(); }
        if (ev.key === 'Escape') { S.editing = null; renderBranch(); }
      });
      item.append(el('div', { class: 'edit-box' }, area,
        el('div', { class: 'edit-buttons' },
          el('button', { type: 'button', class: 'edit-cancel', onclick: () => { S.editing = null; renderBranch(); } }, 'Cancel'),
          el('button', { type: 'button', class: 'edit-save primary', onclick: save }, 'Save and send'))));
      setTimeout(() => { area.focus(); area.setSelectionRange(area.value.length, area.value.length); }, 0);
    } else {
      item.append(body);
    }
    return item;
  }

  /** What a compaction node covers (from the tree, or its block), or
   * null for any other node. */
  function compactionOf(n, blocks) {
    const b = (blocks || []).find((x) => x.type === 'compaction');
    if (b) return b;
    return n && n.compaction ? n.compaction : null;
  }

  /** The nodes that compaction nodes on the active branch stand for. */
  function coveredNodes(active) {
    const covered = new Set();
    for (const id of active) {
      const c = compactionOf(S.nodes.get(id));
      let at = c ? c.through : null;
      while (at && !covered.has(at) && S.nodes.has(at) && at !== S.tree.root_id) {
        covered.add(at);
        at = S.nodes.get(at).parent_id;
      }
    }
    return covered;
  }

  async function compactNow() {
    if (!S.convId || S.running) return;
    try {
      const r = await api('POST', convPath(S.convId) + '/compact', {});
      startedRun(r);
      renderAll();
    } catch (e) {
      reportError('Could not compact the conversation', e);
    }
  }

  function renderLive() {
    const stored = storedToolIds();
    S.liveTools = S.liveTools.filter((id) => !stored.has(id));
    const show = S.running || S.liveText || S.liveReasoning || S.liveTools.length;
    $('live').hidden = !show;
    $('live-text').textContent = S.liveText;
    $('live-text').hidden = !S.liveText;
    const r = $('live-reasoning');
    r.hidden = !S.liveReasoning;
    r.querySelector('.reasoning-text').textContent = S.liveReasoning;
    const cards = $('live-cards');
    const want = S.liveTools.map(cardEl);
    if (want.length !== cards.childNodes.length || want.some((c, i) => cards.childNodes[i] !== c)) cards.replaceChildren(...want);
    $('turn-indicator').hidden = !S.running;
    const scroller = $('scroller');
    if (scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight < 120) scroller.scrollTop = scroller.scrollHeight;
  }

  function renderTree() {
    const panel = $('tree');
    if (!S.tree || !S.tree.root_id || $('tree-panel').hidden) { panel.replaceChildren(); return; }
    const active = new Set(branch());
    const covered = coveredNodes(active);
    const item = (n) => {
      const comp = compactionOf(n);
      const label = comp
        ? 'Compaction: covers ' + comp.covered + ' message' + (comp.covered === 1 ? '' : 's')
        : (ROLE_LABEL[n.role] || n.role) + ': ' + (n.summary || (n.tool_calls || []).map((c) => c.tool_name).join(', ') || '');
      return el('li', { class: 'tree-node' + (active.has(n.id) ? ' on-branch' : '') + (S.tree.active_leaf === n.id ? ' leaf' : '') + (comp ? ' compaction' : '') + (covered.has(n.id) ? ' covered' : ''), dataset: { id: n.id, role: comp ? 'compaction' : n.role } },
        el('button', { type: 'button', class: 'tree-label', title: label, disabled: S.running, onclick: () => setActiveLeaf(n.id) }, label));
    };
    // A run of single children is one flat list; lists nest only where
    // the tree branches (a long conversation is not thousands deep).
    const root = el('ul', { class: 'tree-root' });
    const todo = [[S.tree.root_id, root]];
    while (todo.length) {
      let [id, list] = todo.pop();
      while (id) {
        const n = S.nodes.get(id);
        if (!n) break;
        const li = item(n);
        list.append(li);
        const kids = (n.children || []).filter((c) => S.nodes.has(c));
        if (kids.length === 1) { id = kids[0]; continue; }
        for (const c of kids) {
          const sub = el('ul', {});
          li.append(sub);
          todo.push([c, sub]);
        }
        id = null;
      }
    }
    panel.replaceChildren(root.childNodes.length ? root : '');
  }

  function renderComposer() {
    const box = $('composer');
    const sendBtn = $('send');
    const connected = S.ws && S.ws.readyState === WebSocket.OPEN;
    box.disabled = false;
    if (S.running) {
      box.placeholder = 'Interject: add to the running turn (Enter to send)';
      sendBtn.textContent = 'Interject';
      sendBtn.disabled = !connected;
      $('composer-hint').textContent = connected ? 'A turn is running: what you send now is interjected into it.' : 'Reconnecting… interjections wait for the connection.';
    } else {
      box.placeholder = 'Send a message (Enter to send, Shift+Enter for a new line)';
      sendBtn.textContent = 'Send';
      sendBtn.disabled = S.sending;
      $('composer-hint').textContent = S.note || '';
    }
    $('composer-form').dataset.mode = S.running ? 'interject' : 'send';
    $('stop').hidden = !S.running;
    $('stop').disabled = !connected;
    $('compact-button').disabled = !S.convId || S.running;
  }

  // ---------------------------------------------------------------- actions

  // ------------------------------------------------------------ attachments

  // What the server takes (see POST …/messages): checked here too, so a
  // wrong file is named before anything is read or sent.
  const IMAGE_TYPES = ['image/png', 'image/jpeg', 'image/gif', 'image/webp'];
  const MAX_IMAGE_BYTES = 5 * 1024 * 1024;

  function readBase64(file) {
    return new Promise((resolve, reject) => {
      const reader = new FileReader();
      reader.onload = () => resolve(String(reader.result).replace(/^data:[^,]*,/, ''));
      reader.onerror = () => reject(reader.error || new Error('could not read ' + file.name));
      reader.readAsDataURL(file);
    });
  }

  async function attach(files) {
    for (const file of files) {
      const name = file.name || 'pasted image';
      if (!IMAGE_TYPES.includes(file.type)) {
        showError(name + ': not an image toolwire sends (PNG, JPEG, GIF or WebP)');
        continue;
      }
      if (file.size > MAX_IMAGE_BYTES) {
        showError(name + ': ' + sizeText(file.size) + ' is over the limit of 5.0 MB');
        continue;
      }
      try {
        S.attachments.push({ name, type: file.type, size: file.size, data: await readBase64(file) });
      } catch (e) {
        reportError('Could not read ' + name, e);
      }
    }
    renderAttachments();
  }

  function renderAttachments() {
    const box = $('attachments');
    box.hidden = S.attachments.length === 0;
    box.replaceChildren(...S.attachments.map((a, i) => {
      const remove = el('button', { type: 'button', title: 'Remove', 'aria-label': 'Remove ' + a.name, text: '×' });
      remove.addEventListener('click', () => { S.attachments.splice(i, 1); renderAttachments(); });
      return el('span', { class: 'attachment', dataset: { name: a.name } },
        el('span', { text: a.name + ' · ' + sizeText(a.size) }), remove);
    }));
  }

  async function submitComposer() {
    const box = $('composer');
    const text = box.value.trim();
    if (!text && !S.attachments.length) return;
    clearError();
    if (S.running) {
      if (S.attachments.length) {
        showError('Images go with a new message, not into a running turn: send them when it ends.');
        return;
      }
      if (send({ type: 'interject', text })) box.value = '';
      return;
    }
    S.sending = true;
    renderComposer();
    try {
      if (!S.convId) {
        const c = await newConversation();
        if (!c) return;
        await waitFor(() => S.convId === c.id && S.tree);
      }
      try {
        const body = { text };
        if (S.attachments.length) {
          body.images = S.attachments.map((a) => ({ data: a.data, media_type: a.type }));
        }
        const r = await api('POST', convPath(S.convId) + '/messages', body);
        box.value = '';
        S.attachments = [];
        renderAttachments();
        startedRun(r);
      } catch (e) {
        if (e.code === 'TURN_IN_PROGRESS' && send({ type: 'interject', text })) {
          box.value = '';
        } else {
          throw e;
        }
      }
    } catch (e) {
      reportError('Could not send the message', e);
    } finally {
      S.sending = false;
      renderAll();
    }
  }

  /** A turn was started: running until its stop (which may have come
   * already, on the socket, before the POST answered). */
  function startedRun(r) {
    if (r && r.run_id && !stoppedRuns.has(r.run_id)) {
      S.running = true;
      S.runId = r.run_id;
    }
  }

  function waitFor(cond, ms = 5000) {
    return new Promise((resolve) => {
      const start = Date.now();
      const tick = () => (cond() || Date.now() - start > ms ? resolve() : setTimeout(tick, 30));
      tick();
    });
  }

  function startEdit(id) {
    S.editing = id;
    renderBranch();
  }

  async function saveEdit(id, text) {
    if (!text.trim()) return;
    try {
      const r = await api('POST', convPath(S.convId) + '/messages/' + enc(id) + '/edit', { text });
      S.editing = null;
      startedRun(r);
      renderAll();
    } catch (e) {
      reportError('Could not edit the message', e);
    }
  }

  async function regenerate(id, model) {
    try {
      const r = await api('POST', convPath(S.convId) + '/messages/' + enc(id) + '/regenerate', model ? { model } : undefined);
      startedRun(r);
      renderAll();
    } catch (e) {
      reportError('Could not regenerate the answer', e);
    }
  }

  /** The conversation's model and the models there are. */
  async function loadModel(id) {
    try {
      const m = await api('GET', convPath(id) + '/model');
      if (S.convId !== id) return;
      S.models = m.models || [];
      S.model = m.model;
    } catch (e) {
      if (S.convId === id) reportError('Could not load the models', e);
      return;
    }
    renderModelPicker();
    renderBranch();
  }

  function renderModelPicker() {
    const pick = $('model-picker');
    const many = !!S.convId && S.models.length > 1;
    pick.hidden = !many;
    if (!many) return;
    pick.replaceChildren(...S.models.map((m) => el('option', { value: m.name, title: m.handle || m.model }, m.name)));
    pick.value = S.model || '';
  }

  async function chooseModel(name) {
    const id = S.convId;
    try {
      const m = await api('PUT', convPath(id) + '/model', { model: name });
      if (S.convId !== id) return;
      S.model = m.model;
    } catch (e) {
      reportError('Could not choose the model', e);
    }
    renderModelPicker();
  }

  async function fork(id) {
    try {
      const c = await api('POST', convPath(S.convId) + '/fork', { message_id: id });
      S.conversations = [c, ...S.conversations.filter((x) => x.id !== c.id)];
      navigate(c.id);
    } catch (e) {
      reportError('Could not fork the conversation', e);
    }
  }

  // ---------------------------------------------------------------- WebSocket

  function setConn(state, text) {
    const c = $('conn');
    c.dataset.state = state;
    c.textContent = text;
    renderComposer();
  }

  function connect() {
    if (!S.convId) return;
    clearTimeout(S.retryTimer);
    const gen = ++S.wsGen;
    const conv = S.convId;
    const params = new URLSearchParams();
    if (S.lastSeq !== null) params.set('after', String(S.lastSeq));
    S.floor = S.lastSeq;
    const key = apiKey();
    if (key) params.set('token', key); // a browser's WebSocket cannot send an Authorization header
    const qs = params.toString();
    const url = (location.protocol === 'https:' ? 'wss://' : 'ws://') + location.host + convPath(conv) + '/ws' + (qs ? '?' + qs : '');
    setConn('connecting', S.retries ? 'reconnecting…' : 'connecting…');
    let ws;
    try {
      ws = new WebSocket(url);
    } catch (e) {
      reportError('Could not open the live connection', e);
      return;
    }
    S.ws = ws;
    ws.onopen = () => {
      if (gen !== S.wsGen) return;
      S.retries = 0;
      setConn('open', 'live');
    };
    ws.onmessage = (ev) => {
      if (gen !== S.wsGen) return;
      let frame;
      try { frame = JSON.parse(ev.data); } catch { return; }
      try { handleFrame(frame); } catch (e) { console.error('frame', frame, e); }
    };
    ws.onclose = () => {
      if (gen !== S.wsGen) return;
      S.ws = null;
      S.retries += 1;
      const delay = Math.min(10000, 300 * 2 ** Math.min(S.retries, 6));
      setConn('closed', 'disconnected — retrying in ' + Math.round(delay / 1000) + ' s');
      S.retryTimer = setTimeout(connect, delay);
    };
  }

  function disconnect() {
    S.wsGen += 1;
    clearTimeout(S.retryTimer);
    if (S.ws) {
      try { S.ws.close(); } catch { /* already closed */ }
    }
    S.ws = null;
    S.retries = 0;
    setConn('idle', 'not connected');
  }

  function send(frame) {
    if (!S.ws || S.ws.readyState !== WebSocket.OPEN) {
      showError('Not connected to the server: try again once the connection is back.');
      return false;
    }
    S.ws.send(JSON.stringify(frame));
    return true;
  }

  function handleFrame(f) {
    if (f.type === 'snapshot') {
      S.lastSeq = typeof f.seq === 'number' ? f.seq : S.lastSeq;
      S.floor = S.lastSeq;
      applyTree(f.tree);
      applyTurn(f.turn);
      renderAll();
      return;
    }
    // One stored event may make several frames, all with its seq: a seq
    // equal to the last one is new unless the snapshot or the reconnect's
    // `after` covered it. A reconnect's resync frames (a running call's
    // whole state) carry the `after` itself and are always applied.
    if (typeof f.seq === 'number' && !f.resync) {
      if (S.floor !== null && f.seq <= S.floor) return;
      if (S.lastSeq !== null && f.seq < S.lastSeq) return;
      S.lastSeq = f.seq;
    }
    switch (f.type) {
      case 'turn_started':
        if (stoppedRuns.has(f.run_id)) break;
        S.note = '';
        S.running = true;
        S.runId = f.run_id;
        S.liveText = '';
        S.liveReasoning = '';
        if (S.tree) S.tree.running = true;
        renderAll();
        break;
      case 'text_delta':
        S.running = true;
        if (f.kind === 'reasoning') S.liveReasoning += f.text || '';
        else S.liveText += f.text || '';
        renderLive();
        break;
      case 'conv_update':
        onConvUpdate(f);
        break;
      case 'tool_update':
        onToolUpdate(f);
        break;
      case 'notification': {
        const n = S.nodes.get(f.message_id);
        if (n) n.notifications = (n.notifications || 0) + (f.notifications || []).length;
        const v = S.views.get(f.message_id);
        if (v) for (const x of f.notifications || []) v.content_blocks.push(Object.assign({ type: 'notification' }, x));
        renderBranch();
        break;
      }
      case 'approval_request':
        for (const c of f.tool_calls || []) {
          const t = liveToolState(c.tool_call_id, c.tool_name);
          S.pending.set(c.tool_call_id, c);
          t.answering = false;
          if (c.arguments && typeof c.arguments === 'object') t.args = c.arguments;
          if (!storedToolIds().has(c.tool_call_id) && !S.liveTools.includes(c.tool_call_id)) S.liveTools.push(c.tool_call_id);
          updateCard(c.tool_call_id);
        }
        renderLive();
        break;
      case 'budget_warning':
        S.note = 'The ' + f.scope + "'s " + f.measure + ' budget is ' + Math.round((100 * f.used) / f.limit) + '% used.';
        renderComposer();
        break;
      case 'stop':
        onStop(f);
        break;
      case 'ack':
        break;
      case 'error':
        showError((f.for ? 'The server refused ' + f.for + ': ' : '') + (f.message || 'error'));
        for (const t of S.tools.values()) if (t.answering) { t.answering = false; updateCard(t.id); }
        break;
      default:
        break;
    }
  }

  function applyTurn(turn) {
    S.running = !!turn || !!(S.tree && S.tree.running);
    S.runId = turn ? turn.run_id : null;
    S.liveText = turn ? turn.text || '' : '';
    S.liveReasoning = '';
    S.liveTools = [];
    if (!turn) return;
    const stored = storedToolIds();
    for (const c of turn.tool_calls || []) {
      const t = toolState(c.tool_call_id, c.tool_name);
      t.status = c.status || t.status;
      if (c.arguments !== undefined) t.args = c.arguments;
      t.output = c.output || '';
      if (c.result !== undefined && c.result !== null) t.result = c.result;
      if (!stored.has(c.tool_call_id)) S.liveTools.push(c.tool_call_id);
    }
    for (const p of turn.pending_approval || []) {
      S.pending.set(p.tool_call_id, p);
      const t = toolState(p.tool_call_id, p.tool_name);
      if (p.arguments && typeof p.arguments === 'object') t.args = p.arguments;
      if (!stored.has(p.tool_call_id) && !S.liveTools.includes(p.tool_call_id)) S.liveTools.push(p.tool_call_id);
    }
  }

  function onConvUpdate(f) {
    const id = f.message_id;
    if (!S.tree) S.tree = { conversation_id: S.convId, root_id: f.parent_id ? null : id, active_leaf: null, total_cost: null, running: S.running };
    if (!S.nodes.has(id)) {
      const blocks = f.content_blocks || [];
      const text = blocks.filter((b) => b.type === 'text').map((b) => b.text).join(' ');
      S.nodes.set(id, {
        id,
        parent_id: f.parent_id || null,
        children: [],
        role: f.role,
        summary: text.slice(0, 200) || (f.tool_calls || []).map((c) => c.tool_name).join(', '),
        status: 'completed',
        usage: f.token_usage || null,
        cost: null,
        tool_calls: (f.tool_calls || []).map((c) => ({ tool_call_id: c.tool_call_id, tool_name: c.tool_name })),
        notifications: 0,
        model: f.model || null,
        compaction: blocks.find((b) => b.type === 'compaction') || null,
      });
      S.order.push(id);
      const parent = f.parent_id && S.nodes.get(f.parent_id);
      if (parent && !parent.children.includes(id)) parent.children.push(id);
      // A reader up in the history keeps what is drawn (one more is
      // drawn); at the end, the window moves on with the turn.
      const scroller = $('scroller');
      if (scroller.scrollHeight - scroller.scrollTop - scroller.clientHeight >= 60) S.shown += 1;
    }
    S.views.set(id, Object.assign({}, S.nodes.get(id), { content_blocks: f.content_blocks || [], source: f.source }));
    S.tree.active_leaf = id;
    if (f.role === 'assistant') {
      S.liveText = '';
      S.liveReasoning = '';
    }
    for (const b of f.content_blocks || []) {
      if (b.type === 'tool_use') {
        const t = toolState(cardKey(id, b.id), b.name);
        t.args = b.arguments;
      }
    }
    for (const c of f.tool_calls || []) {
      const t = toolState(f.role === 'assistant' ? cardKey(id, c.tool_call_id) : c.tool_call_id, c.tool_name);
      if (c.status && canBecome(t.status, c.status)) t.status = c.status;
    }
    for (const b of f.content_blocks || []) {
      if (b.type === 'tool_result') {
        const t = toolState(b.tool_use_id);
        t.result = b.content;
        t.images = b.images || [];
        t.isError = !!b.is_error;
        t.status = b.is_error ? 'failed' : 'completed';
        S.pending.delete(b.tool_use_id);
      }
    }
    // Drawn once per frame: a step with many calls stores their results
    // in a burst.
    scheduleBranch();
  }

  const RANK = { pending: 0, executing: 1, in_progress: 1, completed: 2, failed: 2 };
  function canBecome(from, to) {
    const a = RANK[from] ?? 0;
    const b = RANK[to] ?? 0;
    return a < 2 && b >= a;
  }

  function onToolUpdate(f) {
    const id = f.tool_call_id;
    const p = f.patch || {};
    const status = f.status || p.status;
    const isNew = !S.tools.has(id) || (owners.has(id) && (RANK[S.tools.get(id).status] ?? 0) === 2 && status === 'pending');
    const t = liveToolState(id, f.tool_name, status);
    if (status && canBecome(t.status, status)) t.status = status;
    if (p.title !== undefined) t.title = p.title;
    if (p.kind !== undefined) t.kind = p.kind;
    if (p.raw_input !== undefined && p.raw_input !== null) t.args = p.raw_input;
    if (p.content !== undefined) t.output = contentText(p.content);
    if (p.terminal_output && p.terminal_output.data) t.output += p.terminal_output.data;
    if (f.result !== undefined && f.result !== null) t.result = f.result;
    if (t.status !== 'pending') {
      if (S.pending.delete(id)) t.answering = false;
    }
    if (isNew || !cardEls.has(id)) {
      if (!storedToolIds().has(id) && !S.liveTools.includes(id)) S.liveTools.push(id);
      renderLive();
    }
    updateCard(id);
  }

  function onStop(f) {
    if (f.run_id) stoppedRuns.add(f.run_id);
    S.running = false;
    S.runId = null;
    if (S.tree) S.tree.running = false;
    S.liveText = '';
    S.liveReasoning = '';
    const NOTES = {
      cancelled: 'Stopped.',
      max_steps: 'The turn stopped: it reached its step limit.',
      interrupted: 'The turn was interrupted (the server stopped?).',
      requires_approval: 'Waiting for your approval.',
      budget_exceeded: 'The turn stopped: a budget is used up.',
    };
    if (f.reason === 'error' || f.reason === 'llm_api_error') {
      showError('The turn failed' + (f.error ? ': ' + f.error : ' (' + f.reason + ')'));
      S.note = '';
    } else {
      S.note = NOTES[f.reason] ? NOTES[f.reason] + (f.error && f.reason !== 'cancelled' ? ' ' + f.error : '') : '';
    }
    // Calls that never got stored (a cancelled step) are gone.
    const stored = storedToolIds();
    S.liveTools = S.liveTools.filter((id) => stored.has(id) || S.pending.has(id));
    renderAll();
    refreshTree();
    loadConversations();
  }

  // ---------------------------------------------------------------- API key

  function openKeyDialog(reason) {
    const d = $('key-dialog');
    $('key-input').value = apiKey();
    if (reason) showError(reason);
    if (!d.open) d.showModal();
  }

  // ---------------------------------------------------------------- wiring

  function init() {
    if (window.matchMedia && window.matchMedia('(max-width: 800px)').matches) {
      $('sidebar').classList.add('collapsed');
      $('sidebar-toggle').setAttribute('aria-expanded', 'false');
    }
    $('new-conv').addEventListener('click', () => newConversation());
    $('composer-form').addEventListener('submit', (ev) => { ev.preventDefault(); submitComposer(); });
    $('composer').addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && !ev.shiftKey && !ev.isComposing) {
        ev.preventDefault();
        submitComposer();
      }
    });
    $('stop').addEventListener('click', () => send({ type: 'cancel' }));
    $('attach-button').addEventListener('click', () => $('attach').click());
    $('attach').addEventListener('change', async () => {
      const input = $('attach');
      await attach([...input.files]);
      input.value = '';
    });
    $('composer').addEventListener('paste', (ev) => {
      const files = [...(ev.clipboardData ? ev.clipboardData.files : [])].filter((f) => f.type.startsWith('image/'));
      if (files.length) {
        ev.preventDefault();
        attach(files);
      }
    });
    $('compact-button').addEventListener('click', () => compactNow());
    $('model-picker').addEventListener('change', () => chooseModel($('model-picker').value));
    $('error-close').addEventListener('click', clearError);
    $('tree-toggle').addEventListener('click', () => {
      const p = $('tree-panel');
      p.hidden = !p.hidden;
      $('tree-toggle').setAttribute('aria-expanded', String(!p.hidden));
      renderTree();
    });
    $('sidebar-toggle').addEventListener('click', () => {
      const s = $('sidebar');
      s.classList.toggle('collapsed');
      $('sidebar-toggle').setAttribute('aria-expanded', String(!s.classList.contains('collapsed')));
    });
    $('key-button').addEventListener('click', () => openKeyDialog());
    $('key-dialog').addEventListener('close', () => {
      const v = $('key-dialog').returnValue;
      if (v === 'save' || v === 'clear') {
        try {
          if (v === 'save' && $('key-input').value.trim()) localStorage.setItem(KEY_STORAGE, $('key-input').value.trim());
          else localStorage.removeItem(KEY_STORAGE);
        } catch { /* storage off: the key lasts this page only */ }
        clearError();
        loadConversations();
        const id = S.convId;
        S.convId = null;
        selectConversation(id);
      }
    });
    window.addEventListener('hashchange', () => selectConversation(hashConversation()));
    // Back from a sleeping laptop or a hidden tab: reconnect at once.
    window.addEventListener('online', () => { if (S.convId && !S.ws) connect(); });
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && S.convId && !S.ws) connect();
    });
    renderAll();
    loadConversations().then(() => {
      const id = hashConversation() || (S.conversations[0] && S.conversations[0].id);
      if (id) navigate(id);
    });
  }

  init();
})();

// End-to-end tests of the live conversation view: a real `toolwire serve`
// (scripted model) and the page in Debian's Chromium. Screenshots go to
// target/browser-artifacts/. Run: scripts/test, or
//   cargo build -p toolwire-cli && cd crates/toolwire-server/tests/browser && npm ci && node --test

import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';

import { openPage, recordCardStatuses, screenshot, sendMessage, setup, waitTurnEnd } from './support.js';

// A Python-source tool (its schema comes from the signature and docstring).
const SHOUT = `
def shout(text: str, times: int = 1) -> str:
    """Repeat a text in capitals.

    Args:
        text (str): The text to shout.
        times (int): How many times to repeat it.

    Returns:
        str: The shouted text.
    """
    return " ".join([text.upper() + "!"] * times)
`;

/** What the page shows of the active branch, as comparable data. */
function branchView(page) {
  return page.$$eval('#messages > li', (items) =>
    items.map((li) => ({
      id: li.dataset.id,
      role: li.dataset.role,
      text: [...li.querySelectorAll(':scope > .msg-body > .text')].map((e) => e.textContent),
      siblings: li.querySelector(':scope > .msg-head .sib-pos')?.textContent ?? null,
      cards: [...li.querySelectorAll('.tool-card')].map((c) => ({
        name: c.querySelector('.tool-name').textContent,
        status: c.dataset.status,
        result: c.querySelector('.tool-result-text').textContent,
      })),
    })));
}

/** Reloads the page and waits until its socket is live again. */
async function reload(page) {
  await page.reload();
  await page.locator('#conn[data-state="open"]').waitFor();
  await page.waitForFunction(() => document.querySelectorAll('#messages > li .text.loading').length === 0);
}

test('a turn with two tool calls shows two cards, in order, with live status', async (t) => {
  const { server, page, passed } = await setup(t, {
    script: 'two_tools.yaml',
    files: { 'notes.txt': 'hello from the notes\n' },
  });
  await recordCardStatuses(page);
  const conv = await server.api('POST', '/v1/conversations', { title: 'two tools' });
  await openPage(page, server, conv.id);
  await sendMessage(page, 'Run the command and read the notes.');

  // The text streams in before the step is stored.
  await page.locator('#live-text', { hasText: 'Let me' }).waitFor();
  const cards = page.locator('.tool-card');
  await cards.nth(1).waitFor();
  await screenshot(page, 'two-tools-streaming');
  // The command's output streams into its card while it runs.
  await page.locator('.tool-card[data-status="executing"] .tool-output, .tool-card[data-status="in_progress"] .tool-output', { hasText: 'first' }).waitFor();
  await screenshot(page, 'two-tools-running');
  await waitTurnEnd(page);

  assert.deepEqual(await cards.locator('.tool-name').allTextContents(), ['run_command', 'read_file']);
  assert.deepEqual(await cards.evaluateAll((cs) => cs.map((c) => c.dataset.status)), ['completed', 'completed']);
  const [cmdId, readId] = await cards.evaluateAll((cs) => cs.map((c) => c.dataset.toolCallId));
  // Argument fields.
  assert.match(await cards.nth(0).locator('.tool-args').innerText(), /command\s+echo first; sleep 1; echo second/);
  assert.match(await cards.nth(1).locator('.tool-args').innerText(), /path\s+notes\.txt/);
  // Results.
  assert.match(await cards.nth(0).locator('.tool-result-text').innerText(), /first[\s\S]*second/);
  assert.match(await cards.nth(1).locator('.tool-result-text').innerText(), /hello from the notes/);
  await page.locator('#messages .msg-assistant .text', { hasText: 'Both tools answered' }).waitFor();

  // Each card appeared with its name while pending, then went on to a
  // final status; the command was seen running.
  const seen = await page.evaluate(() => ({ status: window.__cardStatus, first: window.__cardFirstSeen }));
  assert.equal(seen.first[cmdId].name, 'run_command');
  assert.equal(seen.first[cmdId].status, 'pending');
  assert.equal(seen.first[readId].name, 'read_file');
  for (const id of [cmdId, readId]) {
    const s = seen.status[id];
    assert.equal(s[0], 'pending', `statuses of ${id}: ${s}`);
    assert.equal(s[s.length - 1], 'completed', `statuses of ${id}: ${s}`);
  }
  assert.ok(seen.status[cmdId].some((s) => s === 'executing' || s === 'in_progress'), `run_command never shown running: ${seen.status[cmdId]}`);

  // Usage is shown on the answer.
  assert.match(await page.locator('#messages .msg-assistant .meta').first().innerText(), /\d+ in · \d+ out/);
  await screenshot(page, 'two-tools');

  // A reload shows the same branch, cards and results included.
  const before = await branchView(page);
  await reload(page);
  assert.deepEqual(await branchView(page), before);
  passed();
});

// One red pixel, a real PNG the browser decodes.
const PIXEL_PNG = Buffer.from('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==', 'base64');

test("an image a tool returned is drawn in its card, and again after a reload", async (t) => {
  const { server, page, passed } = await setup(t, {
    script: 'image.yaml',
    files: { 'pixel.png': PIXEL_PNG },
  });
  const conv = await server.api('POST', '/v1/conversations', { title: 'image' });
  await openPage(page, server, conv.id);
  await sendMessage(page, 'What is in pixel.png?');
  await waitTurnEnd(page);

  // Fetched from /v1/blobs/{sha256} and decoded: the CSP let it in.
  const drawn = () => page.waitForFunction(() => {
    const img = document.querySelector('.tool-card .tool-images img.msg-image');
    return img && img.complete && img.naturalWidth === 1 ? img.alt : null;
  });
  assert.equal(await (await drawn()).jsonValue(), 'image: image/png, 70 B');
  assert.match(await page.locator('.tool-card .tool-result-text').innerText(), /image\/png image, 70 B/);
  assert.equal(await page.locator('.tool-card .tool-output').isVisible(), false, 'the result is shown once');
  await screenshot(page, 'image-in-card');
  await reload(page);
  assert.equal(await (await drawn()).jsonValue(), 'image: image/png, 70 B');
  passed();
});

test('an image attached in the composer is sent with the message and drawn in it', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'plain.yaml' });
  const conv = await server.api('POST', '/v1/conversations', { title: 'attach' });
  await openPage(page, server, conv.id);

  // Not an image: named, and nothing attached.
  await page.setInputFiles('#attach', { name: 'notes.txt', mimeType: 'text/plain', buffer: Buffer.from('hi') });
  await page.locator('#error:not([hidden])').waitFor();
  assert.match(await page.locator('#error-text').innerText(), /notes\.txt: not an image/);
  assert.equal(await page.locator('#attachments .attachment').count(), 0);
  await page.locator('#error-close').click();

  await page.setInputFiles('#attach', { name: 'pixel.png', mimeType: 'image/png', buffer: PIXEL_PNG });
  await page.locator('#attachments .attachment[data-name="pixel.png"]').waitFor();
  await sendMessage(page, 'What is this?');
  await waitTurnEnd(page);
  await page.waitForFunction(() => {
    const img = document.querySelector('#messages > li[data-role="user"] img.msg-image');
    return img && img.complete && img.naturalWidth === 1;
  });
  assert.equal(await page.locator('#attachments .attachment').count(), 0, 'sent, so no longer attached');
  // Stored as a block naming its hash, not the bytes.
  const tree = await server.api('GET', `/v1/conversations/${conv.id}/tree`);
  const user = tree.nodes.find((n) => n.role === 'user');
  const view = await server.api('GET', `/v1/conversations/${conv.id}/messages/${user.id}`);
  assert.deepEqual(view.content_blocks.map((b) => b.type), ['text', 'image']);
  assert.equal(view.content_blocks[1].bytes_len, PIXEL_PNG.length);
  await screenshot(page, 'image-attached');
  passed();
});

test('a call waiting for approval is approved from the page', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'approval.yaml' });
  const tool = await server.api('POST', '/v1/tools', { source_code: SHOUT });
  const agent = await server.api('POST', '/v1/agents', {
    name: 'browser-approval',
    system: 'You are a test agent.',
    model: 'openai/gpt-4o-mini',
    include_base_tools: false,
    tool_ids: [tool.id],
  });
  await server.api('PATCH', `/v1/agents/${agent.id}/tools/approval/shout`, { requires_approval: true });
  assert.ok(agent.conversation_id, 'the agent names its conversation');

  await openPage(page, server, agent.conversation_id);
  await sendMessage(page, 'Shout hi, twice.');
  const card = page.locator('.tool-card', { has: page.locator('.tool-name', { hasText: 'shout' }) });
  await card.locator('button.approve').waitFor({ state: 'visible' });
  assert.equal(await card.getAttribute('data-approval'), 'pending');
  assert.equal(await card.locator('.tool-status').innerText(), 'awaiting approval');
  assert.match(await card.locator('.tool-args').innerText(), /text\s+hi[\s\S]*times\s+2/);
  await screenshot(page, 'approval-pending');

  await card.locator('button.approve').click();
  await card.locator('.tool-result-text', { hasText: 'HI! HI!' }).waitFor();
  await page.locator('#messages .msg-assistant .text', { hasText: 'That was the shout.' }).waitFor();
  await waitTurnEnd(page);
  assert.equal(await card.getAttribute('data-status'), 'completed');
  assert.equal(await card.locator('button.approve').isVisible(), false);
  await screenshot(page, 'approval-done');

  // The agent is not stuck: the next message is answered.
  await sendMessage(page, 'Anything pending?');
  await page.locator('#messages .msg-assistant .text', { hasText: 'nothing is pending' }).waitFor();
  await waitTurnEnd(page);
  passed();
});

test('an interjection during a slow tool shows up as a new message', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'interject.yaml' });
  const conv = await server.api('POST', '/v1/conversations', { title: 'interject' });
  await openPage(page, server, conv.id);
  await sendMessage(page, 'Wait for me.');

  await page.locator('.tool-card[data-status="executing"], .tool-card[data-status="in_progress"]').waitFor();
  assert.equal(await page.locator('#composer-form').getAttribute('data-mode'), 'interject');
  assert.equal(await page.locator('#send').innerText(), 'Interject');
  assert.equal(await page.locator('#stop').isVisible(), true);
  await sendMessage(page, 'Also, say you noticed this.');

  const interjection = page.locator('#messages > li[data-role="user"]', { hasText: 'Also, say you noticed this.' });
  await interjection.waitFor();
  await screenshot(page, 'interjection');
  await page.locator('#messages .msg-assistant .text', { hasText: 'Noted your interjection.' }).waitFor();
  await waitTurnEnd(page);

  // The interjection is a node of the branch after the tool call.
  const view = await branchView(page);
  const callAt = view.findIndex((m) => m.cards.some((c) => c.name === 'run_command'));
  const interjectionAt = view.findIndex((m) => m.role === 'user' && m.text.join('').includes('Also, say you noticed this.'));
  assert.ok(callAt >= 0 && interjectionAt > callAt, JSON.stringify(view));
  assert.equal(view[callAt].cards[0].status, 'completed');
  assert.match(view[callAt].cards[0].result, /slept/);
  passed();
});

test('editing a message makes a sibling; the arrows switch between them; a reload keeps the tree', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'plain.yaml' });
  const conv = await server.api('POST', '/v1/conversations', { title: 'siblings' });
  await openPage(page, server, conv.id);
  // Markup in a message is shown as text, never as markup.
  await sendMessage(page, 'the <b>first</b> question');
  await page.locator('#messages .msg-assistant .text', { hasText: 'A plain answer.' }).waitFor();
  await waitTurnEnd(page);
  assert.equal(await page.locator('#messages b').count(), 0);

  const user = page.locator('#messages > li[data-role="user"]').first();
  assert.equal(await user.locator('.sib-pos').count(), 0, 'no arrows before there is a sibling');
  await user.locator('button.edit').click();
  // The page puts the caret at the end of the old text just after it
  // shows the box: filling before that would type after the old text.
  await page.waitForFunction(() => document.activeElement?.classList.contains('edit-text'));
  await page.locator('.edit-text').fill('the second question');
  await page.locator('button.edit-save').click();
  await page.locator('#messages > li[data-role="user"] .sib-pos', { hasText: '2/2' }).waitFor();
  await waitTurnEnd(page);
  assert.equal(await user.locator('.msg-body .text').innerText(), 'the second question');
  await page.locator('#messages .msg-assistant .text', { hasText: 'A plain answer.' }).waitFor();

  await user.locator('button.sib-prev').click();
  await user.locator('.sib-pos', { hasText: '1/2' }).waitFor();
  assert.equal(await user.locator('.msg-body .text').innerText(), 'the <b>first</b> question');
  await page.locator('#messages .msg-assistant .text', { hasText: 'A plain answer.' }).waitFor();
  await user.locator('button.sib-next').click();
  await user.locator('.sib-pos', { hasText: '2/2' }).waitFor();
  assert.equal(await user.locator('.msg-body .text').innerText(), 'the second question');

  // The whole tree: both versions of the question, the active one marked.
  await page.locator('#tree-toggle').click();
  assert.equal(await page.locator('#tree .tree-node[data-role="user"]').count(), 2);
  assert.equal(await page.locator('#tree .tree-node.on-branch[data-role="user"]').count(), 1);
  await screenshot(page, 'siblings');

  const before = await branchView(page);
  const treeBefore = await page.locator('#tree').innerText();
  await reload(page);
  assert.deepEqual(await branchView(page), before);
  if (!(await page.locator('#tree-panel').isVisible())) await page.locator('#tree-toggle').click();
  assert.equal(await page.locator('#tree').innerText(), treeBefore);
  passed();
});

test("a newcomer's first message plays the built-in demo with tool cards", async (t) => {
  // No --provider and no --script: what the README's run command does.
  const { page, server, passed } = await setup(t, {
    script: null,
    files: { 'README.md': '# A demo workspace\n\nNothing much here.\n' },
  });
  await openPage(page, server);
  await page.locator('#empty').waitFor();
  // Typing right away starts a conversation.
  await sendMessage(page, 'Hello! What can you do?');
  const cards = page.locator('.tool-card');
  await cards.nth(1).waitFor();
  await waitTurnEnd(page);
  assert.deepEqual(await cards.locator('.tool-name').allTextContents(), ['list_dir', 'read_file']);
  assert.deepEqual(await cards.evaluateAll((cs) => cs.map((c) => c.dataset.status)), ['completed', 'completed']);
  assert.match(await cards.nth(1).locator('.tool-result-text').innerText(), /A demo workspace/);
  await page.locator('#messages .msg-assistant .text', { hasText: "That's the tour" }).waitFor();
  // The new conversation is listed and selected.
  assert.equal(await page.locator('#conv-list .conv.active').count(), 1);
  await screenshot(page, 'demo');

  // The demo replays for the next message (the same call ids again):
  // the earlier cards keep their own calls.
  await sendMessage(page, 'Again, please.');
  await cards.nth(3).waitFor();
  await waitTurnEnd(page);
  assert.deepEqual(await cards.locator('.tool-name').allTextContents(), ['list_dir', 'read_file', 'list_dir', 'read_file']);
  assert.deepEqual(await cards.evaluateAll((cs) => cs.map((c) => c.dataset.status)), ['completed', 'completed', 'completed', 'completed']);
  assert.match(await cards.nth(0).locator('.tool-args').innerText(), /path\s+\./);
  assert.match(await cards.nth(1).locator('.tool-result-text').innerText(), /A demo workspace/);
  assert.match(await cards.nth(3).locator('.tool-result-text').innerText(), /A demo workspace/);
  const before = await branchView(page);
  await reload(page);
  assert.deepEqual(await branchView(page), before);

  // "New conversation" opens an empty one beside it.
  await page.locator('#new-conv').click();
  await page.waitForFunction(() => document.querySelectorAll('#conv-list .conv').length === 2);
  await page.locator('#conn[data-state="open"]').waitFor();
  assert.deepEqual((await branchView(page)).map((m) => m.role), ['system']);
  passed();
});

test('the page and its assets load without a key, with a strict content security policy', async (t) => {
  const key = 'browser-test-key';
  const { server, page, passed } = await setup(t, { script: 'plain.yaml', env: { TOOLWIRE_API_KEYS: key } });
  for (const [p, type] of [['/', 'text/html'], ['/assets/app.js', 'text/javascript'], ['/assets/style.css', 'text/css']]) {
    const res = await fetch(server.url + p);
    assert.equal(res.status, 200, p);
    assert.ok(res.headers.get('content-type').startsWith(type), `${p}: ${res.headers.get('content-type')}`);
    assert.equal(res.headers.get('x-content-type-options'), 'nosniff');
    const csp = res.headers.get('content-security-policy');
    assert.match(csp, /default-src 'none'/);
    assert.match(csp, /script-src 'self'/);
    assert.match(csp, /connect-src 'self'/);
    assert.doesNotMatch(csp, /unsafe-inline|unsafe-eval|https?:/);
  }
  assert.equal((await fetch(server.url + '/v1/conversations')).status, 401);

  // Without a key the page asks for one; with it, the API answers.
  const auth = { Authorization: `Bearer ${key}` };
  const conv = await server.api('POST', '/v1/conversations', { title: 'with a key' }, auth);
  await page.goto(server.url + '/');
  await page.locator('#key-dialog[open]').waitFor();
  await page.locator('#key-input').fill(key);
  await page.locator('#key-save').click();
  await page.locator(`#conv-list .conv[data-id="${conv.id}"]`).waitFor();
  await page.locator('#error').waitFor({ state: 'hidden' });
  assert.equal(await page.evaluate(() => localStorage.getItem('toolwire.apiKey')), key);
  passed();
});

// A browser's WebSocket cannot send an Authorization header: the page
// sends the key as `?token=KEY`, which the server accepts on WebSocket
// upgrades only.
test('with API keys, the live socket takes the key the page sends as ?token=', async (t) => {
  const key = 'browser-test-key';
  const { server, page, passed } = await setup(t, { script: 'plain.yaml', env: { TOOLWIRE_API_KEYS: key } });
  const conv = await server.api('POST', '/v1/conversations', { title: 'with a key' }, { Authorization: `Bearer ${key}` });
  await page.goto(server.url + '/');
  await page.evaluate((k) => localStorage.setItem('toolwire.apiKey', k), key);
  await page.goto(server.url + `/#/c/${conv.id}`);
  await page.reload();
  await page.locator('#conn[data-state="open"]').waitFor({ timeout: 5000 });
  await sendMessage(page, 'Hello with a key.');
  await page.locator('#messages .msg-assistant .text', { hasText: 'A plain answer.' }).waitFor();
  await waitTurnEnd(page);
  passed();
});

test('a denied call is not run, and the turn goes on', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'approval.yaml' });
  const tool = await server.api('POST', '/v1/tools', { source_code: SHOUT });
  const agent = await server.api('POST', '/v1/agents', {
    name: 'browser-deny', system: 'You are a test agent.', model: 'openai/gpt-4o-mini', include_base_tools: false, tool_ids: [tool.id],
  });
  await server.api('PATCH', `/v1/agents/${agent.id}/tools/approval/shout`, { requires_approval: true });
  await openPage(page, server, agent.conversation_id);
  await sendMessage(page, 'Shout hi, twice.');
  const card = page.locator('.tool-card', { has: page.locator('.tool-name', { hasText: 'shout' }) });
  await card.locator('button.deny').click();
  await page.locator('#messages .msg-assistant .text', { hasText: 'That was the shout.' }).waitFor();
  await waitTurnEnd(page);
  assert.equal(await card.locator('button.deny').isVisible(), false);
  assert.ok(['failed', 'completed'].includes(await card.getAttribute('data-status')));
  assert.doesNotMatch(await card.locator('.tool-result-text').innerText(), /HI!/);
  await screenshot(page, 'denied');
  passed();
});

test('the stop button cancels a running turn', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'interject.yaml' });
  const conv = await server.api('POST', '/v1/conversations', { title: 'stop' });
  await openPage(page, server, conv.id);
  await sendMessage(page, 'Wait for me.');
  await page.locator('.tool-card[data-status="executing"], .tool-card[data-status="in_progress"]').waitFor();
  await page.locator('#stop').click();
  await waitTurnEnd(page, 10_000);
  assert.equal(await page.locator('#error').isVisible(), false, 'a cancelled turn is not an error');
  assert.equal(await page.locator('#composer-hint').innerText(), 'Stopped.');
  const card = page.locator('.tool-card', { has: page.locator('.tool-name', { hasText: 'run_command' }) });
  assert.doesNotMatch(await card.getAttribute('data-status'), /pending|executing|in_progress/);
  // The conversation takes the next message.
  const answers = await page.locator('#messages .msg-assistant').count();
  await sendMessage(page, 'Are you there?');
  await page.waitForFunction((n) => document.querySelectorAll('#messages .msg-assistant').length > n, answers);
  await waitTurnEnd(page);
  passed();
});

test('after the server restarts, the page reconnects from its last seq and misses nothing', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'plain.yaml' });
  const sockets = [];
  page.on('websocket', (ws) => sockets.push(ws.url()));
  const conv = await server.api('POST', '/v1/conversations', { title: 'reconnect' });
  await openPage(page, server, conv.id);
  await sendMessage(page, 'Before the restart.');
  await page.locator('#messages .msg-assistant .text', { hasText: 'A plain answer.' }).waitFor();
  await waitTurnEnd(page);

  await server.restart();
  await page.locator('#conn[data-state="open"]').waitFor({ timeout: 20_000 });
  assert.ok(sockets.length >= 2, sockets.join('\n'));
  assert.doesNotMatch(sockets[0], /after=/);
  assert.match(sockets[sockets.length - 1], /[?&]after=\d+/);

  await sendMessage(page, 'After the restart.');
  await page.waitForFunction(() => document.querySelectorAll('#messages .msg-assistant').length === 2);
  await waitTurnEnd(page);
  const view = await branchView(page);
  assert.deepEqual(view.filter((m) => m.role === 'user').map((m) => m.text.join('')), ['Before the restart.', 'After the restart.']);
  assert.equal(new Set(view.map((m) => m.id)).size, view.length, 'no message twice');
  await reload(page);
  assert.deepEqual(await branchView(page), view);
  passed();
});

test('regenerate makes a second answer; fork opens a new conversation with the history', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'plain.yaml' });
  const conv = await server.api('POST', '/v1/conversations', { title: 'regenerate' });
  await openPage(page, server, conv.id);
  await sendMessage(page, 'Answer twice.');
  const answer = page.locator('#messages > li[data-role="assistant"]').last();
  await answer.locator('.text', { hasText: 'A plain answer.' }).waitFor();
  await waitTurnEnd(page);
  await answer.locator('button.regenerate').click();
  await page.locator('#messages > li[data-role="assistant"] .sib-pos', { hasText: '2/2' }).waitFor();
  await waitTurnEnd(page);

  await page.locator('#messages > li[data-role="assistant"] button.fork').click();
  await page.waitForFunction((old) => location.hash.startsWith('#/c/') && !location.hash.includes(old), conv.id);
  await page.locator('#conn[data-state="open"]').waitFor();
  await page.locator('#messages > li[data-role="user"] .text', { hasText: 'Answer twice.' }).waitFor();
  await page.locator('#messages > li[data-role="assistant"] .text', { hasText: 'A plain answer.' }).waitFor();
  assert.equal(await page.locator('#conv-list .conv').count(), 2);
  assert.match(await page.locator('#conv-list .conv.active .conv-meta').innerText(), /fork/);
  await screenshot(page, 'forked');
  passed();
});

/** Two scripted models, each answering with its own name. */
function twoModels(home) {
  const table = (name) => {
    const script = path.join(home, `${name}.yaml`);
    fs.writeFileSync(script, `steps: [{text: "${name} answers."}]\n`);
    return `[models.${name}]\nprovider = "scripted"\nmodel = "${name}-1"\nscript = ${JSON.stringify(script)}\n`;
  };
  return `default_model = "alpha"\n${table('alpha')}${table('beta')}`;
}

test('the model picker chooses who answers; regenerate with… asks another model', async (t) => {
  const { server, page, passed } = await setup(t, { config: twoModels });
  const conv = await server.api('POST', '/v1/conversations', { title: 'models' });
  await openPage(page, server, conv.id);
  const picker = page.locator('#model-picker');
  await picker.waitFor();
  assert.deepEqual(await picker.locator('option').allInnerTexts(), ['alpha', 'beta']);
  assert.equal(await picker.inputValue(), 'alpha');

  await sendMessage(page, 'Who are you?');
  const answers = page.locator('#messages > li[data-role="assistant"]');
  await answers.last().locator('.text', { hasText: 'alpha answers.' }).waitFor();
  await waitTurnEnd(page);
  assert.match(await answers.last().locator('.meta').innerText(), /alpha/);

  // Regenerate with beta: a second version, written by beta.
  await answers.last().locator('select.regenerate-with').selectOption('beta');
  await page.locator('#messages > li[data-role="assistant"] .sib-pos', { hasText: '2/2' }).waitFor();
  await answers.last().locator('.text', { hasText: 'beta answers.' }).waitFor();
  await waitTurnEnd(page);
  assert.match(await answers.last().locator('.meta').innerText(), /beta/);
  await screenshot(page, 'regenerated-with-beta');

  // Chosen in the picker, beta answers what follows, and the choice is
  // kept for the conversation.
  await picker.selectOption('beta');
  await page.waitForFunction(async (id) => {
    const r = await fetch(`/v1/conversations/${id}/model`);
    return (await r.json()).chosen === 'beta';
  }, conv.id);
  await sendMessage(page, 'And now?');
  await answers.last().locator('.text', { hasText: 'beta answers.' }).waitFor();
  await waitTurnEnd(page);
  await reload(page);
  assert.equal(await page.locator('#model-picker').inputValue(), 'beta');
  passed();
});

test('a reload during a running turn shows the turn where it is, then its end', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'interject.yaml' });
  const conv = await server.api('POST', '/v1/conversations', { title: 'reload mid-turn' });
  await openPage(page, server, conv.id);
  await sendMessage(page, 'Wait for me.');
  await page.locator('.tool-card[data-status="executing"], .tool-card[data-status="in_progress"]').waitFor();

  await page.reload();
  await page.locator('#conn[data-state="open"]').waitFor();
  // From the snapshot: the turn runs, its call is on its card.
  const card = page.locator('.tool-card', { has: page.locator('.tool-name', { hasText: 'run_command' }) });
  await card.waitFor();
  assert.match(await card.getAttribute('data-status'), /executing|in_progress/);
  assert.match(await card.locator('.tool-args').innerText(), /sleep 3/);
  assert.equal(await page.locator('#composer-form').getAttribute('data-mode'), 'interject');
  await screenshot(page, 'reloaded-mid-turn');

  await page.locator('#messages .msg-assistant .text', { hasText: 'Noted your interjection.' }).waitFor();
  await waitTurnEnd(page);
  assert.equal(await card.getAttribute('data-status'), 'completed');
  assert.match(await card.locator('.tool-result-text').innerText(), /slept/);
  assert.equal(await page.locator('.tool-card').count(), 1);
  passed();
});

// A long conversation: one turn of STEPS steps with CALLS tool calls each
// (built through the API, played by the scripted model). The page asks
// for its messages in batches, not one request per card, and draws the
// branch from its end.
test('a conversation with thousands of tool calls loads in a few batched requests', async (t) => {
  // TOOLWIRE_BROWSER_LONG_STEPS=40 TOOLWIRE_BROWSER_LONG_CALLS=250 makes
  // it 10,000 (docs/performance.md; a turn has at most 50 steps).
  const STEPS = Number(process.env.TOOLWIRE_BROWSER_LONG_STEPS || 20);
  const CALLS = Number(process.env.TOOLWIRE_BROWSER_LONG_CALLS || 100);
  const steps = [];
  for (let s = 0; s < STEPS; s++) {
    const calls = [];
    for (let c = 0; c < CALLS; c++) calls.push(`      - {id: call_${s}_${c}, name: read_file, arguments: {path: "notes.txt"}}`);
    steps.push(`  - text: "Step ${s}."\n    tool_calls:\n${calls.join('\n')}`);
  }
  const script = `model: scripted-long\nsteps:\n${steps.join('\n')}\n  - text: "All ${STEPS * CALLS} reads done."\n`;
  const { server, page, passed } = await setup(t, { script, files: { 'notes.txt': 'a note\n' } });
  const conv = await server.api('POST', '/v1/conversations', { title: 'long' });
  await server.api('POST', `/v1/conversations/${conv.id}/messages`, { text: 'Read the notes many times.' });
  let tree;
  for (let i = 0; i < 1200; i++) {
    tree = await server.api('GET', `/v1/conversations/${conv.id}/tree`);
    if (!tree.running && tree.nodes.some((n) => n.summary.includes('reads done'))) break;
    await new Promise((r) => setTimeout(r, 250));
  }
  const calls = tree.nodes.reduce((sum, n) => sum + n.tool_calls.length, 0);
  assert.equal(calls, STEPS * CALLS);

  const requests = [];
  page.on('request', (r) => { if (new URL(r.url()).pathname.startsWith('/v1/')) requests.push(new URL(r.url())); });
  const started = Date.now();
  await openPage(page, server, conv.id);
  await page.locator('#messages .msg-assistant .text', { hasText: `All ${STEPS * CALLS} reads done.` }).waitFor();
  await page.waitForFunction(() => document.querySelectorAll('#messages > li .text.loading').length === 0);
  const loadedMs = Date.now() - started;
  const one = requests.filter((u) => /\/messages\/[^/]+$/.test(u.pathname));
  const batches = requests.filter((u) => u.pathname.endsWith('/messages') && u.searchParams.has('ids'));
  assert.equal(one.length, 0, 'no request for a single message');
  assert.ok(batches.length >= 1 && batches.length <= 3, `${batches.length} batched requests`);
  // Only the end of the branch is drawn, its earlier part a click away.
  const cards = await page.locator('.tool-card').count();
  // The window: the last 100 messages, back to the step whose results
  // they are.
  assert.ok(cards > 0 && cards <= CALLS + 100, `${cards} cards drawn`);
  const earlier = page.locator('#messages .show-earlier');
  assert.match(await earlier.innerText(), /Show earlier messages \(\d+ more\)/);
  await earlier.click();
  await page.waitForFunction((n) => document.querySelectorAll('.tool-card').length > n, cards);
  await page.waitForFunction(() => document.querySelectorAll('#messages > li .text.loading').length === 0);
  assert.equal(requests.filter((u) => /\/messages\/[^/]+$/.test(u.pathname)).length, 0);
  // Still responsive: a click on the tree toggle is handled at once.
  await page.locator('#tree-toggle').click();
  await page.locator('#tree .tree-node').first().waitFor();
  console.log(`# ${STEPS * CALLS} calls, ${tree.nodes.length} messages: drawn in ${loadedMs} ms with ${batches.length} batched request(s), ${cards} cards`);
  await screenshot(page, 'long-conversation');
  passed();
});

test('the compact button makes a compaction node the branch and the tree show, with what it covers', async (t) => {
  const { server, page, passed } = await setup(t, { script: 'plain.yaml' });
  const conv = await server.api('POST', '/v1/conversations', { title: 'compact' });
  await openPage(page, server, conv.id);
  for (const text of ['First question.', 'Second question.', 'Third question.']) {
    await sendMessage(page, text);
    await page.locator('#messages > li[data-role="user"] .text', { hasText: text }).waitFor();
    await waitTurnEnd(page);
  }
  const button = page.locator('#compact-button');
  assert.equal(await button.isDisabled(), false);
  await button.click();
  const node = page.locator('#messages > li[data-role="compaction"]');
  await node.waitFor();
  await waitTurnEnd(page);
  assert.match(await node.locator('.meta').innerText(), /covers \d+ earlier message/);
  // The summary (the scripted model's answer) is in the node's details.
  await node.locator('details summary').click();
  await node.locator('.text', { hasText: 'A plain answer.' }).waitFor();
  // The tree: the node, and the messages it covers marked on the branch.
  await page.locator('#tree-toggle').click();
  const treeNode = page.locator('#tree li.tree-node.compaction');
  await treeNode.waitFor();
  assert.match(await treeNode.locator('.tree-label').first().innerText(), /Compaction: covers \d+ message/);
  assert.ok((await page.locator('#tree li.tree-node.covered').count()) >= 1);
  await screenshot(page, 'compacted');
  // After a reload the tree API gives the same.
  await reload(page);
  await page.locator('#messages > li[data-role="compaction"]').waitFor();
  const tree = await server.api('GET', `/v1/conversations/${conv.id}/tree`);
  const nodes = tree.nodes.filter((n) => n.compaction);
  assert.equal(nodes.length, 1);
  assert.ok(nodes[0].compaction.covered >= 1);
  passed();
});

// What the browser tests share: a real `toolwire serve` per test (debug
// binary, scripted model, temporary SQLite database and workspace, free
// loopback port) and Debian's Chromium driven by playwright-core (never a
// browser of playwright's own).

import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const HERE = path.dirname(fileURLToPath(import.meta.url));
export const REPO = path.resolve(HERE, '../../../..');
export const SCRIPTS = path.join(HERE, 'scripts');
const TARGET = process.env.CARGO_TARGET_DIR || path.join(REPO, 'target');
export const ARTIFACTS = process.env.TOOLWIRE_BROWSER_ARTIFACTS || path.join(TARGET, 'browser-artifacts');
const BIN = process.env.TOOLWIRE_BIN || path.join(TARGET, 'debug', 'toolwire');
const CHROMIUM = process.env.TOOLWIRE_CHROMIUM || '/usr/bin/chromium';

const START_TIMEOUT_MS = 30_000;

// Servers still running when this process exits (a test that crashed
// before its cleanup) are killed rather than left behind.
const running = new Set();
process.on('exit', () => {
  for (const p of running) if (p.exitCode === null && p.signalCode === null) p.kill('SIGKILL');
});

function freePort() {
  return new Promise((resolve, reject) => {
    const s = net.createServer();
    s.unref();
    s.on('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** The caller's environment without anything that configures the server
 * behind the test's back (TOOLWIRE_*). */
function serverEnv(extra) {
  const env = {};
  for (const [k, v] of Object.entries(process.env)) if (!k.startsWith('TOOLWIRE_')) env[k] = v;
  env.RUST_LOG = env.RUST_LOG || 'info,toolwire_server=debug';
  env.NO_COLOR = '1';
  return Object.assign(env, extra || {});
}

/**
 * Starts `toolwire serve` playing `script` (a file name in scripts/, or
 * the script's text; `null`: no script and no provider, i.e. the built-in
 * demo). `files`: workspace files to write first. `env`: extra variables
 * (e.g. TOOLWIRE_API_KEYS). `config(home)`: the text of a config file
 * (`--config`), given the server's directory.
 */
export async function startServer({ script = null, files = {}, env = {}, config = null } = {}) {
  if (!fs.existsSync(BIN)) throw new Error(`no toolwire binary at ${BIN}: cargo build -p toolwire-cli (or set TOOLWIRE_BIN)`);
  const home = fs.mkdtempSync(path.join(os.tmpdir(), 'toolwire-browser-'));
  const workspace = path.join(home, 'workspace');
  fs.mkdirSync(workspace);
  for (const [name, text] of Object.entries(files)) {
    fs.mkdirSync(path.dirname(path.join(workspace, name)), { recursive: true });
    fs.writeFileSync(path.join(workspace, name), text);
  }
  const logPath = path.join(home, 'server.log');
  const args = ['serve', '--db', `sqlite://${path.join(home, 't.db')}`, '--workspace', workspace];
  if (script !== null) {
    const scriptPath = path.join(home, 'script.yaml');
    const file = path.join(SCRIPTS, script);
    fs.writeFileSync(scriptPath, fs.existsSync(file) ? fs.readFileSync(file) : script);
    args.push('--provider', 'scripted', '--script', scriptPath);
  }
  if (config) {
    const configPath = path.join(home, 'toolwire.toml');
    fs.writeFileSync(configPath, config(home));
    args.push('--config', configPath);
  }
  for (let attempt = 0; attempt < 5; attempt++) {
    const port = await freePort();
    const proc = await spawnServer(args, port, { home, env, logPath });
    if (proc) return makeServer({ proc, args, port, home, env, workspace, logPath });
    if (!fs.readFileSync(logPath, 'utf8').includes('could not listen')) break;
  }
  throw new Error(`toolwire serve did not start:\n${fs.readFileSync(logPath, 'utf8')}`);
}

/** Spawns the server on `port`; resolves with the process once it answers
 * HTTP, or null if it exited or did not answer in time. */
async function spawnServer(args, port, { home, env, logPath }) {
  const all = [...args, '--addr', `127.0.0.1:${port}`];
  fs.appendFileSync(logPath, `$ ${BIN} ${all.join(' ')}\n`);
  const log = fs.openSync(logPath, 'a');
  const proc = spawn(BIN, all, { cwd: home, env: serverEnv(env), stdio: ['ignore', log, log] });
  fs.closeSync(log);
  running.add(proc);
  let exited = false;
  proc.on('exit', () => { exited = true; running.delete(proc); });
  const deadline = Date.now() + START_TIMEOUT_MS;
  while (!exited && Date.now() < deadline) {
    try {
      await fetch(`http://127.0.0.1:${port}/openapi.json`);
      return proc;
    } catch {
      await sleep(50);
    }
  }
  if (!exited) proc.kill('SIGKILL');
  return null;
}

function makeServer({ proc, args, port, home, env, workspace, logPath }) {
  const url = `http://127.0.0.1:${port}`;
  return {
    url,
    home,
    workspace,
    log: () => fs.readFileSync(logPath, 'utf8'),
    /** A JSON request to the API; throws with the body on a non-2xx answer. */
    async api(method, p, body, headers = {}) {
      const res = await fetch(url + p, {
        method,
        headers: Object.assign(body === undefined ? {} : { 'Content-Type': 'application/json' }, headers),
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      if (!res.ok) throw new Error(`${method} ${p}: ${res.status} ${text}`);
      return text ? JSON.parse(text) : null;
    },
    /** Stops the server and starts it again on the same port and database. */
    async restart() {
      await this.stop();
      for (let attempt = 0; attempt < 20; attempt++) {
        const next = await spawnServer(args, port, { home, env, logPath });
        if (next) { proc = next; return; }
        await sleep(250);
      }
      throw new Error(`toolwire serve did not start again:\n${fs.readFileSync(logPath, 'utf8')}`);
    },
    /** SIGTERM, then SIGKILL after 15 s. Resolves with the exit code. */
    stop() {
      if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve(proc.exitCode);
      return new Promise((resolve) => {
        const timer = setTimeout(() => proc.kill('SIGKILL'), 15_000);
        proc.on('exit', (code) => { clearTimeout(timer); resolve(code); });
        proc.kill('SIGTERM');
      });
    },
    cleanup() {
      fs.rmSync(home, { recursive: true, force: true });
    },
  };
}

/** Debian's Chromium, headless, in a fresh profile; the context records
 * the page's console and errors for the test's log. */
export async function launchBrowser() {
  if (!fs.existsSync(CHROMIUM)) throw new Error(`no Chromium at ${CHROMIUM} (apt-get install chromium; scripts/test does it)`);
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'toolwire-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      // A page answered by page.route() counts as public, and Chromium
      // then blocks its socket to 127.0.0.1 (see servePageFromSource).
      ...(process.env.TOOLWIRE_BROWSER_PAGE_FROM_SOURCE ? ['--disable-features=LocalNetworkAccessChecks'] : []),
    ],
    viewport: { width: 1280, height: 900 },
  });
  if (process.env.TOOLWIRE_BROWSER_PAGE_FROM_SOURCE) await servePageFromSource(context);
  const problems = [];
  const attach = (page) => {
    page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
    page.on('console', (m) => { if (m.type() === 'error') problems.push(`console error: ${m.text()}`); });
  };
  context.pages().forEach(attach);
  context.on('page', attach);
  return {
    context,
    problems,
    async page() {
      const page = context.pages()[0] || (await context.newPage());
      page.setDefaultTimeout(20_000);
      return page;
    },
    async close() {
      await context.close();
      fs.rmSync(profile, { recursive: true, force: true });
    },
  };
}

/** For working on the page without rebuilding the binary (it embeds the
 * page): TOOLWIRE_BROWSER_PAGE_FROM_SOURCE=1 answers `/` and `/assets/*`
 * from src/live/page/ instead. Tests of record run without it. */
async function servePageFromSource(context) {
  const dir = path.join(REPO, 'crates/toolwire-server/src/live/page');
  const files = { '/': ['index.html', 'text/html'], '/assets/app.js': ['app.js', 'text/javascript'], '/assets/style.css': ['style.css', 'text/css'] };
  await context.route((url) => url.hostname === '127.0.0.1' && url.pathname in files, (route) => {
    const [name, type] = files[new URL(route.request().url()).pathname];
    route.fulfill({ status: 200, contentType: type, body: fs.readFileSync(path.join(dir, name)) });
  });
}

/** Saves a screenshot under target/browser-artifacts/. */
export async function screenshot(page, name) {
  fs.mkdirSync(ARTIFACTS, { recursive: true });
  const file = path.join(ARTIFACTS, `${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  return file;
}

/**
 * A server and a browser for one test, stopped at its end (screenshot
 * `name-end.png`, and the server's log printed when the test failed).
 */
export async function setup(t, options) {
  const server = await startServer(options);
  const browser = await launchBrowser();
  const page = await browser.page();
  let failed = true;
  t.after(async () => {
    try { await screenshot(page, `${slug(t.name)}-end`); } catch { /* the page may be gone */ }
    await browser.close();
    const code = await server.stop();
    if (failed || process.env.TOOLWIRE_BROWSER_VERBOSE) {
      console.log(`----- server log (${t.name}) -----\n${server.log()}`);
      if (browser.problems.length) console.log(`----- page problems -----\n${browser.problems.join('\n')}`);
    }
    if (!process.env.TOOLWIRE_BROWSER_KEEP) server.cleanup();
    if (code !== 0 && code !== null) throw new Error(`toolwire serve exited with ${code} on SIGTERM`);
  });
  return {
    server,
    browser,
    page,
    passed() { failed = false; },
  };
}

export function slug(s) {
  return s.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, '').slice(0, 60);
}

/** Records every value each tool card's data-status takes, in order
 * (window.__cardStatus[tool_call_id] = [...]). Install before load. */
export async function recordCardStatuses(page) {
  await page.addInitScript(() => {
    window.__cardStatus = {};
    window.__cardFirstSeen = {};
    const note = (card) => {
      const id = card.dataset.toolCallId;
      if (!id) return;
      const list = (window.__cardStatus[id] = window.__cardStatus[id] || []);
      const s = card.dataset.status + (card.dataset.approval ? ':' + card.dataset.approval : '');
      if (list[list.length - 1] !== s) list.push(s);
      if (!window.__cardFirstSeen[id] && card.isConnected) {
        window.__cardFirstSeen[id] = { name: card.querySelector('.tool-name').textContent, status: card.dataset.status };
      }
    };
    new MutationObserver((records) => {
      for (const r of records) {
        const t = r.target;
        if (t.nodeType === 1 && t.classList.contains('tool-card')) note(t);
        for (const n of r.addedNodes || []) {
          if (n.nodeType !== 1) continue;
          if (n.classList.contains('tool-card')) note(n);
          n.querySelectorAll && n.querySelectorAll('.tool-card').forEach(note);
        }
      }
    }).observe(document, { subtree: true, childList: true, attributes: true, attributeFilter: ['data-status', 'data-approval'] });
  });
}

/** Opens the page on conversation `id` (or on the list) and waits until
 * its socket is live. */
export async function openPage(page, server, id) {
  await page.goto(server.url + '/' + (id ? `#/c/${id}` : ''));
  if (id) await page.locator('#conn[data-state="open"]').waitFor();
}

/** Types into the composer and presses Enter. */
export async function sendMessage(page, text) {
  await page.locator('#composer').fill(text);
  await page.locator('#composer').press('Enter');
}

/** Waits until no turn runs (the Stop button is hidden and the live
 * area is gone). */
export async function waitTurnEnd(page, timeout = 30_000) {
  await page.waitForFunction(() => {
    const stop = document.getElementById('stop');
    return stop.hidden && document.getElementById('composer-form').dataset.mode === 'send' && document.getElementById('live').hidden;
  }, null, { timeout });
}

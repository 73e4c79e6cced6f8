// The operator console in a real browser (Debian's chromium, headless, driven by
// playwright-core): sign in, find a seeded `unknown` operation, open its timeline, resolve it,
// see it leave the queue and the next delivery replay; approve a waiting operation and count
// exactly one effect at the fake system of record; refuse an agent token, a stale page and
// forged cross-site forms with nothing changed; end a session by removing its token (SIGHUP).
// The page's polish: every action's reason on the timeline, one "what a caller gets now" in the
// notice and the panel, the contract's owner and runbook, a version that never wraps. And a
// second gateway over the same store without a record's tool (as beside an in-process
// `idemgate.Local`): the record is resolved there by hand, never looked up.
// Every page is screenshotted into IDEMGATE_CONSOLE_SHOTS (default
// $HOME/.cache/idemgate-console-shots), printed at the start.
//
// Run by scripts/ci-console, which installs playwright-core and names the gateway binary
// (IDEMGATE_BIN) and the module directory (PLAYWRIGHT_CORE_DIR).

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import { createRequire } from 'node:module';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';

import { contracts, gatewayBinary } from '../../../../clients/typescript/test/support/gateway.mjs';
import { FakeSystem, until } from '../../../../clients/typescript/test/support/fake.mjs';

const require = createRequire(join(process.env.PLAYWRIGHT_CORE_DIR ?? '.', 'node_modules', 'x.js'));
const { chromium } = require('playwright-core');

const SHOTS = process.env.IDEMGATE_CONSOLE_SHOTS || join(homedir(), '.cache', 'idemgate-console-shots');
mkdirSync(SHOTS, { recursive: true });
console.log(`screenshots: ${SHOTS}`);

const sha256 = (text) => createHash('sha256').update(text).digest('hex');

/**
 * The tests' contracts; tickets.create with a dated version and an owner with a runbook (the
 * operation page shows both).
 */
function consoleContracts(fakeUrl) {
  const all = contracts(fakeUrl);
  all['tickets.create.yaml'] =
    all['tickets.create.yaml'].replace('version: "1"', 'version: "2026-12-01"') +
    'owner:\n  reconciliation: legal-oncall\n  runbook: https://runbooks.example.com/tickets.create\n';
  return all;
}

/**
 * A gateway over `fakeUrl` with an agent and an operator token; its config can be rewritten.
 * `store` names another gateway's SQLite file to share; `omit` leaves contracts out.
 */
async function startGateway(fakeUrl, { store, omit = [] } = {}) {
  const dir = mkdtempSync(join(tmpdir(), 'idemgate-console-'));
  mkdirSync(join(dir, 'contracts'));
  for (const [file, text] of Object.entries(consoleContracts(fakeUrl))) {
    if (!omit.includes(file)) writeFileSync(join(dir, 'contracts', file), text);
  }
  const storePath = store ?? join(dir, 'gate.sqlite');
  const tokens = {
    agent: `idg_test_agent_${randomBytes(12).toString('hex')}`,
    operator: `idg_test_operator_${randomBytes(12).toString('hex')}`,
  };
  const config = join(dir, 'gate.toml');
  const write = (roles) =>
    writeFileSync(
      config,
      `listen = "127.0.0.1:0"
environment = "ci"
store = "sqlite://${storePath}"
contracts = ["${join(dir, 'contracts')}/*.yaml"]
sandbox = false

[[tenants]]
name = "ci"
${roles
  .map((role) => `[[tenants.tokens]]\nname = "${role}-1"\nsha256 = "${sha256(tokens[role])}"\nrole = "${role}"\n`)
  .join('')}`,
    );
  write(['agent', 'operator']);
  const child = spawn(gatewayBinary(), ['serve', '--config', config], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'warn' },
  });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exited = new Promise((resolve) => child.once('exit', resolve));
  await until('the gateway to listen', () => /listening on http:\/\/127\.0\.0\.1:\d+/.test(output), 20_000).catch((e) => {
    throw new Error(`${e.message}\n${output}`);
  });
  const url = output.match(/listening on (http:\/\/127\.0\.0\.1:\d+)/)[1];
  return {
    url,
    tokens,
    storePath,
    output: () => output,
    /** Rewrites the config with only `roles`' tokens and sends SIGHUP; waits for the reload. */
    async reload(roles) {
      const before = output.length;
      write(roles);
      child.kill('SIGHUP');
      await until('the SIGHUP reload', () => output.slice(before).includes('reloaded'), 10_000);
    },
    async stop() {
      if (child.exitCode === null) {
        child.kill('SIGTERM');
        const t = setTimeout(() => child.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(t);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

const fake = await new FakeSystem().start();
const gate = await startGateway(fake.url);
let bare = null;
const attacker = http.createServer();
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium', headless: true, args: ['--no-sandbox'] });
let shot = 0;
const shots = [];

async function snap(page, name) {
  shot += 1;
  const file = join(SHOTS, `${String(shot).padStart(2, '0')}-${name}.png`);
  await page.screenshot({ path: file, fullPage: true });
  shots.push(file);
}

/** One delivery through API v1 with the agent token. */
async function invoke(tool, workflowId, stepId, args) {
  const r = await fetch(`${gate.url}/v1/tools/${tool}/invoke`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gate.tokens.agent}`, 'content-type': 'application/json' },
    body: JSON.stringify({ workflow_id: workflowId, step_id: stepId, arguments: args }),
  });
  return { http: r.status, body: await r.json() };
}

/** The record as API v1 shows it to the operator. */
async function record(key) {
  const r = await fetch(`${gate.url}/v1/operations/${encodeURIComponent(key)}`, {
    headers: { authorization: `Bearer ${gate.tokens.operator}` },
  });
  return r.json();
}

const key = (wf, step) => `ci:ci:${wf}:${step}`;
const watchdog = setTimeout(() => {
  console.error(`the browser test did not finish within 150 s\n${gate.output()}`);
  process.exit(2);
}, 150_000);

try {
  // --- Seeds: an unknown letter (committed, answer lost), an unknown note (lookups off), two
  // tickets waiting for approval.
  fake.fault('letters', 'drop');
  const letterArgs = { to: 'A. Customer', text: 'Your refund is on its way.' };
  const letter = await invoke('letters.send', 'wf-console', 'letter', letterArgs);
  assert.equal(letter.body.outcome, 'unknown', JSON.stringify(letter.body));
  const letterKey = key('wf-console', 'letter');
  const letterRef = fake.committed.find((c) => c.key === letterKey)?.reference;
  assert.ok(letterRef, 'the fake committed the letter');

  fake.lookups = false;
  fake.fault('notes', 'drop');
  const note = await invoke('notes.add', 'wf-console', 'note', { text: '<script>alert("x")</script> called' });
  assert.equal(note.body.outcome, 'unknown', JSON.stringify(note.body));
  const noteKey = key('wf-console', 'note');

  const ticketArgs = { queue_id: 'legal', subject: 'Contract review', body: 'Please review clause 4.' };
  const waiting = await invoke('tickets.create', 'wf-console', 'ticket', ticketArgs);
  assert.equal(waiting.body.next_action, 'ask_for_approval', JSON.stringify(waiting.body));
  const ticketKey = key('wf-console', 'ticket');
  const stale = await invoke('tickets.create', 'wf-console', 'ticket-2', { ...ticketArgs, subject: 'Second review' });
  assert.equal(stale.body.next_action, 'ask_for_approval');
  const staleKey = key('wf-console', 'ticket-2');
  assert.equal(fake.effectsFor(ticketKey), 0, 'nothing runs before approval');

  const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  context.setDefaultTimeout(10_000);
  const page = await context.newPage();

  // --- Sign-in: a browser gets the sign-in page, not a 401 body.
  await page.goto(`${gate.url}/console`);
  assert.match(page.url(), /\/console\/sign-in$/);
  await snap(page, 'sign-in');

  // An agent token is refused, and no cookie is set.
  await page.fill('#token', gate.tokens.agent);
  const [agentAnswer] = await Promise.all([page.waitForResponse((r) => r.request().method() === 'POST'), page.click('button[type=submit]')]);
  assert.equal(agentAnswer.status(), 403);
  assert.match(await page.textContent('#sign-in-error'), /agent token/i);
  assert.equal((await context.cookies()).length, 0);
  await snap(page, 'agent-refused');

  await page.fill('#token', gate.tokens.operator);
  await Promise.all([page.waitForURL(`${gate.url}/console`), page.click('button[type=submit]')]);
  const [cookie] = await context.cookies();
  assert.equal(cookie.name, 'idemgate_console');
  assert.equal(cookie.httpOnly, true);
  assert.equal(cookie.sameSite, 'Strict');
  assert.equal(cookie.path, '/console');
  assert.ok(cookie.expires > Date.now() / 1000 + 3600, 'the session cookie has an expiry hours ahead');

  // --- The unknown queue holds both seeded operations, with evidence; untrusted text is text.
  const letterRow = page.locator(`tr[data-key=\"${letterKey}\"]`);
  await letterRow.waitFor();
  assert.match(await letterRow.textContent(), /letters\.send/);
  assert.ok((await page.locator(`tr[data-key=\"${noteKey}\"]`).count()) === 1);
  await until('the live count', () => true);
  await page.waitForSelector('#live.on');
  assert.equal(await page.textContent('[data-count=unknown]'), '2');
  assert.equal(await page.textContent('[data-count=approval]'), '2');
  await snap(page, 'queue-unknown');

  // --- Its page: the timeline in order.
  await Promise.all([page.waitForURL(/\/console\/operations\//), letterRow.locator('a').click()]);
  const kinds = await page.locator('#timeline .kind').allTextContents();
  for (const kind of ['claimed', 'sent', 'unknown']) assert.ok(kinds.includes(kind), `timeline has ${kind}: ${kinds}`);
  assert.ok(kinds.indexOf('claimed') < kinds.indexOf('sent') && kinds.indexOf('sent') < kinds.indexOf('unknown'));
  assert.equal(await page.textContent('#record-status'), 'unknown');
  await snap(page, 'operation-unknown');

  // A resolution without a reason is refused on the page; nothing changes.
  await page.fill('#reference', letterRef);
  await page.fill('#result', JSON.stringify({ letter_id: letterRef }));
  await page.click('#resolve-applied-button');
  assert.match(await page.textContent('#notice'), /Give a reason/);
  assert.equal(await page.textContent('#record-status'), 'unknown');
  assert.equal((await record(letterKey)).record_status, 'unknown');
  await snap(page, 'missing-reason');

  // Resolved applied with the reference the fake holds.
  await page.fill('#applied-reason', 'found letter in the outbox');
  await page.click('#resolve-applied-button');
  assert.match(await page.textContent('#notice'), /Resolved applied by operator-1\. A caller now gets: replayed/);
  assert.equal(await page.textContent('#outcome-label'), 'replayed');
  assert.match(await page.textContent('#timeline'), /by operator-1; reason: found letter in the outbox/);
  assert.equal(await page.textContent('#record-status'), 'applied');
  assert.equal(await page.textContent('#receipt-reference'), letterRef);
  await snap(page, 'resolved-applied');

  // It left the queue; the next delivery replays; the fake saw one request, one effect.
  await page.goto(`${gate.url}/console`);
  assert.equal(await page.locator(`tr[data-key=\"${letterKey}\"]`).count(), 0);
  await snap(page, 'queue-after-resolve');
  const replay = await invoke('letters.send', 'wf-console', 'letter', letterArgs);
  assert.equal(replay.body.outcome, 'replayed');
  assert.equal(replay.body.effect_reference, letterRef);
  assert.equal(fake.requests('letters'), 1);
  assert.equal(fake.effectsFor(letterKey), 1);

  // --- Look the receipt up now: still unknown while lookups are down, applied once they answer.
  await page.goto(`${gate.url}/console/operations/${encodeURIComponent(noteKey)}`);
  await page.click('#lookup-button');
  assert.match(await page.textContent('#notice'), /Receipt looked up by operator-1\. A caller now gets: unknown/);
  fake.lookups = true;
  await page.click('#lookup-button');
  assert.match(await page.textContent('#notice'), /A caller now gets: replayed, reference /);
  assert.equal(fake.effectsFor(noteKey), 1);
  await snap(page, 'looked-up');

  // --- Approve a waiting operation: exactly one effect downstream.
  await page.goto(`${gate.url}/console?queue=approval`);
  await page.locator(`tr[data-key=\"${ticketKey}\"]`).waitFor();
  await snap(page, 'queue-approval');
  // A narrow window: the dated versions in the queue stay on one line each.
  await page.setViewportSize({ width: 380, height: 900 });
  const wrapped = await page.evaluate(() =>
    [...document.querySelectorAll('tr .version')].filter((v) => v.getClientRects().length !== 1).map((v) => v.textContent),
  );
  assert.ok((await page.locator('tr .version').count()) > 0, 'the queue shows versions');
  assert.deepEqual(wrapped, [], 'no version wraps in the queue');
  await snap(page, 'queue-approval-narrow');
  await page.setViewportSize({ width: 1280, height: 900 });
  await Promise.all([page.waitForURL(/\/console\/operations\//), page.locator(`tr[data-key=\"${ticketKey}\"]`).locator('a').click()]);
  assert.equal(await page.textContent('#record-status'), 'awaiting_approval');
  // The contract's owner and runbook link, and the dated version on one line.
  assert.equal(await page.textContent('#owner'), 'legal-oncall');
  assert.equal(await page.getAttribute('#runbook a', 'href'), 'https://runbooks.example.com/tickets.create');
  assert.equal(await page.textContent('#tool-version'), 'version 2026-12-01');
  await snap(page, 'operation-awaiting-approval');
  await page.fill('#approve-reason', 'legal asked for it');
  await page.click('#approve-button');
  // One answer to "what does a caller get now": the notice says what the panel says.
  const panel = await page.textContent('#outcome-label');
  assert.equal(panel, 'replayed', 'after an approval a caller gets the replay');
  assert.match(await page.textContent('#notice'), new RegExp(`Approved by operator-1\\. A caller now gets: ${panel}[,;]`));
  // The reason is on the timeline.
  assert.match(await page.textContent('#timeline'), /reason: legal asked for it/);
  await snap(page, 'approved');
  // A narrow window: the version still does not wrap (one line box, however tight).
  await page.setViewportSize({ width: 380, height: 900 });
  assert.equal(await page.evaluate(() => document.getElementById('tool-version').getClientRects().length), 1, 'the version never wraps');
  await snap(page, 'approved-narrow');
  await page.setViewportSize({ width: 1280, height: 900 });
  assert.equal(fake.effectsFor(ticketKey), 1, 'one effect at the downstream after approval');

  // --- A stale page: the second ticket is denied elsewhere, then approved from the old page.
  await page.goto(`${gate.url}/console/operations/${encodeURIComponent(staleKey)}`);
  const denied = await fetch(`${gate.url}/v1/operations/${encodeURIComponent(staleKey)}/deny`, {
    method: 'POST',
    headers: { authorization: `Bearer ${gate.tokens.operator}`, 'content-type': 'application/json' },
    body: JSON.stringify({ reason: 'denied by the API meanwhile' }),
  });
  assert.equal(denied.status, 403);
  await page.fill('#approve-reason', 'approving an old page');
  await page.click('#approve-button');
  assert.match(await page.textContent('#notice'), /page was out of date/);
  assert.equal(fake.effectsFor(staleKey), 0, 'a stale approval sends nothing');
  await snap(page, 'stale-page');

  // --- Forged cross-site forms: a page on another origin posts to the console.
  const target = `${gate.url}/console/operations/${encodeURIComponent(noteKey)}`;
  const forgedKey = key('wf-console', 'forged');
  fake.fault('letters', 'drop');
  await invoke('letters.send', 'wf-console', 'forged', { to: 'C. Customer', text: 'hello' });
  assert.equal((await record(forgedKey)).record_status, 'unknown');
  const forgedTarget = `${gate.url}/console/operations/${encodeURIComponent(forgedKey)}`;
  const forged = (await record(forgedKey));
  attacker.on('request', (_req, res) => {
    res.writeHead(200, { 'content-type': 'text/html' });
    res.end(`<!doctype html><title>a prize</title><form id=f method=post action="${forgedTarget}">
<input name=action value=resolve_not_applied><input name=confirm value=yes><input name=reason value=forged>
<input name=fence value=${forged.attempt}><input name=status value=unknown><input name=csrf value=guessed></form>
<script>document.getElementById('f').submit()</script>`);
  });
  await new Promise((resolve) => attacker.listen(0, '127.0.0.2', resolve));
  const evil = `http://127.0.0.2:${attacker.address().port}/`;
  const [forgedAnswer] = await Promise.all([
    page.waitForResponse((r) => r.url() === forgedTarget && r.request().method() === 'POST'),
    page.goto(evil),
  ]);
  assert.ok([303, 403].includes(forgedAnswer.status()), `a forged form answers ${forgedAnswer.status()}`);
  await page.waitForLoadState();
  await snap(page, 'forged-cross-site');
  assert.equal((await record(forgedKey)).record_status, 'unknown', 'the forged form changed nothing');

  // The same form with the session's cookie but a foreign Origin, then with no CSRF token.
  const foreign = await context.request.post(forgedTarget, {
    form: { action: 'resolve_not_applied', confirm: 'yes', reason: 'forged', fence: String(forged.attempt), status: 'unknown', csrf: 'guessed' },
    headers: { origin: 'http://evil.example' },
    maxRedirects: 0,
  });
  assert.equal(foreign.status(), 403);
  const noToken = await context.request.post(forgedTarget, {
    form: { action: 'resolve_not_applied', confirm: 'yes', reason: 'forged', fence: String(forged.attempt), status: 'unknown' },
    headers: { origin: gate.url },
    maxRedirects: 0,
  });
  assert.equal(noToken.status(), 403);
  assert.match(await noToken.text(), /carries no CSRF token/);
  assert.equal((await record(forgedKey)).record_status, 'unknown', 'nothing changed');
  assert.equal(fake.effectsFor(forgedKey), 1);
  void target;

  // --- Resolve not applied goes through a confirmation step.
  await page.goto(forgedTarget);
  await page.fill('#not-applied-reason', 'checked: never delivered');
  await page.click('#resolve-not-applied-button');
  await page.locator('#confirm-not-applied').waitFor();
  assert.equal((await record(forgedKey)).record_status, 'unknown', 'nothing changes before the confirmation');
  await snap(page, 'confirm-not-applied');
  await page.click('#confirm-not-applied-button');
  assert.match(await page.textContent('#notice'), /Resolved not applied by operator-1/);
  await page.locator('#released').waitFor();
  assert.equal(await page.locator('#resolve-applied-button').count(), 0, 'a released claim offers no action');
  await snap(page, 'resolved-not-applied');

  // --- A second gateway over the same store without letters.send (as the console beside an
  // in-process idemgate.Local): the record is resolved by hand there, never looked up.
  fake.fault('letters', 'drop');
  const handArgs = { to: 'D. Customer', text: 'Your parcel is late.' };
  assert.equal((await invoke('letters.send', 'wf-console', 'hand', handArgs)).body.outcome, 'unknown');
  const handKey = key('wf-console', 'hand');
  const handRef = fake.committed.find((c) => c.key === handKey)?.reference;
  assert.ok(handRef, 'the fake committed the letter');
  bare = await startGateway(fake.url, { store: gate.storePath, omit: ['letters.send.yaml'] });
  const bareContext = await browser.newContext({ viewport: { width: 1280, height: 900 } });
  bareContext.setDefaultTimeout(10_000);
  const barePage = await bareContext.newPage();
  await barePage.goto(`${bare.url}/console/sign-in`);
  await barePage.fill('#token', bare.tokens.operator);
  await Promise.all([barePage.waitForURL(`${bare.url}/console`), barePage.click('button[type=submit]')]);
  await barePage.locator(`tr[data-key=\"${handKey}\"]`).waitFor();
  await barePage.goto(`${bare.url}/console/operations/${encodeURIComponent(handKey)}`);
  assert.match(await barePage.textContent('#tool-not-loaded'), /resolve it by hand/);
  assert.equal(await barePage.locator('#lookup-button').count(), 0, 'never looked up');
  await snap(barePage, 'by-hand-unknown');
  await barePage.fill('#reference', handRef);
  await barePage.fill('#applied-reason', 'seen in the letters outbox');
  await barePage.click('#resolve-applied-button');
  assert.match(await barePage.textContent('#notice'), /Resolved applied by operator-1\. A caller now gets: replayed/);
  assert.equal(await barePage.textContent('#outcome-label'), 'replayed');
  assert.match(await barePage.textContent('#timeline'), /reason: seen in the letters outbox/);
  await snap(barePage, 'by-hand-resolved');
  await bareContext.close();
  // The gateway with the tool replays it: one effect.
  const handAgain = await invoke('letters.send', 'wf-console', 'hand', handArgs);
  assert.equal(handAgain.body.outcome, 'replayed', JSON.stringify(handAgain.body));
  assert.equal(handAgain.body.effect_reference, handRef);
  assert.equal(fake.effectsFor(handKey), 1);

  // --- Sign out, then sign in again and lose the session to a SIGHUP that drops the token.
  await page.goto(`${gate.url}/console`);
  await Promise.all([page.waitForURL(/sign-in/), page.click('header button')]);
  assert.match(await page.textContent('main'), /signed out/);
  await snap(page, 'signed-out');
  await page.goto(`${gate.url}/console`);
  assert.match(page.url(), /sign-in/);

  await page.fill('#token', gate.tokens.operator);
  await Promise.all([page.waitForURL(`${gate.url}/console`), page.click('button[type=submit]')]);
  await gate.reload(['agent']);
  await page.goto(`${gate.url}/console?queue=approval`);
  assert.match(page.url(), /sign-in\?ended=revoked/);
  assert.match(await page.textContent('main'), /no longer an operator token/);
  await snap(page, 'session-ended-by-sighup');

  console.log(`console browser test: passed; ${shots.length} screenshots:`);
  for (const file of shots) console.log(`  ${file}`);
} catch (e) {
  console.error(e);
  console.error(`--- gateway output ---\n${gate.output()}`);
  process.exitCode = 1;
} finally {
  clearTimeout(watchdog);
  await browser.close().catch(() => {});
  attacker.close();
  if (bare) await bare.stop();
  await gate.stop();
  await fake.stop();
}

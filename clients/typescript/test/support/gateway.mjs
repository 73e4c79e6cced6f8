// Starts a real `idemgate serve` for a test: its own temp dir, SQLite store, contracts that
// point at the test's fake system of record, and two tokens (an agent's and an operator's).

import { execFileSync, spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { homedir, tmpdir } from 'node:os';
import { join } from 'node:path';

/** The gateway binary: `IDEMGATE_BIN`, else the cargo target dir's debug build. */
export function gatewayBinary() {
  const target = process.env.CARGO_TARGET_DIR || join(homedir(), '.cache', 'idemgate-target');
  const bin = process.env.IDEMGATE_BIN || join(target, 'debug', 'idemgate');
  if (!existsSync(bin)) {
    throw new Error(
      `the idemgate binary is missing at ${bin}: build it (cargo build -p idemgate-cli) or set IDEMGATE_BIN`,
    );
  }
  return bin;
}

const RETENTION = `retention:
  record_ttl: 1d
  tombstone_ttl: 7d
  late_arrival: reject
  max_retry_window: 1d
`;

/**
 * One key-based contract over an HTTP route of `fake`: the operation key from the workflow and
 * step, a JSON object in, the fingerprint over `fields`, a receipt lookup at
 * `{route}/by-key/{operation_key}` when `lookup`. `extra` holds YAML the contract adds at each
 * place: `top` after the purpose, `fingerprint`, `http` after the reference, `tail` before the
 * retention.
 */
function keyBased(fake, { name, purpose, properties, required, fields, route, reference, dedup, lookup, total, extra = {} }) {
  const lookupUrl = lookup ? `    lookup:\n      url: ${fake}/${route}/by-key/{operation_key}\n` : '';
  return `name: ${name}
version: "1"
purpose: ${purpose}
${extra.top ?? ''}effect_class: key_based
operation_key:
  supplied_by: application
  scope: [tenant, environment, workflow_id, step_id]
  reused_for_retry: true
input_schema:
  type: object
  properties:
${properties}  required: [${required}]
  additionalProperties: false
request_fingerprint:
  fields: [${fields}]
${extra.fingerprint ?? ''}downstream:
  deduplicates_by_key: ${dedup}
  receipt_lookup: ${lookup}
  http:
    url: ${fake}/${route}
    reference: ${reference}
${extra.http ?? ''}${lookupUrl}    timeouts:
      connect: 2s
      total: ${total}
${extra.tail ?? ''}${RETENTION}`;
}

/** The contracts the tests run, each pointing at `fake` (a base URL). */
export function contracts(fake) {
  return {
    // Deduplicates on the key and offers a receipt lookup; legal-queue tickets need approval.
    'tickets.create.yaml': keyBased(fake, {
      name: 'tickets.create',
      purpose: 'Create one support ticket for one workflow step.',
      properties: `    queue_id:
      type: string
      minLength: 1
      maxLength: 64
      description: Queue that receives the ticket; support when omitted.
    subject:
      type: string
      minLength: 1
      maxLength: 200
    body:
      type: string
      maxLength: 20000
`,
      required: 'subject, body',
      fields: 'queue_id, subject, body',
      route: 'tickets',
      reference: '/ticket_id',
      dedup: true,
      lookup: true,
      total: '10s',
      extra: {
        top: `use_when:
  - The workflow has a new issue to record.
do_not_use_when:
  - The user asks for a second ticket about the same issue; that is a new step.
`,
        fingerprint: `  defaults:
    queue_id: support
  mismatch: rejected
`,
        http: `    error_message: /error
`,
        tail: `security:
  approval: when_matches
  approval_when:
    queue_id: [legal]
# A short lease: a waiting delivery re-reads the record after a quarter of the lease left, so
# the tests that wait do not sit out the default 30 s lease's 7.5 s pause.
lease_seconds: 4
`,
      },
    }),
    // No deduplication; a receipt lookup that the fake can switch off.
    'notes.add.yaml': keyBased(fake, {
      name: 'notes.add',
      purpose: "Add one note to a customer's file.",
      properties: '    text: {type: string, minLength: 1, maxLength: 2000}\n',
      required: 'text',
      fields: 'text',
      route: 'notes',
      reference: '/note_id',
      dedup: false,
      lookup: true,
      total: '10s',
    }),
    // Neither deduplication nor lookup: a lost answer can only end unknown.
    'letters.send.yaml': keyBased(fake, {
      name: 'letters.send',
      purpose: 'Send one letter to one address.',
      properties: '    to: {type: string, minLength: 1, maxLength: 200}\n    text: {type: string, minLength: 1, maxLength: 2000}\n',
      required: 'to, text',
      fields: 'to, text',
      route: 'letters',
      reference: '/letter_id',
      dedup: false,
      lookup: false,
      total: '1s',
    }),
  };
}

const sha256 = (text) => createHash('sha256').update(text).digest('hex');

/**
 * Starts a gateway over `fakeUrl` and waits until `/healthz` answers 200.
 * @param {string} fakeUrl
 * @param {{ dir?: string }} [options]
 */
export async function startGateway(fakeUrl, options = {}) {
  const bin = gatewayBinary();
  // `options.dir`: a directory of the caller's, whose gate.sqlite the gateway then shares.
  const dir = options.dir ?? mkdtempSync(join(tmpdir(), 'idemgate-ts-'));
  mkdirSync(join(dir, 'contracts'));
  for (const [file, text] of Object.entries(contracts(fakeUrl))) {
    writeFileSync(join(dir, 'contracts', file), text);
  }
  // Test tokens, one for each role: secrets for this run only, never operation identity.
  const tokens = Object.fromEntries(
    ['agent', 'operator'].map((role) => [role, `idg_test_${role}_${randomBytes(12).toString('hex')}`]),
  );
  const tokenTables = Object.entries(tokens).map(
    ([role, token]) => `[[tenants.tokens]]
name = "${role}"
sha256 = "${sha256(token)}"
role = "${role}"
`,
  );
  const config = join(dir, 'gate.toml');
  writeFileSync(
    config,
    `listen = "127.0.0.1:0"
environment = "ci"
store = "sqlite://${join(dir, 'gate.sqlite')}"
contracts = ["${join(dir, 'contracts')}/*.yaml"]
sandbox = false

[[tenants]]
name = "ci"
${tokenTables.join('')}`,
  );

  const child = spawn(bin, ['serve', '--config', config], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'warn' },
  });
  let output = '';
  child.stdout.on('data', (d) => (output += d));
  child.stderr.on('data', (d) => (output += d));
  const exited = new Promise((resolve) => child.once('exit', (code) => resolve(code)));

  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`the gateway did not start within 20 s:\n${output}`));
    }, 20_000);
    const check = () => {
      const m = output.match(/idemgate listening on (http:\/\/127\.0\.0\.1:\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    };
    child.stdout.on('data', check);
    exited.then((code) => {
      clearTimeout(timer);
      reject(new Error(`the gateway exited with ${code} before listening:\n${output}`));
    });
  });

  const deadline = Date.now() + 10_000;
  for (;;) {
    const ok = await fetch(`${url}/healthz`).then(
      (r) => r.status === 200,
      () => false,
    );
    if (ok) break;
    if (Date.now() > deadline) throw new Error(`/healthz never answered 200:\n${output}`);
    await new Promise((r) => setTimeout(r, 50));
  }

  return {
    url,
    agentToken: tokens.agent,
    operatorToken: tokens.operator,
    /** The operation key the gateway gives `workflowId`/`stepId` for this tenant. */
    key: (workflowId, stepId) => `ci:ci:${workflowId}:${stepId}`,
    output: () => output,
    /** The store's audit log of operator actions, through `idemgate audit export`. */
    auditLog() {
      const out = execFileSync(bin, ['audit', 'export', '--store', `sqlite://${join(dir, 'gate.sqlite')}`], {
        timeout: 30_000,
        stdio: ['ignore', 'pipe', 'ignore'],
      }).toString();
      return out
        .split('\n')
        .filter((line) => line.trim() !== '')
        .map((line) => JSON.parse(line));
    },
    async stop() {
      if (child.exitCode === null) {
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
        await exited;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

// A fake system of record over real loopback HTTP, for black-box tests of the client through a
// running gateway. It counts effects on its own side, by the `Idempotency-Key` each request
// carried, so a green answer at the client cannot hide a duplicate.
//
// | route                       | what it does                                                   |
// |-----------------------------|----------------------------------------------------------------|
// | POST /tickets               | creates a ticket; deduplicates on the key: 201 {ticket_id, key} |
// | GET  /tickets/by-key/{key}  | receipt lookup: 200 as above, 404, or 503 while lookups are off |
// | POST /notes                 | creates a note on every request (no deduplication)             |
// | GET  /notes/by-key/{key}    | receipt lookup for notes, like tickets'                         |
// | POST /letters               | sends a letter on every request; no deduplication, no lookup   |
//
// Faults are queued per route with `fault(route, kind)` and apply to the next effect request on
// that route, in arrival order:
// - `drop`: commit the effect, then destroy the socket without a byte of answer;
// - `hold`: commit only when the returned gate is released, then answer;
// - `stall`: hold the request without committing until the gate is released (a client with a
//   shorter timeout sees a timeout where nothing happened), then answer 503;
// - `refuse`: no effect, answer 422.

import http from 'node:http';

const ROUTES = /** @type {const} */ (['tickets', 'notes', 'letters']);

/** A promise with its resolver, released at most once. */
function gate() {
  /** @type {() => void} */
  let release = () => {};
  const opened = new Promise((resolve) => {
    release = () => resolve(undefined);
  });
  return { opened, release };
}

/**
 * Resolves once `check()` is true, polling every 10 ms; rejects after `ms`.
 * @param {string} what
 * @param {() => boolean} check
 * @param {number} ms
 */
export async function until(what, check, ms = 5000) {
  const deadline = Date.now() + ms;
  while (!check()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export class FakeSystem {
  constructor() {
    /** Committed effects per route: `{ route, key, reference }` in commit order. */
    this.committed = [];
    /** Every request received, `{ method, path, key }` in arrival order. */
    this.seen = [];
    /** Whether the `by-key` lookups answer (false: 503). */
    this.lookups = true;
    /** @type {Record<string, Array<{kind: string, gate: ReturnType<typeof gate>}>>} */
    this.faults = { tickets: [], notes: [], letters: [] };
    /** Requests held by `hold` or `stall` right now. */
    this.held = 0;
    this.counter = 0;
    /** @type {Map<string, {reference: string, route: string}>} */
    this.byKey = new Map();
    /** @type {Set<import('node:net').Socket>} */
    this.sockets = new Set();
    this.server = http.createServer((req, res) => {
      this.handle(req, res).catch((e) => {
        res.statusCode = 500;
        res.end(JSON.stringify({ error: String(e) }));
      });
    });
    this.server.on('connection', (s) => {
      this.sockets.add(s);
      s.on('close', () => this.sockets.delete(s));
    });
  }

  /** Binds 127.0.0.1 on an ephemeral port. */
  async start() {
    await new Promise((resolve, reject) => {
      this.server.once('error', reject);
      this.server.listen(0, '127.0.0.1', () => resolve(undefined));
    });
    const address = /** @type {import('node:net').AddressInfo} */ (this.server.address());
    this.url = `http://127.0.0.1:${address.port}`;
    return this;
  }

  async stop() {
    for (const route of ROUTES) for (const f of this.faults[route]) f.gate.release();
    for (const s of this.sockets) s.destroy();
    await new Promise((resolve) => this.server.close(() => resolve(undefined)));
  }

  /**
   * Queues a fault for the next effect request on `route`; returns its gate's release.
   * @param {'tickets' | 'notes' | 'letters'} route
   * @param {'drop' | 'hold' | 'stall' | 'refuse'} kind
   */
  fault(route, kind) {
    const g = gate();
    this.faults[route].push({ kind, gate: g });
    return g.release;
  }

  /** Effects committed on `route` (all routes when omitted). */
  effects(route) {
    return this.committed.filter((c) => route === undefined || c.route === route).length;
  }

  /** Effects committed under `key`, on any route. */
  effectsFor(key) {
    return this.committed.filter((c) => c.key === key).length;
  }

  /** Requests that arrived under `key`, on any route, whatever became of them. */
  requestsFor(key) {
    return this.seen.filter((s) => s.key === key).length;
  }

  /** Effect requests that arrived on `route`, whatever became of them. */
  requests(route) {
    return this.seen.filter((s) => s.method === 'POST' && s.path === `/${route}`).length;
  }

  /**
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   */
  async handle(req, res) {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const path = new URL(req.url ?? '/', 'http://fake').pathname;
    const key = header(req, 'idempotency-key');
    this.seen.push({ method: req.method, path, key });
    const send = (status, body) => {
      res.writeHead(status, { 'content-type': 'application/json' });
      res.end(JSON.stringify(body));
    };

    const lookup = path.match(/^\/(tickets|notes)\/by-key\/([^/]+)$/);
    if (req.method === 'GET' && lookup) {
      if (!this.lookups) return send(503, { error: 'lookup unavailable' });
      const found = this.byKey.get(`${lookup[1]}|${decodeURIComponent(lookup[2])}`);
      if (!found) return send(404, { error: 'no effect under this key' });
      return send(200, receipt(lookup[1], found.reference, decodeURIComponent(lookup[2])));
    }

    const route = path.slice(1);
    if (req.method !== 'POST' || !ROUTES.includes(/** @type {any} */ (route))) {
      return send(404, { error: 'no such route' });
    }
    try {
      JSON.parse(Buffer.concat(chunks).toString('utf8'));
    } catch {
      return send(400, { error: 'body is not JSON' });
    }
    if (!key) return send(400, { error: 'Idempotency-Key is required' });

    const fault = this.faults[route].shift();
    if (fault?.kind === 'refuse') return send(422, { error: 'refused by the fake' });
    if (fault?.kind === 'stall') {
      this.held += 1;
      await fault.gate.opened;
      this.held -= 1;
      return send(503, { error: 'held, not processed' });
    }
    if (fault?.kind === 'hold') {
      this.held += 1;
      await fault.gate.opened;
      this.held -= 1;
    }

    // Tickets deduplicate on the key: a resend answers the first effect's receipt.
    const existing = route === 'tickets' ? this.byKey.get(`${route}|${key}`) : undefined;
    let reference;
    if (existing) {
      reference = existing.reference;
    } else {
      this.counter += 1;
      reference = `${route.slice(0, -1)}_${this.counter}`;
      this.committed.push({ route, key, reference });
      this.byKey.set(`${route}|${key}`, { reference, route });
    }
    if (fault?.kind === 'drop') {
      // Committed; the answer is lost: the socket closes with nothing written.
      req.socket.destroy();
      return;
    }
    send(route === 'tickets' ? 201 : 200, receipt(route, reference, key));
  }
}

function header(req, name) {
  const v = req.headers[name];
  return Array.isArray(v) ? v[0] : v;
}

function receipt(route, reference, key) {
  switch (route) {
    case 'tickets':
      return { ticket_id: reference, key };
    case 'notes':
      return { note_id: reference, key };
    default:
      return { letter_id: reference, key };
  }
}

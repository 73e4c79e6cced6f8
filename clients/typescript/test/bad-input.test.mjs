// Bad input raises a clear error naming what is wrong, and sends nothing that could become an
// effect: an unknown tool, a missing or malformed identity, a gateway that is down, a token
// that is refused, an answer that is not the gateway's. The client never retries on its own.

import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { describe, test } from 'node:test';

import {
  Client,
  GatewayTimeoutError,
  GatewayUnavailableError,
  IdemgateError,
  InvalidIdentityError,
  MissingIdentityError,
  ProtocolError,
  UnauthorizedError,
  UnknownToolError,
} from 'idemgate';
import { idemgateTool } from 'idemgate/ai';

import { T, TICKET, agent, fake, gate, useGateway } from './support/setup.mjs';

useGateway();

/** A loopback port with nothing listening on it. */
async function closedPort() {
  const server = net.createServer();
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  const { port } = /** @type {net.AddressInfo} */ (server.address());
  await new Promise((resolve) => server.close(() => resolve(undefined)));
  return port;
}

/**
 * A loopback server that counts requests and answers each with `handler`.
 * @param {(req: http.IncomingMessage, res: http.ServerResponse) => void} handler
 */
async function countingServer(handler) {
  const state = { requests: 0 };
  const server = http.createServer((req, res) => {
    state.requests += 1;
    req.resume();
    req.on('end', () => handler(req, res));
  });
  await new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(undefined)));
  const { port } = /** @type {net.AddressInfo} */ (server.address());
  return {
    state,
    url: `http://127.0.0.1:${port}`,
    close: () => {
      server.closeAllConnections();
      return new Promise((resolve) => server.close(() => resolve(undefined)));
    },
  };
}

describe('unknown tool', () => {
  test('invoke names the tool, and nothing reaches the system of record', T, async () => {
    const before = fake.seen.length;
    await assert.rejects(agent.workflow('run-bad').step('s').invoke('tickets.creat', TICKET), (e) => {
      assert.ok(e instanceof UnknownToolError && e instanceof IdemgateError);
      assert.equal(e.tool, 'tickets.creat');
      assert.match(e.message, /no tool named "tickets\.creat"/);
      assert.equal(e.httpStatus, 404);
      return true;
    });
    assert.equal(fake.seen.length, before);
  });

  test('tool(name) names it too', T, async () => {
    await assert.rejects(agent.tool('reports.nope'), (e) => {
      assert.ok(e instanceof UnknownToolError);
      assert.equal(e.tool, 'reports.nope');
      assert.match(e.message, /reports\.nope/);
      return true;
    });
  });
});

describe('operation identity', () => {
  test('a key-based tool without identity throws MissingIdentityError naming the tool; no record, no effect', T, async () => {
    const before = fake.requests('tickets');
    await assert.rejects(agent.invoke('tickets.create', TICKET), (e) => {
      assert.ok(e instanceof MissingIdentityError);
      assert.equal(e.tool, 'tickets.create');
      assert.match(e.message, /^tickets\.create needs an operation identity/);
      assert.equal(e.code, 'missing_operation_key');
      return true;
    });
    // Even with the throw option off: bad input is always an error.
    const lenient = new Client({ baseUrl: gate.url, token: gate.agentToken, throw: false });
    await assert.rejects(lenient.invoke('notes.add', { text: 'x' }), MissingIdentityError);
    assert.equal(fake.requests('tickets'), before);
    assert.equal(fake.requests('notes'), 0);
  });

  test('half an identity, an empty part or a part with ":" is refused before anything is sent', T, async () => {
    const requests = fake.seen.length;
    await assert.rejects(agent.invoke('tickets.create', TICKET, { workflowId: 'run-1' }), (e) => {
      assert.ok(e instanceof InvalidIdentityError);
      assert.match(e.message, /tickets\.create: name both workflowId and stepId/);
      return true;
    });
    assert.throws(() => agent.workflow(''), /workflowId is empty/);
    assert.throws(() => agent.workflow('run-1').step('a:b'), (e) => {
      assert.ok(e instanceof InvalidIdentityError);
      assert.match(e.message, /stepId "a:b" contains ':'/);
      return true;
    });
    assert.throws(() => agent.workflow(/** @type {any} */ (42)), /workflowId must be a string/);
    assert.equal(fake.seen.length, requests);
  });

  test('the AI SDK adapter refuses a required-identity tool without a step, naming it', T, async () => {
    const info = await agent.tool('tickets.create');
    assert.throws(() => idemgateTool(agent, info, { workflowId: 'run-1' }), (e) => {
      assert.ok(e instanceof InvalidIdentityError);
      assert.match(e.message, /tickets\.create.*needs a stepId/);
      return true;
    });
    assert.throws(() => idemgateTool(agent, info, /** @type {any} */ ({ stepId: 's' })), /workflowId is required/);
  });
});

describe('the gateway is down or not a gateway', () => {
  test('nothing listening: GatewayUnavailableError names the URL; nothing was received', T, async () => {
    const port = await closedPort();
    const down = new Client({ baseUrl: `http://127.0.0.1:${port}`, token: 'idg_x' });
    await assert.rejects(down.workflow('run-down').step('s').invoke('tickets.create', TICKET), (e) => {
      assert.ok(e instanceof GatewayUnavailableError && e instanceof IdemgateError);
      assert.equal(e.url, `http://127.0.0.1:${port}/v1/tools/tickets.create/invoke`);
      assert.match(e.message, new RegExp(`gateway at http://127\\.0\\.0\\.1:${port}/v1/tools/tickets\\.create/invoke could not be reached \\(ECONNREFUSED\\)`));
      assert.equal(e.maybeReceived, false);
      return true;
    });
    await assert.rejects(down.tools(), GatewayUnavailableError);
  });

  test('a connection that breaks after sending: one request, no retry, and the error says it may have been received', T, async () => {
    const server = await countingServer((req) => req.socket.destroy());
    try {
      const client = new Client({ baseUrl: server.url, token: 'idg_x' });
      await assert.rejects(client.workflow('run-reset').step('s').invoke('tickets.create', TICKET), (e) => {
        assert.ok(e instanceof GatewayUnavailableError);
        assert.equal(e.maybeReceived, true);
        assert.match(e.message, /may have been received/);
        assert.ok(e.message.includes(server.url));
        return true;
      });
      assert.equal(server.state.requests, 1, 'the client must not resend on its own');
    } finally {
      await server.close();
    }
  });

  test('no answer within the timeout: GatewayTimeoutError, one request, no retry', T, async () => {
    const server = await countingServer(() => {});
    try {
      const client = new Client({ baseUrl: server.url, token: 'idg_x', timeoutMs: 300 });
      await assert.rejects(client.workflow('run-slow').step('s').invoke('tickets.create', TICKET), (e) => {
        assert.ok(e instanceof GatewayTimeoutError);
        assert.equal(e.timeoutMs, 300);
        assert.match(e.message, /did not answer within 300 ms; the operation may still be running/);
        return true;
      });
      assert.equal(server.state.requests, 1);
    } finally {
      await server.close();
    }
  });

  test('an answer without `outcome` (a proxy page, a 409 from elsewhere) is a ProtocolError, never a label', T, async () => {
    const server = await countingServer((_req, res) => {
      res.writeHead(409, { 'content-type': 'application/json', 'retry-after': '1' });
      res.end(JSON.stringify({ status: 'in_flight' }));
    });
    try {
      const client = new Client({ baseUrl: server.url, token: 'idg_x' });
      await assert.rejects(client.workflow('run-proxy').step('s').invoke('tickets.create', TICKET), (e) => {
        assert.ok(e instanceof ProtocolError);
        assert.equal(e.httpStatus, 409);
        assert.match(e.message, /no `outcome` member/);
        assert.ok(e.message.includes(server.url));
        return true;
      });
      assert.equal(server.state.requests, 1);
    } finally {
      await server.close();
    }
  });

  test('a refused token is an UnauthorizedError naming the gateway', T, async () => {
    const wrong = new Client({ baseUrl: gate.url, token: 'idg_not_a_token' });
    await assert.rejects(wrong.workflow('run-token').step('s').invoke('tickets.create', TICKET), (e) => {
      assert.ok(e instanceof UnauthorizedError);
      assert.equal(e.httpStatus, 401);
      assert.ok(e.message.includes(gate.url));
      return true;
    });
    await assert.rejects(wrong.tools(), UnauthorizedError);
    assert.equal(fake.effectsFor(gate.key('run-token', 's')), 0);
  });

  test('constructor and argument mistakes are named', T, async () => {
    assert.throws(() => new Client(/** @type {any} */ ({ token: 't' })), /baseUrl is required/);
    assert.throws(() => new Client({ baseUrl: 'not a url', token: 't' }), /"not a url" is not a URL/);
    assert.throws(() => new Client({ baseUrl: 'ftp://127.0.0.1', token: 't' }), /not an http or https URL/);
    assert.throws(() => new Client(/** @type {any} */ ({ baseUrl: gate.url })), /token is required/);
    await assert.rejects(agent.workflow('run-w').step('s').invoke('tickets.create', TICKET, { wait: 1.5 }), /wait is a whole number of seconds/);
  });
});

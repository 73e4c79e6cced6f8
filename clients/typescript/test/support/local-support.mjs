// What the in-process tests share: a fresh SQLite store per test, a fresh PostgreSQL database
// when DATABASE_URL is set, and the ledgers that count effects on the effect's own side.

import { execFileSync, spawn } from 'node:child_process';
import { appendFileSync, closeSync, existsSync, fsyncSync, mkdtempSync, openSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

/** The options of every test: a hang fails the test instead of the run. */
export const T = { timeout: 60_000 };

const made = [];
process.on('exit', () => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

/** A fresh directory under the system's temp dir, removed when the process exits. */
export function tempDir() {
  const dir = mkdtempSync(join(tmpdir(), 'idemgate-local-'));
  made.push(dir);
  return dir;
}

/** A fresh SQLite store's URL. */
export function sqliteStore() {
  return `sqlite://${join(tempDir(), 'ops.sqlite')}`;
}

/** The effects one process's tool functions performed, in memory: each with its key and arguments. */
export class Ledger {
  effects = [];
  calls = 0;
  effect(key, args) {
    this.effects.push({ key, args });
  }
  count(key) {
    return this.effects.filter((e) => e.key === key).length;
  }
}

/** The effects of several processes: one fsynced line per effect in a file. */
export class FileLedger {
  constructor(path) {
    this.path = path;
  }
  effect(key) {
    const fd = openSync(this.path, 'a');
    try {
      appendFileSync(fd, `${key}\n`);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  }
  lines() {
    return existsSync(this.path) ? readFileSync(this.path, 'utf8').split('\n').filter(Boolean) : [];
  }
  has(key) {
    return this.lines().includes(key);
  }
  count(key) {
    return this.lines().filter((k) => k === key).length;
  }
}

const here = dirname(fileURLToPath(import.meta.url));
export const WORKER = join(here, 'local-worker.mjs');

/** Starts `local-worker.mjs` with `args`; its stdout is read line by line. */
export function worker(args, env = {}) {
  const child = spawn(process.execPath, [WORKER, ...args], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  const waiters = [];
  child.stdout.on('data', (d) => {
    out += d;
    for (const w of waiters.splice(0)) w();
  });
  child.stderr.on('data', (d) => {
    err += d;
  });
  const exited = new Promise((resolve) => child.on('exit', (code, signal) => resolve({ code, signal })));
  return {
    child,
    exited,
    stderr: () => err,
    /** The first full line of stdout, waiting up to `ms`. */
    async line(ms) {
      const deadline = Date.now() + ms;
      while (!out.includes('\n')) {
        if (Date.now() > deadline) throw new Error(`the worker printed no line in ${ms} ms; stderr: ${err.slice(-2000)}`);
        await Promise.race([new Promise((r) => waiters.push(r)), exited, new Promise((r) => setTimeout(r, 100))]);
      }
      return out.slice(0, out.indexOf('\n'));
    },
  };
}

const LOCK_SQLITE = `
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
sys.stdin.read()
conn.execute("ROLLBACK")
`;

/**
 * Another process (python3's sqlite3) holding the write lock of the SQLite file at `path`,
 * as a writer of another program would, until `release()`; resolves once the lock is held.
 */
export async function lockSqlite(path) {
  const child = spawn(process.env.IDEMGATE_PYTHON3 || 'python3', ['-c', LOCK_SQLITE, path], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  let err = '';
  child.stderr.on('data', (d) => {
    err += d;
  });
  await new Promise((resolve, reject) => {
    child.on('error', reject);
    child.on('exit', (code) => reject(new Error(`the locking process exited (${code}): ${err}`)));
    child.stdout.on('data', (d) => {
      if (String(d).includes('locked')) resolve();
    });
  });
  return { release: () => child.stdin.end() };
}

/**
 * A fresh database on the PostgreSQL server DATABASE_URL names (created with psql), and the
 * function that drops it; null when DATABASE_URL is not set or psql is missing.
 */
export function postgresDatabase() {
  const base = process.env.DATABASE_URL;
  if (!base) return { skip: 'DATABASE_URL is not set' };
  const name = `idemgate_ts_${process.pid}_${Date.now()}`;
  const psql = (sql) => execFileSync('psql', [base, '-v', 'ON_ERROR_STOP=1', '-qc', sql], { stdio: 'pipe' });
  try {
    psql(`CREATE DATABASE ${name}`);
  } catch (e) {
    return { skip: `could not create a database with psql on DATABASE_URL: ${e.message}` };
  }
  const url = new URL(base);
  url.pathname = `/${name}`;
  return {
    url: url.toString(),
    drop: () => psql(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`),
  };
}

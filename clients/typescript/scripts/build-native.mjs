// Builds the engine's native addon (crates/node, napi-rs) and copies it to
// native/idemgate.node, where `idemgate/local` loads it.
//
//   node scripts/build-native.mjs            # a debug build (what the tests and CI use)
//   node scripts/build-native.mjs --release  # an optimised build (for the benchmark)
//
// Uses cargo from PATH and CARGO_TARGET_DIR (default: the workspace's target/), so the
// workspace's compiled crates are reused.

import { execFileSync } from 'node:child_process';
import { copyFileSync, mkdirSync, renameSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..', '..', '..');
const release = process.argv.includes('--release');
const args = ['build', '--locked', '-p', 'idemgate-node', ...(release ? ['--release'] : [])];
execFileSync('cargo', args, { cwd: root, stdio: 'inherit' });

const target = process.env.CARGO_TARGET_DIR || join(root, 'target');
const library = {
  linux: 'libidemgate_node.so',
  darwin: 'libidemgate_node.dylib',
  win32: 'idemgate_node.dll',
}[process.platform];
if (!library) throw new Error(`build-native: no addon name for platform ${process.platform}`);
const built = join(target, release ? 'release' : 'debug', library);
const out = join(here, '..', 'native');
mkdirSync(out, { recursive: true });
// Copied beside, then renamed over: a process that has the old addon loaded keeps its copy.
copyFileSync(built, join(out, 'idemgate.node.tmp'));
renameSync(join(out, 'idemgate.node.tmp'), join(out, 'idemgate.node'));
console.log(`build-native: ${built} -> native/idemgate.node`);

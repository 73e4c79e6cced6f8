// The readers of API v1's records and the check of an operation key's parts, shared by the
// HTTP client (client.ts) and the in-process face (local.ts). Internal: index.ts does not
// export this module.

import { InvalidIdentityError } from './errors.js';
import type { OperationEvent, OperationSummary } from './client.js';

/** Checks one part of an operation key the way the gateway will, so nothing is sent in vain. */
export function checkPart(name: string, value: unknown): string {
  if (typeof value !== 'string') {
    throw new InvalidIdentityError(`${name} must be a string, not ${value === null ? 'null' : typeof value}`);
  }
  if (value.trim() === '') throw new InvalidIdentityError(`${name} is empty`);
  if (value.includes(':')) {
    throw new InvalidIdentityError(`${name} ${JSON.stringify(value.slice(0, 64))} contains ':', which separates the parts of an operation key`);
  }
  return value;
}

/** A member's name in the API: `effectReference` is `effect_reference`. */
function wireName(name: string): string {
  return name.replace(/[A-Z]/g, (c) => `_${c.toLowerCase()}`);
}

/**
 * Reads an object of the API as `T`: each member of `defaults` from its snake_case name, or its
 * default where the answer has none (or null).
 */
export function fromWire<T extends object>(o: Record<string, unknown>, defaults: T): T {
  const read = { ...defaults };
  for (const name of Object.keys(defaults) as (keyof T & string)[]) {
    read[name] = (o[wireName(name)] ?? defaults[name]) as T[keyof T & string];
  }
  return read;
}

export function summaryOf(o: Record<string, unknown>): OperationSummary {
  return fromWire<OperationSummary>(o, {
    operationKey: '', tool: '', toolVersion: '', recordStatus: '', fingerprint: '', attempt: 0,
    effectReference: null, jobId: null, approvedBy: null, createdAt: 0, updatedAt: 0, expiresAt: null,
  });
}

export function eventOf(o: Record<string, unknown>): OperationEvent {
  return fromWire<OperationEvent>(o, { kind: '', at: 0, attempt: 0, worker: '', detail: null });
}


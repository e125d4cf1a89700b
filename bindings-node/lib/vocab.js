'use strict'
// The core's vocabulary as the addon gives it, read once at load: enum names
// by stable code (both ways) and the scratch layout, each slot resolved by
// name to a constant here, so no other module knows a slot's number.

const native = require('../native.js')
const { describe } = require('./errors.js')

/**
 * @typedef {import('../index').ErrorClass} ErrorClass
 * @typedef {import('../index').Phase} Phase
 * @typedef {import('../index').ErrorKind} ErrorKind
 * @typedef {import('../index').Idempotency} Idempotency
 * @typedef {import('../index').EffectState} EffectState
 * @typedef {import('../index').Action} Action
 * @typedef {import('../index').WaitSource} WaitSource
 * @typedef {import('../index').Reason} Reason
 * @typedef {import('../index').OnFailure} OnFailure
 * @typedef {import('../index').Continuation} Continuation
 * @typedef {import('../index').ApiFamily} ApiFamily
 */

/**
 * What `native.vocab()` returns (src/functions.rs `vocab`, src/scratch.rs `vocab_json`).
 * @typedef {object} Vocab
 * @property {string} version
 * @property {ErrorClass[]} errorClass
 * @property {Phase[]} phase
 * @property {ErrorKind[]} errorKind
 * @property {Idempotency[]} idempotency
 * @property {EffectState[]} effect
 * @property {Action[]} action
 * @property {WaitSource[]} waitSource
 * @property {Reason[]} reason
 * @property {OnFailure[]} onFailure
 * @property {Continuation[]} continuation
 * @property {ApiFamily[]} apiFamily
 * @property {{ len: number, slots: Record<string, Record<string, number>>, results: Record<string, number>, flags: Record<string, number> }} scratch
 */

/** @type {Vocab} */
const VOCAB = JSON.parse(native.vocab())

// ---------------------------------------------------------------------------
// Names <-> stable numeric codes
// ---------------------------------------------------------------------------

/**
 * @param {string[]} names
 * @returns {Map<string, number>}
 */
function codeTable(names) {
  const m = new Map()
  names.forEach((n, i) => m.set(n, i))
  return m
}

const CODES = {
  idempotency: codeTable(VOCAB.idempotency),
  phase: codeTable(VOCAB.phase),
  error: codeTable(VOCAB.errorKind),
  effect: codeTable(VOCAB.effect),
  continuation: codeTable(VOCAB.continuation),
}

/**
 * The code of `value` in table `kind`, with the core's FromStr normalization
 * (trimmed, case-insensitive, '-' for '_'); a TypeError naming `argName` otherwise.
 * @param {keyof typeof CODES} kind
 * @param {unknown} value
 * @param {string} argName
 * @returns {number}
 */
function toCode(kind, value, argName) {
  const table = CODES[kind]
  if (typeof value === 'string') {
    let c = table.get(value)
    if (c !== undefined) return c
    c = table.get(value.trim().toLowerCase().replace(/-/g, '_'))
    if (c !== undefined) return c
  }
  throw new TypeError(`${argName} must be one of ${[...table.keys()].map((k) => `'${k}'`).join(', ')}; got ${describe(value)}`)
}

// ---------------------------------------------------------------------------
// The scratch layout (src/scratch.rs), resolved once
// ---------------------------------------------------------------------------

const SCRATCH = VOCAB.scratch

/**
 * Index of scratch slot `group.name`; throws when the addon has no such slot
 * (this JS and the addon are from different builds).
 * @param {string} group
 * @param {string} name
 * @returns {number}
 */
function slot(group, name) {
  const g = SCRATCH.slots[group]
  const i = g === undefined ? undefined : g[name]
  if (i === undefined || !Number.isInteger(i) || i < 0 || i >= SCRATCH.len) throw new Error(`retrywise: the native addon has no scratch slot ${group}.${name}: the JS layer and the addon are from different builds`)
  return i
}

/**
 * A result code or flag bit the scratch carries (same failure as `slot`).
 * @param {'results' | 'flags'} table
 * @param {string} name
 * @returns {number}
 */
function code(table, name) {
  const v = SCRATCH[table][name]
  if (v === undefined || !Number.isInteger(v)) throw new Error(`retrywise: the native addon has no scratch ${table} code ${name}: the JS layer and the addon are from different builds`)
  return v
}

/** Slot indices, result codes and flag bits, by name. */
const SLOT = Object.freeze({
  LEN: SCRATCH.len,
  // An admitted attempt.
  ATTEMPT_NUMBER: slot('attempt', 'NUMBER'),
  ATTEMPT_UPSTREAM: slot('attempt', 'UPSTREAM'),
  ATTEMPT_CONNECT_MS: slot('attempt', 'CONNECT_MS'),
  ATTEMPT_FIRST_BYTE_MS: slot('attempt', 'FIRST_BYTE_MS'),
  ATTEMPT_IDLE_MS: slot('attempt', 'IDLE_MS'),
  ATTEMPT_TOTAL_MS: slot('attempt', 'TOTAL_MS'),
  ATTEMPT_REMAINING_MS: slot('attempt', 'REMAINING_MS'),
  ATTEMPT_FLAGS: slot('attempt', 'FLAGS'),
  ATTEMPT_STAMP: slot('attempt', 'STAMP'),
  ATTEMPT_FIRST_TOKEN_MS: slot('attempt', 'FIRST_TOKEN_MS'),
  // No attempt may start.
  STOPPED_REASON: slot('stopped', 'REASON'),
  STOPPED_CLASS: slot('stopped', 'CLASS'),
  STOPPED_ON_FAILURE: slot('stopped', 'ON_FAILURE'),
  STOPPED_HAS_DETAIL: slot('stopped', 'HAS_DETAIL'),
  STOPPED_WAIT_MS: slot('stopped', 'WAIT_MS'),
  // A decision.
  DECISION_ACTION: slot('decision', 'ACTION'),
  DECISION_DELAY_MS: slot('decision', 'DELAY_MS'),
  DECISION_CLASS: slot('decision', 'CLASS'),
  DECISION_REASON: slot('decision', 'REASON'),
  DECISION_UPSTREAM: slot('decision', 'UPSTREAM'),
  DECISION_WAIT_SOURCE: slot('decision', 'WAIT_SOURCE'),
  DECISION_RETRY_AFTER_MS: slot('decision', 'RETRY_AFTER_MS'),
  DECISION_ON_FAILURE: slot('decision', 'ON_FAILURE'),
  DECISION_ATTEMPT: slot('decision', 'ATTEMPT'),
  DECISION_FLAGS: slot('decision', 'FLAGS'),
  // A hedge plan.
  HEDGE_AFTER_WAIT_MS: slot('hedge_after', 'WAIT_MS'),
  HEDGE_NO_REASON: slot('hedge_no', 'REASON'),
  // A request read for the next begin (`readNextRequest`).
  REQUEST_FAMILY: slot('request', 'FAMILY'),
  // What every step leaves.
  STEP_RESULT: slot('step', 'RESULT'),
  STEP_HANDLE: slot('step', 'HANDLE'),
  STEP_IDLE: slot('step', 'IDLE'),
  STEP_PENDING_RELEASE: slot('step', 'PENDING_RELEASE'),
  // What a finished call still tells once freed.
  FINISHED_ATTEMPTS: slot('finished', 'ATTEMPTS'),
  FINISHED_OWNER: slot('finished', 'OWNER'),
  FINISHED_STOP_REASON: slot('finished', 'STOP_REASON'),
  FINISHED_STOP_CLASS: slot('finished', 'STOP_CLASS'),
  FINISHED_STOP_ON_FAILURE: slot('finished', 'STOP_ON_FAILURE'),
  FINISHED_STOP_HAS_DETAIL: slot('finished', 'STOP_HAS_DETAIL'),
  FINISHED_HEDGE_REASON: slot('finished', 'HEDGE_REASON'),
  FINISHED_TARGET: slot('finished', 'TARGET'),
  FINISHED_POLICY: slot('finished', 'POLICY'),
  FINISHED_DEADLINE_MS: slot('finished', 'DEADLINE_MS'),
  FINISHED_ID_HI: slot('finished', 'ID_HI'),
  FINISHED_ID_LO: slot('finished', 'ID_LO'),
  // Arguments of the fast entry points.
  BEGIN_ROUTE: slot('begin', 'ROUTE'),
  BEGIN_DEADLINE_MS: slot('begin', 'DEADLINE_MS'),
  BEGIN_IDEMPOTENCY: slot('begin', 'IDEMPOTENCY'),
  BEGIN_TENANT: slot('begin', 'TENANT'),
  BEGIN_REQUEST: slot('begin', 'REQUEST'),
  NEXT_HANDLE: slot('next', 'HANDLE'),
  NEXT_STAMP: slot('next', 'STAMP'),
  REPORT_HANDLE: slot('report', 'HANDLE'),
  REPORT_STATUS: slot('report', 'STATUS'),
  REPORT_RELEASE: slot('report', 'RELEASE'),
  RELEASE_HANDLE: slot('release', 'HANDLE'),
  // Result codes and flag bits.
  RESULT_ATTEMPT: code('results', 'ATTEMPT'),
  RESULT_HEDGE_START: code('results', 'HEDGE_START'),
  RESULT_HEDGE_AFTER: code('results', 'HEDGE_AFTER'),
  FLAG_ATTEMPT_HEDGE: code('flags', 'ATTEMPT_HEDGE'),
  FLAG_ATTEMPT_FALLBACK: code('flags', 'ATTEMPT_FALLBACK'),
  FLAG_DECISION_HEDGE: code('flags', 'DECISION_HEDGE'),
  FLAG_DECISION_DETAIL: code('flags', 'DECISION_DETAIL'),
  FLAG_DECISION_EXCLUDED: code('flags', 'DECISION_EXCLUDED'),
  DECISION_CONTINUATION_SHIFT: code('flags', 'DECISION_CONTINUATION_SHIFT'),
  // Action codes a report returns.
  ACTION_SUCCEEDED: VOCAB.action.indexOf('succeeded'),
  ACTION_RETRY: VOCAB.action.indexOf('retry'),
  ACTION_FALLBACK: VOCAB.action.indexOf('fallback'),
  ACTION_STOP: VOCAB.action.indexOf('stop'),
  ACTION_RECONCILE: VOCAB.action.indexOf('reconcile'),
  ACTION_WAIT: VOCAB.action.indexOf('wait'),
})

/** The public copy (`require('retrywise').vocabulary`). */
const vocabulary = {
  errorClass: VOCAB.errorClass.slice(),
  phase: VOCAB.phase.slice(),
  errorKind: VOCAB.errorKind.slice(),
  idempotency: VOCAB.idempotency.slice(),
  effect: VOCAB.effect.slice(),
  action: VOCAB.action.slice(),
  waitSource: VOCAB.waitSource.slice(),
  reason: VOCAB.reason.slice(),
  continuation: VOCAB.continuation.slice(),
}

module.exports = {
  VOCAB,
  SLOT,
  toCode,
  ACTION: VOCAB.action,
  REASON: VOCAB.reason,
  ERROR_CLASS: VOCAB.errorClass,
  WAIT_SOURCE: VOCAB.waitSource,
  ON_FAILURE: VOCAB.onFailure,
  CONTINUATION: VOCAB.continuation,
  API_FAMILY: VOCAB.apiFamily,
  version: VOCAB.version,
  vocabulary,
}

'use strict'
// retrywise for Node: the idiomatic JS layer over the lean native API
// (native.js). Every decision is made by the Rust core; the modules in lib/
// translate values to the core's codes and back and add the Node idioms
// (sleeping, AbortSignals, async-context nesting, a fetch wrapper).
// This file only re-exports them; lib/ mirrors the Python package:
//
//   vocab        the core's names and codes, the scratch layout (read once)
//   errors       RetrywiseError, PolicyError, StoppedError, AttemptError, ...
//   engine       Engine (begin, run, events, stats, reload, ...)
//   call         Call, Attempt and decisions
//   outcomes     thrown errors, headers and bodies -> outcomes
//   context      the attempt the current async context runs in (nesting)
//   timers       sleeping, racing, per-attempt timers
//   run          engine.run's loop
//   request      readRequest, RequestFacts: what a request needs, read once
//   fetch        wrapFetch
//   stream       StreamGate, Transcript and the wrapped response body
//   idempotency  paramsDigest, deriveIdempotencyKey
//   fleet        Fleet (engine.fleet) and RedisFleet: state shared through Redis

const { version, vocabulary } = require('./lib/vocab.js')
const { RetrywiseError, PolicyError, StoppedError, AttemptError, AttemptTimeoutError } = require('./lib/errors.js')
const { Engine, policySchema } = require('./lib/engine.js')
const { Call, Attempt, decisionOf } = require('./lib/call.js')
const { currentAttempt } = require('./lib/context.js')
const { vendorCodeFromBody, jsonMediaType } = require('./lib/outcomes.js')
const { wrapFetch } = require('./lib/fetch.js')
const { readRequest, RequestFacts } = require('./lib/request.js')
const { StreamGate, Transcript } = require('./lib/stream.js')
const { paramsDigest, deriveIdempotencyKey } = require('./lib/idempotency.js')
const { Fleet, RedisFleet, fleetScripts } = require('./lib/fleet.js')

// Checked against index.d.ts (tsc -p lib): every export, with its type.
/** @type {typeof import('./index')} */
const api = {
  Engine,
  Call,
  Attempt,
  RetrywiseError,
  PolicyError,
  StoppedError,
  AttemptError,
  AttemptTimeoutError,
  wrapFetch,
  readRequest,
  RequestFacts,
  decisionOf,
  currentAttempt,
  paramsDigest,
  deriveIdempotencyKey,
  vendorCodeFromBody,
  policySchema,
  jsonMediaType,
  StreamGate,
  Transcript,
  Fleet,
  RedisFleet,
  fleetScripts,
  version,
  vocabulary,
}

module.exports = api

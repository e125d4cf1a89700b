'use strict'
// Streamed response bodies: the core's StreamGate (holds an event stream's
// preamble until its first meaningful event) and the body a wrapped fetch
// hands on, which reports the attempt's outcome when it ends or fails and
// splices a retry in while nothing was delivered yet.

const native = require('../native.js')
const { describe, AttemptTimeoutError } = require('./errors.js')
const { decisionOf, stoppedFromDecision } = require('./call.js')
const { errorOutcome, timerKind, httpStatus } = require('./outcomes.js')
const { abortReason } = require('./timers.js')

/**
 * @typedef {import('./fetch.js').FetchCall} FetchCall
 * @typedef {import('./fetch.js').BodyParts} BodyParts
 * @typedef {import('../native').StreamGate} NativeGate
 * @typedef {import('../index').StreamGate} ApiStreamGate
 * @typedef {import('../index').Transcript} ApiTranscript
 */

/**
 * Holds a streamed body's preamble (a role-only delta, `message_start`, pings)
 * until its first meaningful event, so a cut before it is `stream_open` and may
 * be retried (the core's StreamGate; wrapFetch runs every attempt's body through one).
 * @implements {ApiStreamGate}
 */
class StreamGate {
  /** @param {string | null} [contentType] */
  constructor(contentType) {
    if (contentType !== undefined && contentType !== null && typeof contentType !== 'string') throw new TypeError(`contentType must be a string; got ${describe(contentType)}`)
    this._g = new native.StreamGate(contentType)
  }

  /**
   * Bytes received in; what the consumer may see now out (empty while holding).
   * @param {Uint8Array} chunk
   * @returns {Uint8Array}
   */
  feed(chunk) {
    if (!(chunk instanceof Uint8Array)) throw new TypeError(`chunk must be a Uint8Array; got ${describe(chunk)}`)
    return this._g.feed(chunk)
  }

  /**
   * The body ended: everything still held.
   * @returns {Uint8Array}
   */
  finish() {
    return this._g.finish()
  }

  /** @type {boolean} */
  get visible() {
    return this._g.visible
  }

  /**
   * Whether feeding may still hold bytes back (an event stream before its first meaningful event).
   * @type {boolean}
   */
  get mayHold() {
    return this._g.mayHold
  }

  /** @type {'stream_open' | 'stream_visible'} */
  get phase() {
    return /** @type {'stream_open' | 'stream_visible'} */ (this._g.phase)
  }

  /** @type {number} */
  get held() {
    return this._g.held
  }

  /** @type {number} */
  get skipped() {
    return this._g.skipped
  }

  /** @type {boolean} */
  get watching() {
    return this._g.watching
  }

  /** @type {import('../index').StreamError | null} */
  get streamError() {
    const e = this._g.streamError
    return e === null ? null : JSON.parse(e)
  }

  /**
   * What the attempt whose body ended (or broke) now with HTTP `status` reports.
   * @param {number} status
   * @returns {import('../index').Outcome}
   */
  outcome(status) {
    return outcomeFromJson(this._g.outcome(status))
  }

  /**
   * What the attempt whose body ended cleanly now with HTTP `status` reports,
   * `transcript` being what the caller received: as `outcome(status)`, except
   * that output shown without its finish was cut (`connection_reset` in the
   * gate's phase; `resumable` when only text was shown). For callers that
   * relay a stream themselves: `call.report(gate.endOutcome(status, transcript))`.
   * @param {number} status
   * @param {Transcript} transcript
   * @returns {import('../index').Outcome}
   */
  endOutcome(status, transcript) {
    httpStatus(status, 'status')
    if (!(transcript instanceof Transcript)) throw new TypeError(`transcript must be a Transcript; got ${describe(transcript)}`)
    return outcomeFromJson(this._g.endOutcome(status, transcript._t))
  }

  /**
   * A gate around a native one (`engine.streamGate`).
   * @param {NativeGate} g
   * @returns {StreamGate}
   */
  static _of(g) {
    const out = /** @type {StreamGate} */ (Object.create(StreamGate.prototype))
    out._g = g
    return out
  }
}

/** The API families a Transcript reads. */
const APIS = ['openai', 'anthropic', 'azure_openai']

/**
 * What a streamed answer delivered to the caller so far (the core's
 * Transcript): feed it exactly the bytes the caller received, in any
 * chunking. `StreamGate.endOutcome` asks it whether an answer that ended
 * was cut.
 * @implements {ApiTranscript}
 */
class Transcript {
  /** @param {'openai' | 'anthropic' | 'azure_openai'} api the stream's API family */
  constructor(api) {
    if (typeof api !== 'string' || !APIS.includes(api)) throw new TypeError(`api must be one of ${APIS.join(', ')}; got ${describe(api)}`)
    /** @type {import('../native').Transcript} */
    this._t = new native.Transcript(api)
  }

  /**
   * Reads bytes the caller received.
   * @param {Uint8Array} delivered
   */
  observe(delivered) {
    if (!(delivered instanceof Uint8Array)) throw new TypeError(`delivered must be a Uint8Array; got ${describe(delivered)}`)
    this._t.observe(delivered)
  }

  /** @type {'openai' | 'anthropic' | 'azure_openai'} */
  get api() {
    return /** @type {'openai' | 'anthropic' | 'azure_openai'} */ (this._t.api)
  }

  /**
   * The visible text so far (reasoning is not part of it).
   * @type {string}
   */
  get text() {
    return this._t.text
  }

  /**
   * Another upstream can continue it: only text was shown, and it did not finish.
   * @type {boolean}
   */
  get resumable() {
    return this._t.resumable
  }

  /**
   * The answer's finish arrived (a finish reason, `message_stop`, `response.completed`).
   * @type {boolean}
   */
  get finished() {
    return this._t.finished
  }

  /**
   * The usage the stream reported, or null.
   * @type {{ inputTokens: number | null, outputTokens: number | null } | null}
   */
  get usage() {
    const u = this._t.usage
    return u === null || u === undefined ? null : { inputTokens: u.inputTokens ?? null, outputTokens: u.outputTokens ?? null }
  }

  /**
   * The model the stream named last, or null.
   * @type {string | null}
   */
  get model() {
    return this._t.model ?? null
  }
}

/**
 * An outcome as the native gate writes it (JSON, absent fields null), with null fields left out.
 * @param {string} json
 * @returns {import('../index').Outcome}
 */
function outcomeFromJson(json) {
  const o = JSON.parse(json)
  /** @type {import('../index').Outcome} */
  const out = { status: o.status }
  if (o.error !== null) out.error = o.error
  if (o.phase !== null) out.phase = o.phase
  if (o.vendorCode !== null) out.vendorCode = o.vendorCode
  if (o.resumable) out.resumable = true
  return out
}

/** Anthropic's `message_stop` event in the bytes of a stream. */
const MESSAGE_STOP = /\nevent: ?message_stop\r?\n|"type": ?"message_stop"/

/**
 * Anthropic's `message_stop` event, after a stream whose last bytes were
 * `tail`: starting on a fresh line, after a blank one.
 * @param {string} tail
 * @returns {Uint8Array}
 */
function messageStop(tail) {
  const sep = tail.endsWith('\n\n') || tail.endsWith('\r\n\r\n') ? '' : tail.endsWith('\n') ? '\n' : '\n\n'
  return Buffer.from(`${sep}event: message_stop\ndata: {"type":"message_stop"}\n\n`)
}

/**
 * The success response of `self` with its body wrapped: the idle timer runs
 * between chunks, the end of the body reports success (or a cut, when the
 * caller was shown output and never its finish), and a failure reports
 * phase `stream_open` (nothing delivered yet: the core may retry, and the next
 * attempt's body is spliced in) or `stream_visible` (bytes were delivered:
 * never replayed). Each attempt's event stream passes through the core's
 * StreamGate, which holds its preamble (a role-only delta, `message_start`)
 * back until the first meaningful event, so a cut after the preamble still
 * delivered nothing. A success reports its time to first token
 * (`firstTokenMs`: from sending the attempt that answered to the first bytes
 * its gate released to the caller).
 * @param {FetchCall} self
 * @param {BodyParts} first
 * @returns {Response}
 */
function wrapBody(self, first) {
  const engine = self.engine
  const res = first.res
  let cur = first
  let delivered = 0
  // What the caller was delivered, so a stream broken after output can be
  // continued elsewhere: read in the family the request's facts named.
  self.api = self.req.family
  const transcript = new native.Transcript(self.api)
  self.transcript = transcript
  // An Anthropic stream: whether its `message_stop` event reached the caller
  // (the last bytes delivered are kept to find it across chunk boundaries).
  const anthropic = self.api === 'anthropic'
  let stopped = false
  let tail = ''
  /**
   * @param {ReadableStreamDefaultController<Uint8Array>} controller
   * @param {Uint8Array} v
   * @param {boolean} [observed]
   */
  const deliver = (controller, v, observed = false) => {
    if (firstToken !== null) {
      clearTimeout(firstToken)
      firstToken = null
    }
    delivered += v.byteLength
    // The attempt's first visible output: its time to first token, reported with its success.
    if (cur.firstAt === null) cur.firstAt = performance.now()
    // `relay` observed it already (the gate's step, one crossing).
    if (!observed) transcript.observe(v)
    if (anthropic && !stopped) {
      // Its event line, or its data's type (inside a JSON string a newline or a quote is escaped).
      const seen = tail + Buffer.from(v.buffer, v.byteOffset, v.byteLength).toString('latin1')
      stopped = MESSAGE_STOP.test(seen)
      tail = seen.slice(-40)
    }
    controller.enqueue(v)
  }
  let finished = false
  // Request sent -> first visible output (pings and the preamble do not count): a
  // stream that opens and then says nothing is left like a silent upstream.
  /** @type {NodeJS.Timeout | null} */
  let firstToken = null
  const stopTimers = () => {
    if (firstToken) clearTimeout(firstToken)
    firstToken = null
    cur.ctl.done()
  }
  const finish = () => {
    finished = true
    stopTimers()
    self.call._release()
  }
  let pulling = false
  /** @type {ReadableStreamDefaultController<Uint8Array> | null} */
  let ctrl = null
  // The attempt's timer (or the caller's signal) may fire while nobody reads the
  // body: report it then, so an unread body cannot keep the call open. While a
  // read is in progress, it is cancelled (its reader's pending read ends at once)
  // and the read reports the abort.
  /** @param {BodyParts} parts */
  const watch = (parts) => {
    parts.ctl.unref()
    if (delivered === 0) {
      const ms = parts.attempt.timeouts.firstTokenMs
      // It ends the attempt only while the caller waits for output: a body
      // nobody reads is bounded by the attempt's total timer.
      firstToken = setTimeout(
        () => {
          firstToken = null
          if (pulling && cur === parts) parts.ctl.abort(new AttemptTimeoutError(timerKind(parts.attempt, 'first_token', true), ms))
        },
        Math.max(0, ms - (performance.now() - parts.sentAt)),
      )
      firstToken.unref()
    }
    parts.ctl.onAbort = (reason) => {
      if (finished || cur !== parts) return
      if (pulling) {
        parts.reader.cancel(reason).catch(() => {})
        return
      }
      {
        stopTimers()
        parts.reader.cancel(reason).catch(() => {})
        const sig = self.req.signal
        let e
        if (sig && sig.aborted) {
          engine._n.cancel(self.call._h)
          engine._flush()
          e = abortReason(sig)
        } else {
          const phase = delivered > 0 ? 'stream_visible' : 'stream_open'
          const d = self._report({ status: parts.res.status, ...errorOutcome(reason, parts.ctl.ac.signal, phase), phase })
          e = stoppedFromDecision(self.call, d, reason)
        }
        finish()
        if (ctrl) ctrl.error(e)
      }
    }
  }
  watch(first)
  const stream = new ReadableStream(
    {
      start(controller) {
        ctrl = controller
      },
      pull(controller) {
        return pullOnce(controller)
      },
      cancel(reason) {
        if (finished) return
        stopTimers()
        cur.reader.cancel(reason).catch(() => {})
        engine._n.cancel(self.call._h)
        engine._flush()
        finish()
      },
    },
    { highWaterMark: 0 },
  )
  /**
   * The attempt in `cur` failed (`err` thrown by its read, or an error event
   * its gate read: `outcome` given): report it; with nothing delivered and a
   * retry or fallback decided, the next attempt's body takes its place (true);
   * after output, a fallback that continues it takes over the stream (true);
   * otherwise the caller's stream ends with the stop (false).
   * @param {ReadableStreamDefaultController<Uint8Array>} controller
   * @param {unknown} err
   * @param {import('../index').Outcome | null} outcome
   * @returns {Promise<boolean>}
   */
  async function failed(controller, err, outcome) {
    stopTimers()
    cur.reader.cancel(err).catch(() => {})
    const sig = self.req.signal
    if (sig && sig.aborted) {
      engine._n.cancel(self.call._h)
      engine._flush()
      finish()
      controller.error(abortReason(sig))
      return false
    }
    const phase = delivered > 0 ? 'stream_visible' : 'stream_open'
    // After output, whether what was delivered can be continued by another upstream.
    const d = self._report(outcome !== null ? outcome : { status: cur.res.status, ...errorOutcome(err, cur.ctl.ac.signal, phase), phase, resumable: delivered > 0 && transcript.resumable })
    const again = delivered === 0 ? d.action === 'retry' || d.action === 'fallback' : d.action === 'fallback' && d.continuation !== null
    if (again) {
      try {
        await self._sleep(d.delayMs)
        self.lastErr = err
        const next = await self.next(true)
        if (!next.parts) {
          // The retry ended in an error response or a stop: surface it on the stream.
          const e3 = stoppedFromDecision(self.call, decisionOf(next.response) || d, err, next.response)
          finish()
          controller.error(e3)
          return false
        }
        cur = next.parts
        // A continuation's stream is turned into the rest of the caller's.
        if (delivered > 0) cur.splicer = new native.Splicer(/** @type {string} */ (self.api), transcript)
        watch(cur)
        return true
      } catch (e2) {
        finish()
        controller.error(e2)
        return false
      }
    }
    const stopped = stoppedFromDecision(self.call, d, err)
    finish()
    controller.error(stopped)
    return false
  }

  /**
   * A provider's error event after output says whether what was delivered can
   * be continued elsewhere (the core decides whether the route does); a
   * malformed event the policy ends the stream on is a stop of its own.
   * @param {import('../index').Outcome} outcome
   * @returns {import('../index').Outcome}
   */
  const resumable = (outcome) => {
    if (outcome.error === undefined && delivered > 0) outcome.resumable = transcript.resumable
    return outcome
  }

  /**
   * An error event ended the stream after output: what came before it was
   * delivered by the last pull, and this one ends the caller's stream.
   * @type {{ err: Error, outcome: import('../index').Outcome } | null}
   */
  let pendingFail = null

  /** @param {ReadableStreamDefaultController<Uint8Array>} controller */
  async function pullOnce(controller) {
    // One async step per chunk: a pull in progress (an abort cancels its read).
    pulling = true
    try {
      if (finished) return
      if (pendingFail !== null) {
        const p = pendingFail
        pendingFail = null
        // A fallback that continues the answer takes over: read on from it.
        if (!(await failed(controller, p.err, resumable(p.outcome)))) return
      }
      for (;;) {
        const ctl = cur.ctl
        ctl.touch()
        let chunk
        try {
          chunk = await cur.reader.read()
          if (ctl.aborted) throw ctl.reason
        } catch (err) {
          if (await failed(controller, ctl.aborted ? ctl.reason : err, null)) continue
          return
        }
        if (chunk.done) {
          stopTimers()
          const g = cur.gate
          cur.gate = null
          if (g !== null) {
            // A stream of preamble only, or a last event without its blank line.
            let rest = g.finish()
            if (cur.splicer !== null && rest.byteLength > 0) rest = cur.splicer.feed(rest)
            if (rest.byteLength > 0) deliver(controller, rest)
          }
          if (cur.splicer !== null) {
            const tail = cur.splicer.finish()
            if (tail.byteLength > 0) deliver(controller, tail)
          }
          // Whether the answer the caller received was whole is the core's call
          // (output shown without its finish was cut, however the body ended).
          /** @type {import('../index').Outcome} */
          const outcome = g !== null ? outcomeFromJson(g.endOutcome(cur.res.status, transcript)) : { status: cur.res.status }
          if (outcome.error !== undefined) {
            if (await failed(controller, new Error(`stream ended without its finish (${outcome.error})`), outcome)) continue
            return
          }
          // Sending this attempt -> the first bytes the gate released to the caller.
          if (cur.firstAt !== null) outcome.firstTokenMs = cur.firstAt - cur.sentAt
          // The answer is whole (its stop_reason came) but its stream never said
          // `message_stop`, after which alone the anthropic SDK completes a
          // message (`finalMessage()`): the caller gets the event it left out.
          if (anthropic && !stopped && transcript.finished) deliver(controller, messageStop(tail))
          self._report(outcome)
          finish()
          controller.close()
          return
        }
        let v = chunk.value
        const g = cur.gate
        // Observed by the transcript with the gate's step (no splice rewrites it).
        let observed = false
        if (v && v.byteLength > 0 && g !== null) {
          const fed = v
          if (cur.splicer === null) {
            v = g.relay(fed, transcript)
            observed = true
          } else v = g.feed(fed)
          // A chunk the gate passed on as it came held no error event: an event
          // stream's gate then still watches.
          if ((v !== fed || !cur.events) && !g.watching) {
            cur.gate = null
            // An error event (the provider's, or a malformed event the policy ends the stream on).
            if (g.streamError !== null) {
              // The gate ends at the event (`endAtError`): `v` is what came before it,
              // which the caller gets first; the event itself never reaches the SDK.
              const outcome = outcomeFromJson(g.outcome(cur.res.status))
              const err = new Error(`stream error event: ${outcome.vendorCode ?? 'error'}`)
              if (v.byteLength > 0 && cur.splicer !== null) v = cur.splicer.feed(v)
              // Enqueue only with bytes to deliver: a pull that enqueues nothing is not called again.
              if (v.byteLength > 0) {
                deliver(controller, v, observed)
                pendingFail = { err, outcome }
                return
              }
              if (await failed(controller, err, resumable(outcome))) continue
              return
            }
          }
        }
        if (v && v.byteLength > 0 && cur.splicer !== null) v = cur.splicer.feed(v)
        if (v && v.byteLength > 0) {
          deliver(controller, v, observed)
          return
        }
      }
    } finally {
      pulling = false
    }
  }
  const out = new Response(stream, { status: res.status, statusText: res.statusText, headers: res.headers })
  if (res.url) Object.defineProperty(out, 'url', { value: res.url })
  return out
}

module.exports = { StreamGate, Transcript, wrapBody }

'use strict'
// The scratch buffer the native engine shares with the JS layer: its layout
// comes from the addon (vocab().scratch); a buffer JS detached (transferred)
// gives a clear error instead of being read or written through a stale
// pointer; the JS layer's own buffer, a SharedArrayBuffer, cannot be detached.
const test = require('node:test')
const assert = require('node:assert/strict')
const native = require('../native.js')
const { Engine } = require('..')

const layout = JSON.parse(native.vocab()).scratch

/** Every way this Node has to detach an ArrayBuffer: returns the buffer that now owns the memory. */
const detachers = [['structuredClone transfer', (buf) => structuredClone(buf, { transfer: [buf] })]]
if (typeof ArrayBuffer.prototype.transfer === 'function') detachers.push(['ArrayBuffer.prototype.transfer', (buf) => buf.transfer()])

test('vocab().scratch: every slot inside the buffer, distinct within its group, inputs above outputs', () => {
  assert.equal(layout.len, 40)
  const inputs = ['begin', 'next', 'report', 'release']
  const outputs = ['attempt', 'stopped', 'decision', 'hedge_after', 'hedge_no', 'request', 'step', 'finished']
  assert.deepEqual(Object.keys(layout.slots).sort(), [...inputs, ...outputs].sort())
  let maxOut = -1
  let minIn = Infinity
  for (const [group, slots] of Object.entries(layout.slots)) {
    const idx = Object.values(slots)
    assert.equal(new Set(idx).size, idx.length, `${group}: two slots alike`)
    for (const i of idx) {
      assert.ok(Number.isInteger(i) && i >= 0 && i < layout.len, `${group}: slot ${i}`)
      if (inputs.includes(group)) minIn = Math.min(minIn, i)
      else maxOut = Math.max(maxOut, i)
    }
  }
  assert.ok(maxOut < minIn, `outputs end at ${maxOut}, inputs start at ${minIn}`)
  // A finishing report writes the decision, the step's results and the finished call's fields at once.
  const written = [...Object.values(layout.slots.decision), ...Object.values(layout.slots.step)]
  for (const i of Object.values(layout.slots.finished)) assert.ok(!written.includes(i), `finished slot ${i} is also a decision or step slot`)
  assert.deepEqual(layout.results, { ATTEMPT: 0, STOPPED: 1, HEDGE_START: 0, HEDGE_AFTER: 2, HEDGE_NO: 3 })
})

test('the fast entry points read and write the slots vocab() names', () => {
  const s = new Float64Array(layout.len)
  const n = new native.NativeEngine(s, 1, JSON.stringify({ max_attempts: 2 }), '1', false)
  const f = n.fast()
  const { begin, next, report, step, attempt, decision } = layout.slots
  assert.equal(s[step.PENDING_RELEASE], -1, 'the constructor clears the pending release')
  s[begin.ROUTE] = n.intern('openai/gpt-4o')
  s[begin.DEADLINE_MS] = 10_000
  s[begin.IDEMPOTENCY] = 0
  s[begin.TENANT] = -1
  f.begin()
  const h = s[step.HANDLE]
  s[next.HANDLE] = h
  s[next.STAMP] = 0
  f.next()
  assert.equal(s[step.RESULT], layout.results.ATTEMPT)
  assert.equal(s[attempt.NUMBER], 1)
  assert.equal(n.upstreamName(s[attempt.UPSTREAM]), 'openai/gpt-4o')
  s[report.HANDLE] = h
  s[report.STATUS] = 503
  s[report.RELEASE] = 0
  f.reportStatus()
  assert.equal(s[step.RESULT], s[decision.ACTION])
  assert.equal(JSON.parse(native.vocab()).action[s[decision.ACTION]], 'retry')
  assert.equal(s[decision.ATTEMPT], 1)
  assert.equal(s[step.IDLE], 1, 'a retry decision leaves nothing in flight')
})

test('readNextRequest: the family code in request.FAMILY, the model returned, the needs taken by the next begin with begin.REQUEST 1 (once)', () => {
  const s = new Float64Array(layout.len)
  const policy = { upstreams: { mini: { capabilities: ['streaming'] }, big: {} }, routes: { chat: { candidates: ['mini', 'big'] } } }
  const n = new native.NativeEngine(s, 1, JSON.stringify(policy), '1', false)
  const f = n.fast()
  const { begin, next, step, attempt, request } = layout.slots
  const tools = Buffer.from('{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[]}')
  assert.equal(n.readNextRequest('http://h/v1/messages', 'content-type', tools), 'm')
  assert.equal(JSON.parse(native.vocab()).apiFamily[s[request.FAMILY]], 'anthropic')
  assert.equal(n.readNextRequest('http://h/v1/chat/completions', 'x-api-key\ncontent-type', null), null)
  assert.equal(JSON.parse(native.vocab()).apiFamily[s[request.FAMILY]], 'anthropic', 'by its headers')
  const first = (withRequest) => {
    s[begin.ROUTE] = n.intern('chat')
    s[begin.DEADLINE_MS] = -1
    s[begin.IDEMPOTENCY] = 0
    s[begin.TENANT] = -1
    s[begin.REQUEST] = withRequest ? 1 : 0
    f.begin()
    s[next.HANDLE] = s[step.HANDLE]
    s[next.STAMP] = 0
    f.next()
    return n.upstreamName(s[attempt.UPSTREAM])
  }
  n.readNextRequest('http://h/v1/chat/completions', null, tools)
  assert.equal(first(false), 'mini', 'a begin that does not ask leaves the needs')
  assert.equal(first(true), 'big', 'tools skip mini')
  assert.equal(first(true), 'mini', 'taken by one begin only')
})

for (const [how, detach] of detachers) {
  test(`a detached scratch buffer (${how}) fails every step with ERR_RETRYWISE_SCRATCH_DETACHED and is never written`, () => {
    const s = new Float64Array(layout.len)
    const n = new native.NativeEngine(s, 0, null, '1', false)
    const f = n.fast()
    const route = n.intern('openai/gpt-4o')
    const h = n.begin('openai/gpt-4o', 10_000, 0, null)
    s.fill(7)
    s[layout.slots.begin.ROUTE] = route
    s[layout.slots.begin.DEADLINE_MS] = 10_000
    s[layout.slots.begin.IDEMPOTENCY] = 0
    s[layout.slots.begin.TENANT] = -1
    const before = Array.from(s)
    const moved = new Float64Array(detach(s.buffer))
    assert.equal(s.length, 0, 'the engine\'s view is detached')
    assert.deepEqual(Array.from(moved), before, 'the memory moved with the new owner')
    const detached = { code: 'ERR_RETRYWISE_SCRATCH_DETACHED', message: /detached/ }
    for (const name of ['begin', 'beginAttempt', 'next', 'reportStatus', 'reportOk', 'release']) {
      assert.throws(() => f[name](), detached, `fast ${name}()`)
    }
    assert.throws(() => n.begin('openai/gpt-4o', 10_000, 0, null), detached)
    assert.throws(() => n.beginEx('openai/gpt-4o', 10_000, 0, '{}', -1, 0, true), detached)
    assert.throws(() => n.nextAttempt(h), detached)
    assert.throws(() => n.reportStatus(h, 200), detached)
    assert.throws(() => n.reportOk(h), detached)
    assert.throws(() => n.report(h, 200, -1, -1, -1, null, null, -1, null, 0, false), detached)
    assert.throws(() => n.cancel(h), detached)
    assert.throws(() => n.nextHedge(h), detached)
    assert.deepEqual(Array.from(moved), before, 'no step wrote into the memory the engine no longer owns')
    // What needs no scratch still works, and the call can be given back.
    assert.equal(typeof JSON.parse(n.stats()).logical_requests, 'number')
    assert.equal(n.liveCalls(), 1)
    n.release(h)
    assert.equal(n.liveCalls(), 0)
  })
}

test('Engine: its scratch buffer cannot be transferred away, and the engine keeps deciding', async () => {
  const e = new Engine(undefined, { seed: 1 })
  assert.ok(e._s.buffer instanceof SharedArrayBuffer)
  // Node 20 throws a TypeError, Node 22 and later a DataCloneError: either way it stays.
  assert.throws(
    () => structuredClone(e._s.buffer, { transfer: [e._s.buffer] }),
    (err) => err instanceof TypeError || (err instanceof DOMException && err.name === 'DataCloneError'),
  )
  if (typeof ArrayBuffer.prototype.transfer === 'function') assert.equal(typeof e._s.buffer.transfer, 'undefined')
  assert.equal(e._s.length, layout.len)
  assert.equal(await e.run(() => 'ok', { route: 'openai/gpt-4o' }), 'ok')
  const c = e.begin({ route: 'openai/gpt-4o' })
  assert.equal(c.nextAttempt().number, 1)
  assert.equal(c.report({ status: 503 }).action, 'retry')
  c.release()
})

test('NativeEngine over a SharedArrayBuffer (growable too) works without a detach check', () => {
  for (const sab of [new SharedArrayBuffer(8 * layout.len), new SharedArrayBuffer(8 * layout.len, { maxByteLength: 16 * layout.len })]) {
    const s = new Float64Array(sab)
    const n = new native.NativeEngine(s, 0, null, '1', false)
    const f = n.fast()
    s[layout.slots.begin.ROUTE] = n.intern('openai/gpt-4o')
    s[layout.slots.begin.DEADLINE_MS] = 10_000
    s[layout.slots.begin.IDEMPOTENCY] = 0
    s[layout.slots.begin.TENANT] = -1
    f.beginAttempt()
    assert.equal(s[layout.slots.step.RESULT], layout.results.ATTEMPT)
    assert.equal(s[layout.slots.attempt.NUMBER], 1)
    if (sab.growable) {
      sab.grow(16 * layout.len)
      s[layout.slots.report.HANDLE] = s[layout.slots.step.HANDLE]
      s[layout.slots.report.STATUS] = 200
      s[layout.slots.report.RELEASE] = 1
      f.reportStatus()
      assert.equal(s[layout.slots.step.RESULT], 0)
      assert.equal(s[layout.slots.step.HANDLE], 1, 'released with the success')
    }
  }
})

test('NativeEngine refuses a scratch buffer it could not keep using', () => {
  const bad = { code: 'ERR_INVALID_ARG_TYPE', name: 'TypeError', message: new RegExp(`scratch must be a Float64Array of at least ${layout.len} elements over a SharedArrayBuffer or a fixed-length ArrayBuffer`) }
  const make = (s) => new native.NativeEngine(s, 0, null, null, false)
  assert.throws(() => make(new Float64Array(layout.len - 1)), bad, 'too short')
  assert.throws(() => make(new Float32Array(layout.len)), bad, 'another element type')
  assert.throws(() => make([]), bad, 'not a typed array')
  assert.throws(() => make(new Float64Array(new ArrayBuffer(8 * layout.len, { maxByteLength: 16 * layout.len }))), bad, 'resizable: could shrink under the engine')
  const s = new Float64Array(layout.len)
  structuredClone(s.buffer, { transfer: [s.buffer] })
  assert.throws(() => make(s), bad, 'already detached')
  // A view at an offset into a larger buffer is fine.
  const big = new ArrayBuffer(8 * (layout.len + 4))
  assert.doesNotThrow(() => make(new Float64Array(big, 16, layout.len)))
})

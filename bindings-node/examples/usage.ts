// A typed usage example; `npm run typecheck` checks it with tsc --noEmit.
import { OpenAI } from 'openai'
import Redis from 'ioredis'
import {
  Engine,
  StoppedError,
  PolicyError,
  wrapFetch,
  decisionOf,
  paramsDigest,
  deriveIdempotencyKey,
  StreamGate,
  Transcript,
  RedisFleet,
  readRequest,
  RequestFacts,
  type Attempt,
  type FleetStats,
  type FirstTokenStats,
  type Decision,
  type Outcome,
  type RetrywiseEvent,
  type Needs,
  type ApiFamily,
  type Endpoint,
} from 'retrywise'

const engine = new Engine({ max_attempts: 3, deadline_ms: 20_000 }, { seed: 1n })
const fromYaml = new Engine('max_attempts: 2\n')
void fromYaml

// The idiomatic loop: engine.run owns retries, waits and the deadline.
async function withRun(): Promise<string> {
  const ac = new AbortController()
  return engine.run(
    async (attempt: Attempt) => {
      const res = await fetch('http://127.0.0.1:1/v1/chat/completions', {
        method: 'POST',
        headers: attempt.headers,
        signal: attempt.signal,
      })
      if (!res.ok) throw Object.assign(new Error(`HTTP ${res.status}`), { status: res.status, headers: res.headers })
      return res.text()
    },
    { route: 'openai/gpt-4o-mini', deadlineMs: 10_000, signal: ac.signal },
  )
}

// The explicit decision loop.
function explicitLoop(): Decision {
  const call = engine.begin({ route: 'openai/gpt-4o-mini', deadlineMs: 5_000, idempotency: 'keyed', idempotencyKey: deriveIdempotencyKey('acme', 'chat', paramsDigest({ a: 1 })) })
  try {
    for (;;) {
      const a = call.nextAttempt()
      const outcome: Outcome = a.number === 1 ? { status: 503, headers: { 'retry-after': '1' } } : { status: 200 }
      const d = call.report(outcome)
      if (d.action === 'succeeded' || d.action === 'stop' || d.action === 'reconcile') return d
    }
  } catch (e) {
    if (e instanceof StoppedError) console.log(e.reason, e.errorClass, e.detail)
    throw e
  } finally {
    call.release()
  }
}

// The openai recipe: the SDK's own retries off, retrywise owns them.
const openai = new OpenAI({
  apiKey: 'test',
  baseURL: 'http://127.0.0.1:1/v1',
  maxRetries: 0,
  fetch: wrapFetch(engine, fetch, { route: 'openai/gpt-4o-mini', deadlineMs: 30_000 }),
})

async function chat(): Promise<string | null> {
  const r = await openai.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] })
  return r.choices[0]?.message.content ?? null
}

// A fallback keeps what each request needs: the wrapped fetch reads every
// request's facts (tools, schema, images, size, family) and the caller adds
// its own, for every request (an object or a function of the request) or for
// one (init.retrywise.needs).
const routed = new Engine({
  upstreams: {
    mini: { api: 'openai', model: 'gpt-4o-mini', capabilities: ['streaming'], context_tokens: 16_000 },
    big: { api: 'openai', model: 'gpt-4o', capabilities: ['streaming', 'tool_calling', 'json_schema', 'vision'] },
  },
  routes: { chat: { candidates: ['mini', 'big'] } },
  models: { 'gpt-4o-mini': 'chat' },
})
const needsFor = (req: { model: string | null; facts: RequestFacts }): Needs | null => (req.facts.endpoint === 'responses' ? { capabilities: ['json_schema'] } : null)
const routedClient = new OpenAI({ apiKey: 'test', baseURL: 'http://127.0.0.1:1/v1', maxRetries: 0, fetch: wrapFetch(routed, fetch, { needs: needsFor }) })
const fixedNeeds = wrapFetch(routed, fetch, { needs: { capabilities: ['vision'], maxOutputTokens: 1024 } })

async function chatWithImages(): Promise<string | null> {
  const r = await routedClient.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }] })
  const res = await fixedNeeds('http://127.0.0.1:1/v1/chat/completions', {
    method: 'POST',
    body: JSON.stringify({ model: 'gpt-4o-mini', messages: [] }),
    retrywise: { needs: { capabilities: ['tool_calling'] } },
  })
  void res
  return r.choices[0]?.message.content ?? null
}

// The same facts by hand: readRequest, then begin with them (the spec's needs on top).
function beginForRequest(body: string): Decision {
  const facts: RequestFacts = readRequest('https://api.openai.com/v1/chat/completions', { 'content-type': 'application/json' }, body)
  const family: ApiFamily = facts.family
  const endpoint: Endpoint | null = facts.endpoint
  const needs: Needs = facts.needs
  void [family, endpoint, needs.capabilities, needs.inputTokens, facts.model]
  let call
  try {
    call = routed.begin({ route: 'chat', request: facts, needs: { capabilities: ['x-eu-only'] } })
  } catch (e) {
    // A route the policy does not know: a PolicyError naming the known routes, before any I/O.
    if (e instanceof PolicyError) console.log(e.path, e.message)
    throw e
  }
  call.nextAttempt()
  // A streamed success says when its first visible output came (ms after sending).
  return call.report({ status: 200, firstTokenMs: 420 })
}

const off: () => void = engine.onEvent((ev: RetrywiseEvent) => {
  if (ev.kind === 'decision') console.log(ev.action, ev.reason, ev['error.type'])
})
off()

try {
  engine.reload({ max_attempts: 0 })
} catch (e) {
  if (e instanceof PolicyError) console.log(e.path, e.errors.length)
}

engine.setMode({ retries: false })
const amplification: number = engine.stats().amplification
// Each upstream's learned first-token limit (timeouts.learn): null until min_samples streamed successes.
const learned: Array<[string, number | null]> = Object.entries(engine.stats().first_token).map(([u, ft]: [string, FirstTokenStats]) => [u, ft.limit_ms])
const text: string = engine.prometheus()
const state = engine.breakerState('openai/gpt-4o-mini')
const items = engine.reconcileList().map((i) => i.logical_request_id)
const maybe: Decision | null = decisionOf(new Response(null))

// A caller reading an event stream itself: hold its preamble back so a cut
// before any output can be retried (wrapFetch does this for every attempt).
async function readStream(res: Response, onBytes: (b: Uint8Array) => void): Promise<'stream_open' | 'stream_visible'> {
  const gate = new StreamGate(res.headers.get('content-type'))
  try {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      const out = gate.feed(chunk)
      if (out.byteLength > 0) onBytes(out)
    }
    onBytes(gate.finish())
  } catch {
    // report the failure with this phase
  }
  return gate.phase
}

// The same relay keeping a transcript of what the caller received: the end of
// the body reports a cut when output was shown without its finish.
async function relayStream(res: Response, onBytes: (b: Uint8Array) => void): Promise<Outcome> {
  const gate = engine.streamGate(res.headers.get('content-type'))
  const seen = new Transcript('openai')
  for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
    const out = gate.feed(chunk)
    seen.observe(out)
    onBytes(out)
  }
  const usage: { inputTokens: number | null; outputTokens: number | null } | null = seen.usage
  const model: string | null = seen.model
  void [usage, model, seen.text, seen.resumable, seen.finished, seen.api]
  return gate.endOutcome(res.status, seen)
}
// Breakers shared by a fleet through Redis (the README's one line); an ioredis
// client is what RedisFleet takes.
function shareState(): FleetStats {
  const fleet = new RedisFleet(new Engine().fleet({ quorum: 2 }), new Redis('redis://127.0.0.1:6379', { enableOfflineQueue: false, lazyConnect: true })).start()
  fleet.stop()
  return fleet.fleet.stats()
}
void [withRun, explicitLoop, chat, chatWithImages, beginForRequest, amplification, learned, text, state, items, maybe, readStream, relayStream, shareState]

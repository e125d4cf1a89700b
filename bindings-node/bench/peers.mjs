// What the Node benchmarks measure retrywise against, configured once:
// cockatiel's wrap(retry, circuitBreaker) as its README shows (retry
// handleAll, 3 attempts, exponential backoff; consecutive breaker of 5,
// half-open after 10 s), and the async function every peer call awaits.
import { retry, circuitBreaker, wrap, handleAll, ConsecutiveBreaker, ExponentialBackoff } from 'cockatiel'

export const value = { ok: true }
export const op = async () => value
export const sleep = (ms) => new Promise((ok) => setTimeout(ok, ms))

export const cockatiel = wrap(
  retry(handleAll, { maxAttempts: 3, backoff: new ExponentialBackoff() }),
  circuitBreaker(handleAll, { halfOpenAfter: 10 * 1000, breaker: new ConsecutiveBreaker(5) }),
)

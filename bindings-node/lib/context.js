'use strict'
// Nesting: the retrywise attempt the current async context runs in. A call
// begun inside one inherits its deadline and ids and is a non-owner (the
// core decides what that means; this only carries the attempt along).

const { AsyncLocalStorage } = require('node:async_hooks')

/**
 * The store is the Attempt itself (its call and engine are attempt._call, attempt._call._e).
 * @type {AsyncLocalStorage<import('./call.js').Attempt>}
 */
const als = new AsyncLocalStorage()

/**
 * The innermost retrywise attempt the caller runs inside, or undefined.
 * @returns {import('./call.js').Attempt | undefined}
 */
function currentAttempt() {
  return als.getStore()
}

module.exports = { als, currentAttempt }

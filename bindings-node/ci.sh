#!/usr/bin/env bash
# Node binding CI: install, build from source, build the fault server, type-check
# the typed example and the JS layer (index.js, lib/) against index.d.ts, run the
# node:test suite (API, errors, nesting, panic hook, scratch buffer, fetch
# wrapper, openai and anthropic SDKs end to end) and install the package into
# a scratch project.
# Needs node >= 20, npm and cargo. Exits non-zero on any failure.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$here"

major="$(node -p 'process.versions.node.split(".")[0]')"
if [ "$major" -lt 20 ]; then
  echo "ci.sh: node >= 20 required, found $(node --version)" >&2
  exit 1
fi

echo "== npm ci"
npm ci --no-audit --no-fund

# The tests need the same code, not the shipped build's fat LTO: with the
# plain release profile the crate builds in about half the time.
# scripts/package builds the shipped addon (release-node, no test hooks).
echo "== build (napi build --profile release; test hooks on for the panic test)"
npm run build:test

echo "== fault server (cargo build -p retrywise-fault-server)"
(cd "$root" && cargo build -p retrywise-fault-server)
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
export RETRYWISE_FAULT_SERVER="$target/debug/retrywise-fault-server"
test -x "$RETRYWISE_FAULT_SERVER"

echo "== tsc --noEmit (examples/usage.ts)"
npm run typecheck

echo "== tsc --checkJs (index.js and lib/ against index.d.ts and native.d.ts)"
npm run typecheck:js

echo "== node --test"
# node --test exits 0 when it finds no test at all: count them and fail on none.
log="$(mktemp)"
set +e
# Two test files at a time: the flap and rate-limit end-to-end files sleep through
# real outages and windows (about 110 s of the suite), the rest runs beside them.
node --test --test-concurrency=2 __test__/ 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
tests="$(sed -n 's/^# tests \([0-9][0-9]*\)$/\1/p' "$log" | tail -n 1)"
rm -f "$log"
if [ "$status" != 0 ]; then
  exit "$status"
fi
if [ -z "$tests" ] || [ "$tests" = 0 ]; then
  echo "ci.sh: node --test ran no test: treated as a failure" >&2
  exit 1
fi

echo "== node --test nesting.test.js with RETRYWISE_NESTING=async-local-storage (the other nesting carrier)"
RETRYWISE_NESTING=async-local-storage node --test __test__/nesting.test.js

echo "== npm install ./bindings-node from another project"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
(
  cd "$scratch"
  npm init -y >/dev/null
  npm install --no-audit --no-fund "$here" >/dev/null
  node -e "
    const rw = require('retrywise');
    const e = new rw.Engine({ max_attempts: 2 });
    const c = e.begin({ route: 'x' });
    c.nextAttempt();
    if (c.report({ status: 200 }).action !== 'succeeded') process.exit(1);
    console.log('installed retrywise', rw.version, 'works');
  "
)
echo "ci.sh: all Node binding checks passed"

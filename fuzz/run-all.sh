#!/usr/bin/env bash
# Runs every retrywise fuzz target for SECONDS each (default 60), one after
# another, one libFuzzer job (one core) at a time, and prints a summary:
# executions, exec/s, coverage (edges) and features per target, plus any
# crash, leak, timeout or out-of-memory artifact.
#
#   fuzz/run-all.sh [SECONDS] [TARGET...]
#
# The committed seeds in fuzz/corpus/<target>/ are read, never written: what a
# run discovers goes to fuzz/corpus-work/<target>/ (gitignored) and is reused
# by the next run. Logs: fuzz/logs/<target>.log. Crash inputs:
# fuzz/artifacts/<target>/ (minimize with `cargo fuzz tmin <target> <file>`).
#
# Needs cargo-fuzz (installed from crates.io when missing) and, on a stable
# toolchain, RUSTC_BOOTSTRAP=1 for the nightly-only sanitizer and coverage
# flags; this script sets it. Exit status 1 when any target crashed.
set -euo pipefail

FUZZ="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SECONDS_PER_TARGET="${1:-60}"
shift || true
if [ "$#" -gt 0 ]; then
    TARGETS=("$@")
else
    TARGETS=(retry_after inbound policy decisions ffi bodies)
fi
case "$SECONDS_PER_TARGET" in
    '' | *[!0-9]*) echo "usage: $0 [SECONDS] [TARGET...]" >&2; exit 2 ;;
esac

export RUSTC_BOOTSTRAP=1
# One build job: the machine is shared.
export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-1}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz from crates.io"
    cargo install cargo-fuzz --locked
fi

# Default cargo-fuzz build: optimized, with debug assertions and overflow
# checks (so arithmetic overflow is a crash) and AddressSanitizer.
echo "== building fuzz targets"
for t in "${TARGETS[@]}"; do
    cargo fuzz build --fuzz-dir "$FUZZ" "$t"
done

mkdir -p "$FUZZ/logs"
status=0
summary=()
for t in "${TARGETS[@]}"; do
    work="$FUZZ/corpus-work/$t"
    seeds="$FUZZ/corpus/$t"
    log="$FUZZ/logs/$t.log"
    mkdir -p "$work" "$seeds" "$FUZZ/artifacts/$t"
    before=$(find "$FUZZ/artifacts/$t" -type f | wc -l)
    extra=(-max_len=4096)
    # The arbitrary-driven targets need room for a policy plus a long operation sequence.
    if [ "$t" = decisions ] || [ "$t" = ffi ]; then
        extra=(-max_len=8192 -len_control=0)
    fi
    echo "== $t: ${SECONDS_PER_TARGET}s (log: ${log#"$FUZZ"/})"
    set +e
    cargo fuzz run --fuzz-dir "$FUZZ" --jobs 1 "$t" "$work" "$seeds" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
        -print_final_stats=1 "${extra[@]}" >"$log" 2>&1
    rc=$?
    set -e
    after=$(find "$FUZZ/artifacts/$t" -type f | wc -l)
    done_line=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 || true)
    execs=$(grep -E '^stat::number_of_executed_units:' "$log" | awk '{print $2}' | tail -1)
    rate=$(grep -E '^stat::average_exec_per_sec:' "$log" | awk '{print $2}' | tail -1)
    cov=$(sed -nE 's/.*cov: ([0-9]+).*/\1/p' <<<"$done_line")
    ft=$(sed -nE 's/.*ft: ([0-9]+).*/\1/p' <<<"$done_line")
    corp=$(sed -nE 's/.*corp: ([0-9]+\/[0-9]+[a-zA-Z]*).*/\1/p' <<<"$done_line")
    result=ok
    if [ "$rc" -ne 0 ] || [ "$after" -gt "$before" ]; then
        result="CRASH (exit $rc; see $log and artifacts/$t/)"
        grep -E 'panicked at|ERROR: (libFuzzer|AddressSanitizer)|^SUMMARY' "$log" | head -5 || true
        status=1
    fi
    line=$(printf '%-12s execs=%-10s exec/s=%-7s cov=%-6s ft=%-6s corpus=%-12s %s' \
        "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result")
    echo "$line"
    summary+=("$line")
done

echo
echo "== summary (${SECONDS_PER_TARGET}s per target, $(nproc) cores, $(uname -m))"
printf '%s\n' "${summary[@]}"
exit "$status"

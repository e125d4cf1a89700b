#!/usr/bin/env bash
# CI for the Python binding, on a machine with only python3 (>= 3.10) + pip and cargo:
#   1. a virtualenv with maturin, pytest, pytest-asyncio, httpx, httpx2, openai,
#      anthropic, redis (the fleet adapter's client) (+ ruff, mypy and the
#      benchmark's peers), each at the version constraints.txt pins,
#   2. `pip install ./bindings-python` (maturin builds the abi3 extension from crates.io),
#   3. the fault-injection server (`cargo build -p retrywise-fault-server`),
#   4. lint (ruff, mypy, stubtest), the pytest suite, and a quick benchmark smoke run.
# Exits non-zero on any failure, including a pytest run that collected no test.
#
# Environment:
#   RETRYWISE_PY_VENV   virtualenv to create/reuse (default: bindings-python/.venv)
#   RETRYWISE_PY_CONSTRAINTS  pip constraints file (default: constraints.txt here;
#                       empty: the newest releases, as scripts/test-latest runs)
#   RETRYWISE_PY_LINT   0 to skip ruff / mypy / stubtest (default 1)
#   RETRYWISE_PY_BENCH  0 to skip the benchmark smoke run (default 1)
#   RETRYWISE_REQUIRE_REDIS  1: the fleet tests fail, not skip, without redis-server
#                       (scripts/test-all sets it and installs redis-server)
#   PYTHON              interpreter for the virtualenv (default python3)
#   extra arguments are passed to pytest.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
VENV="${RETRYWISE_PY_VENV:-$HERE/.venv}"
PYTHON="${PYTHON:-python3}"

step() { printf '\n== %s\n' "$*"; }

step "virtualenv $VENV"
if [ ! -x "$VENV/bin/python" ]; then
    if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
        # Debian's python3 without python3-venv: fall back to virtualenv from PyPI.
        rm -rf "$VENV"
        "$PYTHON" -m pip install --quiet --user -c "$HERE/constraints.txt" virtualenv
        "$PYTHON" -m virtualenv --quiet "$VENV"
    fi
fi
PY="$VENV/bin/python"
# The build backend runs the venv's `maturin` executable: the venv's bin/ comes first.
export VIRTUAL_ENV="$VENV" PATH="$VENV/bin:$PATH"
# Every version from constraints.txt (RETRYWISE_PY_CONSTRAINTS: another file,
# as scripts/test-latest passes for the newest releases).
CONSTRAINTS="${RETRYWISE_PY_CONSTRAINTS-$HERE/constraints.txt}"
pin() { [ -n "$CONSTRAINTS" ] && printf -- '-c\n%s\n' "$CONSTRAINTS"; return 0; }
mapfile -t PIN < <(pin)
"$PY" -m pip install --quiet --disable-pip-version-check "${PIN[@]}" pip
"$PY" -m pip install --quiet --disable-pip-version-check "${PIN[@]}" \
    "maturin>=1.5,<2" pytest pytest-asyncio httpx httpx2 openai anthropic redis \
    ruff mypy tenacity stamina backoff pybreaker
"$PY" -m pip list --format=freeze 2>/dev/null | grep -iE '^(openai|anthropic|httpx2?|pytest)==' | tr '\n' ' '
echo
"$PY" --version

step "build and install the extension (pip install ./bindings-python, test hooks on for the panic tests)"
# maturin's build backend passes MATURIN_PEP517_ARGS to cargo: the core's
# test-only policy hooks, which tests/test_errors.py uses.
# The tests need the same code, not the shipped wheel's fat LTO: the plain
# release profile builds without whole-program LTO (scripts/package builds the
# shipped wheel with release-python, as `pip install ./bindings-python` does).
MATURIN_PEP517_ARGS="--profile release --features test-hooks" \
    "$PY" -m pip install --quiet --no-build-isolation --force-reinstall --no-deps "$HERE"
"$PY" -c 'import retrywise; print("retrywise", retrywise.__version__, "from", retrywise.__file__)'

step "build the fault server"
(cd "$ROOT" && cargo build --quiet -p retrywise-fault-server)
TARGET_DIR="$(cd "$ROOT" && cargo metadata --format-version 1 --no-deps |
    "$PY" -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
export RETRYWISE_FAULT_SERVER="$TARGET_DIR/debug/retrywise-fault-server"
test -x "$RETRYWISE_FAULT_SERVER"

cd "$HERE"
if [ "${RETRYWISE_PY_LINT:-1}" != 0 ]; then
    step "lint"
    "$PY" -m ruff check .
    "$PY" -m ruff format --check .
    # Types of the package sources (with the native stub) and of the tests that
    # use them; stubtest checks the stub against the built extension.
    "$PY" -m mypy --no-incremental python/retrywise
    "$PY" -m mypy --no-incremental tests
    "$PY" -m mypy.stubtest retrywise._retrywise
fi

# pytest's exit status, with "collected no test" (5) as a failure.
checked() {
    if [ "$1" = 5 ]; then
        echo "pytest collected no test: treated as a failure" >&2
        return 1
    fi
    return "$1"
}

step "pytest"
# The suite imports the installed package; -p no:cacheprovider keeps the tree clean.
if [ $# -gt 0 ]; then
    set +e
    "$PY" -m pytest -p no:cacheprovider -q "$@" tests
    status=$?
    set -e
    checked "$status"
else
    # Two files sleep most of their time: test_flap.py waits out a 60 s outage
    # (about 80 s), test_ratelimit_e2e.py through its windows (about 2 min, a
    # family at a time). Each runs in a process of its own (its own fault
    # server) beside the rest of the suite.
    beside=(tests/test_flap.py tests/test_ratelimit_e2e.py)
    pids=()
    logs=()
    ignore=()
    set +e
    for f in "${beside[@]}"; do
        log="$(mktemp)"
        "$PY" -m pytest -p no:cacheprovider -q "$f" >"$log" 2>&1 &
        pids+=("$!")
        logs+=("$log")
        ignore+=("--ignore=$f")
    done
    "$PY" -m pytest -p no:cacheprovider -q "${ignore[@]}" tests
    status=$?
    statuses=()
    for pid in "${pids[@]}"; do
        wait "$pid"
        statuses+=("$?")
    done
    set -e
    for i in "${!beside[@]}"; do
        printf '\n-- %s (run beside the rest)\n' "${beside[$i]}"
        cat "${logs[$i]}"
        rm -f "${logs[$i]}"
    done
    checked "$status"
    for s in "${statuses[@]}"; do
        checked "$s"
    done
fi

if [ "${RETRYWISE_PY_BENCH:-1}" != 0 ]; then
    step "benchmark smoke run (bench/bench.py --quick)"
    "$PY" bench/bench.py --quick
fi

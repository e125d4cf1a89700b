#!/usr/bin/env bash
# CI for the C ABI (libretrywise). Exits non-zero on the first failure.
#
#   1. cargo build --release -p retrywise-ffi --features test-hooks (cdylib + staticlib)
#   2. check-header.sh: committed include/retrywise.h == fresh cbindgen output
#   3. tests/test_loop.c, tests/test_rescue.c and tests/test_request.c with
#      gcc -Wall -Wextra -Werror, each linked dynamically and statically
#   4. run each; run each under valgrind --error-exitcode=1 --leak-check=full
#   5. the library again without test hooks; examples/readme_example.c (the
#      README snippet): compile and run
#   6. install.sh into a scratch prefix; compile and run the example through
#      pkg-config, shared and static
#   7. bench/bench.c compiles (run it with RW_CI_BENCH=1)
#   8. cargo test -p retrywise-ffi, cargo fmt --check and clippy (warnings in
#      bindings-ffi are errors)
#
# Uses $CARGO_TARGET_DIR when set, else <repo>/target. Needs gcc, valgrind,
# pkg-config; cbindgen is installed by check-header.sh when missing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
LIB_DIR="$TARGET_DIR/release"
OUT="$TARGET_DIR/ffi-ci"
CC="${CC:-gcc}"
CFLAGS=(-std=c11 -Wall -Wextra -Werror -O1 -g -I"$HERE/include")
export RUST_BACKTRACE=0 # the panic-hook test prints one expected panic message

case "$(uname -s)" in
    Darwin) SHARED=libretrywise.dylib NATIVE_LIBS=(-framework Security -framework CoreFoundation -liconv -lSystem -lc -lm) ;;
    *) SHARED=libretrywise.so NATIVE_LIBS=(-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc) ;;
esac

step() { printf '\n==> %s\n' "$*"; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "ci: $1 is required" >&2; exit 1; }; }
need cargo
need "$CC"
need valgrind
need pkg-config

# The C tests' build has the core's test-only policy hooks (test_loop.c's panic
# test); the library the later steps install and link is built without them.
step "build with test hooks (cargo build --release -p retrywise-ffi --features test-hooks)"
(cd "$ROOT" && cargo build --release -p retrywise-ffi --features test-hooks)
test -f "$LIB_DIR/$SHARED" && test -f "$LIB_DIR/libretrywise.a"

step "header is up to date"
"$HERE/check-header.sh"

rm -rf "$OUT"
mkdir -p "$OUT"

TESTS=(test_loop test_rescue test_request)
VALGRIND=(valgrind --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect,possible -q)
for t in "${TESTS[@]}"; do
    step "compile tests/$t.c (dynamic and static)"
    "$CC" "${CFLAGS[@]}" "$HERE/tests/$t.c" -o "$OUT/${t}_dynamic" \
        -L"$LIB_DIR" -lretrywise -Wl,-rpath,"$LIB_DIR" -pthread
    "$CC" "${CFLAGS[@]}" "$HERE/tests/$t.c" -o "$OUT/${t}_static" \
        "$LIB_DIR/libretrywise.a" -pthread "${NATIVE_LIBS[@]}"

    step "run $t (dynamic)"
    "$OUT/${t}_dynamic"
    step "run $t (static)"
    "$OUT/${t}_static"

    step "valgrind $t (dynamic)"
    "${VALGRIND[@]}" "$OUT/${t}_dynamic"
    step "valgrind $t (static)"
    "${VALGRIND[@]}" "$OUT/${t}_static"
done

step "build without test hooks (cargo build --release -p retrywise-ffi)"
(cd "$ROOT" && cargo build --release -p retrywise-ffi)

step "README example (examples/readme_example.c)"
"$CC" "${CFLAGS[@]}" "$HERE/examples/readme_example.c" -o "$OUT/readme_example" \
    -L"$LIB_DIR" -lretrywise -Wl,-rpath,"$LIB_DIR"
"$OUT/readme_example"
"${VALGRIND[@]}" "$OUT/readme_example" >/dev/null

step "install.sh + pkg-config (shared and static)"
PREFIX="$OUT/prefix"
"$HERE/install.sh" --no-build "$PREFIX"
export PKG_CONFIG_PATH="$PREFIX/lib/pkgconfig"
pkg-config --exact-version="$(cd "$ROOT" && cargo pkgid -p retrywise-ffi | sed 's/.*[@#]//')" retrywise
# shellcheck disable=SC2046 # word splitting of pkg-config output is intended
"$CC" "${CFLAGS[@]}" "$HERE/examples/readme_example.c" -o "$OUT/readme_pkgconfig" \
    $(pkg-config --cflags --libs retrywise) -Wl,-rpath,"$PREFIX/lib"
"$OUT/readme_pkgconfig" >/dev/null
# shellcheck disable=SC2046
"$CC" "${CFLAGS[@]}" "$HERE/examples/readme_example.c" -o "$OUT/readme_pkgconfig_static" \
    $(pkg-config --cflags retrywise) "$PREFIX/lib/libretrywise.a" \
    $(pkg-config --static --libs-only-l retrywise | sed 's/-lretrywise//')
"$OUT/readme_pkgconfig_static" >/dev/null

step "bench/bench.c compiles"
"$CC" -std=c11 -Wall -Wextra -Werror -O2 -I"$HERE/include" "$HERE/bench/bench.c" -o "$OUT/bench" \
    "$LIB_DIR/libretrywise.a" "${NATIVE_LIBS[@]}"
if [ "${RW_CI_BENCH:-0}" = 1 ]; then
    (cd "$ROOT" && cargo build --release -p retrywise-ffi --example bench_core)
    "$LIB_DIR/examples/bench_core"
    "$OUT/bench"
fi

# scripts/test-all already ran these for the whole workspace (RETRYWISE_FFI_RUST_CHECKS=0).
if [ "${RETRYWISE_FFI_RUST_CHECKS:-1}" != 0 ]; then
    step "Rust unit tests (cargo test -p retrywise-ffi)"
    (cd "$ROOT" && cargo test -p retrywise-ffi)

    step "cargo fmt --check and clippy (bindings-ffi)"
    (cd "$ROOT" && cargo fmt -p retrywise-ffi --check)
    # Clippy lints path dependencies too; only findings in bindings-ffi fail this
    # step (the core crate has its own lint gate).
    CLIPPY_LOG="$OUT/clippy.log"
    (cd "$ROOT" && cargo clippy -p retrywise-ffi --all-targets --message-format=short) >"$CLIPPY_LOG" 2>&1 || {
        cat "$CLIPPY_LOG"
        echo "ci: cargo clippy failed" >&2
        exit 1
    }
    if grep -E '^bindings-ffi/.*(warning|error)' "$CLIPPY_LOG"; then
        echo "ci: clippy findings in bindings-ffi" >&2
        exit 1
    fi
fi

printf '\nci: bindings-ffi OK\n'

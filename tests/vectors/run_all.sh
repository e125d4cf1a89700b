#!/usr/bin/env bash
# Runs the conformance vectors through every runner that can run here:
# Rust (core integration test), Python (binding), Node (binding), C (libretrywise).
#
#   tests/vectors/run_all.sh                 # every runner
#   tests/vectors/run_all.sh python c        # only these
#
# Called from .ci/run after the bindings are built. Where the builds are:
#   CARGO_TARGET_DIR        cargo's target dir (default: <repo>/target)
#   RETRYWISE_PYTHON        a Python that can `import retrywise` (default: the first of
#                           bindings-python/.venv/bin/python, python3 that imports it)
#   RETRYWISE_NODE_PACKAGE  the built Node package dir, holding index.js and the .node
#                           addon (default: bindings-node)
#   RETRYWISE_FFI_LIB_DIR   dir holding libretrywise.so (default: $CARGO_TARGET_DIR/release,
#                           then $CARGO_TARGET_DIR/debug)
#   RETRYWISE_VECTORS_REQUIRE  comma-separated runners that must run (e.g. rust,python,node,c);
#                           a required runner that cannot run fails the script. Default: none
#                           (a runner whose binding is not built is reported as skipped).
#   CC                      C compiler (default: cc)
#
# Exit status: 0 when every runner that ran passed and no required runner was skipped.
set -u

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
REQUIRE=",${RETRYWISE_VECTORS_REQUIRE:-},"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/retrywise-vectors.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

RUNNERS=("$@")
[ ${#RUNNERS[@]} -eq 0 ] && RUNNERS=(rust python node c)

declare -A STATUS
failed=0

skip() { # runner reason
  if [[ "$REQUIRE" == *",$1,"* ]]; then
    STATUS[$1]="FAILED (required, cannot run: $2)"
    failed=1
  else
    STATUS[$1]="skipped ($2)"
  fi
  echo "== $1: skipped: $2"
}

result() { # runner exit-code
  if [ "$2" -eq 0 ]; then STATUS[$1]="passed"; else STATUS[$1]="FAILED"; failed=1; fi
}

run_rust() {
  echo "== rust: cargo test -p retrywise --test vectors"
  if ! command -v cargo >/dev/null; then skip rust "cargo not found"; return; fi
  (cd "$ROOT" && cargo test -p retrywise --test vectors -- --nocapture)
  result rust $?
}

run_python() {
  local py="${RETRYWISE_PYTHON:-}"
  if [ -z "$py" ]; then
    for cand in "$ROOT/bindings-python/.venv/bin/python" python3; do
      if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import retrywise' >/dev/null 2>&1; then py="$cand"; break; fi
    done
  fi
  if [ -z "$py" ] || ! "$py" -c 'import retrywise' >/dev/null 2>&1; then
    skip python "no Python with the retrywise binding installed (set RETRYWISE_PYTHON)"; return
  fi
  echo "== python: $py tests/vectors/run_python.py"
  "$py" "$HERE/run_python.py"
  result python $?
}

run_node() {
  local pkg="${RETRYWISE_NODE_PACKAGE:-$ROOT/bindings-node}"
  if ! command -v node >/dev/null; then skip node "node not found"; return; fi
  if [ ! -f "$pkg/index.js" ]; then skip node "no $pkg/index.js (set RETRYWISE_NODE_PACKAGE)"; return; fi
  if ! RETRYWISE_NODE_PACKAGE="$pkg" node -e 'require(process.env.RETRYWISE_NODE_PACKAGE)' >/dev/null 2>&1; then
    skip node "$pkg does not load (native addon not built?)"; return
  fi
  echo "== node: node tests/vectors/run_node.mjs ($pkg)"
  RETRYWISE_NODE_PACKAGE="$pkg" node "$HERE/run_node.mjs"
  result node $?
}

run_c() {
  local lib="${RETRYWISE_FFI_LIB_DIR:-}" cc="${CC:-cc}" py
  if [ -z "$lib" ]; then
    for d in "$TARGET/release" "$TARGET/debug"; do
      if [ -f "$d/libretrywise.so" ]; then lib="$d"; break; fi
    done
  fi
  if [ -z "$lib" ] || [ ! -f "$lib/libretrywise.so" ]; then
    skip c "no libretrywise.so (build retrywise-ffi or set RETRYWISE_FFI_LIB_DIR)"; return
  fi
  if ! command -v "$cc" >/dev/null; then skip c "no C compiler ($cc)"; return; fi
  py="$(command -v python3 || command -v python || true)"
  if [ -z "$py" ]; then skip c "python3 needed for to_lines.py"; return; fi
  echo "== c: to_lines.py | run_c ($lib)"
  "$py" "$HERE/to_lines.py" >"$WORK/vectors.lines" || { result c 1; return; }
  "$cc" -std=c11 -O1 -Wall -Wextra -Werror -I "$ROOT/bindings-ffi/include" "$HERE/run_c.c" \
    -L "$lib" -Wl,-rpath,"$lib" -lretrywise -lm -o "$WORK/run_c" || { result c 1; return; }
  "$WORK/run_c" "$WORK/vectors.lines"
  result c $?
}

for r in "${RUNNERS[@]}"; do
  case "$r" in
    rust) run_rust ;;
    python) run_python ;;
    node) run_node ;;
    c) run_c ;;
    *) echo "unknown runner: $r (expected rust, python, node, c)"; exit 2 ;;
  esac
done

echo "== conformance vectors: $(ls "$HERE"/*.json | wc -l | tr -d ' ') vectors"
for r in "${RUNNERS[@]}"; do echo "   $r: ${STATUS[$r]}"; done
exit $failed

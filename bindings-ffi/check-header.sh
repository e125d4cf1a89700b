#!/usr/bin/env bash
# Checks that the committed include/retrywise.h equals a fresh cbindgen
# generation from src/ (exit 1 and a diff when it does not).
#
#   bindings-ffi/check-header.sh           # check
#   bindings-ffi/check-header.sh --update  # regenerate include/retrywise.h
#
# cbindgen is pinned (CBINDGEN_VERSION) so every machine generates the same
# bytes. A cbindgen of that version on PATH is used; otherwise it is installed
# with `cargo install cbindgen --locked` into <target dir>/tools (needs
# crates.io access once), leaving any other cbindgen on the machine alone.
set -euo pipefail

CBINDGEN_VERSION="${CBINDGEN_VERSION:-0.29.4}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
HEADER="$HERE/include/retrywise.h"

find_cbindgen() {
    if command -v cbindgen >/dev/null 2>&1 && [ "$(cbindgen --version 2>/dev/null)" = "cbindgen $CBINDGEN_VERSION" ]; then
        command -v cbindgen
        return
    fi
    local root="$TARGET_DIR/tools/cbindgen-$CBINDGEN_VERSION"
    if [ ! -x "$root/bin/cbindgen" ]; then
        echo "check-header: installing cbindgen $CBINDGEN_VERSION into $root" >&2
        # Unoptimised: it runs once per check (half a second on this crate) and
        # installs in 30 s instead of 76 s; its output does not depend on it.
        CARGO_PROFILE_RELEASE_OPT_LEVEL=0 CARGO_PROFILE_RELEASE_DEBUG=0 \
            cargo install cbindgen --locked --version "$CBINDGEN_VERSION" --root "$root" >&2
    fi
    echo "$root/bin/cbindgen"
}

CBINDGEN="$(find_cbindgen)"
FRESH="$(mktemp "${TMPDIR:-/tmp}/retrywise.h.XXXXXX")"
trap 'rm -f "$FRESH"' EXIT

# -q: cbindgen warns about every non-pub item it skips; those are expected.
(cd "$HERE" && "$CBINDGEN" -q --config cbindgen.toml --crate retrywise-ffi --output "$FRESH" .)

if [ "${1:-}" = "--update" ]; then
    mkdir -p "$(dirname "$HEADER")"
    cp "$FRESH" "$HEADER"
    echo "check-header: wrote $HEADER"
    exit 0
fi

if ! diff -u "$HEADER" "$FRESH"; then
    echo "check-header: include/retrywise.h is stale; run bindings-ffi/check-header.sh --update and commit it" >&2
    exit 1
fi
echo "check-header: include/retrywise.h is up to date (cbindgen $CBINDGEN_VERSION)"

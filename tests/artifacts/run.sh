#!/usr/bin/env bash
# Installs each artifact of scripts/package into a clean environment with no
# Rust toolchain on PATH and makes a real call through it:
#   python  a fresh venv; pip installs the wheel with --no-index (nothing to
#           build, nothing fetched), httpx from PyPI as wheels only; check_python.py
#   node    a fresh npm project; npm installs the two tarballs --offline from an
#           empty cache (a registry fetch would fail); check_node.js
#   c       the tarball unpacked; check.c compiled with pkg-config against it,
#           linked shared (LD_LIBRARY_PATH) and static; exact output compared
#
#   tests/artifacts/run.sh [DIST]     (default <repo>/dist)
#
# Prints 'N passed, N failed' and exits non-zero when any check failed.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
DIST="$(cd "${1:-$ROOT/dist}" && pwd)" || exit 1
PYTHON="$(command -v "${PYTHON:-python3}")"
SCRATCH="$(mktemp -d)"
trap 'rm -rf "$SCRATCH"' EXIT
PASSED=0
FAILED=0

# PATH without any directory holding cargo, rustc or rustup; nothing that
# could build Rust code is reachable, and no Rust build variable is set.
clean_path=""
IFS=: read -r -a dirs <<<"$PATH"
for d in "${dirs[@]}"; do
    if [ -z "$d" ] || [ -e "$d/cargo" ] || [ -e "$d/rustc" ] || [ -e "$d/rustup" ]; then continue; fi
    clean_path="${clean_path:+$clean_path:}$d"
done
export PATH="$clean_path"
unset CARGO_HOME RUSTUP_HOME CARGO_TARGET_DIR RUSTFLAGS CARGO_BUILD_TARGET
if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    echo "artifacts: cargo or rustc still on PATH ($PATH)" >&2
    exit 1
fi
echo "PATH without Rust: cargo and rustc not found"

one() { # one FILE GLOB: the single artifact matching GLOB in DIST
    local matches=("$DIST"/$1)
    if [ "${#matches[@]}" -ne 1 ] || [ ! -f "${matches[0]}" ]; then
        echo "artifacts: expected one $1 in $DIST, found: ${matches[*]}" >&2
        return 1
    fi
    printf '%s\n' "${matches[0]}"
}

check_python() {
    local whl venv="$SCRATCH/venv"
    whl="$(one 'retrywise-*-cp310-abi3-manylinux_*.whl')" || return 1
    # Debian's python3 without python3-venv: virtualenv (as bindings-python/ci.sh does).
    "$PYTHON" -m venv "$venv" 2>/dev/null || { rm -rf "$venv" && "$PYTHON" -m pip install --quiet --user -c "$ROOT/bindings-python/constraints.txt" virtualenv &&
        "$PYTHON" -m virtualenv --quiet "$venv"; } || return 1
    # --no-index: pip may not look for (let alone build) anything but this wheel.
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-index "$whl" || return 1
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary :all: \
        -c "$ROOT/bindings-python/constraints.txt" "httpx>=0.27" || return 1
    (cd "$SCRATCH" && "$venv/bin/python" "$HERE/check_python.py")
}

check_node() {
    local main addon project="$SCRATCH/npm-project"
    main="$(one 'retrywise-[0-9]*.tgz')" || return 1
    addon="$(one 'retrywise-linux-*.tgz')" || return 1
    mkdir -p "$project" && cd "$project" || return 1
    npm init -y >/dev/null || return 1
    # --offline with an empty cache: any fetch from the registry fails.
    npm install --offline --cache "$SCRATCH/npm-cache" --no-audit --no-fund "$main" "$addon" || return 1
    if compgen -G "node_modules/retrywise/*.node" >/dev/null; then
        echo "artifacts: the JS package carries an addon: $(ls node_modules/retrywise/*.node)" >&2
        return 1
    fi
    cp "$HERE/check_node.js" "$project/" && node check_node.js
}

check_c() {
    local tarball prefix out="$SCRATCH/c" expected version
    tarball="$(one 'libretrywise-*-linux-gnu.tar.gz')" || return 1
    mkdir -p "$out" && tar -xzf "$tarball" -C "$out" || return 1
    prefix="$(echo "$out"/libretrywise-*)"
    version="${prefix##*/libretrywise-}"
    export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
    pkg-config --exact-version="$version" retrywise || { echo "artifacts: pkg-config finds no retrywise $version" >&2; return 1; }
    # The library records only the major version; programs linked against it too.
    readelf -d "$prefix/lib/libretrywise.so.$version" | grep -q "SONAME.*\[libretrywise.so.${version%%.*}\]" ||
        { echo "artifacts: libretrywise.so.$version has no SONAME libretrywise.so.${version%%.*}" >&2; return 1; }
    local cflags=(-std=c11 -Wall -Wextra -Werror -O1)
    # shellcheck disable=SC2046 # word splitting of pkg-config output is intended
    gcc "${cflags[@]}" "$HERE/check.c" -o "$out/check_shared" $(pkg-config --cflags --libs retrywise) || return 1
    readelf -d "$out/check_shared" | grep -q "NEEDED.*\[libretrywise.so.${version%%.*}\]" ||
        { echo "artifacts: check_shared does not need libretrywise.so.${version%%.*}" >&2; return 1; }
    # shellcheck disable=SC2046
    gcc "${cflags[@]}" "$HERE/check.c" -o "$out/check_static" $(pkg-config --cflags retrywise) \
        "$prefix/lib/libretrywise.a" $(pkg-config --static --libs-only-l retrywise | sed 's/-lretrywise//') || return 1
    if readelf -d "$out/check_static" | grep -q 'NEEDED.*libretrywise'; then
        echo "artifacts: check_static needs libretrywise.so" >&2
        return 1
    fi
    expected="libretrywise $version
attempt 1: retry retryable_status class=transient wait=retry_after 5 ms
attempt 2: succeeded success class=none wait=none 0 ms
after success: call_finished
overall: 1 request, 2 attempts, 1 retry"
    local got status=0
    got="$(LD_LIBRARY_PATH="$prefix/lib" "$out/check_shared")" || status=1
    diff <(printf '%s\n' "$expected") <(printf '%s\n' "$got") || status=1
    got="$("$out/check_static")" || status=1
    diff <(printf '%s\n' "$expected") <(printf '%s\n' "$got") || status=1
    [ "$status" = 0 ] && printf '%s\n(shared and static: output as expected)\n' "$got"
    return "$status"
}

for kind in python node c; do
    printf '\n== artifacts: %s\n' "$kind"
    if ("check_$kind"); then
        PASSED=$((PASSED + 1))
    else
        FAILED=$((FAILED + 1))
        printf '== artifacts: %s FAILED\n' "$kind"
    fi
done
printf '\nartifacts: %s passed, %s failed\n' "$PASSED" "$FAILED"
[ "$FAILED" = 0 ]

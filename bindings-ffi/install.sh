#!/usr/bin/env bash
# Installs libretrywise under PREFIX: the shared and static libraries, the
# header and a pkg-config file.
#
#   bindings-ffi/install.sh PREFIX            # builds (cargo build --release) first
#   bindings-ffi/install.sh --no-build PREFIX # installs what is already built
#
# Result:
#   PREFIX/include/retrywise.h
#   PREFIX/lib/libretrywise.so (.dylib on macOS) and PREFIX/lib/libretrywise.a
#   PREFIX/lib/pkgconfig/retrywise.pc
#
# Options for a tree that is packed and unpacked elsewhere (scripts/package):
#   --relocatable  retrywise.pc names its prefix relative to itself (${pcfiledir})
#   --soname       Linux: the shared library is libretrywise.so.X.Y.Z with the
#                  SONAME libretrywise.so.X (set with $PATCHELF, default
#                  patchelf), and libretrywise.so.X and libretrywise.so are
#                  symlinks to it, so programs record the major version only
#
# With PKG_CONFIG_PATH=PREFIX/lib/pkgconfig:
#   shared: cc app.c $(pkg-config --cflags --libs retrywise)
#   static: cc app.c $(pkg-config --cflags retrywise) PREFIX/lib/libretrywise.a \
#              $(pkg-config --static --libs-only-l retrywise | sed 's/-lretrywise//')
#           (Libs.private lists the system libraries the static library needs.)
set -euo pipefail

BUILD=1
RELOCATABLE=0
SONAME=0
while [ $# -gt 1 ]; do
    case "$1" in
        --no-build) BUILD=0 ;;
        --relocatable) RELOCATABLE=1 ;;
        --soname) SONAME=1 ;;
        *) break ;;
    esac
    shift
done
if [ $# -ne 1 ]; then
    echo "usage: $0 [--no-build] [--relocatable] [--soname] PREFIX" >&2
    exit 2
fi
mkdir -p "$1"
PREFIX="$(cd "$1" && pwd)"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
LIB_DIR="$TARGET_DIR/release"

if [ "$BUILD" = 1 ]; then
    (cd "$ROOT" && cargo build --release -p retrywise-ffi)
fi

case "$(uname -s)" in
    Darwin)
        SHARED=libretrywise.dylib
        LIBS_PRIVATE="-framework Security -framework CoreFoundation -liconv -lSystem -lc -lm"
        ;;
    *)
        SHARED=libretrywise.so
        # `cargo rustc --crate-type staticlib -- --print native-static-libs` on Linux.
        LIBS_PRIVATE="-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc"
        ;;
esac

for f in "$LIB_DIR/$SHARED" "$LIB_DIR/libretrywise.a" "$HERE/include/retrywise.h"; do
    if [ ! -f "$f" ]; then
        echo "install: missing $f (build with: cargo build --release -p retrywise-ffi)" >&2
        exit 1
    fi
done

VERSION="$(cd "$ROOT" && cargo pkgid -p retrywise-ffi | sed 's/.*[@#]//')"

install -d "$PREFIX/include" "$PREFIX/lib/pkgconfig"
install -m 0644 "$HERE/include/retrywise.h" "$PREFIX/include/retrywise.h"
install -m 0644 "$LIB_DIR/libretrywise.a" "$PREFIX/lib/libretrywise.a"
if [ "$SONAME" = 1 ] && [ "$SHARED" = libretrywise.so ]; then
    # cargo links the cdylib without a SONAME; setting one at link time would
    # make every program linked against target/release need a versioned name.
    MAJOR="${VERSION%%.*}"
    install -m 0755 "$LIB_DIR/$SHARED" "$PREFIX/lib/$SHARED.$VERSION"
    "${PATCHELF:-patchelf}" --set-soname "$SHARED.$MAJOR" "$PREFIX/lib/$SHARED.$VERSION"
    ln -sfn "$SHARED.$VERSION" "$PREFIX/lib/$SHARED.$MAJOR"
    ln -sfn "$SHARED.$MAJOR" "$PREFIX/lib/$SHARED"
else
    install -m 0755 "$LIB_DIR/$SHARED" "$PREFIX/lib/$SHARED"
fi

if [ "$RELOCATABLE" = 1 ]; then
    # shellcheck disable=SC2016 # pkg-config expands ${pcfiledir}, not the shell
    PC_PREFIX='${pcfiledir}/../..'
else
    PC_PREFIX="$PREFIX"
fi
cat >"$PREFIX/lib/pkgconfig/retrywise.pc" <<EOF
prefix=$PC_PREFIX
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include

Name: retrywise
Description: One retry owner for model-API calls (C ABI)
Version: $VERSION
Libs: -L\${libdir} -lretrywise
Libs.private: $LIBS_PRIVATE
Cflags: -I\${includedir}
EOF

echo "install: libretrywise $VERSION installed under $PREFIX"

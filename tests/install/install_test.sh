#!/usr/bin/env bash
# install_test.sh - install the build into a scratch DESTDIR and prefix inside the build tree,
# then use the installed package the two ways a user would:
#   1. pkg-config + cc: tests/install/consumer.c and examples/engine_loop.c against the shared
#      library, and consumer.c against the static one with `pkg-config --static`;
#   2. CMake: tests/install/CMakeLists.txt (find_package(kvcache) then kvcache::kvcache and
#      kvcache::kvcache_static), and a find_package for a version the package must refuse;
# run every program, and check that the shared library exports exactly the public API: every
# exported symbol is a function some installed header declares KVC_API (the one kvc__ symbol
# allowed is kvc__assert_fail, which the public KVC_ASSERT macro calls), and every function an
# installed header declares KVC_API is exported.
#
# usage: install_test.sh BUILD_DIR SOURCE_DIR CMAKE CC VERSION
set -u
BUILD=$1 SRC=$2 CMAKE=$3 CC=$4 VERSION=$5
WORK=$BUILD/install-test
DEST=$WORK/destdir
PREFIX=/kvcache-install-test # never created: everything lands under $DEST
ROOT=$DEST$PREFIX
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
die() { echo "FAIL: $*"; exit 1; }
run() { # run a command, showing its output only if it fails
  "$@" >"$WORK/last.log" 2>&1 || { fail "$*"; cat "$WORK/last.log"; return 1; }
}

rm -rf "$WORK"
mkdir -p "$WORK"

# ---- install: both components, so that the manifest of a real `make install` (no component)
# is left alone
for comp in Runtime Development; do
  DESTDIR=$DEST "$CMAKE" --install "$BUILD" --prefix "$PREFIX" --component "$comp" \
    >"$WORK/install-$comp.log" 2>&1 || { cat "$WORK/install-$comp.log"; die "install $comp"; }
done
# DESTDIR and the prefix were honoured: every file installed is under the prefix (the manifest
# lists them without DESTDIR) and lies under DESTDIR, and nothing was written to the prefix itself
for comp in Runtime Development; do
  while IFS= read -r f || [ -n "$f" ]; do
    case $f in "$PREFIX"/*) ;; *) fail "installed outside the prefix: $f" ;; esac
    [ -e "$DEST$f" ] || fail "not under DESTDIR: $f"
  done <"$BUILD/install_manifest_$comp.txt"
done
[ -e "$PREFIX" ] && fail "DESTDIR ignored: $PREFIX exists" 
[ -d "$ROOT/lib" ] || die "no lib/ under $ROOT (libdir is not lib?)"
LIBDIR=$(dirname "$(find "$ROOT" -name libkvcache.a | head -1)")
for f in bin/kvcache include/kvcache/kvcache.h include/kvcache/version.h; do
  [ -f "$ROOT/$f" ] || fail "not installed: $f"
done
for f in libkvcache.a libkvcache.so "libkvcache.so.$VERSION" pkgconfig/kvcache.pc \
  cmake/kvcache/kvcacheConfig.cmake cmake/kvcache/kvcacheConfigVersion.cmake \
  cmake/kvcache/kvcacheTargets.cmake; do
  [ -e "$LIBDIR/$f" ] || fail "not installed: $LIBDIR/$f"
done
# every public header, and nothing private
for h in "$SRC"/include/kvcache/*.h; do
  [ -f "$ROOT/include/kvcache/$(basename "$h")" ] || fail "header not installed: $(basename "$h")"
done
find "$ROOT/include" -name '*_int.h' | grep -q . && fail "a private header was installed"
"$ROOT/bin/kvcache" --version | grep -qF "$VERSION" || fail "installed kvcache --version"

# ---- 1. pkg-config + cc ----------------------------------------------------------------------
export PKG_CONFIG_PATH=$LIBDIR/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
[ "$(pkg-config --modversion kvcache)" = "$VERSION" ] || fail "pkg-config --modversion kvcache"
for m in libxxhash libcjson; do
  pkg-config --print-requires-private kvcache | grep -qw "$m" || fail "kvcache.pc lacks $m"
done
CFLAGS="-std=c11 -Wall -Wextra -Wpedantic -Werror -O1"
read -ra PC_CFLAGS <<<"$(pkg-config --cflags kvcache)"
read -ra PC_LIBS <<<"$(pkg-config --libs kvcache)"
read -ra PC_STATIC <<<"$(pkg-config --static --libs kvcache | sed 's/-lkvcache\b/-l:libkvcache.a/')"
# shared: -lkvcache alone must do (the dependencies are private to the shared library)
run "$CC" $CFLAGS "${PC_CFLAGS[@]}" "$SRC/tests/install/consumer.c" -o "$WORK/consumer_pc" \
  "${PC_LIBS[@]}" -Wl,-rpath,"$LIBDIR"
run "$CC" $CFLAGS "${PC_CFLAGS[@]}" "$SRC/examples/engine_loop.c" -o "$WORK/engine_loop_pc" \
  "${PC_LIBS[@]}" -lm -Wl,-rpath,"$LIBDIR"
# static: the archive and everything Requires.private / Libs.private name
run "$CC" $CFLAGS "${PC_CFLAGS[@]}" "$SRC/tests/install/consumer.c" \
  -o "$WORK/consumer_pc_static" "${PC_STATIC[@]}"
if [ -x "$WORK/consumer_pc" ]; then
  [ "$("$WORK/consumer_pc")" = "$VERSION" ] || fail "consumer_pc did not print $VERSION"
  readelf -d "$WORK/consumer_pc" | grep -q 'NEEDED.*libkvcache\.so\.0' ||
    fail "consumer_pc does not load libkvcache.so.0"
  # it loads the installed library, not the build tree's
  ldd "$WORK/consumer_pc" | grep -qF "$LIBDIR/libkvcache.so.0" ||
    fail "consumer_pc does not resolve libkvcache from $LIBDIR"
fi
[ -x "$WORK/engine_loop_pc" ] && { run "$WORK/engine_loop_pc" || true; }
if [ -x "$WORK/consumer_pc_static" ]; then
  [ "$("$WORK/consumer_pc_static")" = "$VERSION" ] || fail "consumer_pc_static did not print $VERSION"
  readelf -d "$WORK/consumer_pc_static" | grep -q 'libkvcache' &&
    fail "consumer_pc_static needs libkvcache.so"
fi

# ---- 2. CMake: find_package(kvcache) ---------------------------------------------------------
cm_args=(-DCMAKE_PREFIX_PATH="$ROOT" -DCMAKE_C_COMPILER="$CC" -DKVC_SOURCE_DIR="$SRC"
  -DCMAKE_BUILD_TYPE=Release)
if run "$CMAKE" -S "$SRC/tests/install" -B "$WORK/cmake-consumer" "${cm_args[@]}" -DKVC_WANT=0.1; then
  if run "$CMAKE" --build "$WORK/cmake-consumer"; then
    for exe in consumer consumer_static; do
      [ "$("$WORK/cmake-consumer/$exe")" = "$VERSION" ] || fail "cmake $exe did not print $VERSION"
    done
    run "$WORK/cmake-consumer/engine_loop" || true
    readelf -d "$WORK/cmake-consumer/consumer" | grep -q 'NEEDED.*libkvcache\.so\.0' ||
      fail "kvcache::kvcache is not the shared library"
    readelf -d "$WORK/cmake-consumer/consumer_static" | grep -q 'libkvcache' &&
      fail "kvcache::kvcache_static needs libkvcache.so"
  fi
fi
# the version file refuses what it is not compatible with (0.x: another minor version)
"$CMAKE" -S "$SRC/tests/install" -B "$WORK/cmake-consumer-bad" "${cm_args[@]}" -DKVC_WANT=0.2 \
  >"$WORK/bad-version.log" 2>&1 && fail "find_package(kvcache 0.2) accepted version $VERSION"
grep -q "kvcacheConfigVersion\|version" "$WORK/bad-version.log" ||
  fail "find_package(kvcache 0.2) failed for another reason: $(tail -5 "$WORK/bad-version.log")"

# ---- 3. the shared library exports exactly the public API ------------------------------------
SO=$LIBDIR/libkvcache.so.$VERSION
nm -D --defined-only "$SO" | awk '{print $NF}' | sort -u >"$WORK/exported.txt"
cat "$ROOT"/include/kvcache/*.h | tr '\n' ' ' | sed 's/;/;\n/g' |
  grep -oP 'KVC_API\b[^;{]*?\bkvc_\w+(?=\s*\()' | grep -oP 'kvc_\w+$' | sort -u >"$WORK/declared.txt"
[ -s "$WORK/declared.txt" ] || die "found no KVC_API declarations in the installed headers"
[ "$(wc -l <"$WORK/declared.txt")" -ge 100 ] ||
  fail "only $(wc -l <"$WORK/declared.txt") KVC_API declarations found: the parser missed some"
while IFS= read -r sym; do
  case $sym in
  _init | _fini | _edata | _end | __bss_start) ;; # the linker's own
  kvc__assert_fail) ;;                               # called by KVC_ASSERT, declared in util.h
  kvc__*) fail "internal symbol exported: $sym" ;;
  *) grep -qx "$sym" "$WORK/declared.txt" || fail "exported but no installed header declares it KVC_API: $sym" ;;
  esac
done <"$WORK/exported.txt"
while IFS= read -r sym; do
  grep -qx "$sym" "$WORK/exported.txt" || fail "declared KVC_API but not exported: $sym"
done <"$WORK/declared.txt"
echo "shared library: $(wc -l <"$WORK/exported.txt") exported symbols," \
  "$(wc -l <"$WORK/declared.txt") KVC_API functions declared"

# ---- 4. every installed header compiles on its own, as C and as C++ ---------------------------
CXX=$(command -v c++ || true)
for h in "$ROOT"/include/kvcache/*.h; do
  name=kvcache/$(basename "$h")
  printf '#include <%s>\nint kvc_test_nonempty;\n' "$name" | "$CC" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only \
    -I"$ROOT/include" -x c - 2>"$WORK/hdr.log" || { fail "$name alone (C)"; cat "$WORK/hdr.log"; }
  if [ -n "$CXX" ]; then
    printf '#include <%s>\nint kvc_test_nonempty;\n' "$name" | "$CXX" -std=c++17 -Wall -Wextra \
      -Wpedantic -Werror -fsyntax-only -I"$ROOT/include" -x c++ - 2>"$WORK/hdr.log" ||
      { fail "$name alone (C++)"; cat "$WORK/hdr.log"; }
  fi
done
[ -n "$CXX" ] || echo "note: no c++ on PATH: the headers were not compiled as C++"

if [ "$fails" -ne 0 ]; then
  echo "install: $fails check(s) failed (work folder: $WORK)"
  exit 1
fi
echo "install: all checks passed"

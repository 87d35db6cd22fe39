#!/usr/bin/env bash
# Builds the slow-disk fault injector (slow_fsync.c) once, into e2e/.tools/slow, and prints
# the library's path. Needs a C compiler (cc).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/../.tools/slow"
library="$out/libslowfsync.so"
if [ ! -f "$library" ] || [ "$here/slow_fsync.c" -nt "$library" ]; then
  mkdir -p "$out"
  # A name of its own per build, then a rename, so that concurrent callers never load half a file.
  cc -shared -fPIC -O2 -o "$library.$$" "$here/slow_fsync.c" -ldl
  mv -f "$library.$$" "$library"
fi
echo "$(cd "$out" && pwd)/libslowfsync.so"

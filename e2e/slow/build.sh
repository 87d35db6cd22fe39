#!/usr/bin/env bash
# Builds the slow-disk fault injector (slow_fsync.c) once, into e2e/.tools/slow, and prints
# the library's path. Needs a C compiler: without one it installs Debian's gcc (as root).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$here/../.tools/slow"
library="$out/libslowfsync.so"
if [ ! -f "$library" ] || [ "$here/slow_fsync.c" -nt "$library" ]; then
  if ! command -v cc >/dev/null; then
    { apt-get update -qq && apt-get install -y -qq gcc libc6-dev; } >&2
  fi
  mkdir -p "$out"
  # A name of its own per build, then a rename, so that concurrent callers never load half a file.
  cc -shared -fPIC -O2 -o "$library.$$" "$here/slow_fsync.c" -ldl
  mv -f "$library.$$" "$library"
fi
echo "$(cd "$out" && pwd)/libslowfsync.so"

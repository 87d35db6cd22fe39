#!/usr/bin/env bash
# The fault campaign (see README.md): `run.sh` replays the corpus and runs 10 new seeds (what
# .ci/run does); `run.sh --runs 200` is the long campaign, whose table it adds to RESULTS.md.
# Other flags go to ursula-chaos (--first-seed N, --no-shrink, --dry-run). Partitions and full
# disks need root (network namespaces, tmpfs mounts); without it the campaign runs every other
# fault.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
# Clock steps need libfaketime (Debian's faketime package); without it no clock step is drawn.
if ! ls /usr/lib/faketime/libfaketime.so.1 /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 \
  && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  apt-get install -y -q faketime >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q faketime >/dev/null 2>&1; } \
    || echo "could not install faketime: the campaign steps no clock"
fi
# The same build as .ci/run's, so that nothing is compiled again there.
cargo build --quiet --locked --workspace --all-targets
runs=10
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs="$2"; shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
table="$(mktemp)"
trap 'rm -f "$table"' EXIT
status=0
target/debug/ursula-chaos --runs "$runs" --corpus "$here/corpus.txt" --results "$table" "${args[@]}" || status=$?
if [ "$runs" -ge 100 ]; then
  {
    printf '\n## %s: %s seeds\n\n' "$(date -u +%Y-%m-%d)" "$runs"
    cat "$table"
  } >>"$here/RESULTS.md"
fi
exit $status

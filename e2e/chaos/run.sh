#!/usr/bin/env bash
# The fault campaign (see README.md): `run.sh` replays the corpus and runs 10 new seeds (what
# .ci/run does); `run.sh --runs 200` is the long campaign, whose table it adds to RESULTS.md.
# Other flags go to ursula-chaos (--first-seed N, --no-shrink). Partitions need root (network
# namespaces); without it the campaign runs every other fault.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
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

# Sourced by the benchmark scripts: a scratch directory `$work`, and the processes they start
# (`pids+=($!)`), which stop when the script exits. Stopped voters drain first; waiting for
# them lets a next run find the ports free.
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

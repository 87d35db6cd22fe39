#!/usr/bin/env bash
# Runs a command as if on a slow machine with a slow disk:
#   - in a CPU cgroup of its own, limited to URSULA_SLOW_CPU_PERCENT of one core (default 30);
#     cgroup v1's cpu controller (cpu.cfs_quota_us) or, without it, cgroup v2's cpu.max;
#   - with the slow-disk fault injector preloaded (slow_fsync.c, built by build.sh), which adds
#     URSULA_FAULT_FSYNC_DELAY_MS to every fsync/fdatasync and URSULA_FAULT_FSYNC_STALL_MS to
#     every URSULA_FAULT_FSYNC_STALL_EVERY-th one (defaults below).
# The command keeps this script's process ID (exec), so a harness can signal it directly.
#
# Usage: e2e/slow/exec.sh NAME COMMAND [ARGS...]   (NAME: the cgroup, unique among those running)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
name="$1"
shift
percent="${URSULA_SLOW_CPU_PERCENT:-30}"
export URSULA_FAULT_FSYNC_DELAY_MS="${URSULA_FAULT_FSYNC_DELAY_MS:-5}"
export URSULA_FAULT_FSYNC_STALL_MS="${URSULA_FAULT_FSYNC_STALL_MS:-200}"
export URSULA_FAULT_FSYNC_STALL_EVERY="${URSULA_FAULT_FSYNC_STALL_EVERY:-40}"
library="$("$here/build.sh")"

if [ -w /sys/fs/cgroup/cpu ] && [ -e /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]; then
  parent=/sys/fs/cgroup/cpu/ursula-slow
  mkdir -p "$parent"
  # Groups of commands that have ended are empty; rmdir refuses the others.
  find "$parent" -mindepth 1 -maxdepth 1 -type d -exec rmdir {} + 2>/dev/null || true
  mkdir -p "$parent/$name"
  echo 100000 >"$parent/$name/cpu.cfs_period_us"
  echo $((percent * 1000)) >"$parent/$name/cpu.cfs_quota_us"
elif [ -w /sys/fs/cgroup/cgroup.subtree_control ] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
  parent=/sys/fs/cgroup/ursula-slow
  mkdir -p "$parent"
  echo +cpu >"$parent/cgroup.subtree_control" 2>/dev/null || true
  find "$parent" -mindepth 1 -maxdepth 1 -type d -exec rmdir {} + 2>/dev/null || true
  mkdir -p "$parent/$name"
  echo "$((percent * 1000)) 100000" >"$parent/$name/cpu.max"
else
  echo "slow machine: no writable CPU cgroup (v1 /sys/fs/cgroup/cpu or v2 cpu.max); run as root" >&2
  exit 1
fi
echo $$ >"$parent/$name/cgroup.procs"
export LD_PRELOAD="$library${LD_PRELOAD:+:$LD_PRELOAD}"
exec "$@"

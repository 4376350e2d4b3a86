# Shared by the server benchmarks (bench/dns, bench/proxy, bench/ingress): caps the server under
# test with a cgroup-v1 CPU quota, so that on a 2-core machine the server — not the load side on
# the other core — sets the rate, and rate ratios become capacity ratios. Source it, then:
#
#   quota_init TAG PERCENT         validate PERCENT (1-100), check root + cgroup-v1 cpu, make the
#                                  per-run parent /sys/fs/cgroup/cpu/ferry-TAG.<pid>
#   quota_group NAME PID [SHARES]  a child cgroup NAME holding every thread of PID (no quota yet;
#                                  SHARES: its cpu.shares, to win the core against other jobs)
#   quota_set NAME PERCENT|-1      cap NAME at PERCENT of a core per QUOTA_PERIOD_US (10000), or
#                                  lift the cap (-1)
#   quota_throttled NAME           "periods throttled" so far (cpu.stat), for a throttled share
#   quota_run NAME CMD...          CMD started inside NAME
#   quota_cleanup                  every thread back to the root cgroup, the cgroups removed
#                                  (call it from the script's EXIT trap)
#
# QUOTA_CG is empty until quota_init: the other functions are then no-ops (quota_throttled
# prints "0 0", quota_run runs CMD as is), so a script calls them unconditionally.

QUOTA_ROOT=/sys/fs/cgroup/cpu
QUOTA_CG=""
QUOTA_PERIOD_US=${QUOTA_PERIOD_US:-10000}

quota_init() {
  local tag=$1 pct=$2
  case $pct in '' | *[!0-9]*) echo "quota: $pct is not a percentage (1-100)" >&2; return 1 ;; esac
  if [ "$pct" -lt 1 ] || [ "$pct" -gt 100 ]; then echo "quota: $pct is not 1-100" >&2; return 1; fi
  [ -w "$QUOTA_ROOT/cgroup.procs" ] || { echo "quota: needs root and cgroup-v1 cpu at $QUOTA_ROOT" >&2; return 1; }
  QUOTA_CG="$QUOTA_ROOT/ferry-$tag.$$"
  mkdir "$QUOTA_CG"
}

quota_group() {
  local name=$1 pid=$2 shares=${3:-} t
  [ -n "$QUOTA_CG" ] || return 0
  mkdir "$QUOTA_CG/$name"
  if [ -n "$shares" ]; then
    echo "$shares" >"$QUOTA_CG/$name/cpu.shares"
    # The parent must weigh as much as its children together, or they share one weight.
    echo $(($(cat "$QUOTA_CG/cpu.shares") + shares)) >"$QUOTA_CG/cpu.shares"
  fi
  echo "$QUOTA_PERIOD_US" >"$QUOTA_CG/$name/cpu.cfs_period_us"
  echo -1 >"$QUOTA_CG/$name/cpu.cfs_quota_us"
  echo "$pid" >"$QUOTA_CG/$name/cgroup.procs" # the whole thread group
  for t in /proc/"$pid"/task/*; do echo "${t##*/}" >"$QUOTA_CG/$name/tasks"; done
  for t in /proc/"$pid"/task/*; do
    grep -qx "${t##*/}" "$QUOTA_CG/$name/tasks" || { echo "quota: thread ${t##*/} of $name escaped" >&2; return 1; }
  done
}

quota_set() {
  [ -n "$QUOTA_CG" ] || return 0
  if [ "$2" = -1 ]; then
    echo -1 >"$QUOTA_CG/$1/cpu.cfs_quota_us"
  else
    echo $((QUOTA_PERIOD_US * $2 / 100)) >"$QUOTA_CG/$1/cpu.cfs_quota_us"
  fi
}

quota_throttled() {
  if [ -n "$QUOTA_CG" ]; then
    awk '$1 == "nr_periods" {p = $2} $1 == "nr_throttled" {t = $2} END {print p + 0, t + 0}' "$QUOTA_CG/$1/cpu.stat"
  else
    echo 0 0
  fi
}

quota_run() {
  local name=$1
  shift
  if [ -n "$QUOTA_CG" ]; then
    sh -c 'echo $$ >"$1" && shift && exec "$@"' sh "$QUOTA_CG/$name/cgroup.procs" "$@"
  else
    "$@"
  fi
}

quota_cleanup() {
  local d t
  [ -n "$QUOTA_CG" ] && [ -d "$QUOTA_CG" ] || return 0
  for d in "$QUOTA_CG"/*/; do
    [ -f "$d/cgroup.procs" ] || continue
    while read -r t; do echo "$t" >"$QUOTA_ROOT/cgroup.procs" 2>/dev/null || true; done <"$d/cgroup.procs"
    rmdir "$d" 2>/dev/null || true
  done
  rmdir "$QUOTA_CG" 2>/dev/null || echo "warning: could not remove $QUOTA_CG" >&2
}

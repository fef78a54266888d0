#!/usr/bin/env bash
# Whether two squish-sim binaries decide the same: every workload in
# bench/workloads/ (or those given) under each policy at scales 0.5, 1 and
# 1.5, with --dump (every request's outcome and finish, every batch's device,
# start and size), compared after taking out the CPU fields (measured, not
# simulated). For a change to the dispatcher core that must not change a
# decision (a faster data structure):
#   bench/sim/same_decisions.sh /tmp/squish-sim-before build/bench/squish-sim
# SCALES="1" (default "0.5 1 1.5") and SIM_ARGS="--duration 2" (passed to
# both) shorten it: a --dump of a million requests takes a while.
# Prints one line per run and "same: N of N"; exit status 1 on any difference.
set -uo pipefail
if [ $# -lt 2 ]; then
  echo "usage: $0 SIM_A SIM_B [WORKLOAD.json...]" >&2
  exit 2
fi
a=$1
b=$2
shift 2
cd "$(dirname "$0")/../.."
if [ $# -eq 0 ]; then
  set -- bench/workloads/*.json
fi
strip() { grep -v -E '^  "cpu_(s|us_per_request)":' | sha256sum | cut -d' ' -f1; }
n=0
same=0
for w in "$@"; do
  for p in deferred adaptive early-drop; do
    for x in ${SCALES:-0.5 1 1.5}; do
      n=$((n + 1))
      ha=$("$a" "$w" --policy "$p" --scale "$x" ${SIM_ARGS:-} --dump | strip)
      hb=$("$b" "$w" --policy "$p" --scale "$x" ${SIM_ARGS:-} --dump | strip)
      if [ "$ha" = "$hb" ]; then
        same=$((same + 1))
        echo "same    $w $p x$x"
      else
        echo "DIFFER  $w $p x$x"
      fi
    done
  done
done
echo "same: $same of $n"
[ "$same" -eq "$n" ]

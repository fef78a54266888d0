#!/bin/sh
# CPU backend benchmark: squish (oneDNN) and torch side by side, in the same
# run, alternating per model and round so that both see the same machine
# load. Results: one JSON line per (engine, model, batch, round) on stdout,
# then a summary of medians across rounds.
#
#   bench/cpu_bench.sh BUILD_DIR [ROUNDS] [ITERS] [THREADS]
#
# Models come from scripts/export_models.py (exported into
# BUILD_DIR/tests/models if missing).
set -eu
build=${1:?usage: bench/cpu_bench.sh BUILD_DIR [ROUNDS] [ITERS] [THREADS]}
rounds=${2:-3}
iters=${3:-20}
threads=${4:-2}
src=$(cd "$(dirname "$0")/.." && pwd)
models_dir=$build/tests/models
models="resnet18 mobilenet_v2 squeezenet1_1 googlenet"
[ -f "$models_dir/models.stamp" ] || /usr/bin/python3 "$src/scripts/export_models.py" "$models_dir" >&2
out=$(mktemp)
echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) cpus: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" >&2
r=1
while [ "$r" -le "$rounds" ]; do
    for m in $models; do
        "$build/bench/squish-cpu-bench" --threads "$threads" --iters "$iters" \
            "$models_dir/$m.onnx" | sed "s/}\$/, \"round\": $r}/" | tee -a "$out"
        /usr/bin/python3 "$src/bench/torch_bench.py" --threads "$threads" --iters "$iters" "$m" \
            2>/dev/null | sed "s/}\$/, \"round\": $r}/" | tee -a "$out"
    done
    r=$((r + 1))
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
keys = sorted({(r["model"], r["batch"]) for r in rows})
print("\n| model | batch | squish ms | squish img/s | squish CPU ms | torch ms | torch img/s | torch CPU ms | speedup (wall) | speedup (CPU) |")
print("|---|---|---|---|---|---|---|---|---|---|")
for m, b in keys:
    def med(engine, key):
        v = [r[key] for r in rows if r["model"] == m and r["batch"] == b and r["engine"] == engine]
        return statistics.median(v) if v else float("nan")
    s, t = med("squish", "median_ms"), med("torch", "median_ms")
    sc, tc = med("squish", "cpu_ms"), med("torch", "cpu_ms")
    print("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx |" % (
        m, b, s, b * 1000 / s, sc, t, b * 1000 / t, tc, t / s, tc / sc))
PY
rm -f "$out"

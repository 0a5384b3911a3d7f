#!/usr/bin/env bash
# Profiles of the per-command hot path on the GPU machine, and the driver's floor.
# Run there as: scripts/gpu-check benchmarks/profile_gpu.sh   (carry .whl with py-spy)
# Leaves $OUT/profiles.tgz (timings, layer breakdown, cProfile and py-spy summaries).
cd "$(dirname "$0")/.." || exit 2
P="${OUT:-/tmp/asynccube-out}/prof"
mkdir -p "$P"
H=benchmarks/profile_hot_path.py
for loop in asyncio uvloop; do
    python3 $H --loop $loop --breakdown 2>&1 | tee "$P/times-$loop.txt"
    python3 $H --loop $loop --cprofile "$P" 2>&1 | tee -a "$P/times-$loop.txt"
done
SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
for sc in execute_unchecked execute_checked read_1KiB sync_after_launch empty_drop_1MiB; do
    for loop in asyncio uvloop; do
        timeout 60 "$SPY" record --native -r 997 -f raw -o "$P/pyspy-$loop-$sc.raw" -- \
            python3 $H --loop $loop --only $sc --seconds 3 >"$P/pyspy-$loop-$sc.log" 2>&1 \
            && python3 $H --fold "$P/pyspy-$loop-$sc.raw" >"$P/pyspy-$loop-$sc.txt"
        tail -3 "$P/pyspy-$loop-$sc.log"
    done
done
python3 - <<'PY' 2>&1 | tee "$P/floor.txt"
import json, sys
sys.argv = ["x"]
sys.path.insert(0, "benchmarks")
import bench_cuda, _floor
g = bench_cuda.Gpu()
print(json.dumps(_floor.c_floor(g.cubin)))
print(json.dumps(_floor.extension_call_floor(g.cubin)))
PY
tar czf "${OUT:-/tmp/asynccube-out}/profiles.tgz" -C "$(dirname "$P")" prof
ls -la "$P" | head -50

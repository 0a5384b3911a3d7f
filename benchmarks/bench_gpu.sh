#!/usr/bin/env bash
# Every GPU figure of issue 11 in one call on the GPU machine:
#     scripts/gpu-check benchmarks/bench_gpu.sh      (tool `run`, carry .whl)
# 1. the code before issue 11 (its src/ copied to baseline/src, when present) and
# 2. the pure-Python fallback (ASYNCCUBE_NO_EXTENSIONS=1): bench_cuda's client section;
# 3. bench_cuda.py, all figures beside their floors and peers (compiled hot path);
# 4. bench_service.py on the GPU, asyncio and uvloop, then with --admit 4 (every server
#    lets at most 4 requests into its handler: results/service_admit4);
# 5. with PROFILE="scenario ...": py-spy --native profiles of profile_hot_path.py scenarios.
# SKIP="baseline fallback cuda service admit" leaves parts out (one call has 10 minutes).
# Leaves $OUT/results.tgz (benchmarks/results/ and the logs); then, here:
#     tar xzf results.tgz -C benchmarks && python benchmarks/report.py
cd "$(dirname "$0")/.." || exit 2
OUT="${OUT:-/tmp/asynccube-out}"
mkdir -p "$OUT"
L=/tmp/bench-logs  # packed into $OUT/results.tgz (few files come back from $OUT)
mkdir -p "$L"
B=benchmarks/bench_cuda.py
SECTIONS=${SECTIONS:-"abi floor launch completion storage client"}
skip() { case " ${SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
if [ -d baseline/src ] && ! skip baseline; then
    ASYNCCUBE_BENCH_SRC="$PWD/baseline/src" timeout 120 python3 $B client \
        --results cuda_baseline >"$L/baseline.log" 2>&1
    echo "baseline rc=$?"; grep -E "client \(asyncio\): (execute|read_1KiB|sync|alloc)" "$L/baseline.log"
fi
if ! skip fallback; then
    ASYNCCUBE_NO_EXTENSIONS=1 timeout 120 python3 $B client --results cuda_fallback >"$L/fallback.log" 2>&1
    echo "fallback rc=$?"; grep -E "hot_path|client \(asyncio\): (execute|read_1KiB|sync|alloc)" "$L/fallback.log" | cut -c1-160
fi
if ! skip cuda; then
    # shellcheck disable=SC2086
    timeout 240 python3 $B $SECTIONS >"$L/cuda.log" 2>&1
    echo "bench_cuda rc=$?"
fi
if ! skip service; then
    timeout 300 python3 benchmarks/bench_service.py --device cuda:0 --procs 4 \
        --seconds "${SERVICE_SECONDS:-3}" --warmup 1.5 >"$L/service.log" 2>&1
    echo "bench_service rc=$?"
fi
if ! skip admit; then
    timeout 300 python3 benchmarks/bench_service.py --device cuda:0 --procs 4 --admit 4 \
        --seconds "${SERVICE_SECONDS:-3}" --warmup 1.5 >"$L/service_admit.log" 2>&1
    echo "bench_service --admit 4 rc=$?"
fi
if [ -n "${PROFILE:-}" ]; then  # py-spy --native of the hot path as it is now (asyncio)
    SPY=$(command -v py-spy || echo /tmp/site/bin/py-spy)
    H=benchmarks/profile_hot_path.py
    for sc in $PROFILE; do
        timeout 60 "$SPY" record --native -r 997 -f raw -o "$L/pyspy-$sc.raw" -- \
            python3 $H --only "$sc" --seconds 2 >"$L/pyspy-$sc.log" 2>&1 &&
            python3 $H --fold "$L/pyspy-$sc.raw" >"$L/pyspy-$sc.txt"
        rm -f "$L/pyspy-$sc.raw"
    done
fi
tar czf "$OUT/results.tgz" -C benchmarks results -C /tmp bench-logs
[ -f "$L/cuda.log" ] && sed -n '/^## CUDA hot path/,$p' "$L/cuda.log"
for log in "$L/service.log" "$L/service_admit.log"; do
    [ -f "$log" ] || continue
    grep -E "^(asyncio|uvloop) " "$log" | cut -c1-200
    sed -n '/^| server loop/,/^$/p' "$log"
done

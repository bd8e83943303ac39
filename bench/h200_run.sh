#!/usr/bin/env bash
# The GPU run behind results/h200/: step 04's GPU tests and the contract on every step, step 04's
# memory figures, then `python -m bench` (leaderboard, FlashAttention's grid, the CS336 sweep).
# Each part has its own time limit so one slow part cannot take the others' results with it.
# Usage (on a GPU machine): OUT=out/h200 bash bench/h200_run.sh
set -uo pipefail
OUT=${OUT:-out/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PY:-python3}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
timeout 140 $PY -m pytest --impl solutions tests/test_step04_flash_torch.py tests/test_contract.py \
    -q -p no:cacheprovider 2>&1 | tee "$OUT/tests.log" | tail -4
timeout 90 $PY bench/step04_figures.py --out "$OUT/step04" 2>&1 | tee "$OUT/step04.log" | tail -30
timeout 50 $PY -m bench leaderboard --out "$OUT/bench_lb" --budget-s 25 2>&1 | tail -14
timeout 200 $PY -m bench grid --out "$OUT/bench_grid" --budget-s 150 2>&1 | tee "$OUT/grid.log" | grep -E "ceilings|sdpa-flash|step0[567] " | tail -40
timeout 80 $PY -m bench sweep --out "$OUT/bench_sweep" --budget-s 50 2>&1 | tee "$OUT/sweep.log" | tail -3
tar czf "$OUT/h200.tgz" -C "$OUT" --exclude h200.tgz . && ls -la "$OUT"

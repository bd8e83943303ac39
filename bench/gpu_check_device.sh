#!/usr/bin/env bash
# The whole `make gpu-check` on the course's lent H200 in one command: that machine runs a command for at
# most 10 minutes and sends back at most 8 files, and its copy of .git is not the commit you sent.
#
#   device `run`, carry [".whl"]:  GPU_CHECK_COMMIT=<full sha> bash bench/gpu_check_device.sh
#   here, after it:                python -m bench.gpu_check_import <files_at>/gc.tgz
#
# It prepares the machine (bench/device_setup.sh), runs the three parts at GPU_CHECK_COMMIT (at ab83369:
# 455 s with setup; the tests get 440 s), and archives the whole --out folder into $OUT/gc.tgz.
set -u
cd "$(dirname "$0")/.."
: "${GPU_CHECK_COMMIT:?set GPU_CHECK_COMMIT to the full sha of the commit whose working tree this is}"
: "${OUT:?OUT: the folder whose files come back (the device tool sets it)}"
GC=${GPU_CHECK_DIR:-/tmp/gc}
rm -rf "$GC"
mkdir -p "$GC"
bash bench/device_setup.sh > "$GC/setup.log" 2>&1 || { echo "device_setup failed:"; tail -20 "$GC/setup.log"; }
timeout "${GPU_CHECK_TIMEOUT_S:-540}" python3 -m bench.gpu_check --out "$GC" \
    --tests-budget-s "${GPU_CHECK_TESTS_BUDGET_S:-440}" > "$GC/gc_run.log" 2>&1
rc=$?
tar czf "$OUT/gc.tgz" -C "$(dirname "$GC")" "$(basename "$GC")"
grep "^\[gpu-check" "$GC/gc_run.log"
python3 - "$GC/summary.json" <<'PYEOF'
import json, sys
try:
    s = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit(f"no summary: {e}")
p = s.get("pytest") or {}
print("complete:", s.get("complete"), "| pytest passed", p.get("passed"), "failed", p.get("failed"),
      "errors", p.get("errors"), "| not passing:", p.get("not_passing"),
      "| solutions", (s.get("grade_solutions") or {}).get("points"), "stubs", (s.get("grade_stubs") or {}).get("points"),
      "| CS336 harness", (s.get("leaderboard_ms") or {}).get("cs336_harness"))
PYEOF
exit $rc

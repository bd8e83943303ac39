#!/usr/bin/env bash
# Try the autograder zip as Gradescope would, in a stock Ubuntu 22.04 (Python 3.10) root made
# by debootstrap, where no container engine runs. As root, with the network:
#
#     grading/gradescope/try_in_chroot.sh [ROOT]        # default ROOT: /tmp/attn-jammy
#
# 1. debootstrap jammy into ROOT (once; reused after), with the sources of Docker's ubuntu:22.04
#    image (main restricted universe multiverse, -updates, -security);
# 2. unzip `python -m grading autograder` into ROOT/autograder/source and run setup.sh as shipped;
# 3. grade three submissions with run_autograder -- steps 01-02 solved (a zip of the whole course:
#    attention-course/steps/), the pristine stubs, and nothing -- and check each results.json:
#    valid, step 02 passed (torch.compile found Python.h and a compiler), stubs 0, nothing 0
#    with the files it saw listed.
#
# PIP_CERT (a CA bundle on the host) is copied in and passed on when set: for networks that
# inspect TLS. AUTOGRADER_CONFIG=FILE ships FILE as grading/config.toml (`autograder --config`):
# where PyTorch's CPU index cannot be reached, setup.sh installs PyPI's CUDA build, which needs
# memory_mb = 16384. The bind mounts of /proc, /dev and /sys are undone on exit.
set -euo pipefail
HERE="$(cd "$(dirname "$0")/../.." && pwd)"
ROOT="${1:-/tmp/attn-jammy}"
PY="${PYTHON:-python3}"

if [ ! -x "$ROOT/usr/bin/apt-get" ]; then
    command -v debootstrap >/dev/null || { echo "needs debootstrap (apt-get install debootstrap)" >&2; exit 2; }
    debootstrap --variant=minbase jammy "$ROOT" http://archive.ubuntu.com/ubuntu
fi
printf '%s\n' "deb http://archive.ubuntu.com/ubuntu jammy main restricted universe multiverse" \
    "deb http://archive.ubuntu.com/ubuntu jammy-updates main restricted universe multiverse" \
    "deb http://security.ubuntu.com/ubuntu jammy-security main restricted universe multiverse" \
    > "$ROOT/etc/apt/sources.list"
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
for d in proc dev sys; do mountpoint -q "$ROOT/$d" || mount --bind "/$d" "$ROOT/$d"; done
trap 'for d in sys dev proc; do umount "$ROOT/$d" 2>/dev/null || true; done' EXIT

ENV=(PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8)
if [ -n "${PIP_CERT:-}" ]; then cp "$PIP_CERT" "$ROOT/tmp/pip-ca.crt"; ENV+=(PIP_CERT=/tmp/pip-ca.crt); fi
in_root() { chroot "$ROOT" /usr/bin/env -i "${ENV[@]}" "$@"; }

rm -rf "$ROOT/autograder"
mkdir -p "$ROOT/autograder/source"
(cd "$HERE" && "$PY" -m grading autograder --out "$ROOT/tmp/autograder.zip" \
    ${AUTOGRADER_CONFIG:+--config "$AUTOGRADER_CONFIG"})
(cd "$ROOT/autograder/source" && "$PY" -m zipfile -e "$ROOT/tmp/autograder.zip" . && chmod +x setup.sh run_autograder \
    && cp setup.sh run_autograder ..)
in_root bash /autograder/source/setup.sh

grade() {     # grade NAME: grade ROOT/tmp/submissions/NAME; its results.json lands beside it
    rm -rf "$ROOT/autograder/submission" "$ROOT/autograder/results"
    cp -r "$ROOT/tmp/submissions/$1" "$ROOT/autograder/submission"
    in_root bash /autograder/run_autograder
    cp "$ROOT/autograder/results/results.json" "$ROOT/tmp/submissions/$1.json"
}
rm -rf "$ROOT/tmp/submissions" && mkdir -p "$ROOT/tmp/submissions/"{solved/attention-course/steps,stubs,nothing}
cp "$HERE"/solutions/step0[12]_*.py "$ROOT/tmp/submissions/solved/attention-course/steps/"
cp "$HERE"/steps/step0*.py "$ROOT/tmp/submissions/stubs/"
echo "my answers are in the email" > "$ROOT/tmp/submissions/nothing/README.txt"
for s in solved stubs nothing; do grade "$s"; done

"$PY" - "$ROOT/tmp/submissions" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
res = {n: json.loads((d / f"{n}.json").read_text()) for n in ("solved", "stubs", "nothing")}
for n, r in res.items():
    assert isinstance(r["score"], (int, float)) and isinstance(r["tests"], list) and r["tests"], (n, r)
    for t in r["tests"]:
        assert {"name", "score", "max_score", "output", "visibility"} <= set(t), (n, t)
    print(f"{n:8s} score {r['score']:6.2f}  " + ", ".join(f"{k}: {v['status']}" for k, v in r["extra_data"]["steps"].items()))
steps = res["solved"]["extra_data"]["steps"]
assert steps["step02_compile"]["status"] == "passed", steps["step02_compile"]
assert steps["step01_naive"]["status"] == "passed" and res["solved"]["score"] == 20, res["solved"]["score"]
assert res["stubs"]["score"] == 0 and res["nothing"]["score"] == 0
assert "It saw: README.txt" in res["nothing"]["output"], res["nothing"]["output"]
print("the autograder zip works on a stock Ubuntu 22.04 root: step 02 compiles and passes")
PY

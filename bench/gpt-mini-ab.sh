#!/usr/bin/env bash
# GPT-mini step time of two builds in interleaved pairs (issue 26's "no slower than before"):
# `lockstep-bench gpt --model=gpt-mini --steps=5 --reps=3` (8 x 256 tokens, forward + loss +
# backward) for each precision and thread count, the order alternating from pair to pair, and per
# pair the ratio after/before of the median step time and of the process's CPU time.
#   bench/gpt-mini-ab.sh BEFORE_BUILD_DIR AFTER_BUILD_DIR
#   PAIRS=8 CONFIGS="fp32:2 bf16:1" bench/gpt-mini-ab.sh ../old/build build
# On a shared machine: setsid bash -c 'echo -15 > /proc/self/autogroup; bench/gpt-mini-ab.sh ...'.
# Prints one line per run and a summary per configuration; writes nothing else.
set -euo pipefail
[ $# -eq 2 ] || { sed -n '2,8p' "$0" >&2; exit 2; }
BEFORE=$1/apps/lockstep-bench
AFTER=$2/apps/lockstep-bench
for b in "$BEFORE" "$AFTER"; do [ -x "$b" ] || { echo "gpt-mini-ab.sh: no $b (build first)" >&2; exit 1; }; done
PAIRS=${PAIRS:-5}
CONFIGS=${CONFIGS:-"fp32:1 fp32:2 bf16:1 bf16:2"}
LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
for cfg in $CONFIGS; do
  prec=${cfg%:*} threads=${cfg#*:}
  for i in $(seq 1 "$PAIRS"); do
    order="before after"; (( i % 2 )) || order="after before"
    for which in $order; do
      bin=$BEFORE; [ "$which" = after ] && bin=$AFTER
      out=$( { /usr/bin/time -f "cpu %U %S" "$bin" gpt --model=gpt-mini --steps=5 --reps=3 \
        --threads="$threads" --precision="$prec" 2>&1; } 2>&1 | tr '\n' ' ')
      ms=$(grep -o '"step_ms": [0-9.]*' <<<"$out" | awk '{print $2}')
      loss=$(grep -o '"loss": [0-9][0-9.]*' <<<"$out" | awk '{print $NF}')
      cpu=$(grep -o 'cpu [0-9.]* [0-9.]*' <<<"$out" | awk '{print $2 + $3}')
      echo "$prec $threads $i $which $ms $cpu $loss $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$LOG"
    done
  done
done
python3 - "$LOG" <<'PY'
import statistics as st, sys
runs = {}
for line in open(sys.argv[1]):
    prec, threads, pair, which, ms, cpu, loss, load = line.split()
    runs.setdefault((prec, threads), {}).setdefault(pair, {})[which] = (float(ms), float(cpu), loss)
print("| precision, threads | pairs | before ms (tokens/s) | after | after/before (range) | CPU after/before |")
print("|---|---:|---:|---:|---:|---:|")
for (prec, threads), pairs in runs.items():
    p = [v for v in pairs.values() if "before" in v and "after" in v]
    r = [v["after"][0] / v["before"][0] for v in p]
    c = [v["after"][1] / v["before"][1] for v in p]
    b = st.median(v["before"][0] for v in p); a = st.median(v["after"][0] for v in p)
    print(f"| {prec}, {threads} | {len(p)} | {b:.1f} ({2048e3 / b:.0f}) | {a:.1f} ({2048e3 / a:.0f}) "
          f"| {st.median(r):.2f} ({min(r):.2f}-{max(r):.2f}) | {st.median(c):.2f} |")
PY

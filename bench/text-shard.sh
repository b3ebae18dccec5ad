#!/usr/bin/env bash
# lockstep-shard text against tiktoken, its peer, in one run on one machine (issue 28's targets):
#   1. GPT-2 encoding throughput of one thread: `lockstep-shard text --threads=1` end to end
#      (vocabulary load, reading, shards written and read back for the statistics included)
#      against tiktoken's encode_ordinary on the same text (encoding only); median of 3 each.
#   2. the same with 2 threads, against tiktoken's one thread (the target) and against its
#      encode_ordinary_batch with 2 threads over the paragraphs.
#   3. peak RSS (/usr/bin/time -v) of a 2-thread GPT-2 run over a generated corpus of SIZE_GB
#      (the sample repeated, each copy numbered), at the default --memory=256MiB.
#   4. the shards of 1, 2 and 4 MPI ranks x 1 and 2 threads, compared byte for byte.
# The sample (about 24 MB): the King James Bible, Debian's licences and man pages (roff source),
# made UTF-8. Needs LOCKSTEP_TIKTOKEN_PYTHON (a Python with tiktoken) and GPT-2's vocabulary
# (scripts/install-deps.sh --gpt2); tiktoken reads the same local rank file (no network).
#   bench/text-shard.sh                       build/, SIZE_GB=2, results in results/text-shard/
#   BUILD=build-cpu SIZE_GB=0.5 bench/text-shard.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build}
SIZE_GB=${SIZE_GB:-2}
OUT=${OUT:-$ROOT/results/text-shard}
PY=${LOCKSTEP_TIKTOKEN_PYTHON:?point LOCKSTEP_TIKTOKEN_PYTHON at a Python with tiktoken}
GPT2=${LOCKSTEP_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/gpt2}
SHARD=$BUILD/apps/lockstep-shard
[ -x "$SHARD" ] || { echo "text-shard.sh: no $SHARD (build first)" >&2; exit 1; }
[ -f "$GPT2/gpt2.tiktoken" ] || { echo "text-shard.sh: no $GPT2/gpt2.tiktoken (scripts/install-deps.sh --gpt2)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-text-bench.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$OUT"
SUMMARY=$OUT/summary.md

{
  cat "$ROOT/data/kjv/kjv.txt" 2>/dev/null || bible -f Gen1:1-Rev22:21 </dev/null
  cat /usr/share/common-licenses/*
  find /usr/share/man/man1 -name '*.gz' | sort | xargs zcat 2>/dev/null || true
} >"$WORK/raw.txt"
# The first 24 MB, what is not UTF-8 dropped, ending at a line.
python3 - "$WORK/raw.txt" "$WORK/sample.txt" <<'EOF'
import sys
text = open(sys.argv[1], "rb").read()[:24_000_000].decode("utf-8", "ignore")
open(sys.argv[2], "w", encoding="utf-8").write(text[:text.rindex("\n") + 1])
EOF
rm "$WORK/raw.txt"
SAMPLE_BYTES=$(wc -c <"$WORK/sample.txt")

median() { sort -g | sed -n 2p; }
# Seconds of one run of lockstep-shard text over the sample.
ours() {  # threads
  local t0 t1
  t0=$(date +%s.%N)
  "$SHARD" text --input="$WORK/sample.txt" --documents=paragraph --tokenizer=gpt2 --gpt2-dir="$GPT2" \
    --threads="$1" --out="$WORK/ours" --overwrite >/dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
mbs() { echo "scale=2; $SAMPLE_BYTES / $1 / 1000000" | bc -l; }

{
  echo "# bench/text-shard.sh: GPT-2 encoding, lockstep-shard text vs tiktoken"
  echo
  echo "$(date -u +%FT%TZ) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs; uptime at start: $(uptime)"
  echo "tiktoken $("$PY" -c 'import tiktoken; print(tiktoken.__version__)'); sample $SAMPLE_BYTES bytes"
  echo
} >"$SUMMARY"

# 1 and 2: three rounds, ours and tiktoken's interleaved, so both see the same machine load.
one=() two=() tk_one=() tk_batch=()
for round in 1 2 3; do
  one+=("$(ours 1)")
  two+=("$(ours 2)")
  res=$(TIKTOKEN_CACHE_DIR="" "$PY" "$ROOT/bench/text_tiktoken.py" "$WORK/sample.txt" "$GPT2" 2 1)
  tk_one+=("$(sed -n 's/^tiktoken encode_ordinary, 1 thread: \([0-9.]*\) MB\/s.*/\1/p' <<<"$res")")
  tk_batch+=("$(sed -n 's/^tiktoken encode_ordinary_batch, 2 threads: \([0-9.]*\) MB\/s.*/\1/p' <<<"$res")")
done
ours1=$(mbs "$(printf '%s\n' "${one[@]}" | median)")
ours2=$(mbs "$(printf '%s\n' "${two[@]}" | median)")
tk1=$(printf '%s\n' "${tk_one[@]}" | median)
tkb=$(printf '%s\n' "${tk_batch[@]}" | median)
{
  echo "| encoder | threads | MB/s (median of 3) | vs tiktoken encode_ordinary |"
  echo "|---|---|---|---|"
  echo "| tiktoken encode_ordinary | 1 | $tk1 | 1.00x |"
  echo "| tiktoken encode_ordinary_batch (paragraphs) | 2 | $tkb | $(echo "scale=2; $tkb / $tk1" | bc -l)x |"
  echo "| lockstep-shard text (end to end) | 1 | $ours1 | $(echo "scale=2; $ours1 / $tk1" | bc -l)x |"
  echo "| lockstep-shard text (end to end) | 2 | $ours2 | $(echo "scale=2; $ours2 / $tk1" | bc -l)x |"
  echo
  echo "runs (s): ours 1 thread ${one[*]}; ours 2 threads ${two[*]}; tiktoken MB/s ${tk_one[*]}, batch ${tk_batch[*]}"
  echo
} >>"$SUMMARY"

# 4: ranks x threads, byte for byte (before the large corpus, which takes longest).
"$SHARD" text --input="$WORK/sample.txt" --documents=paragraph --tokenizer=gpt2 --gpt2-dir="$GPT2" \
  --shards=4 --val-fraction=0.01 --out="$WORK/ref" >/dev/null
ref=$(cd "$WORK/ref" && sha256sum -- *.h5)
identity="identical"
for np in 1 2 4; do
  for t in 1 2; do
    mpirun --oversubscribe --bind-to none -np $np "$SHARD" text --input="$WORK/sample.txt" \
      --documents=paragraph --tokenizer=gpt2 --gpt2-dir="$GPT2" --shards=4 --val-fraction=0.01 \
      --threads=$t --out="$WORK/np$np-t$t" >/dev/null
    [ "$(cd "$WORK/np$np-t$t" && sha256sum -- *.h5)" = "$ref" ] || identity="DIFFERENT at $np ranks x $t threads"
  done
done
{
  echo "ranks x threads (1, 2, 4 x 1, 2; 4 train + 1 val shards of the sample): $identity"
  echo '```'
  echo "$ref"
  echo '```'
  echo
} >>"$SUMMARY"

# 3: peak RSS over SIZE_GB of text, generated from the sample.
target=$(echo "$SIZE_GB * 1000000000 / 1" | bc)
copy=0
while [ "$(stat -c %s "$WORK/big.txt" 2>/dev/null || echo 0)" -lt "$target" ]; do
  copy=$((copy + 1))
  { echo "Copy $copy."; echo; cat "$WORK/sample.txt"; echo; } >>"$WORK/big.txt"
done
BIG_BYTES=$(stat -c %s "$WORK/big.txt")
/usr/bin/time -v "$SHARD" text --input="$WORK/big.txt" --documents=paragraph --tokenizer=gpt2 \
  --gpt2-dir="$GPT2" --threads=2 --shards=8 --val-fraction=0.005 --out="$WORK/big" \
  >"$WORK/big.log" 2>"$WORK/big.time"
rss_kb=$(sed -n 's/.*Maximum resident set size (kbytes): //p' "$WORK/big.time")
wall=$(sed -n 's/.*Elapsed (wall clock) time (h:mm:ss or m:ss): //p' "$WORK/big.time")
{
  echo "peak RSS, 2 threads, --memory=256MiB (default), $BIG_BYTES bytes ($copy copies of the sample), 8+1 shards:"
  echo "$((rss_kb / 1024)) MiB, wall $wall"
  echo '```'
  head -4 "$WORK/big.log"
  echo '```'
} >>"$SUMMARY"
cat "$SUMMARY"

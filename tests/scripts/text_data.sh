#!/usr/bin/env bash
# Text data end to end: scripts/make-text-data.sh shards the King James Bible (Debian's bible-kjv)
# with the bytes tokenizer, and with GPT-2's when its vocabulary is present (else it says so),
# inspect reads the shards back (tokens, tokenizer, a decoded preview, the unigram baseline), and
# lockstep-shard text refuses bad input with an error naming the file: text that is not UTF-8, an
# empty corpus, a missing GPT-2 vocabulary; and shards an earlier run left in --out that the new
# run would not replace (a validation split, another shard count), unless --overwrite.
# Usage: bash tests/scripts/text_data.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: text_data.sh BUILD_DIR}" && pwd)
SOURCE=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
SHARD=$BUILD/apps/lockstep-shard
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v bible >/dev/null || { echo "SKIP: the bible-kjv package is missing (scripts/install-deps.sh)"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-text.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

LOCKSTEP_BUILD_DIR=$BUILD bash "$SOURCE/scripts/make-text-data.sh" "$WORK/data" >"$WORK/make.log" 2>&1 ||
  { cat "$WORK/make.log"; fail "make-text-data.sh failed"; }
cat "$WORK/make.log"
for f in train-00000-of-00004.h5 train-00003-of-00004.h5 val-00000-of-00001.h5; do
  [ -f "$WORK/data/kjv/$f" ] || fail "make-text-data.sh wrote no $WORK/data/kjv/$f"
done
grep -q '^val: .* 59 documents' "$WORK/make.log" || fail "the validation split is not 59 chapters"

"$SHARD" inspect "$WORK/data/kjv/val" >"$WORK/inspect.log" 2>&1 || { cat "$WORK/inspect.log"; fail "inspect failed"; }
cat "$WORK/inspect.log"
grep -q '^kind: *tokens' "$WORK/inspect.log" || fail "inspect does not say the set holds tokens"
grep -q '^tokenizer: *bytes' "$WORK/inspect.log" || fail "inspect does not name the tokenizer"
grep -q '^vocabulary: *256' "$WORK/inspect.log" || fail "inspect does not give the vocabulary"
grep -q '^unigram entropy: *[0-9.]* nats/token' "$WORK/inspect.log" || fail "inspect gives no unigram entropy"
# Every chapter starts with end-of-text (shown as \x00); the validation split's first is the 20th,
# Genesis 20, "And Abraham journeyed from thence toward the south country".
grep -q '^decoded: *\\x00And Abraham journeyed from thence' "$WORK/inspect.log" ||
  fail "the decoded preview is not Genesis 20"
h=$(sed -n 's/^unigram entropy: *\([0-9.]*\).*/\1/p' "$WORK/inspect.log")
awk -v h="$h" 'BEGIN { exit !(h > 2.5 && h < 3.5) }' || fail "unigram entropy $h of English bytes is not near 3 nats"

# ---- GPT-2's shards, from gpt2.tiktoken (scripts/install-deps.sh --gpt2), when it is there.
GPT2=${LOCKSTEP_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/gpt2}
if [ -f "$GPT2/gpt2.tiktoken" ] || { [ -f "$GPT2/encoder.json" ] && [ -f "$GPT2/vocab.bpe" ]; }; then
  "$SHARD" inspect "$WORK/data/kjv-gpt2/val" >"$WORK/inspect-gpt2.log" 2>&1 ||
    { cat "$WORK/make.log" "$WORK/inspect-gpt2.log"; fail "make-text-data.sh made no kjv-gpt2 with the vocabulary in $GPT2"; }
  cat "$WORK/inspect-gpt2.log"
  grep -q '^tokenizer: *gpt2' "$WORK/inspect-gpt2.log" || fail "kjv-gpt2 is not tokenized with gpt2"
  grep -q '^vocabulary: *50257' "$WORK/inspect-gpt2.log" || fail "kjv-gpt2's vocabulary is not 50257"
  # "<|endoftext|>And Abraham journeyed": end-of-text 50256, then GPT-2's ids of the verse.
  grep -q '^first 64 ids: *50256 1870 16660 7002 276 422 41952 3812 262 5366 1499 ' "$WORK/inspect-gpt2.log" ||
    fail "kjv-gpt2's validation split does not start with Genesis 20 in GPT-2's ids"
else
  grep -q "GPT-2 vocabulary not found: skipped" "$WORK/make.log" || fail "make-text-data.sh did not say it skipped kjv-gpt2"
  echo "note: no GPT-2 vocabulary in $GPT2: kjv-gpt2 not checked (scripts/install-deps.sh --gpt2)"
fi

# ---- a second run into the same --out: what the first left and the second would not replace is
# refused, naming the files, before any work; --overwrite removes it once the new set is written.
OUT=$WORK/data/kjv
expect_stale() {  # description, stale files..., -- command args
  local what=$1
  shift
  local files=()
  while [ "$1" != -- ]; do files+=("$1"); shift; done
  shift
  if "$SHARD" text --input="$OUT/kjv.txt" --documents=paragraph --out="$OUT" "$@" >"$WORK/err.log" 2>&1; then
    fail "$what: a second run into $OUT succeeded, leaving ${files[*]}"
  fi
  for f in "${files[@]}"; do
    grep -qF "$OUT/$f" "$WORK/err.log" || { cat "$WORK/err.log"; fail "$what: the error does not name $f"; }
  done
  grep -qF -- "--overwrite" "$WORK/err.log" || fail "$what: the error does not mention --overwrite"
  echo "ok: $what: $(head -c 400 "$WORK/err.log")"
}
expect_stale "a validation split the new run does not make" val-00000-of-00001.h5 -- --shards=4
expect_stale "shards of another count" train-00000-of-00004.h5 train-00003-of-00004.h5 -- \
  --shards=8 --val-fraction=0.05
[ -f "$OUT/train-00000-of-00004.h5" ] && [ ! -e "$OUT/train-00000-of-00008.h5" ] ||
  fail "a refused run changed $OUT"
"$SHARD" text --input="$OUT/kjv.txt" --documents=paragraph --out="$OUT" --shards=8 --overwrite >"$WORK/over.log" 2>&1 ||
  { cat "$WORK/over.log"; fail "--overwrite failed"; }
cat "$WORK/over.log"
left=$(cd "$OUT" && ls -- *.h5 | tr '\n' ' ')
[ "$left" = "$(printf 'train-0000%d-of-00008.h5 ' 0 1 2 3 4 5 6 7)" ] ||
  fail "after --overwrite $OUT holds $left, not only the 8 new shards"
grep -qF "removed $OUT/val-00000-of-00001.h5" "$WORK/over.log" || fail "--overwrite did not say what it removed"

# ---- bad input: each an error naming the file.
expect_error() {  # description, expected text, command...
  local what=$1 expected=$2
  shift 2
  if "$@" >"$WORK/err.log" 2>&1; then fail "$what: the command succeeded"; fi
  grep -qF -- "$expected" "$WORK/err.log" || { cat "$WORK/err.log"; fail "$what: the error does not say '$expected'"; }
  echo "ok: $what: $(head -c 300 "$WORK/err.log")"
}
printf 'fine\nna\xefve\n' >"$WORK/latin1.txt"
expect_error "text that is not UTF-8" "$WORK/latin1.txt is not UTF-8: byte 0xef at byte offset 7 (line 2, column 3)" \
  "$SHARD" text --input="$WORK/latin1.txt" --out="$WORK/bad"
: >"$WORK/empty.txt"
printf '\n \n' >"$WORK/blank.txt"
expect_error "an empty corpus" "empty corpus: $WORK/empty.txt and 1 more" \
  "$SHARD" text --input="$WORK/empty.txt" --input="$WORK/blank.txt" --out="$WORK/bad"
expect_error "a missing GPT-2 vocabulary" "$WORK/nowhere/gpt2.tiktoken" \
  "$SHARD" text --input="$WORK/data/kjv/kjv.txt" --tokenizer=gpt2 --gpt2-dir="$WORK/nowhere" --out="$WORK/bad"
grep -qF "scripts/install-deps.sh --gpt2" "$WORK/err.log" || fail "the missing-vocabulary error does not say how to fetch it"
expect_error "a missing input file" "$WORK/none.txt does not exist" \
  "$SHARD" text --input="$WORK/none.txt" --out="$WORK/bad"
[ ! -e "$WORK/bad" ] || [ -z "$(ls -A "$WORK/bad")" ] || fail "a failed run left files in $WORK/bad"
echo "PASS: KJV token shards made and inspected; stale shards and bad text input refused naming the files"

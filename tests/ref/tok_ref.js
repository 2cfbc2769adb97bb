// tests/ref/tok_ref.js - reference token ids from @lenml/tokenizers (a port
// of transformers.js's tokenizers), for tests/cli/tokenize.sh and
// bench/tokenize.sh.
//
//   node tests/ref/tok_ref.js ids DIR LINES.txt OUT.jsonl
//       for every line of LINES.txt (split on \n only, the \n dropped):
//       {"s": ids with special tokens, "p": ids without, "d": decode(p),
//        "k": decode(s, skip_special_tokens)}.  The text is encoded once
//       and post-processed both ways, exactly as encode() does it inside
//       (_tokenize_helper); the first lines are checked against encode().
//   node tests/ref/tok_ref.js text DIR FILE OUT.json
//       the whole of FILE as one text: {"s": ids with special tokens, "p": without}
//   node tests/ref/tok_ref.js texts DIR TEXTS.jsonl OUT.jsonl
//       each line of TEXTS.jsonl a JSON string (a text that may hold
//       newlines, a rendered chat say): {"s": ..., "p": ...} per line
//   node tests/ref/tok_ref.js decode DIR IDS.jsonl OUT.jsonl
//       each line {"ids": [...]}: {"k": decode(ids, skip_special_tokens),
//       "d": decode(ids)}
//   node tests/ref/tok_ref.js bench DIR TEXT.txt SECONDS
//       encodes TEXT.txt line by line (no special tokens) for about SECONDS
//       and prints {"bytes": B, "seconds": S, "mb_per_s": R, "tokens": T}
//       (S in CPU seconds of this process: the machine is shared)
//
// DIR holds tokenizer.json and tokenizer_config.json.  The packages are
// installed into build/node_modules by ./tandem.sh; NODE_PATH points there.
"use strict";
const fs = require("fs");
const path = require("path");
const { TokenizerLoader } = require("@lenml/tokenizers");

function load(dir) {
  const json = JSON.parse(fs.readFileSync(path.join(dir, "tokenizer.json"), "utf8"));
  const cfgPath = path.join(dir, "tokenizer_config.json");
  const cfg = fs.existsSync(cfgPath) ? JSON.parse(fs.readFileSync(cfgPath, "utf8")) : {};
  return TokenizerLoader.fromPreTrained({ tokenizerJSON: json, tokenizerConfig: cfg });
}

function lines(file) {
  const text = fs.readFileSync(file, "utf8");
  const v = text.split("\n");
  if (v.length && v[v.length - 1] === "") v.pop();   // a final \n ends the last line
  return v;
}

function ids(dir, input, output) {
  const tok = load(dir);
  const out = fs.openSync(output, "w");
  let buf = [];
  const ids_of = (toks, special) => {
    const t = tok.post_processor ? tok.post_processor(toks, null, { add_special_tokens: special }).tokens : toks;
    return tok.model.convert_tokens_to_ids(t);
  };
  let n = 0;
  for (const line of lines(input)) {
    const toks = tok._encode_text(line);
    const s = ids_of(toks, true), p = ids_of(toks, false);
    if (n++ < 200) {
      const s2 = tok.encode(line, { add_special_tokens: true }), p2 = tok.encode(line, { add_special_tokens: false });
      if (JSON.stringify(s) !== JSON.stringify(s2) || JSON.stringify(p) !== JSON.stringify(p2)) {
        console.error("tok_ref: the one-pass ids differ from encode() on " + JSON.stringify(line));
        process.exit(1);
      }
    }
    const d = p.length ? tok.decode(p, { skip_special_tokens: false }) : "";
    const k = s.length ? tok.decode(s, { skip_special_tokens: true }) : "";
    buf.push(JSON.stringify({ s, p, d, k }));
    if (buf.length >= 4096) {
      fs.writeSync(out, buf.join("\n") + "\n");
      buf = [];
    }
  }
  if (buf.length) fs.writeSync(out, buf.join("\n") + "\n");
  fs.closeSync(out);
}

function text(dir, input, output) {
  const tok = load(dir);
  const t = fs.readFileSync(input, "utf8");
  const s = tok.encode(t, { add_special_tokens: true }), p = tok.encode(t, { add_special_tokens: false });
  fs.writeFileSync(output, JSON.stringify({ s, p }) + "\n");
}

function texts(dir, input, output) {
  const tok = load(dir);
  const out = lines(input).map((l) => {
    const t = JSON.parse(l);
    return JSON.stringify({ s: tok.encode(t, { add_special_tokens: true }), p: tok.encode(t, { add_special_tokens: false }) });
  });
  fs.writeFileSync(output, out.join("\n") + (out.length ? "\n" : ""));
}

function decodeIds(dir, input, output) {
  const tok = load(dir);
  const out = lines(input).map((l) => {
    const ids = JSON.parse(l).ids;
    const k = ids.length ? tok.decode(ids, { skip_special_tokens: true }) : "";
    const d = ids.length ? tok.decode(ids, { skip_special_tokens: false }) : "";
    return JSON.stringify({ k, d });
  });
  fs.writeFileSync(output, out.join("\n") + (out.length ? "\n" : ""));
}

function bench(dir, input, seconds) {
  const tok = load(dir);
  const v = lines(input);
  const bytes = v.reduce((a, l) => a + Buffer.byteLength(l, "utf8") + 1, 0);
  let done = 0, tokens = 0;
  const cpu = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1e6; };
  const t0 = cpu();
  let el = 0;
  do {
    for (const l of v) tokens += tok.encode(l, { add_special_tokens: false }).length;
    done += bytes;
    el = cpu() - t0;
  } while (el < seconds);
  console.log(JSON.stringify({ bytes: done, seconds: el, mb_per_s: done / el / 1e6, tokens }));
}

const [mode, dir, input, arg] = process.argv.slice(2);
if (mode === "ids" && arg) ids(dir, input, arg);
else if (mode === "text" && arg) text(dir, input, arg);
else if (mode === "texts" && arg) texts(dir, input, arg);
else if (mode === "decode" && arg) decodeIds(dir, input, arg);
else if (mode === "bench" && arg) bench(dir, input, Number(arg));
else {
  console.error("usage: tok_ref.js ids DIR LINES.txt OUT.jsonl | text DIR FILE OUT.json | texts DIR TEXTS.jsonl OUT.jsonl | decode DIR IDS.jsonl OUT.jsonl | bench DIR TEXT.txt SECONDS");
  process.exit(2);
}

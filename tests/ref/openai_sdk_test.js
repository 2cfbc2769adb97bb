// tests/ref/openai_sdk_test.js - `tandem serve` driven by the official OpenAI
// Node SDK (npm `openai`, unmodified; installed into build/node_modules by
// ./tandem.sh), for tests/cli/serve_chat.sh.
//
//   node tests/ref/openai_sdk_test.js URL MODEL OUT.json
//
// URL is the server (http://127.0.0.1:PORT), MODEL the name /v1/models must
// list.  Calls: models.list(); chat (whole, streamed with include_usage:
// the deltas reassemble to the whole text for the same seed), max_tokens and
// max_completion_tokens, n > 1 (choice i is the request with seed + i), a
// stop string (the text ends before its first occurrence, finish "stop"),
// chat logprobs with top_logprobs; completions (whole, streamed, logprobs);
// bad requests, which the SDK raises as BadRequestError with the server's
// message.  Writes OUT.json with what the caller checks against `tandem
// generate` and `tandem score`: the messages, sampling settings, token ids
// and log-probabilities of a chat completion.  Exits 1 on the first failed
// check, naming it.
"use strict";
const fs = require("fs");
const { OpenAI } = require("openai");

const [url, model, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: openai_sdk_test.js URL MODEL OUT.json");
  process.exit(2);
}
// TANDEM_TEST_API_KEY: the server was started with --api-key it; then a
// client with another key must get AuthenticationError (401)
const apiKey = process.env.TANDEM_TEST_API_KEY || "unused";
const client = new OpenAI({ baseURL: url + "/v1", apiKey, maxRetries: 0, timeout: 60000 });

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

const MESSAGES = [
  { role: "system", content: "You answer in one short sentence." },
  { role: "user", content: "What is a fortune cookie? Réponds en français, s'il te plaît 🙂" },
];

async function models() {
  const page = await client.models.list();
  const ids = [];
  for await (const m of page) ids.push(m.id);
  check(ids.length === 1 && ids[0] === model, `models.list(): ${JSON.stringify(ids)}, want [${model}]`);
  const m = await client.models.retrieve(model);
  check(m.id === model && m.object === "model", `models.retrieve: ${JSON.stringify(m)}`);
  return `models.list() = [${ids}]`;
}

async function chat(extra) {
  return client.chat.completions.create({ model, messages: MESSAGES, ...extra });
}

async function chatWhole() {
  const r = await chat({ max_tokens: 24, seed: 5, temperature: 0.8 });
  check(r.object === "chat.completion" && r.id.startsWith("chatcmpl-"), `object/id ${r.object} ${r.id}`);
  check(r.model === model && Number.isInteger(r.created), "model/created");
  check(r.choices.length === 1, "one choice");
  const c = r.choices[0];
  check(c.index === 0 && c.message.role === "assistant" && typeof c.message.content === "string", "message");
  check(["stop", "length"].includes(c.finish_reason), `finish_reason ${c.finish_reason}`);
  check(c.token_ids.length === r.usage.completion_tokens, "usage.completion_tokens == generated tokens");
  check(r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, "usage adds up");
  if (c.finish_reason === "length") check(c.token_ids.length === 24, "length finish at max_tokens");
  // max_completion_tokens is the same limit
  const r2 = await chat({ max_completion_tokens: 24, seed: 5, temperature: 0.8 });
  check(r2.choices[0].message.content === c.message.content, "max_completion_tokens == max_tokens");
  return r;
}

async function chatStream(whole) {
  const stream = await chat({ max_tokens: 24, seed: 5, temperature: 0.8, stream: true,
                              stream_options: { include_usage: true } });
  let text = "", role = null, finish = null, usage = null, chunks = 0, afterFinish = 0;
  for await (const ch of stream) {
    chunks++;
    check(ch.object === "chat.completion.chunk", `chunk object ${ch.object}`);
    if (ch.choices.length === 0) {
      usage = ch.usage;
      continue;
    }
    const d = ch.choices[0].delta;
    if (chunks === 1) role = d.role;
    if (finish) afterFinish++;
    if (d.content) text += d.content;
    if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
  }
  const w = whole.choices[0];
  check(role === "assistant", `first delta's role ${role}`);
  check(afterFinish === 0, "no content chunk after finish_reason");
  check(text === w.message.content, `streamed ${JSON.stringify(text)} != whole ${JSON.stringify(w.message.content)}`);
  check(finish === w.finish_reason, "streamed finish_reason");
  check(usage && JSON.stringify(usage) === JSON.stringify(whole.usage), `include_usage: ${JSON.stringify(usage)}`);
  return `streamed chat: ${chunks} chunks reassemble to the whole text (${text.length} chars), usage chunk last`;
}

async function chatN() {
  const r = await chat({ max_tokens: 12, seed: 100, n: 3 });
  check(r.choices.length === 3 && r.choices.every((c, i) => c.index === i), "n=3: three choices");
  for (let i = 0; i < 3; i++) {
    const one = await chat({ max_tokens: 12, seed: 100 + i });
    check(one.choices[0].message.content === r.choices[i].message.content, `n=3: choice ${i} == seed ${100 + i}`);
  }
  check(r.usage.completion_tokens === r.choices.reduce((a, c) => a + c.token_ids.length, 0), "n=3 usage");
  return "n=3: choice i == the request with seed + i";
}

async function chatStop() {
  // a greedy answer, then a stop string taken from its middle: the answer
  // with stop is the text before the first occurrence
  const base = await chat({ max_tokens: 40, temperature: 0 });
  const t = base.choices[0].message.content;
  let stop = null;
  for (let i = 8; i + 3 <= t.length && !stop; i++) {
    const s = t.slice(i, i + 3);
    if (/^[\x20-\x7e]{3}$/.test(s)) stop = s;
  }
  check(stop, `no ASCII stop string in ${JSON.stringify(t)}`);
  const r = await chat({ max_tokens: 40, temperature: 0, stop: [stop, "\u0001never"] });
  const c = r.choices[0];
  const want = t.slice(0, t.indexOf(stop));
  check(c.finish_reason === "stop", `stop: finish ${c.finish_reason}`);
  check(c.message.content === want, `stop ${JSON.stringify(stop)}: ${JSON.stringify(c.message.content)} != ${JSON.stringify(want)}`);
  const s = await chat({ max_tokens: 40, temperature: 0, stop, stream: true });
  let text = "";
  for await (const ch of s) if (ch.choices.length && ch.choices[0].delta.content) text += ch.choices[0].delta.content;
  check(text === want, `streamed with stop: ${JSON.stringify(text)}`);
  return `stop ${JSON.stringify(stop)}: the text ends before it, streamed too`;
}

async function chatLogprobs() {
  const r = await chat({ max_tokens: 16, seed: 9, logprobs: true, top_logprobs: 3 });
  const c = r.choices[0], lp = c.logprobs.content;
  check(lp.length === c.token_ids.length, `logprobs.content has ${lp.length} entries for ${c.token_ids.length} tokens`);
  let bytes = [];
  for (const e of lp) {
    check(typeof e.token === "string" && e.logprob <= 0 && Array.isArray(e.bytes), `entry ${JSON.stringify(e)}`);
    check(e.top_logprobs.length === 3, "top_logprobs of 3");
    const v = e.top_logprobs.map((a) => a.logprob);
    check(v.every((x, i) => i === 0 || v[i - 1] >= x), "top_logprobs sorted");
    bytes = bytes.concat(e.bytes);
  }
  if (c.finish_reason === "length")
    check(Buffer.from(bytes).toString("utf8") === c.message.content, "the tokens' bytes make the content");
  return { r, note: `chat logprobs: ${lp.length} tokens with 3 alternatives each, bytes join to the content` };
}

async function completions() {
  const body = { model, prompt: "A fortune cookie says:", max_tokens: 12, seed: 3, logprobs: 2 };
  const r = await client.completions.create(body);
  check(r.object === "text_completion" && r.id.startsWith("cmpl-"), "completion object/id");
  const c = r.choices[0];
  check(typeof c.text === "string" && c.logprobs.tokens.length === c.logprobs.token_logprobs.length, "logprobs shape");
  check(c.logprobs.tokens.every((t) => typeof t === "string"), "logprobs tokens are strings");
  if (c.logprobs.tokens.every((t) => !t.startsWith("bytes:")))
    check(c.logprobs.tokens.join("") === c.text, "tokens join to the text");
  const s = await client.completions.create({ ...body, stream: true });
  let text = "";
  for await (const ch of s) text += ch.choices[0].text;
  check(text === c.text, `streamed completion ${JSON.stringify(text)} != ${JSON.stringify(c.text)}`);
  return `completions: ${r.usage.prompt_tokens} prompt tokens, ${JSON.stringify(c.text)}, streamed alike`;
}

async function badRequests() {
  const cases = [
    [{ messages: [{ role: "user", content: "hi" }, { content: "no role" }] }, "messages[1]"],
    [{ messages: [{ role: "user", content: 7 }] }, "messages[0]: 'content' must be"],
    [{ messages: [] }, "'messages' must be a non-empty array"],
    [{ messages: MESSAGES, top_logprobs: 2 }, "'top_logprobs' needs 'logprobs': true"],
    [{ messages: MESSAGES, n: 1000 }, "'n' must be an integer"],
  ];
  for (const [body, want] of cases) {
    let err = null;
    try {
      await client.chat.completions.create({ model, ...body });
    } catch (e) {
      err = e;
    }
    check(err instanceof OpenAI.BadRequestError, `${JSON.stringify(body)}: want BadRequestError, got ${err}`);
    check(err.status === 400 && err.message.includes(want), `${JSON.stringify(body)}: message ${err.message}`);
  }
  return `bad requests: ${cases.length} raised BadRequestError with the server's message`;
}

async function wrongKey() {
  const other = new OpenAI({ baseURL: url + "/v1", apiKey: apiKey + "x", maxRetries: 0, timeout: 60000 });
  let err = null;
  try {
    await other.models.list();
  } catch (e) {
    err = e;
  }
  check(err instanceof OpenAI.AuthenticationError && err.status === 401,
        `a wrong API key: want AuthenticationError (401), got ${err}`);
  return "a wrong API key raised AuthenticationError (401): " + err.message;
}

(async () => {
  const out = {};
  try {
    if (process.env.TANDEM_TEST_API_KEY) console.log("ok   " + (await wrongKey()));
    console.log("ok   " + (await models()));
    const whole = await chatWhole();
    console.log(`ok   chat: ${JSON.stringify(whole.choices[0].message.content)} (${whole.usage.completion_tokens} tokens, ${whole.choices[0].finish_reason})`);
    console.log("ok   " + (await chatStream(whole)));
    console.log("ok   " + (await chatN()));
    console.log("ok   " + (await chatStop()));
    const lp = await chatLogprobs();
    console.log("ok   " + lp.note);
    console.log("ok   " + (await completions()));
    console.log("ok   " + (await badRequests()));
    const c = whole.choices[0], l = lp.r.choices[0];
    out.sampled = { messages: MESSAGES, seed: 5, temperature: 0.8, max_tokens: 24, token_ids: c.token_ids,
                    finish_reason: c.finish_reason };
    out.logprobs = { messages: MESSAGES, seed: 9, max_tokens: 16, token_ids: l.token_ids,
                     logprobs: l.logprobs.content.map((e) => e.logprob) };
    fs.writeFileSync(outPath, JSON.stringify(out) + "\n");
  } catch (e) {
    console.log("FAIL openai SDK: " + (e && e.stack ? e.stack.split("\n").slice(0, 3).join(" | ") : e));
    process.exit(1);
  }
})();

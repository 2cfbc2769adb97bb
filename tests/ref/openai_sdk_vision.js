// tests/ref/openai_sdk_vision.js - image requests to `tandem serve` through
// the official OpenAI Node SDK (npm `openai`, unmodified), for
// tests/cli/serve_vision.sh.
//
//   node tests/ref/openai_sdk_vision.js URL MODEL P IMG_A.png IMG_B.jpg OUT.json
//
// P is the model's tokens per image.  Sends, as an SDK user writes them,
// content parts [{type: "text"}, {type: "image_url", image_url: {url:
// "data:image/png;base64,..."}}]: a PNG and a JPEG (whole and streamed with
// include_usage: the deltas reassemble to the whole answer), two images in
// one message, the same text with image A and with image B, and, all at
// once, image and text-only requests (the server batches them together:
// each answer must equal the one it got alone, token ids and log-probability
// bits).  Usage: prompt_tokens counts P per image (checked against /tokenize
// of the same messages, and against the text-only request's count).  Bad
// images (an http URL, garbage base64, a text file, a truncated PNG) raise
// BadRequestError with the server's one-line message.  Writes OUT.json with
// the messages, seeds and answers the caller checks further.  Exits 1 on
// the first failed check, naming it.
"use strict";
const fs = require("fs");
const { OpenAI } = require("openai");

const [url, model, pStr, imgA, imgB, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: openai_sdk_vision.js URL MODEL P IMG_A.png IMG_B.jpg OUT.json");
  process.exit(2);
}
const P = Number(pStr);
const client = new OpenAI({ baseURL: url + "/v1", apiKey: "unused", maxRetries: 0, timeout: 120000 });
const dataUrl = (file, type) => `data:${type};base64,${fs.readFileSync(file).toString("base64")}`;
const A = dataUrl(imgA, "image/png"), B = dataUrl(imgB, "image/jpeg");

function check(cond, msg) {
  if (!cond) throw new Error(msg);
}

const ask = (img, q) => [{ role: "user", content: [{ type: "image_url", image_url: { url: img } }, { type: "text", text: q }] }];
const TEXT = [{ role: "user", content: "What color is the shape?" }];
const base = { model, max_tokens: 8, temperature: 0.9, seed: 3, logprobs: true };

async function tokenizeCount(messages) {
  const r = await fetch(url + "/tokenize", { method: "POST", headers: { "Content-Type": "application/json" },
                                             body: JSON.stringify({ messages }) });
  check(r.status === 200, `/tokenize: HTTP ${r.status}`);
  return (await r.json()).count;
}

const lp = (r) => r.choices[0].logprobs.content.map((e) => e.logprob);
const same = (a, b) => JSON.stringify(a.choices[0].token_ids) === JSON.stringify(b.choices[0].token_ids) &&
  JSON.stringify(lp(a)) === JSON.stringify(lp(b));

(async () => {
  const out = {};
  try {
    const mA = ask(A, "What color is the shape?"), mB = ask(B, "What color is the shape?");
    const text = await client.chat.completions.create({ ...base, messages: TEXT });
    const a = await client.chat.completions.create({ ...base, messages: mA });
    check(a.object === "chat.completion" && a.choices.length === 1, "image request: one choice");
    // "<image>\n" (2 tokens) stands before the question: P image tokens and the "\n"
    check(a.usage.prompt_tokens === text.usage.prompt_tokens + P + 1,
          `usage.prompt_tokens ${a.usage.prompt_tokens}, want the text request's ${text.usage.prompt_tokens} + P ${P} + 1`);
    const tk = await tokenizeCount(mA);
    check(tk === a.usage.prompt_tokens, `/tokenize counts ${tk}, usage ${a.usage.prompt_tokens}`);
    console.log(`ok   a PNG image: ${JSON.stringify(a.choices[0].message.content)}; prompt_tokens ${a.usage.prompt_tokens} = ` +
                `text ${text.usage.prompt_tokens} + ${P} image tokens + 1 (/tokenize agrees)`);
    const b = await client.chat.completions.create({ ...base, messages: mB });
    check(!same(a, b), "images A and B gave the same tokens and log-probabilities: the image is not seen");
    console.log(`ok   a JPEG image: ${JSON.stringify(b.choices[0].message.content)}, another answer than image A's`);
    // streamed: the deltas reassemble to the whole answer
    const st = await client.chat.completions.create({ ...base, messages: mA, logprobs: false, stream: true,
                                                      stream_options: { include_usage: true } });
    let textS = "", usage = null;
    for await (const ch of st) {
      if (ch.usage) usage = ch.usage;
      for (const c of ch.choices) textS += c.delta.content || "";
    }
    check(textS === a.choices[0].message.content, `streamed ${JSON.stringify(textS)} vs ${JSON.stringify(a.choices[0].message.content)}`);
    check(usage && usage.prompt_tokens === a.usage.prompt_tokens, "streamed usage");
    console.log("ok   streamed: the deltas give the same answer, usage counts the image");
    // two images in one message
    const two = [{ role: "user", content: [{ type: "text", text: "Compare" }, { type: "image_url", image_url: { url: A } },
                                           { type: "image_url", image_url: { url: B } }] }];
    const t2 = await client.chat.completions.create({ ...base, messages: two });
    const tk2 = await tokenizeCount(two);
    check(t2.usage.prompt_tokens === tk2 && tk2 === (await tokenizeCount([{ role: "user", content: "Compare\n\n" }])) + 2 * P,
          `two images: prompt_tokens ${t2.usage.prompt_tokens}, /tokenize ${tk2}`);
    console.log(`ok   two images in one message: prompt_tokens ${t2.usage.prompt_tokens} (2 x ${P} image tokens)`);
    // image and text requests at once: one batch of the server; each answer is what it was alone
    const all = await Promise.all([mA, TEXT, mB, TEXT, mA, mB].map((m) => client.chat.completions.create({ ...base, messages: m })));
    const alone = [a, text, b, text, a, b];
    for (let i = 0; i < all.length; i++) check(same(all[i], alone[i]), `concurrent request ${i} differs from its answer alone`);
    console.log("ok   6 image and text requests at once: every answer equals its answer alone, bit for bit");
    // bad images: BadRequestError with the server's message, and the server goes on
    const bad = [
      ["an http URL", "http://127.0.0.1:1/cat.png", "only data: URLs are accepted"],
      ["garbage base64", "data:image/png;base64,@@@@", "invalid character"],
      ["a text file", "data:image/png;base64," + Buffer.from("hello, world").toString("base64"), "not a PNG or JPEG"],
      ["a truncated PNG", A.slice(0, 22 + 200), "truncated PNG"],
    ];
    for (const [what, u, words] of bad) {
      let err = null;
      try {
        await client.chat.completions.create({ ...base, messages: ask(u, "What?") });
      } catch (e) {
        err = e;
      }
      check(err instanceof OpenAI.BadRequestError && err.status === 400 && err.message.includes(words),
            `${what}: want BadRequestError naming '${words}', got ${err}`);
    }
    console.log(`ok   ${bad.length} bad images raised BadRequestError (400) with the server's message`);
    const again = await client.chat.completions.create({ ...base, messages: mA });
    check(same(again, a), "after the bad requests the same request gives the same answer");
    console.log("ok   the server still answers, the same bits");
    out.a = { messages: mA, seed: 3, temperature: 0.9, max_tokens: 8, token_ids: a.choices[0].token_ids, logprobs: lp(a) };
    out.text = { token_ids: text.choices[0].token_ids };
    fs.writeFileSync(outPath, JSON.stringify(out) + "\n");
  } catch (e) {
    console.log("FAIL openai SDK (images): " + (e && e.stack ? e.stack.split("\n").slice(0, 3).join(" | ") : e));
    process.exit(1);
  }
})();

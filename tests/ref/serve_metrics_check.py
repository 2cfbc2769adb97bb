#!/usr/bin/python3
"""tests/ref/serve_metrics_check.py SCRAPE_LOG SOAK_OUT --top-k K [--min-scrapes N]

Holds the last scrape of a soak's scrape log (bench/soak_load.py
--scrape-log, taken once the server is idle) against what the soak's
clients sent and saw (the "sent" list of its JSON line, the last line of
SOAK_OUT):
  * every /metrics scrape is prefixed by '# scrape <unix time>', times increasing;
  * tandem_time_to_first_token_seconds, tandem_queue_wait_seconds,
    tandem_request_prompt_tokens and tandem_request_generation_tokens count
    one observation per choice sent, as tandem_requests_total does; their
    buckets are cumulative;
  * the prompt-token histogram's sum is the sum over choices of the prompt
    lengths (usage.prompt_tokens, which equals the prompt sent, once per
    request; n choices each have it);
  * the generation-token histogram's sum is the completion tokens the
    clients saw, plus what cancelled streams generated after the client's
    first token (at least what it saw of them);
  * per MoE layer, tandem_expert_tokens_total over its experts is
    K x the rows the engine computed:
        tandem_prompt_tokens_total + tandem_recomputed_tokens_total
        + sum(generated tokens) - finished{length, cancelled, error}
    (a choice's last token is fed only when it was followed by a stop id:
    it ended "stop"), and without preemptions tandem_prompt_tokens_total is
    the prompt tokens sent less those found in the prefix cache.
"""
import argparse
import json
import re
import sys

ap = argparse.ArgumentParser()
ap.add_argument("log")
ap.add_argument("soak_out")
ap.add_argument("--top-k", type=int, required=True)
ap.add_argument("--min-scrapes", type=int, default=5)
A = ap.parse_args()
bad = 0


def check(ok, what):
    global bad
    print(("ok   " if ok else "FAIL ") + what)
    bad |= not ok


scrapes, times = [], []
for line in open(A.log):
    line = line.rstrip("\n")
    if line.startswith("# scrape "):
        times.append(float(line.split()[2]))
        scrapes.append({})
    elif line and not line.startswith("#"):
        name, v = line.rsplit(" ", 1)
        scrapes[-1][name] = float(v)
check(len(scrapes) >= A.min_scrapes and all(b > a for a, b in zip(times, times[1:])),
      f"scrape log: {len(scrapes)} scrapes (>= {A.min_scrapes}), each after '# scrape <unix time>', times increasing")
m = scrapes[-1]
sent = json.loads(open(A.soak_out).read().splitlines()[-1])["sent"]
choices = sum(r["n"] for r in sent)
fin = {k: m.get(f'tandem_requests_total{{finish_reason="{k}"}}', 0) for k in ("length", "stop", "cancelled", "error")}
check(sum(fin.values()) == choices, f"tandem_requests_total: {sum(fin.values()):.0f} finished choices, "
      f"the clients sent {choices} in {len(sent)} requests")
for h in ("tandem_time_to_first_token_seconds", "tandem_queue_wait_seconds", "tandem_request_prompt_tokens",
          "tandem_request_generation_tokens"):
    b = [(k, v) for k, v in m.items() if k.startswith(h + "_bucket{")]
    cum = [v for _, v in b]
    check(m.get(h + "_count") == choices and cum == sorted(cum) and cum[-1] == choices and 'le="+Inf"' in b[-1][0],
          f"{h}: count {m.get(h + '_count')}, +Inf bucket {cum[-1] if cum else None} == {choices} choices, "
          f"buckets cumulative")
for r in sent:
    if r["usage_prompt"] is not None and r["usage_prompt"] != r["prompt"]:
        check(False, f"usage.prompt_tokens {r['usage_prompt']} != the {r['prompt']} tokens sent ({r['kind']})")
        break
want_p = sum(r["prompt"] * r["n"] for r in sent)
check(m["tandem_request_prompt_tokens_sum"] == want_p,
      f"tandem_request_prompt_tokens_sum {m['tandem_request_prompt_tokens_sum']:.0f} == sum of usage.prompt_tokens "
      f"x n over the requests: {want_p}")
seen = sum(r["completion"] for r in sent if r["finish"] is not None)
canc = [r for r in sent if r["finish"] is None]
gen = m["tandem_request_generation_tokens_sum"]
extra = gen - seen
ok = extra == 0 if not canc else sum(r["completion"] for r in canc) <= extra <= 64 * len(canc)
check(ok, f"tandem_request_generation_tokens_sum {gen:.0f}: {seen} completion tokens the clients saw + {extra:.0f} "
      f"of {len(canc)} cancelled streams (which saw {sum(r['completion'] for r in canc)}, max_tokens 64 each)")
rows = m["tandem_prompt_tokens_total"] + m["tandem_recomputed_tokens_total"] + gen - fin["length"] - \
    fin["cancelled"] - fin["error"]
layers = {}
for k, v in m.items():
    g = re.fullmatch(r'tandem_expert_tokens_total\{layer="(\d+)",expert="(\d+)"\}', k)
    if g:
        layers.setdefault(int(g[1]), {})[int(g[2])] = v
check(len(layers) > 0, f"tandem_expert_tokens_total: {len(layers)} MoE layers x "
      f"{sorted({len(e) for e in layers.values()})} experts")
sums = {l: sum(e.values()) for l, e in layers.items()}
check(all(s == A.top_k * rows for s in sums.values()),
      f"per layer, expert tokens {sorted(set(sums.values()))} == top_k {A.top_k} x {rows:.0f} rows computed "
      f"(prompt {m['tandem_prompt_tokens_total']:.0f} + recomputed {m['tandem_recomputed_tokens_total']:.0f} + "
      f"generated {gen:.0f} - length {fin['length']:.0f} - cancelled {fin['cancelled']:.0f} - error {fin['error']:.0f})")
hit = m["tandem_prefix_cache_hit_tokens_total"]
if m["tandem_preemptions_total"] == 0:
    check(m["tandem_prompt_tokens_total"] == want_p - hit,
          f"no preemption: tandem_prompt_tokens_total {m['tandem_prompt_tokens_total']:.0f} == prompt tokens sent "
          f"{want_p} - found cached {hit:.0f}")
else:
    check(m["tandem_prompt_tokens_total"] >= want_p - hit,
          f"{m['tandem_preemptions_total']:.0f} preemptions: prompt tokens computed "
          f"{m['tandem_prompt_tokens_total']:.0f} >= sent - cached {want_p - hit:.0f}")
occ = m.get("tandem_kv_occupancy_ratio")
check(occ == m["tandem_kv_blocks_used"] / m["tandem_kv_blocks_total"] and
      0 <= m["tandem_prefix_cache_blocks"] <= m["tandem_kv_blocks_total"] and
      m["tandem_prefix_cache_blocks"] >= m["tandem_kv_blocks_cached"],
      f"idle: tandem_kv_occupancy_ratio {occ} == used / total blocks, tandem_prefix_cache_blocks "
      f"{m['tandem_prefix_cache_blocks']:.0f} within [cached {m['tandem_kv_blocks_cached']:.0f}, total]")
sys.exit(bad)

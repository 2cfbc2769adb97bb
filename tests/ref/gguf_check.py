#!/usr/bin/python3
"""GGUF checks for tests/cli/gguf.sh: an independent reader of the files
`tandem ckpt export --format gguf` writes, and the comparisons of llama.cpp's
logits with tandem's.  numpy + h5py only (no gguf-py, no llama.cpp code).

  gguf_check.py file  GGUF --h5 CKPT --arch A --dtype f32|f16|q8_0 [--tokenizer DIR]
      parses the whole file (ggml docs/gguf.md: header, kv, tensor infos,
      alignment, data) and checks it against the checkpoint: the metadata
      keys from the model config, every tensor's name, shape, type and
      bytes (float32 exact; float16 = numpy astype(float16); Q8_0 = the
      numpy transcription of ggml's quantize_row_q8_0_ref below), the q/k
      row permutation of llama's adjacent-pair RoPE done here in numpy, and
      the tokenizer arrays against tokenizer.json / tokenizer_config.json.
  gguf_check.py logits --peer L.bin --ids IDS --score S.h5 --gen G.json --tol T [--top-tol T2]
      llama.cpp's logits [T, V] of IDS (c_peer --tokens --logits-out) against
      tandem: the log-probability of every next token of IDS[:n_score+1]
      from `tandem score` (S.h5 /logprobs, window 0) and, for the greedy
      continuation G.json (`tandem generate --json --logprobs 20` of the
      prompt IDS[:n_prompt]), the top-20 log-probabilities at every generated
      position and the argmax (which may differ only where tandem's top-2 gap is
      below 2 T).  Prints max |diff| and fails above T.
  gguf_check.py ids2data --ids IDS --vocab V --out DATA.bin
      a token file of IDS (docs/data.md) for `tandem score`.
  gguf_check.py greedy --peer-json C.json --gen G.json --tol T
      c_peer's free-running greedy tokens against `tandem generate`'s.
"""
import argparse, json, struct, sys
import numpy as np

MAGIC, ALIGN = 0x46554747, 32
GGML = {0: ("F32", 4, 1), 1: ("F16", 2, 1), 8: ("Q8_0", 34, 32)}   # type: name, bytes per block, block
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Reader:
    def __init__(self, path):
        self.b = open(path, "rb").read()
        self.o = 0

    def take(self, fmt):
        v = struct.unpack_from(fmt, self.b, self.o)[0]
        self.o += struct.calcsize(fmt)
        return v

    def string(self):
        n = self.take("<Q")
        assert self.o + n <= len(self.b), "string runs past the end of the file"
        s = self.b[self.o:self.o + n]
        self.o += n
        return s.decode("utf-8")

    def value(self, t):
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("<I"), self.take("<Q")
            if et == 8:
                return [self.string() for _ in range(n)]
            assert et in SCALAR, "array of type %d" % et
            dt = np.dtype(SCALAR[et])
            a = np.frombuffer(self.b, dtype=dt, count=n, offset=self.o)
            self.o += n * dt.itemsize
            return a
        assert t in SCALAR, "value type %d" % t
        return (self.take(SCALAR[t]), t)


def read_gguf(path):
    """-> (kv {key: value}, kv_types {key: gguf type}, tensors {name: dict}) after validating the layout."""
    r = Reader(path)
    assert r.take("<I") == MAGIC, "bad magic"
    assert r.take("<I") == 3, "not GGUF v3"
    n_t, n_kv = r.take("<Q"), r.take("<Q")
    kv, kvt = {}, {}
    for _ in range(n_kv):
        k = r.string()
        t = r.take("<I")
        v = r.value(t)
        assert k not in kv, "key %s twice" % k
        if isinstance(v, tuple):
            v, _ = v
        kv[k], kvt[k] = v, t
    align = kv.get("general.alignment", ALIGN)
    infos = []
    for _ in range(n_t):
        name = r.string()
        nd = r.take("<I")
        ne = [r.take("<Q") for _ in range(nd)]
        t, off = r.take("<I"), r.take("<Q")
        assert t in GGML, "%s: ggml type %d" % (name, t)
        assert off % align == 0, "%s: offset %d not aligned" % (name, off)
        _, bs, blk = GGML[t]
        assert ne[0] % blk == 0, "%s: row %d not a multiple of the block" % (name, ne[0])
        infos.append((name, ne, t, off, int(np.prod(ne)) // blk * bs))
    data = (r.o + align - 1) // align * align
    assert all(x == 0 for x in r.b[r.o:data]), "padding before the data is not zero"
    tensors, end = {}, 0
    for name, ne, t, off, nbytes in sorted(infos, key=lambda x: x[3]):
        assert off >= end, "%s overlaps the tensor before it" % name
        assert name not in tensors, "tensor %s twice" % name
        tensors[name] = dict(ne=ne, type=t, raw=r.b[data + off:data + off + nbytes])
        assert len(tensors[name]["raw"]) == nbytes, "%s runs past the end of the file" % name
        end = off + (nbytes + align - 1) // align * align
    assert len(r.b) == data + end, "file has %d bytes, the layout %d" % (len(r.b), data + end)
    return kv, kvt, tensors


# ---------------------------------------------------------------- expected bytes

def q8_0(a):
    """ggml quantize_row_q8_0_ref: per block of 32, d = amax / 127 (float32), id = 1/d, q = roundf(x*id)
    (halves away from zero: exact in float64), the scale stored as fp16(d)."""
    x = np.ascontiguousarray(a, dtype=np.float32).reshape(-1, 32)
    amax = np.abs(x).max(axis=1)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    v = (x * inv[:, None]).astype(np.float32).astype(np.float64)
    q = np.trunc(v + np.copysign(0.5, v)).astype(np.int8)
    blk = np.zeros(x.shape[0], dtype=[("d", "<f2"), ("q", "i1", 32)])
    blk["d"], blk["q"] = d.astype(np.float16), q
    return blk.tobytes()


def permute(w, n_head):
    """HF/tandem rotate-half rows -> llama.cpp NORM RoPE (adjacent pairs), as convert_hf_to_gguf permutes."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


LAYER = {  # tandem dataset under model/layers/i/ -> (gguf name under blk.i., matrix?)
    "input_layernorm": ("attn_norm.weight", False), "post_attention_layernorm": ("ffn_norm.weight", False),
    "self_attn/q_proj": ("attn_q.weight", True), "self_attn/k_proj": ("attn_k.weight", True),
    "self_attn/v_proj": ("attn_v.weight", True), "self_attn/o_proj": ("attn_output.weight", True),
    "self_attn/q_proj.bias": ("attn_q.bias", False), "self_attn/k_proj.bias": ("attn_k.bias", False),
    "self_attn/v_proj.bias": ("attn_v.bias", False), "self_attn/o_proj.bias": ("attn_output.bias", False),
    "self_attn/q_norm": ("attn_q_norm.weight", False), "self_attn/k_norm": ("attn_k_norm.weight", False),
    "mlp/gate": ("ffn_gate_inp.weight", False),
    "mlp/experts/gate_proj": ("ffn_gate_exps.weight", True), "mlp/experts/up_proj": ("ffn_up_exps.weight", True),
    "mlp/experts/down_proj": ("ffn_down_exps.weight", True),
    "mlp/shared_experts/gate_proj": ("ffn_gate_shexp.weight", True),
    "mlp/shared_experts/up_proj": ("ffn_up_shexp.weight", True),
    "mlp/shared_experts/down_proj": ("ffn_down_shexp.weight", True),
    "mlp/shared_expert_gate": ("ffn_gate_inp_shexp.weight", False),
}
GLOBAL = {"model/embed_tokens": ("token_embd.weight", True), "model/norm": ("output_norm.weight", False),
          "lm_head": ("output.weight", True)}


def expected_tensors(h5, cfg, arch, dtype):
    """{gguf name: (ne, ggml type, bytes)} from the checkpoint."""
    import h5py
    H, Hk = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = {}
    with h5py.File(h5, "r") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        for n in names:
            if not (n.startswith("model/") or n == "lm_head") or n.endswith(".scale"):
                continue   # an int8 tensor's scales are read with it
            if n.startswith("model/layers/"):
                i, rest = n.split("/", 3)[2:]
                dst, mat = LAYER[rest]
                dst = "blk.%s.%s" % (i, dst)
            else:
                rest = n
                dst, mat = GLOBAL[n]
            q8 = f[n].dtype == np.int8   # an int8 checkpoint: q and its float32 scale per 32
            if q8:
                q, sc = f[n][()], f[n + ".scale"][()]
                a = q.astype(np.float32) * np.repeat(sc, 32, axis=-1)[..., :q.shape[-1]]   # q * s, as tandem reads it
            else:
                a = np.asarray(f[n], dtype=np.float32)
            for r, heads in (("q", H), ("k", Hk)):
                if arch == "llama" and rest in ("self_attn/%s_proj" % r, "self_attn/%s_proj.bias" % r):
                    a = permute(a, heads)
                    if q8:
                        q, sc = permute(q, heads), permute(sc, heads)
            if rest == "mlp/shared_expert_gate":
                a = a.reshape(-1)
            ne = list(reversed(a.shape))
            t = 0
            if mat and dtype == "f16":
                t = 1
            if mat and dtype == "q8_0":
                t = 8 if ne[0] % 32 == 0 else 1
            if t == 8 and q8:   # the int8 values as they are, each group's scale as fp16
                blk = np.zeros(q.size // 32, dtype=[("d", "<f2"), ("q", "i1", 32)])
                blk["d"], blk["q"] = sc.reshape(-1).astype(np.float16), q.reshape(-1, 32)
                raw = blk.tobytes()
            else:
                raw = a.tobytes() if t == 0 else a.astype(np.float16).tobytes() if t == 1 else q8_0(a)
            out[dst] = (ne, t, raw)
            if n == "model/embed_tokens" and cfg.get("tie_word_embeddings") and arch in ("qwen2moe", "olmoe"):
                out["output.weight"] = (ne, t, raw)   # these graphs always read output.weight
    return out


def check_meta(kv, kvt, cfg, arch, dtype):
    A = arch
    d, H = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = cfg.get("head_dim") or d // H
    F = cfg.get("moe_intermediate_size") or 2 * d
    S = cfg.get("shared_expert_intermediate_size") or F * cfg.get("n_shared_experts", 0)
    want = {
        "general.architecture": arch, "general.file_type": {"f32": 0, "f16": 1, "q8_0": 7}[dtype],
        A + ".block_count": cfg["num_hidden_layers"], A + ".embedding_length": d,
        A + ".context_length": cfg.get("max_position_embeddings", 4096),
        A + ".attention.head_count": H, A + ".attention.head_count_kv": cfg.get("num_key_value_heads", H),
        A + ".expert_count": cfg.get("num_local_experts", 8), A + ".expert_used_count": cfg.get("num_experts_per_tok", 2),
        A + ".rope.dimension_count": hd,
        A + ".rope.freq_base": float(np.float32(cfg.get("rope_theta", 10000.0))),
        A + ".attention.layer_norm_rms_epsilon": float(np.float32(cfg.get("rms_norm_eps", 1e-5))),
    }
    if arch in ("qwen2moe", "qwen3moe"):
        want[A + ".expert_feed_forward_length"] = F
    else:
        want[A + ".feed_forward_length"] = F
    if arch == "qwen2moe":
        want[A + ".expert_shared_feed_forward_length"] = S
    if hd * H != d:
        want[A + ".attention.key_length"] = hd
        want[A + ".attention.value_length"] = hd
    for k, v in want.items():
        assert k in kv, "metadata %s missing" % k
        got = kv[k]
        assert got == v, "metadata %s = %r, want %r" % (k, got, v)
    for k in (A + ".attention.layer_norm_rms_epsilon", A + ".rope.freq_base"):
        assert kvt[k] == 6, "%s is not float32" % k
    return len(want)


def looks_special(s):
    """convert_hf_to_gguf.py does_token_look_special: such added tokens are CONTROL."""
    return (s in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or (s.startswith("<|") and s.endswith("|>"))
            or (s.startswith("<\uff5c") and s.endswith("\uff5c>")) or (s.startswith("<unused") and s.endswith(">")))


def check_vocab(kv, cfg, tok_dir):
    V = cfg.get("vocab_size", 256)
    toks = kv["tokenizer.ggml.tokens"]
    types = np.asarray(kv["tokenizer.ggml.token_type"])
    assert len(toks) == V and len(types) == V, "token list of %d, vocab_size %d" % (len(toks), V)
    assert len(set(toks)) == V, "token strings are not unique (llama.cpp needs them one to one)"
    if not tok_dir:
        assert kv["tokenizer.ggml.model"] == "llama"
        assert toks == ["<0x%02X>" % i for i in range(256)] and (types == 6).all()
        return "256 byte tokens"
    tj = json.load(open(tok_dir + "/tokenizer.json", encoding="utf-8"))
    try:
        tc = json.load(open(tok_dir + "/tokenizer_config.json", encoding="utf-8"))
    except OSError:
        tc = {}
    m = tj["model"]
    spm = bool(m.get("byte_fallback"))
    assert kv["tokenizer.ggml.model"] == ("llama" if spm else "gpt2")
    by_id = {i: s for s, i in m["vocab"].items()}
    added = {a["id"]: a for a in tj["added_tokens"]}
    for i, a in added.items():
        by_id[i] = a["content"]
    for i in range(V):
        s = by_id.get(i, "[PAD%d]" % i)
        assert toks[i] == s, "token %d: %r, tokenizer.json %r" % (i, toks[i], s)
        if i not in by_id:
            want = 5
        elif i in added and (added[i]["special"] or looks_special(s)):
            want = 3
        elif i in added:
            want = 4
        elif spm and len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            want = 6
        else:
            want = 1
        if spm and s == m.get("unk_token"):
            want = 2
        assert types[i] == want, "token %d %r: type %d, want %d" % (i, s, types[i], want)
    merges = [" ".join(x) if isinstance(x, list) else x for x in m["merges"]]
    if spm:
        sc = np.asarray(kv["tokenizer.ggml.scores"], dtype=np.float32)
        want = np.full(V, -1e9, dtype=np.float32)
        for r, mg in enumerate(merges):
            a, b = mg.split(" ", 1)
            i = m["vocab"].get(a + b)
            if i is not None and want[i] == np.float32(-1e9):
                want[i] = -r
        assert (sc == want).all(), "scores differ from -(merge rank) at %d ids" % int((sc != want).sum())
        norm = json.dumps(tj.get("normalizer"))
        prefix = '"Prepend"' in norm or (tj.get("pre_tokenizer") or {}).get("prepend_scheme", "never") != "never"
        assert bool(kv["tokenizer.ggml.add_space_prefix"]) == prefix, "add_space_prefix"
    else:
        assert list(kv["tokenizer.ggml.merges"]) == merges, "merges differ from tokenizer.json"
    for key, name in (("tokenizer.ggml.bos_token_id", "bos_token"), ("tokenizer.ggml.eos_token_id", "eos_token")):
        t = tc.get(name)
        t = t.get("content") if isinstance(t, dict) else t
        if t:
            ids = [i for i, s in by_id.items() if s == t]
            assert kv.get(key) == ids[0], "%s = %r, %s is %r (id %d)" % (key, kv.get(key), name, t, ids[0])
    if "add_bos_token" in tc:
        assert bool(kv["tokenizer.ggml.add_bos_token"]) == tc["add_bos_token"], "add_bos_token"
    if "chat_template" in tc:
        assert kv["tokenizer.chat_template"] == tc["chat_template"], "chat_template differs"
    return "%d tokens (%s), %d merges, types, specials" % (V, "llama" if spm else "gpt2 " + kv["tokenizer.ggml.pre"],
                                                           len(merges))


def cmd_file(a):
    import h5py
    with h5py.File(a.h5, "r") as f:
        cfg = json.loads(f.attrs["config"])
    kv, kvt, tensors = read_gguf(a.gguf)
    n_meta = check_meta(kv, kvt, cfg, a.arch, a.dtype)
    want = expected_tensors(a.h5, cfg, a.arch, a.dtype)
    assert sorted(tensors) == sorted(want), "tensor names differ: only in GGUF %s, only expected %s" % (
        sorted(set(tensors) - set(want)), sorted(set(want) - set(tensors)))
    types = {}
    for name, (ne, t, raw) in want.items():
        g = tensors[name]
        assert g["ne"] == ne, "%s: ne %s, want %s" % (name, g["ne"], ne)
        assert g["type"] == t, "%s: type %s, want %s" % (name, GGML[g["type"]][0], GGML[t][0])
        if g["raw"] != raw:
            diff = next(i for i in range(len(raw)) if raw[i] != g["raw"][i])
            sys.exit("%s: bytes differ from the checkpoint (first at byte %d of %d)" % (name, diff, len(raw)))
        types[GGML[t][0]] = types.get(GGML[t][0], 0) + 1
    vocab = check_vocab(kv, cfg, a.tokenizer)
    print("ok: %s: %d tensors bit-exact (%s), %d metadata keys, tokenizer: %s" % (
        a.gguf, len(want), ", ".join("%d %s" % (n, t) for t, n in sorted(types.items())), n_meta, vocab))


# ---------------------------------------------------------------- logits

def log_softmax(l):
    l = l.astype(np.float64)
    m = l.max(axis=-1, keepdims=True)
    return l - m - np.log(np.exp(l - m).sum(axis=-1, keepdims=True))


def cmd_logits(a):
    import h5py
    ids = [int(x) for x in open(a.ids).read().replace(",", " ").split()]
    lp = log_softmax(np.fromfile(a.peer, dtype=np.float32).reshape(len(ids), -1))
    worst = {}
    # 1. every next-token log-probability of the scored window
    with h5py.File(a.score, "r") as f:
        s = np.asarray(f["logprobs"][0], dtype=np.float64)
    T = len(s)
    peer = lp[np.arange(T), ids[1:T + 1]]
    worst["score"] = float(np.abs(peer - s).max())
    # 2. greedy continuation: top-20 and argmax at each generated position
    g = json.load(open(a.gen))
    n_p = len(g["prompt_ids"])
    assert ids[:n_p] == g["prompt_ids"] and ids[n_p:] == g["ids"][:len(ids) - n_p], "IDS is not prompt + greedy ids"
    top, agree, ties = 0.0, 0, 0
    for j, (tid, tops) in enumerate(zip(g["ids"], g["top_logprobs"])):
        row = lp[n_p - 1 + j]
        for k, v in tops.items():
            top = max(top, abs(row[int(k)] - v))
        vals = sorted(tops.values(), reverse=True)
        gap = vals[0] - vals[1] if len(vals) > 1 else 1.0
        if int(np.argmax(row)) == tid:
            agree += 1
        elif gap < 2 * a.tol:
            ties += 1     # a near tie: each side may move by tol, so either token may win
        else:
            sys.exit("position %d: llama.cpp's argmax %d, tandem's greedy token %d (top-2 gap %.3g)" % (
                j, int(np.argmax(row)), tid, gap))
    worst["top20"] = top
    n = len(g["ids"])
    msg = "%s: max |logprob diff| %.3g over %d next tokens, %.3g over the top-20 of %d greedy steps; argmax %d/%d" % (
        a.label, worst["score"], T, worst["top20"], n, agree, n)
    if ties:
        msg += " (%d near ties)" % ties
    print(msg)
    if max(worst.values()) > a.tol:
        sys.exit("%s: logprob difference %.3g exceeds %.3g" % (a.label, max(worst.values()), a.tol))


def cmd_ids2data(a):
    """IDS -> a token file as `tandem data prepare` writes it (docs/data.md), all of it the training split."""
    ids = np.array([int(x) for x in open(a.ids).read().replace(",", " ").split()], dtype=np.uint32)
    width = 1 if a.vocab <= 256 else 2 if a.vocab <= 65536 else 4
    head = b"TNDMTOK1" + struct.pack("<IIQQI", 1, width, len(ids), 0, a.vocab) + bytes(28)
    with open(a.out, "wb") as f:
        f.write(head + ids.astype({1: "<u1", 2: "<u2", 4: "<u4"}[width]).tobytes())


def cmd_greedy(a):
    """c_peer's free-running greedy_first16 against tandem generate --json of the same prompt: equal, or
    different only after a step where tandem's top-2 gap is within the noise."""
    peer = json.load(open(a.peer_json))["bench"]["greedy_first16"]
    g = json.load(open(a.gen))
    ours = g["ids"][:len(peer)]
    for j, (x, y) in enumerate(zip(peer, ours)):
        if x != y:
            vals = sorted(g["top_logprobs"][j].values(), reverse=True)
            if vals[0] - vals[1] < 2 * a.tol:
                print("%s: greedy tokens equal for %d steps, then a near tie (gap %.3g)" % (a.label, j, vals[0] - vals[1]))
                return
            sys.exit("%s: greedy step %d: llama.cpp %d, tandem %d (top-2 gap %.3g)\n  llama.cpp %s\n  tandem    %s" % (
                a.label, j, x, y, vals[0] - vals[1], peer, ours))
    print("%s: greedy tokens equal for all %d steps: %s" % (a.label, len(peer), ours))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("file")
    f.add_argument("gguf")
    f.add_argument("--h5", required=True)
    f.add_argument("--arch", required=True)
    f.add_argument("--dtype", default="f32", choices=["f32", "f16", "q8_0"])
    f.add_argument("--tokenizer")
    lg = sub.add_parser("logits")
    lg.add_argument("--peer", required=True)
    lg.add_argument("--ids", required=True)
    lg.add_argument("--score", required=True)
    lg.add_argument("--gen", required=True)
    lg.add_argument("--tol", type=float, required=True)
    lg.add_argument("--label", default="logits")
    d = sub.add_parser("ids2data")
    d.add_argument("--ids", required=True)
    d.add_argument("--vocab", type=int, required=True)
    d.add_argument("--out", required=True)
    gr = sub.add_parser("greedy")
    gr.add_argument("--peer-json", required=True)
    gr.add_argument("--gen", required=True)
    gr.add_argument("--tol", type=float, required=True)
    gr.add_argument("--label", default="greedy")
    a = ap.parse_args()
    {"file": cmd_file, "logits": cmd_logits, "ids2data": cmd_ids2data, "greedy": cmd_greedy}[a.cmd](a)


if __name__ == "__main__":
    main()

"""bench/torch_vlm.py - the VLM of docs/vision.md trained in PyTorch as a
good user would write it, for bench/vision.sh to compare with
bench/vision_train.c (tandem's training step) on the same shapes.

    /usr/bin/python3 bench/torch_vlm.py MODEL.json B T STEPS WARMUP THREADS

The language model is bench/torch_train.py's MoETransformer (fused q/k/v and
gate/up products, sorted MoE dispatch, foreach AdamW, float32, its malloc
tunables); the vision tower and projector are docs/vision.md's: a stride-p
Conv2d patch embedding with bias, learnt position embeddings, pre-norm
encoder layers (F.layer_norm, fused q/k/v with bias, an unmasked softmax
attention as batched products, an out projection, fc1 -> GELU (erf) ->
fc2), the post LayerNorm and the two-layer GELU projector; its vectors
replace the placeholder rows of the embeddings (masked_scatter, as HF
LLaVA).  Each step: B sequences of T tokens, the first P the image's
placeholders, random pixels in [-1, 1], random ids and targets;
cross-entropy plus the router losses, backward, clipping at 1.0, AdamW
(lr 1e-3, betas 0.9 / 0.95, weight decay 0.1 on matrices).  Prints one line
    torch_vlm tokens_per_s=X step_s=Y loss_first=A loss_last=B
(median step over STEPS after WARMUP untimed ones).
"""
import os
import sys

MALLOC_TUNE = "glibc.malloc.mmap_threshold=2147483647:glibc.malloc.trim_threshold=17179869184"
if __name__ == "__main__" and "glibc.malloc" not in os.environ.get("GLIBC_TUNABLES", ""):
    _env = dict(os.environ)
    _env["GLIBC_TUNABLES"] = ":".join(filter(None, [_env.get("GLIBC_TUNABLES"), MALLOC_TUNE]))
    os.execve(sys.executable, [sys.executable] + sys.argv, _env)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import json  # noqa: E402
import math  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as Fn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_train as TT  # noqa: E402


class Vlm(TT.MoETransformer):
    def __init__(self, c, v, tok, T, seed):
        super().__init__(c, T, seed)
        self.v, self.tok = v, tok
        g = torch.Generator().manual_seed(seed + 1)
        D, Fv, p, d = v["hidden_size"], v["intermediate_size"], v["patch_size"], c["hidden_size"]
        P = (v["image_size"] // p) ** 2

        def mat(*shape, s=0.02):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * s)

        def zeros(n):
            return torch.nn.Parameter(torch.zeros(n))

        def ones(n):
            return torch.nn.Parameter(torch.ones(n))

        self.patch_w, self.patch_b, self.pos = mat(D, 3, p, p), zeros(D), mat(P, D)
        self.vlayers = torch.nn.ModuleList()
        for _ in range(v["num_hidden_layers"]):
            m = torch.nn.Module()
            m.ln1_w, m.ln1_b, m.ln2_w, m.ln2_b = ones(D), zeros(D), ones(D), zeros(D)
            m.qkv_w, m.qkv_b, m.o_w, m.o_b = mat(3 * D, D), zeros(3 * D), mat(D, D), zeros(D)
            m.fc1_w, m.fc1_b, m.fc2_w, m.fc2_b = mat(Fv, D), zeros(Fv), mat(D, Fv), zeros(D)
            self.vlayers.append(m)
        self.post_w, self.post_b = ones(D), zeros(D)
        self.p1_w, self.p1_b, self.p2_w, self.p2_b = mat(d, D), zeros(d), mat(d, d), zeros(d)

    def tower(self, pixels):
        v = self.v
        D, H, eps = v["hidden_size"], v["num_attention_heads"], v.get("layer_norm_eps", 1e-6)
        n = pixels.shape[0]
        x = Fn.conv2d(pixels, self.patch_w, self.patch_b, stride=v["patch_size"])
        x = x.flatten(2).transpose(1, 2) + self.pos              # (n, P, D)
        P, hd = x.shape[1], D // H
        for m in self.vlayers:
            h = Fn.layer_norm(x, (D,), m.ln1_w, m.ln1_b, eps)
            q, k, vv = Fn.linear(h, m.qkv_w, m.qkv_b).view(n, P, 3, H, hd).permute(2, 0, 3, 1, 4)
            a = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(hd)), dim=-1)
            a = torch.matmul(a, vv).transpose(1, 2).reshape(n, P, D)
            x = x + Fn.linear(a, m.o_w, m.o_b)
            h = Fn.layer_norm(x, (D,), m.ln2_w, m.ln2_b, eps)
            x = x + Fn.linear(Fn.gelu(Fn.linear(h, m.fc1_w, m.fc1_b)), m.fc2_w, m.fc2_b)
        x = Fn.layer_norm(x, (D,), self.post_w, self.post_b, eps)
        return Fn.linear(Fn.gelu(Fn.linear(x, self.p1_w, self.p1_b)), self.p2_w, self.p2_b)

    def forward(self, ids, targets, pixels):
        c = self.c
        B, T = ids.shape
        d = c["hidden_size"]
        x = Fn.embedding(ids, self.embed)
        img = self.tower(pixels).reshape(-1, d)
        x = x.masked_scatter((ids == self.tok)[..., None].expand_as(x), img)
        auxes, zs = [], []
        for m in self.layers:
            attn = self.mla if c["kv_lora_rank"] else self.attention
            x = x + attn(m, self.rmsnorm(x, m.ln1), B, T)
            h = self.rmsnorm(x, m.ln2)
            if m.dense:
                x = x + self.swiglu(h, m.gate_up, m.down)
            else:
                y, aux, z = self.moe(m, h.view(B * T, d))
                x = x + y.view(B, T, d)
                auxes.append(aux)
                zs.append(z)
        x = self.rmsnorm(x, self.norm)
        logits = Fn.linear(x, self.embed if self.lm_head is None else self.lm_head)
        ce = Fn.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))
        aux = torch.stack(auxes).mean() if auxes else torch.zeros(())
        z = torch.stack(zs).mean() if zs else torch.zeros(())
        return ce + c["router_aux_loss_coef"] * aux + c["router_z_loss_coef"] * z, ce


def main():
    path, B, T, steps, warm, threads = sys.argv[1], *(int(x) for x in sys.argv[2:7])
    torch.set_num_threads(threads)
    cfg = json.load(open(path))
    v, tok = cfg.pop("vision_config"), cfg.pop("image_token_index")
    cfg.pop("projector_hidden_act", None)
    c = TT.full_config(cfg)
    model = Vlm(c, v, tok, T, 1234)
    params = list(model.parameters())
    opt = torch.optim.AdamW([dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
                             dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)],
                            lr=1e-3, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    S, P = v["image_size"], (v["image_size"] // v["patch_size"]) ** 2
    g = torch.Generator().manual_seed(1)
    times, losses = [], []
    for step in range(warm + steps):
        ids = torch.randint(0, tok, (B, T), generator=g)
        ids[:, :P] = tok
        tg = torch.randint(0, tok, (B, T), generator=g)
        pixels = torch.rand((B, 3, S, S), generator=g) * 2 - 1
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss, ce = model(ids, tg, pixels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(ce.item())
        if step >= warm:
            times.append(dt)
    med = statistics.median(times)
    print("torch_vlm tokens_per_s=%.1f step_s=%.4f loss_first=%.4f loss_last=%.4f" % (B * T / med, med, losses[0], losses[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

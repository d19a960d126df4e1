#!/usr/bin/env python3
"""GRPO of the line writer's LoRA adapter on a GPU, from `memctl train data --steps`.

Reinforcement learning on the memory step's outcome, each step its own conversation (as
MemAgent trained its writers): for each prompt (a chunk of a training-split conversation
and the notes so far, token ids as the engine renders them) the model samples a group of
replies; each reply earns the share of the chunk's facts it states (a line holding all of
a fact's values) less 0.5 per noise sentence (one holding no fact of the conversation so
far, or said twice; `--noise-unit line` counts lines, as the first run did) and less 1
when it never ends; the reply's log-likelihood is pushed by its reward
less its group's mean, over its group's spread (GRPO, one on-policy update per batch, no
reference model: the low rank keeps the model near its base).

The model is the GGUF file itself, dequantized into PyTorch in the file's own layout (its
rotary pairs adjacent, as llama.cpp and the engine rotate them), so the adapter it writes
(`blk.N.TARGET.lora_a|lora_b`, scale folded into B) loads in memctl unchanged. Needs
torch, safetensors and gguf.

    memctl train data --steps --writer lines --chunk-max 256 --count 1500 > steps.jsonl
    python3 grpo.py --model SmolLM2-135M-Instruct.Q4_1.gguf --init ADAPTER.safetensors \\
        --steps steps.jsonl --out DIR --seconds 420
    python3 grpo.py --model ... --init ... --greedy "Say hello."   # check against memctl
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
import gguf
from safetensors.torch import load_file, save_file

TARGETS = ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Model:
    def __init__(self, path, device):
        r = gguf.GGUFReader(path)
        field = lambda k: r.fields[k].contents()
        self.n_layer = field("llama.block_count")
        self.d = field("llama.embedding_length")
        self.n_head = field("llama.attention.head_count")
        self.n_kv = field("llama.attention.head_count_kv")
        self.hd = self.d // self.n_head
        self.base = float(field("llama.rope.freq_base"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.eos = int(field("tokenizer.ggml.eos_token_id"))
        self.tokens = field("tokenizer.ggml.tokens")
        self.types = field("tokenizer.ggml.token_type")
        self.byte = bytes_to_unicode()
        self.device = device
        w = {}
        for t in r.tensors:
            a = gguf.quants.dequantize(t.data, t.tensor_type)
            shape = [int(x) for x in reversed(t.shape)]
            w[t.name] = torch.from_numpy(np.array(a, dtype=np.float32).reshape(shape)).to(device)
        self.w = w
        self.emb = w["token_embd.weight"]
        self.out = w.get("output.weight", self.emb)
        inv = self.base ** (-torch.arange(0, self.hd, 2, dtype=torch.float64) / self.hd)
        self.inv = inv.float().to(device)
        self.lora = {}

    def decode(self, ids):
        out = bytearray()
        for i in ids:
            if self.types[i] == 3:  # control tokens print nothing
                continue
            out.extend(self.byte.get(c, 32) for c in self.tokens[i])
        return out.decode("utf-8", errors="replace")

    def load_lora(self, path, rank=8):
        if path == "none":  # a fresh adapter: A small and random, B zero
            g = torch.Generator().manual_seed(7)
            for li in range(self.n_layer):
                for name in TARGETS:
                    out_dim, in_dim = self.w[f"blk.{li}.{name}.weight"].shape
                    a = (torch.randn(rank, in_dim, generator=g) / math.sqrt(in_dim)).to(self.device)
                    b = torch.zeros(out_dim, rank, device=self.device)
                    self.lora[(li, name)] = (a.requires_grad_(True), b.requires_grad_(True))
            return
        t = load_file(path)
        for li in range(self.n_layer):
            for name in TARGETS:
                a = t[f"blk.{li}.{name}.lora_a"].float().to(self.device)
                b = t[f"blk.{li}.{name}.lora_b"].float().to(self.device)
                self.lora[(li, name)] = (a.requires_grad_(True), b.requires_grad_(True))

    def params(self):
        return [p for ab in self.lora.values() for p in ab]

    def save_lora(self, path):
        t = {}
        for (li, name), (a, b) in self.lora.items():
            t[f"blk.{li}.{name}.lora_a"] = a.detach().to("cpu", torch.float16).contiguous()
            t[f"blk.{li}.{name}.lora_b"] = b.detach().to("cpu", torch.float16).contiguous()
        save_file(t, path)

    def lin(self, x, li, name):
        y = x @ self.w[f"blk.{li}.{name}.weight"].T
        ab = self.lora.get((li, name))
        if ab is not None:
            y = y + (x @ ab[0].T) @ ab[1].T
        return y

    def rms(self, x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps).to(x.dtype) * w

    def rope(self, x, pos):
        ang = pos[..., None].float() * self.inv  # [B,T,hd/2]
        cos, sin = ang.cos()[:, :, None, :].to(x.dtype), ang.sin()[:, :, None, :].to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1).flatten(-2)

    def forward(self, ids, pos, mask, cache=None, at=0):
        """Hidden states after the final norm. `mask` [B,1,T,K] (True attends); with
        `cache` (per layer [k, v] of [B,KV,Tmax,hd]) this pass's keys go to `at`.."""
        B, T = ids.shape
        h = self.emb[ids]
        rep = self.n_head // self.n_kv
        for li in range(self.n_layer):
            x = self.rms(h, self.w[f"blk.{li}.attn_norm.weight"])
            q = self.rope(self.lin(x, li, "attn_q").view(B, T, self.n_head, self.hd), pos)
            k = self.rope(self.lin(x, li, "attn_k").view(B, T, self.n_kv, self.hd), pos)
            v = self.lin(x, li, "attn_v").view(B, T, self.n_kv, self.hd)
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            if cache is not None:
                cache[li][0][:, :, at:at + T] = k.to(cache[li][0].dtype)
                cache[li][1][:, :, at:at + T] = v.to(cache[li][1].dtype)
                k, v = cache[li][0][:, :, :at + T].to(q.dtype), cache[li][1][:, :, :at + T].to(q.dtype)
            k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
            o = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask)
            h = h + self.lin(o.transpose(1, 2).reshape(B, T, self.d), li, "attn_output")
            x = self.rms(h, self.w[f"blk.{li}.ffn_norm.weight"])
            h = h + self.lin(F.silu(self.lin(x, li, "ffn_gate")) * self.lin(x, li, "ffn_up"), li, "ffn_down")
        return self.rms(h, self.w["output_norm.weight"])

    def logits(self, h):
        return h @ self.out.T


def left_pad(prompts, pad):
    L = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), L), pad, dtype=torch.long)
    valid = torch.zeros((len(prompts), L), dtype=torch.bool)
    for i, p in enumerate(prompts):
        ids[i, L - len(p):] = torch.tensor(p)
        valid[i, L - len(p):] = True
    return ids, valid


def attention_mask(valid_q, valid_k, causal_offset):
    """[B,1,Tq,Tk]: causal over key positions, pads masked, each query sees itself."""
    B, Tq = valid_q.shape
    Tk = valid_k.shape[1]
    qi = torch.arange(Tq, device=valid_k.device)[:, None] + causal_offset
    ki = torch.arange(Tk, device=valid_k.device)[None, :]
    causal = ki <= qi
    return (causal[None] & valid_k[:, None, :] | (ki == qi)[None])[:, None]


@torch.no_grad()
def sample(model, prompts, max_new, temperature, autocast, gen=None):
    dev = model.device
    ids, valid = left_pad(prompts, model.eos)
    ids, valid = ids.to(dev), valid.to(dev)
    B, L = ids.shape
    pos = (valid.long().cumsum(1) - 1).clamp(min=0)
    dtype = torch.bfloat16 if autocast else torch.float32
    cache = [[torch.zeros(B, model.n_kv, L + max_new, model.hd, device=dev, dtype=dtype) for _ in range(2)]
             for _ in range(model.n_layer)]
    kvalid = torch.cat([valid, torch.zeros(B, max_new, dtype=torch.bool, device=dev)], 1)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        h = model.forward(ids, pos, attention_mask(valid, valid, 0), cache, 0)
    logits = model.logits(h[:, -1].float())
    cur = pos[:, -1] + 1
    out = torch.full((B, max_new), model.eos, dtype=torch.long, device=dev)
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    n = 0
    for t in range(max_new):
        if temperature > 0:
            tok = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen)[:, 0]
        else:
            tok = logits.argmax(-1)
        tok = torch.where(done, torch.full_like(tok, model.eos), tok)
        out[:, t] = tok
        n = t + 1
        done |= tok == model.eos
        if bool(done.all()) or t + 1 == max_new:
            break
        kvalid[:, L + t] = True
        mask = kvalid[:, None, None, :L + t + 1]
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
            h = model.forward(tok[:, None], cur[:, None], mask, cache, L + t)
        logits = model.logits(h[:, -1].float())
        cur = cur + 1
    return out[:, :n].cpu()


def completion(model, row):
    """Token ids up to and including the end token, and whether it ended."""
    ids = row.tolist()
    if model.eos in ids:
        return ids[:ids.index(model.eos) + 1], True
    return ids, False


def line_key(line):
    return re.sub(r"^\s*(\d+[.)]|[-*•])\s*", "", line).strip()


CHAT_TURN = re.compile(r"^(\[[^\]]{0,32}\]\s*)?(user|assistant|system|human|ai|bot|tool)(\s*\([^)]*\))?\s*:", re.I)


def kept_line(line):
    """Whether the engine's merge keeps a reply line: not NONE, a copied chat turn or
    under three words (its hygiene's other rules concern degenerate text)."""
    return line and line.rstrip(".").lower() != "none" and not CHAT_TURN.match(line) \
        and len(re.findall(r"\w+", line)) >= 3


def sentences(line):
    """A line's sentences, cut as the engine's line merge cuts them (`lines::sentences`)."""
    out, start = [], 0
    for m in re.finditer(r"[.!?](?= [A-Z0-9])", line):
        word = re.split(r"[^A-Za-z0-9]", line[start:m.start()])[-1]
        if m.group() == "." and (len(word) == 1 or word.lower() in ABBREVIATIONS):
            continue
        out.append(line[start:m.end()].strip())
        start = m.end()
    out.append(line[start:].strip())
    return [s for s in out if s]


ABBREVIATIONS = {"mr", "mrs", "ms", "dr", "st", "jr", "sr", "prof", "mt", "no", "vs", "etc", "approx"}


def reward(text, ended, values, earlier, unit="sentence"):
    lines = [l for l in (line_key(l) for l in text.splitlines()) if kept_line(l)]
    if unit == "sentence":
        # Each sentence is a fact of its own (the merge splits lines so): a line of
        # several cannot hide one that states nothing, and one said twice is noise.
        split, seen = [], set()
        for s in (s for l in lines for s in sentences(l) if kept_line(s)):
            key = s.lower().rstrip(".")
            split.append(s if key not in seen else "")
            seen.add(key)
        lines = split
    holds = lambda line, vs: all(v.lower() in line.lower() for v in vs)
    kept = sum(any(holds(l, vs) for l in lines) for vs in values)
    known = values + earlier
    noise = sum(not any(holds(l, vs) for vs in known) for l in lines)
    score = kept / len(values) if values else 1.0
    r = score - 0.5 * noise - (0.0 if ended else 1.0)
    return r, score, noise


def logprobs(model, prompts, comps, autocast):
    """Sum of log-probabilities of each completion, and its token count."""
    dev = model.device
    ids, valid = left_pad(prompts, model.eos)
    L = ids.shape[1]
    C = max(len(c) for c in comps)
    cid = torch.full((len(comps), C), model.eos, dtype=torch.long)
    cvalid = torch.zeros((len(comps), C), dtype=torch.bool)
    for i, c in enumerate(comps):
        cid[i, :len(c)] = torch.tensor(c)
        cvalid[i, :len(c)] = True
    seq = torch.cat([ids, cid], 1).to(dev)
    v = torch.cat([valid, cvalid], 1).to(dev)
    pos = (v.long().cumsum(1) - 1).clamp(min=0)
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast):
        h = model.forward(seq, pos, attention_mask(v, v, 0))
    hc = h[:, L - 1:L + C - 1].float()
    lp = torch.log_softmax(model.logits(hc), -1).gather(-1, cid.to(dev)[..., None])[..., 0]
    return (lp * cvalid.to(dev)).sum(1), cvalid.sum(1).to(dev)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--init", required=True, help="adapter to start from (safetensors, scale folded into B), or none")
    p.add_argument("--steps", help="memctl train data --steps output (JSON Lines)")
    p.add_argument("--out", help="folder for adapters and the log")
    p.add_argument("--seconds", type=float, default=420, help="training time, then the last adapter is written")
    p.add_argument("--prompts", type=int, default=16, help="prompts per update")
    p.add_argument("--group", type=int, default=8, help="replies sampled per prompt")
    p.add_argument("--micro", type=int, default=32, help="sequences per backward pass")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-new", type=int, default=96)
    p.add_argument("--save-every", type=float, default=0, help="also write an adapter every this many seconds")
    p.add_argument("--max-updates", type=int, default=0)
    p.add_argument("--noise-unit", choices=["sentence", "line"], default="sentence",
                   help="what a noise penalty counts: each sentence (default), or each line as the "
                        "first run did, which taught the writer to put several sentences on a line")
    p.add_argument("--seed", type=int, default=5)
    p.add_argument("--greedy", help="print the greedy reply (chat-templated token ids as JSON) and stop")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--bf16", action="store_true", help="bfloat16 products on the CPU too (always on a GPU)")
    a = p.parse_args()
    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    autocast = dev.type == "cuda" or a.bf16
    if autocast:
        torch.backends.cuda.matmul.allow_tf32 = True
    t0 = time.time()
    model = Model(a.model, dev)
    model.load_lora(a.init)
    print(f"loaded in {time.time() - t0:.1f}s on {dev}", flush=True)
    if a.greedy:
        out = sample(model, [json.loads(a.greedy)], 48, 0.0, autocast)
        ids, _ = completion(model, out[0])
        print(json.dumps({"ids": ids, "text": model.decode(ids)}))
        return
    rows = [json.loads(l) for l in open(a.steps)]
    rows = [r for r in rows if r["mode"] == "general"]
    random.shuffle(rows)
    print(f"{len(rows)} steps, {sum(bool(r['values']) for r in rows)} with facts", flush=True)
    os.makedirs(a.out, exist_ok=True)
    log = open(os.path.join(a.out, "log.jsonl"), "a")
    opt = torch.optim.AdamW(model.params(), lr=a.lr, weight_decay=0.0)
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    start, last_save, update, cursor = time.time(), time.time(), 0, 0
    while time.time() - start < a.seconds and (not a.max_updates or update < a.max_updates):
        batch = rows[cursor:cursor + a.prompts]
        cursor += a.prompts
        if len(batch) < a.prompts:
            random.shuffle(rows)
            cursor = 0
            continue
        prompts = [r["prompt_ids"] for r in batch for _ in range(a.group)]
        ts = time.time()
        out = sample(model, prompts, a.max_new, a.temperature, autocast, gen)
        tg = time.time() - ts
        comps, rewards, scores, noises, ended_n = [], [], [], [], 0
        for i, r in enumerate(batch):
            for g in range(a.group):
                ids, ended = completion(model, out[i * a.group + g])
                rw, sc, nz = reward(model.decode(ids), ended, r["values"], r["earlier_values"], a.noise_unit)
                comps.append(ids)
                rewards.append(rw)
                scores.append(sc)
                noises.append(nz)
                ended_n += ended
        R = torch.tensor(rewards).view(a.prompts, a.group)
        adv = (R - R.mean(1, keepdim=True)) / (R.std(1, keepdim=True) + 1e-4)
        adv = adv.flatten()
        live = [i for i in range(len(comps)) if abs(float(adv[i])) > 1e-6]
        opt.zero_grad(set_to_none=True)
        norm = a.prompts * a.group * a.max_new
        for s in range(0, len(live), a.micro):
            idx = live[s:s + a.micro]
            lp, _ = logprobs(model, [prompts[i] for i in idx], [comps[i] for i in idx], autocast)
            loss = -(adv[idx].to(dev) * lp).sum() / norm
            loss.backward()
        gnorm = float(torch.nn.utils.clip_grad_norm_(model.params(), 1.0)) if live else 0.0
        if live:
            opt.step()
        update += 1
        rec = {"update": update, "seconds": round(time.time() - start, 1), "sample_s": round(tg, 2),
               "reward": round(float(R.mean()), 4), "score": round(sum(scores) / len(scores), 4),
               "noise": round(sum(noises) / len(noises), 4), "ended": ended_n / len(comps),
               "live": len(live), "grad_norm": round(gnorm, 4)}
        print(json.dumps(rec), flush=True)
        log.write(json.dumps(rec) + "\n")
        log.flush()
        if a.save_every and time.time() - last_save >= a.save_every:
            model.save_lora(os.path.join(a.out, f"adapter-u{update}.safetensors"))
            last_save = time.time()
    model.save_lora(os.path.join(a.out, "adapter.safetensors"))
    print(f"done: {update} updates in {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()

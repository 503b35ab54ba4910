#!/usr/bin/python3
"""A float64 reference forward of DeepSeek-V4 and V4.1 ("deepseek4" and "deepseek41" GGUF files of
f32 tensors), in numpy.

Written from DeepSeek's public description of DeepSeek-V4 (the model card and technical report:
hyper-connections with Sinkhorn-normalized mixes, compressed sparse attention with a lightning
indexer, heavily compressed attention, a sliding window, attention sinks, grouped low-rank output,
sqrt-softplus routing with hash-routed first layers) and llama.cpp's GGUF names for its tensors and
keys (src/llama-arch.cpp). It runs one token at a time and keeps every row as it is first computed,
the simplest reading of the model: an independent check of gale's model/arch/deepseek4.cc and of
the references it is tested against.

DeepSeek-V4.1 follows the description in llama.cpp's later deepseek41 port (its source comments,
and its GGUF names and keys: engram.*, the roles read from which tensors a layer carries) and
DeepSeek's Engram paper and demo (deepseek-ai/Engram, engram_demo_v1.py: n-gram hashing by
multiply-xor per head modulo distinct primes, the signed-sqrt sigmoid gate per copy):
- single-pass hyper-connections: a sublayer collapses the copies with the pre weights the one
  before it computed (layer 0: the first copy); the last FFN's collapse the output, no output head;
- shared compressed KV: KV source layers pool disjoint blocks of their ratio (softmax-gated per
  channel, no positional bias; at ratio 1 a plain projection), RMSNorm, RoPE at the block's first
  position; a source's index keys come from its normed, unrotated row (indexer.attn_k, k_norm,
  RoPE); index sources pick the top-k rows; later compressed layers read the last source's rows
  and reuse the last index source's picks; no per-head query norm;
- Engram before the layers that have it: the token and its predecessors through token_map (pad_id
  from the sequence's start), hashed, the rows through engram_wkv to a key per copy and a shared
  value, each copy gaining value * sigmoid(sgn(s) sqrt(max(|s|, 1e-6))), s the normed key and copy's
  dot product over sqrt(dim);
- the two-level index (which the port leaves out): the candidate source layer, an index source,
  takes each block of candidate_block_size of its rows at its best score, always keeps the block
  of the newest row, and keeps the candidate_top_k_blocks best blocks; the index sources after it
  pick their top-k among the rows of those blocks only (read from the role, keys and unit tests
  of published V4.1 serving code: candidate_source_layer_id, candidate_topk_blocks,
  candidate_block_size).
Where the port is silent the choices are gale's (docs/deepseek-v4.md): RoPE of a compressed row at
its block's first position, as V4; the index key from the row after its norm.

    /usr/bin/python3 tools/deepseek4_reference.py REFERENCE.gguf NAME=MODEL.gguf ... [--write OUT.gguf]

runs the tokens of REFERENCE.gguf (tests/data/llamacpp/deepseek4.gguf, written by
scripts/make-ggml-reference.sh) through each MODEL.gguf (that script's NAME file: `gale synth
--arch deepseek4 ...` with the flags it lists) and prints the largest difference of its logits from
the rows "NAME" there (llama.cpp's, every 8th position; none for V4.1, which that llama.cpp cannot
run); --write keeps its own rows (as f32) in OUT.gguf, with the tokens, for
tests/model/deepseek4_test.cc. Needs Debian's python3-numpy.
"""
import struct
import sys

import numpy as np

# --- GGUF -------------------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def read_gguf(path):
    """(metadata dict, tensors dict of numpy arrays, rows first) of a GGUF v3 file of f32/i32 tensors."""
    data = open(path, "rb").read()
    at = 0

    def take(fmt):
        nonlocal at
        v = struct.unpack_from(fmt, data, at)[0]
        at += struct.calcsize(fmt)
        return v

    def string():
        nonlocal at
        n = take("<Q")
        s = data[at:at + n].decode("utf-8")
        at += n
        return s

    def value(t):
        if t in _SCALARS:
            return take(_SCALARS[t])
        if t == 8:
            return string()
        if t == 9:
            et, n = take("<I"), take("<Q")
            return [value(et) for _ in range(n)]
        raise ValueError("GGUF value type %d" % t)

    if data[:4] != b"GGUF":
        raise ValueError(path + " is not a GGUF file")
    at = 4
    take("<I")  # version
    n_tensors, n_kv = take("<Q"), take("<Q")
    meta = {}
    for _ in range(n_kv):
        key = string()
        meta[key] = value(take("<I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("<Q") for _ in range(take("<I"))]
        infos.append((name, dims, take("<I"), take("<Q")))
    align = meta.get("general.alignment", 32)
    base = (at + align - 1) // align * align
    tensors = {}
    for name, dims, ttype, off in infos:
        count = int(np.prod(dims))
        if ttype == 0:
            arr = np.frombuffer(data, np.float32, count, base + off).astype(np.float64)
        elif ttype == 26:
            arr = np.frombuffer(data, np.int32, count, base + off)
        else:
            raise ValueError("tensor %s: type %d (this reference reads f32 and i32 files)" % (name, ttype))
        tensors[name] = arr.reshape(list(reversed(dims)))
    return meta, tensors


# --- the model ----------------------------------------------------------------------------------


def rms(x, w=None, eps=1e-6):
    y = x / np.sqrt(np.mean(x * x) + eps)
    return y if w is None else y * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def rope_tail(x, n_rot, pos, base, inverse=False):
    """Rotates the last n_rot values of x (adjacent pairs, pair i by pos * base^(-2i / n_rot))."""
    y = x.copy()
    half = n_rot // 2
    theta = pos * base ** (-2.0 * np.arange(half) / n_rot)
    c, s = np.cos(theta), np.sin(theta) * (-1.0 if inverse else 1.0)
    a, b = x[-n_rot::2].copy(), x[-n_rot + 1::2].copy()
    y[-n_rot::2] = a * c - b * s
    y[-n_rot + 1::2] = a * s + b * c
    return y


MASK64 = (1 << 64) - 1


class DeepSeekV4:
    def __init__(self, meta, t):
        arch = meta["general.architecture"]
        self.v41 = arch == "deepseek41"
        p = arch + "."
        g = lambda k, d=None: meta.get(p + k, d)
        self.t = t
        self.dim = g("embedding_length")
        self.n_layer = g("block_count")
        self.n_head = g("attention.head_count")
        self.head = g("attention.key_length")
        self.n_rot = g("rope.dimension_count")
        self.base = g("rope.freq_base", 10000.0)
        self.comp_base = g("attention.compress_rope_freq_base")
        self.eps = g("attention.layer_norm_rms_epsilon")
        self.window = g("attention.sliding_window")
        self.ratios = g("attention.compress_ratios")
        self.i_heads = g("attention.indexer.head_count")
        self.i_dim = g("attention.indexer.key_length")
        self.top_k = g("attention.indexer.top_k")
        self.groups = g("attention.output_group_count")
        self.o_rank = g("attention.output_lora_rank")
        self.hc = g("hyper_connection.count")
        self.sinkhorn = g("hyper_connection.sinkhorn_iterations")
        self.hc_eps = g("hyper_connection.epsilon")
        self.hash_layers = g("hash_layer_count")
        self.n_used = g("expert_used_count")
        self.w_scale = g("expert_weights_scale", 1.0)
        clamp = g("swiglu_clamp_exp", 0.0)
        self.clamp = clamp if isinstance(clamp, list) else [clamp] * self.n_layer
        if g("hyper_connection.count") != 4 or g("expert_gating_func") != 4 or "rope.scaling.type" in str(meta):
            raise ValueError("this reference reads 4 hyper-connection copies, sqrt-softplus routing, no RoPE scaling")
        # V4.1: each compressed layer's rows (and keys) come from the last KV source, its picks
        # from the last index source; the Engram sites and constants.
        self.rows_from, self.picks_from = [-1] * self.n_layer, [-1] * self.n_layer
        src = idx = -1
        for l in range(self.n_layer if self.v41 else 0):
            b = "blk.%d." % l
            if b + "attn_compressor_kv.weight" in t:
                src = l
            if b + "indexer.attn_q_b.weight" in t:
                idx = l
            if self.ratios[l]:
                self.rows_from[l], self.picks_from[l] = src, idx
        # V4.1's two-level index: the candidate source scores blocks of its rows for the later
        # index sources, which pick only inside the blocks it kept.
        self.cand_layer = g("attention.indexer.candidate_source_layer", -1) if self.v41 else -1
        self.cand_blocks = g("attention.indexer.candidate_top_k_blocks", 0)
        self.cand_bs = g("attention.indexer.candidate_block_size", 0)
        self.sites = g("engram.layer_ids", [])
        if self.sites:
            self.e_heads, self.e_ngram, self.pad = g("engram.head_count"), g("engram.max_ngram_size"), g("engram.pad_id")
            self.e_mult, self.e_prime = g("engram.multipliers"), g("engram.primes")
            self.e_offset, self.e_map = g("engram.offsets"), g("engram.token_map")
        self.reset()

    def reset(self):
        L = self.n_layer
        self.raw = [[] for _ in range(L)]                 # per layer: the K=V row of every position
        self.state = [[] for _ in range(L)]               # per layer: (kv, score) of every position
        self.i_state = [[] for _ in range(L)]
        self.comp = [[] for _ in range(L)]                # per layer: completed compressed rows
        self.i_comp = [[] for _ in range(L)]
        self.keys = [[] for _ in range(L)]                # V4.1 key owners: index keys of their rows
        self.picks = []                                   # V4.1: the last index source's picks
        self.cand = None                                  # V4.1: the candidate source's blocks
        self.tokens = []
        self.pos = 0

    # Hyper-connections: the sublayer's input, and (post, mix[src, dst]) for its output.
    def hc_pre(self, H, prefix, full=True, pre_in=None):
        """V4.1 (pre_in given): collapses with pre_in and also returns its own pre weights."""
        t = self.t
        m = t[prefix + "fn.weight"] @ rms(H.reshape(-1), eps=self.eps)
        s, b = t[prefix + "scale.weight"], t[prefix + "base.weight"]
        n = self.hc
        pre = sigmoid(m[:n] * s[0] + b[:n]) + self.hc_eps
        x = (pre if pre_in is None else pre_in) @ H
        if not full:
            return x
        post = 2.0 * sigmoid(m[n:2 * n] * s[1] + b[n:2 * n])
        mix = (m[2 * n:] * s[2] + b[2 * n:]).reshape(n, n)  # [src, dst]
        mix = np.exp(mix - mix.max(axis=1, keepdims=True))
        mix = mix / mix.sum(axis=1, keepdims=True) + self.hc_eps
        mix = mix / (mix.sum(axis=0, keepdims=True) + self.hc_eps)  # each dst sums to 1 over src
        for _ in range(self.sinkhorn - 1):
            mix = mix / (mix.sum(axis=1, keepdims=True) + self.hc_eps)  # each src over dst
            mix = mix / (mix.sum(axis=0, keepdims=True) + self.hc_eps)
        return (x, post, mix) if pre_in is None else (x, post, mix, pre)

    @staticmethod
    def hc_post(y, H, post, mix):
        return post[:, None] * y[None, :] + mix.T @ H

    def compressor(self, prefix, layer, x, pos, ratio, states, rows, width):
        """Appends this position's state; on a block's last position, its compressed row."""
        t = self.t
        coff = 2 if ratio == 4 else 1
        kv = t[prefix + "kv.weight"] @ x
        score = t[prefix + "gate.weight"] @ x + t[prefix + "ape.weight"][pos % ratio]
        states.append((kv, score))
        if (pos + 1) % ratio:
            return
        start = pos + 1 - ratio
        vals, scores = [], []
        if coff == 2 and start >= ratio:  # the block before, first half of the channels
            for p in range(start - ratio, start):
                vals.append(states[p][0][:width])
                scores.append(states[p][1][:width])
        for p in range(start, pos + 1):
            vals.append(states[p][0][(coff - 1) * width:])
            scores.append(states[p][1][(coff - 1) * width:])
        vals, scores = np.array(vals), np.array(scores)
        w = np.exp(scores - scores.max(axis=0))
        row = (vals * (w / w.sum(axis=0))).sum(axis=0)
        row = rms(row, t[prefix + "norm.weight"], self.eps)
        rows.append(rope_tail(row, self.n_rot, start, self.comp_base))

    def compressor41(self, l, x, pos):
        """V4.1 KV source: this position's state; on a block's last position its row (and key)."""
        t, b, ratio = self.t, "blk.%d." % l, self.ratios[l]
        kv = t[b + "attn_compressor_kv.weight"] @ x
        gate = b + "attn_compressor_gate.weight"
        self.state[l].append((kv, t[gate] @ x if gate in t else kv))
        if (pos + 1) % ratio:
            return
        start = pos + 1 - ratio
        vals = np.array([self.state[l][p][0] for p in range(start, pos + 1)])
        scores = np.array([self.state[l][p][1] for p in range(start, pos + 1)])
        w = np.exp(scores - scores.max(axis=0))
        row = rms((vals * (w / w.sum(axis=0))).sum(axis=0), t[b + "attn_compressor_norm.weight"], self.eps)
        if b + "indexer.attn_k.weight" in t:
            key = rms(t[b + "indexer.attn_k.weight"] @ row, t[b + "indexer.k_norm.weight"], self.eps)
            self.keys[l].append(rope_tail(key, self.n_rot, start, self.comp_base))
        self.comp[l].append(rope_tail(row, self.n_rot, start, self.comp_base))

    def engram(self, e, l, H, pos):
        t, b, dim = self.t, "blk.%d." % l, self.dim
        n, heads = self.e_ngram, self.e_heads
        cols = (n - 1) * heads
        mult, prime = self.e_mult[e * n:(e + 1) * n], self.e_prime[e * cols:(e + 1) * cols]
        offset = self.e_offset[e * cols:(e + 1) * cols]
        mapped = lambda tok: self.e_map[tok] if 0 <= tok < len(self.e_map) else self.pad
        ctx = [mapped(self.tokens[pos - s]) if pos - s >= 0 else self.pad for s in range(n)]
        rows, rolling = [], (ctx[0] * mult[0]) & MASK64
        for s in range(1, n):
            rolling ^= (ctx[s] * mult[s]) & MASK64
            rows += [rolling % prime[(s - 1) * heads + h] + offset[(s - 1) * heads + h] for h in range(heads)]
        emb = np.concatenate([t[b + "engram_embd.weight"][r] for r in rows])
        kv = t[b + "engram_wkv.weight"] @ emb
        value = kv[self.hc * dim:]
        H = H.copy()
        for c in range(self.hc):
            k = rms(kv[c * dim:(c + 1) * dim], t[b + "engram_k.weight"][c], self.eps)
            q = rms(H[c], t[b + "engram_q.weight"][c], self.eps)
            s = k @ q / np.sqrt(dim)
            H[c] = H[c] + value * sigmoid(np.sign(s) * np.sqrt(max(abs(s), 1e-6)))
        return H

    def attention(self, l, x, pos):
        t, b = self.t, "blk.%d." % l
        ratio = self.ratios[l]
        base = self.comp_base if ratio else self.base
        qr = rms(t[b + "attn_q_a.weight"] @ x, t[b + "attn_q_a_norm.weight"], self.eps)
        q = (t[b + "attn_q_b.weight"] @ qr).reshape(self.n_head, self.head)
        q = np.array([rope_tail(h if self.v41 else rms(h, eps=self.eps), self.n_rot, pos, base) for h in q])
        kv = rope_tail(rms(t[b + "attn_kv.weight"] @ x, t[b + "attn_kv_a_norm.weight"], self.eps), self.n_rot, pos, base)
        self.raw[l].append(kv)
        keys = self.raw[l][max(0, pos - self.window + 1):]
        if ratio and self.v41:
            if self.rows_from[l] == l:
                self.compressor41(l, x, pos)
            src = self.rows_from[l]
            if self.picks_from[l] == l:
                n_rows = len(self.comp[src])
                visible = list(range(n_rows))
                if 0 <= self.cand_layer < l and self.cand is not None:
                    visible = [c for c in visible if c // self.cand_bs in self.cand]
                n_blocks = -(-n_rows // self.cand_bs) if self.cand_bs else 0
                choose = l == self.cand_layer and n_blocks > self.cand_blocks
                if len(visible) > self.top_k or choose:
                    iq = (t[b + "indexer.attn_q_b.weight"] @ qr).reshape(self.i_heads, self.i_dim)
                    iq = np.array([rope_tail(h, self.n_rot, pos, self.comp_base) for h in iq])
                    iw = (t[b + "indexer.proj.weight"] @ x) / np.sqrt(self.i_dim * self.i_heads)
                    score = (np.maximum(iq @ np.array(self.keys[src]).T, 0.0) * iw[:, None]).sum(axis=0)
                    if choose:  # each block's best row; the newest row's block always kept
                        best = np.array([score[k * self.cand_bs:(k + 1) * self.cand_bs].max() for k in range(n_blocks)])
                        best[(n_rows - 1) // self.cand_bs] = np.inf
                        self.cand = set(int(k) for k in np.argsort(-best, kind="stable")[:self.cand_blocks])
                    if len(visible) > self.top_k:
                        sub = np.array(visible)
                        visible = sorted(int(c) for c in sub[np.argsort(-score[sub], kind="stable")[:self.top_k]])
                self.picks = visible
            keys = keys + [self.comp[src][c] for c in self.picks]
        elif ratio:
            self.compressor(b + "attn_compressor_", l, x, pos, ratio, self.state[l], self.comp[l], self.head)
            visible = list(range(len(self.comp[l])))
            if ratio == 4:
                self.compressor(b + "indexer_compressor_", l, x, pos, ratio, self.i_state[l], self.i_comp[l], self.i_dim)
                if len(visible) > self.top_k:
                    iq = (t[b + "indexer.attn_q_b.weight"] @ qr).reshape(self.i_heads, self.i_dim)
                    iq = np.array([rope_tail(h, self.n_rot, pos, self.comp_base) for h in iq])
                    iw = (t[b + "indexer.proj.weight"] @ x) / np.sqrt(self.i_dim * self.i_heads)
                    K = np.array(self.i_comp[l])
                    score = (np.maximum(iq @ K.T, 0.0) * iw[:, None]).sum(axis=0)
                    visible = sorted(np.argsort(-score, kind="stable")[:self.top_k])
            keys = keys + [self.comp[l][c] for c in visible]
        K = np.array(keys)                                          # [rows, head], also V
        logits = q @ K.T / np.sqrt(self.head)                       # [heads, rows]
        sink = t[b + "attn_sinks.weight"]
        top = np.maximum(logits.max(axis=1), sink)
        e = np.exp(logits - top[:, None])
        p = e / (e.sum(axis=1) + np.exp(sink - top))[:, None]
        out = np.array([rope_tail(o, self.n_rot, pos, base, inverse=True) for o in p @ K])
        gdim = self.n_head * self.head // self.groups
        wo_a = t[b + "attn_output_a.weight"]
        low = np.concatenate([wo_a[g * self.o_rank:(g + 1) * self.o_rank] @ out.reshape(-1)[g * gdim:(g + 1) * gdim]
                              for g in range(self.groups)])
        return t[b + "attn_output_b.weight"] @ low

    def experts(self, l, x, token):
        t, b = self.t, "blk.%d." % l
        logits = t[b + "ffn_gate_inp.weight"] @ x
        probs = np.sqrt(np.logaddexp(0.0, logits))                  # sqrt(softplus)
        if l < self.hash_layers:
            chosen = list(t[b + "ffn_gate_tid2eid.weight"][token])
        else:
            chosen = list(np.argsort(-(probs + t[b + "exp_probs_b.bias"]), kind="stable")[:self.n_used])
        w = probs[chosen]
        w = w / max(w.sum(), 6.103515625e-5) * self.w_scale
        c = self.clamp[l]

        def ffn(gate, up, down):
            g, u = gate @ x, up @ x
            if c > 1e-6:
                g, u = np.minimum(g, c), np.clip(u, -c, c)
            return down @ (g * sigmoid(g) * u)

        out = sum(wi * ffn(t[b + "ffn_gate_exps.weight"][e], t[b + "ffn_up_exps.weight"][e], t[b + "ffn_down_exps.weight"][e])
                  for wi, e in zip(w, chosen))
        return out + ffn(t[b + "ffn_gate_shexp.weight"], t[b + "ffn_up_shexp.weight"], t[b + "ffn_down_shexp.weight"])

    def step(self, token):
        t, pos = self.t, self.pos
        self.tokens.append(token)
        self.cand = None
        H = np.repeat(t["token_embd.weight"][token][None, :], self.hc, axis=0)
        pre_next = np.eye(self.hc)[0]  # V4.1: what layer 0's attention collapses with
        for l in range(self.n_layer):
            b = "blk.%d." % l
            if l in self.sites:
                H = self.engram(self.sites.index(l), l, H, pos)
            if self.v41:
                x, post, mix, pre_own = self.hc_pre(H, b + "hc_attn_", pre_in=pre_next)
            else:
                x, post, mix = self.hc_pre(H, b + "hc_attn_")
            H = self.hc_post(self.attention(l, rms(x, t[b + "attn_norm.weight"], self.eps), pos), H, post, mix)
            if self.v41:
                x, post, mix, pre_next = self.hc_pre(H, b + "hc_ffn_", pre_in=pre_own)
            else:
                x, post, mix = self.hc_pre(H, b + "hc_ffn_")
            H = self.hc_post(self.experts(l, rms(x, t[b + "ffn_norm.weight"], self.eps), token), H, post, mix)
        x = pre_next @ H if self.v41 else self.hc_pre(H, "output_hc_", full=False)
        self.pos += 1
        return t["output.weight"] @ rms(x, t["output_norm.weight"], self.eps)


def write_gguf(path, tokens, tensors):
    """A GGUF v3 file of metadata "tokens" (i32 array) and f32 tensors [name -> 2-D array]."""
    def string(x):
        b = x.encode("utf-8")
        return struct.pack("<Q", len(b)) + b

    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 1)
    out += string("tokens") + struct.pack("<IIQ", 9, 5, len(tokens)) + struct.pack("<%di" % len(tokens), *tokens)
    blobs, offset = [], 0
    for name, arr in tensors.items():
        blob = np.ascontiguousarray(arr, dtype=np.float32).tobytes()
        out += string(name) + struct.pack("<I", arr.ndim) + struct.pack("<%dQ" % arr.ndim, *reversed(arr.shape))
        out += struct.pack("<IQ", 0, offset)
        blobs.append(blob + b"\0" * (-len(blob) % 32))
        offset += len(blobs[-1])
    out += b"\0" * (-len(out) % 32)
    open(path, "wb").write(out + b"".join(blobs))


def main():
    args = sys.argv[1:]
    out = None
    if "--write" in args:
        at = args.index("--write")
        out = args[at + 1]
        del args[at:at + 2]
    if len(args) < 2 or any("=" not in a for a in args[1:]):
        sys.exit(__doc__)
    ref_meta, ref = read_gguf(args[0])
    tokens = ref_meta["tokens"]
    written = {}
    for pair in args[1:]:
        name, path = pair.split("=", 1)
        meta, tensors = read_gguf(path)
        model = DeepSeekV4(meta, tensors)
        want = ref.get(name, [])
        rows, worst, same = [], 0.0, 0
        for i, token in enumerate(tokens):
            logits = model.step(token)
            if i % 8 == 7 and (i // 8 < len(want) or not len(want)):
                rows.append(logits)
                if len(want):
                    worst = max(worst, float(np.abs(logits - want[i // 8]).max()))
                    same += int(np.argmax(logits) == np.argmax(want[i // 8]))
        written[name] = np.array(rows)
        if len(want):
            print("%s: max |diff| against llama.cpp's logits %.2e, the same greedy token at %d of %d positions" %
                  (name, worst, same, len(rows)))
        else:
            print("%s: %d rows (no llama.cpp rows to compare)" % (name, len(rows)))
    if out:
        write_gguf(out, tokens, written)


if __name__ == "__main__":
    main()

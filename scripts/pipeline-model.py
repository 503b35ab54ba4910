#!/usr/bin/env python3
"""What pipeline and tensor parallelism over a real network would give, from what this machine measures.

Measures here (nothing is assumed that can be measured on one host):
  - the decode cost of one Llama-2-7B-shaped layer at Q4_0: `gale bench` on two synth files of
    that shape with 2 and 6 layers (the difference / 4 is one layer; the rest is the embedding,
    final norm and output head);
  - the software cost of one hop: `dist_bench` under `mpirun -np 2` over TCP loopback (Open MPI's
    tcp transport, the one a cluster of ordinary hosts uses), for the message sizes a token needs.
Then models, for Llama-2-7B and -70B at Q4_0 split over P hosts like this one joined by 10/25/100
GbE: per generated token (one stream) the bytes and messages that cross the network, the time
they take (software cost measured here + bytes / link rate + an assumed 10 us per NIC and switch
hop), and the expected tokens/s. 70B's layer cost is 7B's scaled by its bytes per layer (decode
is memory-bound: measured here at the roofline).

Pipeline (layers per host): a token's layers run one host after another (P row hops per token).
Tensor parallelism (heads and FFN width per host): every host reads 1/P of each layer's weights,
then two all-reduces per layer through rank 0 (the others' partial rows in, the sum out: on rank
0's link (P - 1) rows each way, one after another); the head split by vocabulary rows, each
host's logits sent to rank 0.

DeepSeek-V4.1-Flash (--v41-layer FILE: one layer at its real shapes, as docs/deepseek-v4.md writes
it with `gale synth`): `gale bench --trace` on that file measures one layer's decode and prefill
cost (the trace's spans split the output head and Engram's projection from the layer), then the
40-layer model (2 Engram layers) is laid out over 2-8 hosts of 128, 256 and 384 GB at 25 and 100
Gb/s as pipeline stages: a stage hands on per token the hyper-connection copies and their pre
weights (4 * (dim + 1) floats), the picks (1 + top-k), the candidate blocks (1 + 2048) and each of
the 4 KV sources' new row and index key (1 + 512 + 128). Per layout: whether the weights fit (300 GB with FP4 experts; the
200 GB of Engram tables are mapped and may stay on disk), one stream's tokens/s, and the time to
first token of a 1,024-token prompt (prefill cost per token as measured at 256 tokens).

  python3 scripts/pipeline-model.py --gale build/gale --dist-bench build/dist_bench [--out FILE.json]
  python3 scripts/pipeline-model.py ... --v41-layer v41l1.gguf   # adds DeepSeek-V4.1-Flash
"""
import argparse, json, os, re, subprocess, sys, tempfile

Q4_0_BYTES_PER_WEIGHT = 18 / 32  # 32 weights in 18 bytes
SHAPES = {  # dim, layers, heads, kv heads, ffn, vocab (Llama 2's published configurations)
    "7B": dict(dim=4096, layers=32, heads=32, kv=32, ffn=11008, vocab=32000),
    "70B": dict(dim=8192, layers=80, heads=64, kv=8, ffn=28672, vocab=32000),
}
LINKS = {"10 GbE": 1.25e9, "25 GbE": 3.125e9, "100 GbE": 12.5e9}  # bytes/s
WIRE_US = 10.0  # NIC + one switch, one way (assumed; not measurable on one host)


def layer_weights(s):
    head = s["dim"] // s["heads"]
    attn = 2 * s["dim"] * s["dim"] + 2 * s["dim"] * s["kv"] * head
    return attn + 3 * s["dim"] * s["ffn"]


def run(cmd, env=None):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout


def bench_tg(gale, path):
    out = run([gale, "bench", "-m", path, "-p", "0", "-n", "32", "-r", "3", "-t", str(os.cpu_count() or 2)])
    for line in out.splitlines():
        if "| tg32 |" in line:
            return float(line.split("|")[5])
    sys.exit("no tg32 row in:\n" + out)


# DeepSeek-V4.1-Flash (its published config): layers, hidden size, Engram layers; weights with FP4
# experts and FP8 dense tensors, the Engram tables apart.
V41 = dict(layers=40, dim=5120, engram_layers=2, weights_gb=300.0, engram_tables_gb=200.0, top_k=512,
           candidate_blocks=2048, sources=4, head_dim=512, index_dim=128)
V41_LINKS = {"25 Gb/s": 3.125e9, "100 Gb/s": 12.5e9}
RESERVE_GB = 16.0  # per host: the OS, the KV cache of a few long requests, buffers


def trace_costs(gale, path):
    """ms per token of the layer, of Engram's part and of the head, at decode (tg32) and prefill (pp256)."""
    tmp = tempfile.mkdtemp()
    costs = {}
    for test, args in (("decode", ["-p", "0", "-n", "32"]), ("prefill", ["-p", "256", "-n", "0"])):
        trace = os.path.join(tmp, test + ".json")
        run([gale, "bench", "-m", path, *args, "-r", "3", "-t", str(os.cpu_count() or 2), "--trace", trace])
        events = json.load(open(trace))
        events = events["traceEvents"] if isinstance(events, dict) else events
        steps = sorted((e for e in events if e.get("cat") == "step"), key=lambda e: e["ts"])
        tokens = 32 if test == "decode" else 256
        step_name = steps[-1]["name"]
        runs = [e for e in steps if e["name"] == step_name]
        # The repetitions after the warm-up: decode steps of one token each, or one prefill each.
        per_run = tokens if test == "decode" else 1
        timed = runs[len(runs) - 3 * per_run:]
        t0, t1 = timed[0]["ts"], timed[-1]["ts"] + timed[-1]["dur"]
        total = sum(e["dur"] for e in timed) / 1e3 / (3 * tokens)  # ms per token
        head = engram = 0.0
        for e in events:
            if e.get("cat") != "op" or not t0 <= e["ts"] < t1:
                continue
            if e["name"] in ("lm_head", "output_norm", "embed"):
                head += e["dur"]
            elif e["name"] in ("ds4_engram_rows", "ds4_engram_wkv", "ds4_engram_gate"):
                engram += e["dur"]
        head, engram = head / 1e3 / (3 * tokens), engram / 1e3 / (3 * tokens)
        costs[test] = dict(layer=total - head - engram, engram=engram, head=head)
    return costs


def v41_layouts(costs, software_us):
    row_bytes = 4 * (4 * (V41["dim"] + 1) + 1 + V41["top_k"] + 1 + V41["candidate_blocks"]
                     + V41["sources"] * (1 + V41["head_dim"] + V41["index_dim"]))
    print(f"\nDeepSeek-V4.1-Flash: one layer {costs['decode']['layer']:.2f} ms per decoded token "
          f"(Engram's part {costs['decode']['engram']:.2f}, head {costs['decode']['head']:.2f}); prefill "
          f"{costs['prefill']['layer']:.3f} ms per token and layer at 256 tokens. A stage hands on "
          f"{row_bytes / 1024:.0f} KiB per token.\n")
    print("| hosts x memory | link | weights per host | fits | decode tok/s (one stream) | network share "
          "| TTFT, 1,024 tokens | network share |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for p in (2, 3, 4, 6, 8):
        for mem in (128, 256, 384):
            per_host = V41["weights_gb"] / p
            fits = per_host <= mem - RESERVE_GB
            for link, rate in V41_LINKS.items():
                def hops_ms(tokens):  # p hops (p - 1 forward, one back to rank 0's head)
                    nbytes = tokens * row_bytes
                    return p * (software_us(min(nbytes, 32768)) + WIRE_US + nbytes / rate * 1e6) / 1e3
                d, f = costs["decode"], costs["prefill"]
                decode_ms = V41["layers"] * d["layer"] + V41["engram_layers"] * d["engram"] + d["head"]
                net_d = hops_ms(1)
                prompt = 1024
                prefill_ms = prompt * (V41["layers"] * f["layer"] + V41["engram_layers"] * f["engram"] + f["head"])
                net_p = hops_ms(prompt)
                row = dict(hosts=p, memory_gb=mem, link=link, weights_per_host_gb=per_host, fits=fits,
                           decode_tokens_per_s=1e3 / (decode_ms + net_d), decode_network_share=net_d / (decode_ms + net_d),
                           ttft_s=(prefill_ms + net_p) / 1e3, ttft_network_share=net_p / (prefill_ms + net_p))
                rows.append(row)
                if not fits:
                    continue
                print(f"| {p} x {mem} GB | {link} | {per_host:.0f} GB | yes | {row['decode_tokens_per_s']:.2f} | "
                      f"{100 * row['decode_network_share']:.2f}% | {row['ttft_s']:.1f} s | {100 * row['ttft_network_share']:.1f}% |")
    print("(layouts whose weights do not fit are left out of the table; the JSON has them)")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gale", default="build/gale")
    ap.add_argument("--dist-bench", default="build/dist_bench")
    ap.add_argument("--out", default="pipeline-model.json")
    ap.add_argument("--v41-layer", help="a one-layer DeepSeek-V4.1-Flash-shaped GGUF (docs/deepseek-v4.md)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    s7 = SHAPES["7B"]
    tg = {}
    for layers in (2, 6):
        path = os.path.join(tmp, f"l{layers}.gguf")
        run([a.gale, "synth", "--shape", "custom", "--arch", "llama", "--dim", str(s7["dim"]), "--layers", str(layers),
             "--heads", str(s7["heads"]), "--kv-heads", str(s7["kv"]), "--ffn", str(s7["ffn"]), "--vocab",
             str(s7["vocab"]), "--ctx", "4096", "--type", "q4_0", "-o", path])
        tg[layers] = bench_tg(a.gale, path)
        os.remove(path)
    t2, t6 = 1e3 / tg[2], 1e3 / tg[6]
    t_layer7 = (t6 - t2) / 4  # ms per token per layer
    t_head7 = t2 - 2 * t_layer7
    env = dict(os.environ, OMPI_MCA_btl="self,tcp")
    if os.getuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    jpath = os.path.join(tmp, "dist.json")
    run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", "2", a.dist_bench, "--out", jpath], env=env)
    hops = {e["bytes"]: e["one_way_us"] for e in json.load(open(jpath))["sizes"]}

    def software_us(nbytes):  # the measured size at or above nbytes
        return hops[min([b for b in hops if b >= nbytes] or [max(hops)])]

    def shape_costs(s):  # ms per token of one layer and of embedding + head, one token's row in bytes
        return (t_layer7 * layer_weights(s) / layer_weights(s7), t_head7 * s["dim"] / s7["dim"], s["dim"] * 4)

    print(f"measured here: one 7B-shaped Q4_0 layer {t_layer7:.2f} ms per decoded token, embedding + head "
          f"{t_head7:.2f} ms; TCP loopback one way: 16 KiB {software_us(16384):.1f} us, 32 KiB {software_us(32768):.1f} us\n")
    print("| model | hosts | link | bytes / token | messages / token | network ms / token | compute ms / token "
          "| expected tok/s (one stream) | network share |")
    print("|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name, s in SHAPES.items():
        t_layer, t_head, hidden = shape_costs(s)
        compute = s["layers"] * t_layer + t_head
        for p in ((2, 4) if name == "7B" else (2, 4, 8)):
            for link, rate in LINKS.items():
                # p - 1 boundaries forward, one back to rank 0 (the rows for its output head); the
                # step's plan goes out to every rank before rank 0 computes (off the critical path).
                per_hop_ms = (software_us(hidden) + WIRE_US + hidden / rate * 1e6) / 1e3
                net = p * per_hop_ms
                tps = 1e3 / (compute + net)
                row = dict(model=name, hosts=p, link=link, bytes_per_token=p * hidden, messages_per_token=p + (p - 1),
                           network_ms=net, compute_ms=compute, tokens_per_s=tps, network_share=net / (compute + net))
                rows.append(row)
                print(f"| {name} Q4_0 | {p} | {link} | {p * hidden / 1024:.0f} KiB | {p} + {p - 1} plans | {net:.3f} | "
                      f"{compute:.0f} | {tps:.2f} | {100 * net / (compute + net):.2f}% |")
    print("\nTensor parallelism:\n")
    print("| model | hosts | link | bytes / token (rank 0's link) | messages / token | network ms / token "
          "| compute ms / token | expected tok/s (one stream) | network share |")
    print("|---|---|---|---|---|---|---|---|---|")
    tp_rows = []
    for name, s in SHAPES.items():
        t_layer, t_head, hidden = shape_costs(s)
        for p in (2, 4, 8):
            if s["kv"] % p or s["heads"] % p:
                continue
            for link, rate in LINKS.items():
                # Each all-reduce: the others' rows in, then the sum out, (p - 1) rows each way on
                # rank 0's link; the first and last of each way pay the software and wire latency.
                per_reduce_ms = (2 * (software_us(hidden) + WIRE_US) + 2 * (p - 1) * hidden / rate * 1e6) / 1e3
                reduces = 2 * s["layers"]
                # The head split by vocabulary rows: each rank's logits for the token to rank 0.
                logits = s["vocab"] // p * 4
                gather_ms = (software_us(logits) + WIRE_US + (p - 1) * logits / rate * 1e6) / 1e3
                net = reduces * per_reduce_ms + gather_ms
                compute = s["layers"] * t_layer / p + t_head / p
                tps = 1e3 / (compute + net)
                nbytes = reduces * 2 * (p - 1) * hidden + (p - 1) * logits
                msgs = reduces * 2 * (p - 1) + (p - 1)
                row = dict(model=name, hosts=p, link=link, bytes_per_token=nbytes, messages_per_token=msgs + (p - 1),
                           network_ms=net, compute_ms=compute, tokens_per_s=tps, network_share=net / (compute + net))
                tp_rows.append(row)
                print(f"| {name} Q4_0 | {p} | {link} | {nbytes / 1024:.0f} KiB | {msgs} + {p - 1} plans | {net:.2f} | "
                      f"{compute:.0f} | {tps:.2f} | {100 * net / (compute + net):.1f}% |")
    v41 = {}
    if a.v41_layer:
        v41["costs"] = trace_costs(a.gale, a.v41_layer)
        v41["rows"] = v41_layouts(v41["costs"], software_us)
    json.dump(dict(t_layer_7b_ms=t_layer7, t_head_7b_ms=t_head7, tcp_one_way_us=hops, wire_us=WIRE_US, rows=rows,
                   tensor_parallel_rows=tp_rows, deepseek_v41_flash=v41),
              open(a.out, "w"), indent=1)
    print(f"\nwrote {a.out}")


if __name__ == "__main__":
    main()

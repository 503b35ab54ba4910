#!/usr/bin/env bash
# Regenerates tests/data/llamacpp from a real llama.cpp: the prebuilt CPU libraries in the npm
# package @node-llama-cpp/linux-x64 (fetched with `npm pack`, nothing is installed). Not part of the
# build or the tests; run by hand when the reference should change (see tools/ggml_reference.cc).
set -euo pipefail
cd "$(dirname "$0")/.."
version="${NODE_LLAMA_CPP_VERSION:-3.22.1}"
build="${BUILD_DIR:-build}"
cmake --build "$build" -j"$(nproc)" --target gale ggml_reference
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
lib="$(NODE_LLAMA_CPP_VERSION="$version" scripts/fetch-llamacpp.sh "$tmp/npm")"
cat "$lib/_nlcBuildMetadata.json"; echo
mkdir -p tests/data/llamacpp
# Qwen3.5 (qwen35, Gated DeltaNet hybrids): 200 tokens, past llama.cpp's 64-token chunks (the
# test's Shapes(); `make-ggml-reference.sh qwen35` writes only these). qwen35_odd: odd heads, three
# value heads on one key head, attention every third layer; qwen35_sections: RoPE sections that
# leave pairs in the fourth section (unrotated for text); qwen35_recurrent: the layers' kinds as a
# list (attention at layers 1 and 3); qwen35moe, qwen35moe_odd: the mixture of experts with its
# gated shared expert.
if [[ "${1:-}" != keys ]]; then
  q35=()
  while IFS='|' read -r name args keys; do
    kflags=()
    for k in $keys; do kflags+=(--key "$k"); done
    # shellcheck disable=SC2086
    "$build/gale" synth --shape custom $args --vocab 512 --ctx 256 --type f32 --seed 7 "${kflags[@]}" \
      -o "$tmp/$name.gguf"
    q35+=("$name=$tmp/$name.gguf")
  done <<'SHAPES'
qwen35|--arch qwen35 --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ffn 256|
qwen35_odd|--arch qwen35 --dim 96 --layers 6 --heads 3 --kv-heads 1 --head-dim 48 --ffn 192 --ssm-k-heads 1 --ssm-v-heads 3 --ssm-state 24 --full-attention-interval 3|
qwen35_sections|--arch qwen35 --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ffn 256|rope.dimension_sections=i32s:0,1,1,0
qwen35_recurrent|--arch qwen35 --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ffn 256|attention.recurrent_layers=bools:true,false,true,false
qwen35moe|--arch qwen35moe --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ffn 96 --experts 8 --experts-used 2 --expert-ffn 64|
qwen35moe_odd|--arch qwen35moe --dim 96 --layers 6 --heads 3 --kv-heads 1 --head-dim 48 --ffn 64 --experts 6 --experts-used 3 --expert-ffn 32 --ssm-k-heads 1 --ssm-v-heads 3 --ssm-state 24 --full-attention-interval 3|
SHAPES
  LD_LIBRARY_PATH="$lib" "$build/ggml_reference" long "$lib" tests/data/llamacpp/qwen35.gguf 200 "${q35[@]}" \
      2> "$tmp/log" || { tail -20 "$tmp/log"; exit 1; }
  if [[ "${1:-}" == qwen35 ]]; then exit 0; fi
fi
# Keys llama.cpp reads that the shapes below leave at their defaults, each set to another value
# (tests/model/hparam_keys_test.cc's kKeyShapes must match): llama.cpp's logits of 64 tokens, every
# 8th position, in tests/data/llamacpp/keys.gguf. `make-ggml-reference.sh keys` writes only these.
mkdir -p tests/data/llamacpp
keyed=()
while IFS='|' read -r name args keys; do
  kflags=()
  for k in $keys; do kflags+=(--key "$k"); done
  # shellcheck disable=SC2086
  "$build/gale" synth --shape custom $args --vocab 512 --ctx 256 --type f32 --seed 7 "${kflags[@]}" -o "$tmp/$name.gguf"
  keyed+=("$name=$tmp/$name.gguf")
done <<'SHAPES'
gemma3_keys|--arch gemma3 --dim 128 --layers 7 --heads 4 --kv-heads 1 --head-dim 64 --ffn 256 --window 5|attention.sliding_window_pattern=u32:3 rope.freq_base_swa=f32:50000 final_logit_softcapping=f32:3 rope.scaling.factor=f32:2
gemma3_pattern|--arch gemma3 --dim 128 --layers 7 --heads 4 --kv-heads 1 --head-dim 64 --ffn 256 --window 5|attention.sliding_window_pattern=bools:true,false,true,true,false,true,false
gemma2_keys|--arch gemma2 --dim 128 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ffn 256 --window 5 --attn-softcap 1.5 --final-softcap 3|attention.sliding_window_pattern=u32:3 rope.freq_base_swa=f32:50000 rope.scaling.factor=f32:2
gpt_oss_keys|--arch gpt-oss --dim 192 --layers 4 --heads 3 --kv-heads 1 --head-dim 64 --ffn 384 --experts 6 --experts-used 3 --expert-ffn 96 --window 5 --yarn 4 --yarn-orig-ctx 64|attention.sliding_window_pattern=u32:3 rope.freq_base_swa=f32:40000
llama_linear|--arch llama --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512|rope.scaling.factor=f32:4 rope.scaling.attn_factor=f32:0.8 rope.scaling.finetuned=bool:true rope.scaling.alpha=f32:3 vocab_size=u32:1000 attention.layer_norm_rms_epsilon=f32:0.01
llama_scale_linear|--arch llama --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512|rope.scale_linear=f32:3
llama_none|--arch llama --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512|rope.scaling.type=str:none rope.scaling.factor=f32:4
qwen2_arrays|--arch qwen2 --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512|attention.head_count=u32s:4,4 attention.head_count_kv=u32s:2,2 feed_forward_length=u32s:512,512
qwen3moe_arrays|--arch qwen3moe --dim 256 --layers 2 --heads 4 --kv-heads 2 --head-dim 64 --ffn 512 --experts 8 --experts-used 2 --expert-ffn 128|expert_used_count=u32s:2,2 expert_feed_forward_length=u32s:128,128
phi3_window|--arch phi3 --dim 256 --layers 2 --heads 4 --kv-heads 4 --ffn 512|attention.sliding_window=u32:5
deepseek4_shexp|--arch deepseek4 --dim 128 --layers 5 --heads 2 --kv-heads 1 --head-dim 128 --rope-dim 64 --q-lora-rank 64 --window 24 --compress-ratios 4,128,4,0,128 --hash-layers 1 --indexer-heads 16 --indexer-dim 64 --indexer-top-k 8 --out-groups 1 --out-lora-rank 32 --ffn 256 --experts 6 --experts-used 3 --expert-ffn 32 --shared-experts 1 --swiglu-clamp 0.3|swiglu_clamp_shexp=f32s:0.02,0.02,0.02,0.02,0.02
SHAPES
LD_LIBRARY_PATH="$lib" "$build/ggml_reference" long "$lib" tests/data/llamacpp/keys.gguf 64 "${keyed[@]}" \
    2> "$tmp/log" || { tail -20 "$tmp/log"; exit 1; }
if [[ "${1:-}" == keys ]]; then exit 0; fi
# A small llama whose every row length is a multiple of 256, so llama-quantize's mixes keep their
# K and IQ4 types (grouped-query attention, two layers: use_more_bits picks layer 0 only).
"$build/gale" synth --shape custom --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 \
  --ctx 256 --type f32 --seed 7 -o "$tmp/f32.gguf"
# The same shape with Llama 3.1's frequency scaling (rope_freqs.weight; a small original context so
# that most frequencies are scaled).
"$build/gale" synth --shape custom --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --vocab 512 \
  --ctx 256 --type f32 --seed 7 --rope-freqs-ctx 64 -o "$tmp/rope_freqs.gguf"
# Each architecture in several shapes: grouped-query attention, odd head counts, a head size other
# than dim / heads (the shapes must match tests/gguf/llamacpp_reference_test.cc's kArchShapes).
extra=("rope_freqs=$tmp/rope_freqs.gguf")
while read -r name arch dim layers heads kv_heads head_dim ffn rope_ctx yarn; do
  "$build/gale" synth --shape custom --arch "$arch" --dim "$dim" --layers "$layers" --heads "$heads" \
    --kv-heads "$kv_heads" --head-dim "$head_dim" --ffn "$ffn" --vocab 512 --ctx 256 --type f32 --seed 7 \
    --rope-freqs-ctx "$rope_ctx" --yarn "$yarn" --yarn-orig-ctx 64 --window "$([[ $arch == gemma* ]] && echo 5 || echo 0)" \
    --attn-softcap 1.5 --final-softcap 3 \
    -o "$tmp/$name.gguf"
  extra+=("$name=$tmp/$name.gguf")
done <<'SHAPES'
llama_head48 llama 256 2 8 2 48 512 0 0
llama_yarn llama 256 2 4 2 0 512 0 4
qwen2_gqa qwen2 256 2 4 2 0 512 0 0
qwen2_odd qwen2 192 2 3 1 64 320 0 0
qwen2_yarn qwen2 192 2 3 1 64 320 0 4
qwen3_gqa qwen3 256 2 4 2 128 512 0 0
qwen3_odd qwen3 160 3 5 5 48 384 0 0
phi3 phi3 256 2 4 4 0 512 0 0
phi3_longrope phi3 192 2 3 1 64 320 64 0
gemma3 gemma3 128 7 4 1 64 256 0 0
gemma3_odd gemma3 96 7 3 3 48 160 0 0
gemma2 gemma2 128 4 4 2 64 256 0 0
gemma2_odd gemma2 96 3 3 1 48 160 0 0
SHAPES
# Mixtures of experts (the shapes must match the test's kMoeShapes): qwen3moe, and llama with
# experts (Mixtral-style); experts, experts per token, expert width.
while read -r name arch dim layers heads kv_heads head_dim ffn experts used expert_ffn; do
  "$build/gale" synth --shape custom --arch "$arch" --dim "$dim" --layers "$layers" --heads "$heads" \
    --kv-heads "$kv_heads" --head-dim "$head_dim" --ffn "$ffn" --vocab 512 --ctx 256 --type f32 --seed 7 \
    --experts "$experts" --experts-used "$used" --expert-ffn "$expert_ffn" -o "$tmp/$name.gguf"
  extra+=("$name=$tmp/$name.gguf")
done <<'SHAPES'
qwen3moe qwen3moe 256 2 4 2 64 512 8 2 128
qwen3moe_odd qwen3moe 192 3 3 1 64 384 6 3 96
mixtral llama 256 2 4 2 0 128 4 2 0
SHAPES
# glm4moe: biases, per-head norms, partial NEOX RoPE, dense leading layers, sigmoid routing with a
# selection bias, shared experts, and one multi-token-prediction layer at the end (never run).
while read -r name dim layers heads kv_heads head_dim rope ffn experts used expert_ffn dense shared; do
  "$build/gale" synth --shape custom --arch glm4moe --dim "$dim" --layers "$layers" --heads "$heads" \
    --kv-heads "$kv_heads" --head-dim "$head_dim" --rope-dim "$rope" --ffn "$ffn" --experts "$experts" \
    --experts-used "$used" --expert-ffn "$expert_ffn" --leading-dense "$dense" --shared-experts "$shared" \
    --nextn-layers 1 --vocab 512 --ctx 256 --type f32 --seed 7 -o "$tmp/$name.gguf"
  extra+=("$name=$tmp/$name.gguf")
done <<'SHAPES'
glm4moe 256 4 4 2 64 32 512 8 2 64 1 1
glm4moe_odd 192 4 3 1 64 16 384 6 3 96 0 2
SHAPES
# gpt-oss: biases, attention sinks, windows of 5 on the even layers, the router's and experts'
# biases, clamped SwiGLU (the test's kMoeShapes); gpt_oss: a query width (8 x 64) other than dim;
# gpt_oss_yarn: YaRN by 4 from an original context of 64. gpt_oss_mxfp4: gpt_oss's shape with one
# layer (its router reads the f32 embeddings, the same in both engines: no routing flips from the
# engines' different int8 activations) through `gale quantize --type mxfp4` (MXFP4 experts, Q8_0
# attention).
while read -r name dim layers heads kv_heads head_dim ffn experts used expert_ffn yarn; do
  "$build/gale" synth --shape custom --arch gpt-oss --dim "$dim" --layers "$layers" --heads "$heads" \
    --kv-heads "$kv_heads" --head-dim "$head_dim" --ffn "$ffn" --experts "$experts" --experts-used "$used" \
    --expert-ffn "$expert_ffn" --window 5 --yarn "$yarn" --yarn-orig-ctx 64 --vocab 512 --ctx 256 --type f32 \
    --seed 7 -o "$tmp/$name.gguf"
  extra+=("$name=$tmp/$name.gguf")
done <<'SHAPES'
gpt_oss 256 3 8 2 64 512 8 2 128 0
gpt_oss_yarn 192 4 3 1 64 384 6 3 96 4
gpt_oss_1l 256 1 8 2 64 512 8 2 128 0
SHAPES
"$build/gale" quantize --type mxfp4 -i "$tmp/gpt_oss_1l.gguf" -o "$tmp/gpt_oss_mxfp4.gguf" 2> /dev/null
extra+=("gpt_oss_mxfp4=$tmp/gpt_oss_mxfp4.gguf")
# Latent attention (deepseek2, llama.cpp's MLA format) with DeepSeek-V3's routing: sigmoid scores,
# selection bias, expert groups, a shared expert, dense leading layers (the test's kMlaShapes);
# the lite variant has no query low rank (26 layers: llama.cpp tells lite files by layer count).
# deepseek2_yarn: YaRN by 4 from an original context of 64, yarn_log_multiplier 0.1.
while read -r name dim layers heads kv_lora q_lora nope rope v_head ffn experts used expert_ffn dense shared groups gused yarn; do
  "$build/gale" synth --shape custom --arch deepseek2 --dim "$dim" --layers "$layers" --heads "$heads" \
    --kv-lora-rank "$kv_lora" --q-lora-rank "$q_lora" --nope-dim "$nope" --rope-dim "$rope" --v-head-dim "$v_head" \
    --ffn "$ffn" --experts "$experts" --experts-used "$used" --expert-ffn "$expert_ffn" --leading-dense "$dense" \
    --shared-experts "$shared" --expert-groups "$groups" --groups-used "$gused" --yarn "$yarn" --yarn-orig-ctx 64 \
    --vocab 512 --ctx 256 --type f32 --seed 7 -o "$tmp/$name.gguf"
  extra+=("$name=$tmp/$name.gguf")
done <<'SHAPES'
deepseek2 256 3 4 128 96 32 32 48 512 8 2 64 1 1 4 2 0
deepseek2_lite 128 26 2 64 0 32 16 32 256 4 2 32 1 1 0 0 0
deepseek2_yarn 256 3 4 128 96 32 32 48 512 8 2 64 1 1 4 2 4
SHAPES
# Embedding models (pooling_type mean, cls, last): llama.cpp's pooled embeddings of the tokens too.
for pool in mean cls last; do
  "$build/gale" synth --shape custom --arch qwen3 --dim 256 --layers 2 --heads 4 --kv-heads 2 --head-dim 64 \
    --ffn 512 --vocab 512 --ctx 256 --type f32 --seed 7 --pooling "$pool" -o "$tmp/qwen3_embd_$pool.gguf"
  extra+=("qwen3_embd_$pool=$tmp/qwen3_embd_$pool.gguf")
done
# BERT encoders (bidirectional attention, learned positions, LayerNorm, GELU; pooled mean and CLS):
# llama.cpp's pooled embeddings of the tokens in one batch (the test's kBertShapes).
while read -r name dim layers heads ffn pool; do
  "$build/gale" synth --shape custom --arch bert --dim "$dim" --layers "$layers" --heads "$heads" --kv-heads "$heads" \
    --ffn "$ffn" --vocab 512 --ctx 256 --type f32 --seed 7 --pooling "$pool" -o "$tmp/$name.gguf"
  extra+=("$name=$tmp/$name.gguf")
done <<'SHAPES'
bert_mean 256 2 4 512 mean
bert_cls_odd 192 3 3 320 cls
SHAPES
mkdir -p tests/data/llamacpp
# DeepSeek-V4 (deepseek4): 320 tokens, so that windows pass and compressed rows (4 and 128
# positions each) outnumber the indexer's top-k; tests/data/llamacpp/deepseek4.gguf keeps every 8th
# position's logits (the test's Shapes()). 16 indexer heads: with few, a row's score is often
# exactly 0 (every head's ReLU at 0), and ties at the top-k cut are broken differently by the two
# engines.
ds4=()
while read -r name dim layers heads head rope qlora window ratios hash iheads idim topk groups olora experts used effn clamp; do
  "$build/gale" synth --shape custom --arch deepseek4 --dim "$dim" --layers "$layers" --heads "$heads" --kv-heads 1 \
    --head-dim "$head" --rope-dim "$rope" --q-lora-rank "$qlora" --window "$window" --compress-ratios "$ratios" \
    --hash-layers "$hash" --indexer-heads "$iheads" --indexer-dim "$idim" --indexer-top-k "$topk" --out-groups "$groups" \
    --out-lora-rank "$olora" --ffn 256 --experts "$experts" --experts-used "$used" --expert-ffn "$effn" \
    --shared-experts 1 --swiglu-clamp "$clamp" --vocab 512 --ctx 1024 --type f32 --seed 7 -o "$tmp/$name.gguf"
  ds4+=("$name=$tmp/$name.gguf")
done <<'SHAPES'
deepseek4 256 4 4 128 64 128 16 0,4,128,4 2 16 128 4 2 64 8 2 64 10
deepseek4_b 128 5 2 128 64 64 24 4,128,4,0,128 1 16 64 8 1 32 6 3 32 0.3
SHAPES
LD_LIBRARY_PATH="$lib" "$build/ggml_reference" long "$lib" tests/data/llamacpp/deepseek4.gguf 320 "${ds4[@]}" \
    2> "$tmp/log" || { tail -20 "$tmp/log"; exit 1; }
# The float64 reference forward on the same files and tokens (Debian's python3-numpy).
mkdir -p tests/data/reference
/usr/bin/python3 tools/deepseek4_reference.py tests/data/llamacpp/deepseek4.gguf "${ds4[@]}" \
    --write tests/data/reference/deepseek4_f64.gguf
# DeepSeek-V4.1 (deepseek41), which this llama.cpp cannot run: the float64 reference alone, on the
# same tokens (tests/model/deepseek4_test.cc's V41Shapes()): ratios 2 and 1 (and 4) with more rows
# than the top-k, readers of an earlier source's rows and of an earlier index source's picks,
# Engram on two layers (the first's n-grams reaching back past the sequence's start), and the
# two-level index (candidate blocks from layer 0 for the index sources after it).
ds41=()
while read -r name dim layers heads head qlora window ratios sources pickers sites eheads edim engram erows hash topk groups olora experts used effn clamp cand cblocks cbs; do
  "$build/gale" synth --shape custom --arch deepseek41 --dim "$dim" --layers "$layers" --heads "$heads" --kv-heads 1 \
    --head-dim "$head" --rope-dim 64 --q-lora-rank "$qlora" --window "$window" --compress-ratios "$ratios" \
    --kv-source-layers "$sources" --index-source-layers "$pickers" --engram-layers "$sites" --engram-heads "$eheads" \
    --engram-dim "$edim" --engram-ngram "$engram" --engram-rows "$erows" --hash-layers "$hash" --indexer-heads 16 \
    --indexer-dim 64 --indexer-top-k "$topk" --out-groups "$groups" --out-lora-rank "$olora" --ffn 256 \
    --experts "$experts" --experts-used "$used" --expert-ffn "$effn" --shared-experts 1 --swiglu-clamp "$clamp" \
    --candidate-source-layer "$cand" --candidate-top-k-blocks "$cblocks" --candidate-block-size "$cbs" \
    --vocab 512 --ctx 1024 --type f32 --seed 7 -o "$tmp/$name.gguf"
  ds41+=("$name=$tmp/$name.gguf")
done <<'SHAPES'
deepseek41 256 6 4 128 128 16 0,2,2,2,1,1 1,4 1,2,4 0,3 2 16 3 50 1 8 2 64 8 2 64 10 -1 0 0
deepseek41_b 128 5 2 128 64 24 1,1,0,4,4 0,3 0,1,3 1 4 8 4 30 0 12 1 32 6 3 32 0.3 -1 0 0
deepseek41_c 128 5 2 128 64 16 1,1,1,1,1 0 0,2,4 1 2 16 3 30 0 6 1 32 6 3 32 10 0 3 4
SHAPES
/usr/bin/python3 tools/deepseek4_reference.py tests/data/llamacpp/deepseek4.gguf "${ds41[@]}" \
    --write tests/data/reference/deepseek41_f64.gguf
LD_LIBRARY_PATH="$lib" "$build/ggml_reference" "$lib" "$tmp/f32.gguf" tests/data/llamacpp "$tmp" \
    "${extra[@]}" 2> "$tmp/log" ||
  { tail -20 "$tmp/log"; exit 1; }
cat > tests/data/llamacpp/README.md <<END
Written by \`scripts/make-ggml-reference.sh\` (tools/ggml_reference.cc) with llama.cpp's CPU
libraries as prebuilt in the npm package @node-llama-cpp/linux-x64@$version
($(tr -d '\n ' < "$lib/_nlcBuildMetadata.json" | grep -o '"llamaCpp":{[^}]*}')). llama.cpp and ggml are
MIT-licensed (ggml-org); the weights are gale's own random synth model (seed 7), no one's data.
Read by tests/gguf/llamacpp_reference_test.cc.
END
ls -la tests/data/llamacpp

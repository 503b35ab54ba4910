// `gale convert` and `gale synth`: the two ways to make a GGUF file.
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tools/commands.h"
#include "convert/hf_convert.h"
#include "model/hf_tokenizer.h"
#include "convert/llama2c_convert.h"
#include "model/hparams.h"
#include "model/synth.h"

namespace gale {

CommandFn RegisterConvert(CLI::App& app) {
  struct Opts {
    std::string llama2c, tokenizer, hf, outtype = "f16", out;
  };
  auto o = std::make_shared<Opts>();
  app.add_option("--llama2c", o->llama2c, "llama2.c checkpoint (.bin), with --tokenizer");
  app.add_option("--tokenizer", o->tokenizer, "llama2.c tokenizer (.bin)");
  app.add_option("--hf", o->hf, "Hugging Face checkpoint folder: Llama, Mistral, Qwen2/2.5/3, Phi-3, Gemma 2/3, DeepSeek-V4/V4.1 (config.json, *.safetensors, tokenizer.json)");
  app.add_option("--outtype", o->outtype, "--hf: matrix type f32 | f16 | bf16 (DeepSeek-V4's FP8 and FP4 tensors keep their bytes as f8_e4m3 and mxfp4)")->capture_default_str();
  app.add_option("-o,--output", o->out, "output GGUF path")->required();
  return [o]() {
    auto fail = [](const Status& s) {
      std::fprintf(stderr, "gale convert: %s\n", s.ToString().c_str());
      return 1;
    };
    if (o->hf.empty() == o->llama2c.empty()) return fail(InvalidArgument("give one of --hf DIR or --llama2c FILE"));
    if (!o->hf.empty()) {
      const auto type = ParseTypeName(o->outtype);
      if (!type || (*type != GgmlType::kF32 && *type != GgmlType::kF16 && *type != GgmlType::kBF16)) {
        return fail(InvalidArgument("--outtype '{}' is not one of f32, f16, bf16 (quantize afterwards)", o->outtype));
      }
      GgufWriter w;
      auto r = ConvertHf(o->hf, *type, &w);
      if (!r.ok()) return fail(r.status().WithContext(o->hf));
      if (Status s = w.WriteFile(o->out); !s.ok()) return fail(s);
      // A DeepSeek release skips thousands (its draft layers' experts, a vision tower): the first
      // few and a count.
      for (size_t i = 0; i < r->skipped.size() && i < 12; ++i) std::fprintf(stderr, "skipped: %s\n", r->skipped[i].c_str());
      if (r->skipped.size() > 12) std::fprintf(stderr, "skipped: %zu more\n", r->skipped.size() - 12);
      std::fprintf(stderr, "wrote %s: %lld tensors, %lld layers, vocab %lld, pre-tokenizer %s, %s\n", o->out.c_str(),
                   static_cast<long long>(r->num_tensors), static_cast<long long>(r->layers),
                   static_cast<long long>(r->vocab), r->pre.c_str(), o->outtype.c_str());
      return 0;
    }
    if (o->tokenizer.empty()) return fail(InvalidArgument("--llama2c needs --tokenizer"));
    Llama2cConfig c;
    auto w = ConvertLlama2c(o->llama2c, o->tokenizer, &c);
    if (!w.ok()) return fail(w.status());
    if (Status s = w->WriteFile(o->out); !s.ok()) return fail(s);
    std::fprintf(stderr, "wrote %s: dim %d, layers %d, heads %d/%d, ffn %d, vocab %d, %s classifier\n",
                 o->out.c_str(), c.dim, c.num_layers, c.num_heads, c.num_kv_heads, c.hidden_dim, c.vocab_size,
                 c.shared_classifier ? "shared" : "separate");
    return 0;
  };
}

CommandFn RegisterSynth(CLI::App& app) {
  struct Opts {
    std::string shape = "tiny", type = "f16", out, tokenizer_dir, pooling, expert_type;
    std::vector<std::string> keys;
    uint64_t seed = 1;
    SynthShape custom;
  };
  auto o = std::make_shared<Opts>();
  std::vector<std::string> shapes = NamedSynthShapes();
  shapes.push_back("custom");
  app.add_option("--shape", o->shape, fmt::format("{}", fmt::join(shapes, " | ")))->capture_default_str();
  app.add_option("--arch", o->custom.arch, fmt::format("custom: architecture ({})", fmt::join(SupportedArchitectures(), " | ")))
      ->capture_default_str();
  app.add_option("--head-dim", o->custom.head_dim, "custom: head size (0: dim / heads)");
  app.add_option("--type", o->type, "f32 | f16 | bf16 | q8_0 | q4_0")->capture_default_str();
  app.add_option("--seed", o->seed, "weight seed")->capture_default_str();
  app.add_option("-o,--output", o->out, "output GGUF path")->required();
  app.add_option("--dim", o->custom.dim, "custom: embedding size");
  app.add_option("--layers", o->custom.num_layers, "custom: layers");
  app.add_option("--heads", o->custom.num_heads, "custom: attention heads");
  app.add_option("--kv-heads", o->custom.num_kv_heads, "custom: KV heads");
  app.add_option("--ffn", o->custom.ffn_dim, "custom: feed-forward size");
  app.add_option("--vocab", o->custom.vocab_size, "custom: vocab size");
  app.add_option("--ctx", o->custom.context_length, "custom: context length");
  app.add_option("--tokenizer", o->tokenizer_dir,
                 "a Hugging Face tokenizer folder (tokenizer.json, tokenizer_config.json) to write instead of the "
                 "synthetic vocab; the vocab size becomes its");
  app.add_option("--window", o->custom.sliding_window, "custom gemma2, gemma3, gpt-oss: sliding window (default 512, 512, 128); llama: a window on every layer (Mistral v0.1)");
  app.add_option("--attn-softcap", o->custom.attn_softcap, "custom gemma2: attention scores' soft-capping")->capture_default_str();
  app.add_option("--final-softcap", o->custom.final_softcap, "custom gemma2: the logits' soft-capping")->capture_default_str();
  app.add_option("--pooling", o->pooling, "make it an embedding model: its pooling_type (mean | cls | last)");
  app.add_option("--yarn", o->custom.yarn_factor, "YaRN RoPE scaling by this factor (with --yarn-orig-ctx)");
  app.add_option("--yarn-orig-ctx", o->custom.yarn_orig_ctx, "YaRN's original context length");
  app.add_option("--experts", o->custom.num_experts, "custom: a mixture of this many experts per layer (llama, qwen3moe)");
  app.add_option("--experts-used", o->custom.experts_used, "custom: experts per token");
  app.add_option("--expert-ffn", o->custom.expert_ffn, "custom: one expert's feed-forward size (0: --ffn)");
  app.add_option("--expert-type", o->expert_type, "the experts' type (default: --type; gpt-oss-20b, deepseek-v4-flash, deepseek-v4.1-flash: mxfp4)");
  app.add_option("--kv-lora-rank", o->custom.kv_lora_rank, "custom deepseek2: the latent's rank");
  app.add_option("--q-lora-rank", o->custom.q_lora_rank, "custom deepseek2: the query's low rank (0: one wq)");
  app.add_option("--nope-dim", o->custom.nope_dim, "custom deepseek2: query/key dims per head without RoPE");
  app.add_option("--rope-dim", o->custom.rope_dim, "custom deepseek2: RoPE dims (the shared key part); glm4moe, qwen35: rotated dims per head (0: half, a quarter)");
  app.add_option("--v-head-dim", o->custom.v_head_dim, "custom: value dims per head (deepseek2's value_length_mla; others: V's head size where it differs from K's)");
  app.add_option("--leading-dense", o->custom.leading_dense, "custom deepseek2, glm4moe: dense leading layers");
  app.add_option("--shared-experts", o->custom.shared_experts, "custom deepseek2, glm4moe: shared experts");
  app.add_option("--expert-groups", o->custom.expert_groups, "custom deepseek2: expert groups (0: none)");
  app.add_option("--groups-used", o->custom.groups_used, "custom deepseek2: groups a token chooses from");
  app.add_option("--nextn-layers", o->custom.nextn_layers, "custom glm4moe: multi-token-prediction layers at the end");
  app.add_option("--compress-ratios", o->custom.compress_ratios,
                 "custom deepseek4: per layer 0 (window only), 4 (with the indexer) or 128; the last repeats")
      ->delimiter(',');
  app.add_option("--hash-layers", o->custom.hash_layers, "custom deepseek4: leading layers routed by token id");
  app.add_option("--indexer-heads", o->custom.indexer_heads, "custom deepseek4: the lightning indexer's heads");
  app.add_option("--indexer-dim", o->custom.indexer_dim, "custom deepseek4: the indexer's head size");
  app.add_option("--indexer-top-k", o->custom.indexer_top_k, "custom deepseek4: compressed rows each query attends");
  app.add_option("--out-groups", o->custom.out_groups, "custom deepseek4: the output projection's groups");
  app.add_option("--out-lora-rank", o->custom.out_lora_rank, "custom deepseek4: each group's low rank");
  app.add_option("--swiglu-clamp", o->custom.swiglu_clamp, "custom deepseek4: the experts' SwiGLU clamp (0: none)");
  app.add_option("--kv-source-layers", o->custom.kv_source_layers,
                 "custom deepseek41: layers that compress KV and own index keys (default: the first of each ratio's run)")
      ->delimiter(',');
  app.add_option("--index-source-layers", o->custom.index_source_layers,
                 "custom deepseek41: layers whose indexer picks rows (default: the KV sources)")
      ->delimiter(',');
  app.add_option("--candidate-source-layer", o->custom.candidate_layer,
                 "custom deepseek41: the index source whose scores pick candidate blocks for the later ones (-1: none)");
  app.add_option("--candidate-top-k-blocks", o->custom.candidate_blocks, "custom deepseek41: candidate blocks kept");
  app.add_option("--candidate-block-size", o->custom.candidate_block_size, "custom deepseek41: compressed rows per block");
  app.add_option("--engram-layers", o->custom.engram_layers, "custom deepseek41: layers with Engram")->delimiter(',');
  app.add_option("--engram-heads", o->custom.engram_heads, "custom deepseek41: Engram heads per n-gram size");
  app.add_option("--engram-dim", o->custom.engram_dim, "custom deepseek41: an Engram table row's length");
  app.add_option("--engram-ngram", o->custom.engram_ngram, "custom deepseek41: the longest n-gram");
  app.add_option("--engram-rows", o->custom.engram_rows, "custom deepseek41: about this many table rows per head");
  app.add_option("--ssm-conv", o->custom.ssm_conv, "custom qwen35: Gated DeltaNet's convolution taps (0: 4)");
  app.add_option("--ssm-state", o->custom.ssm_state, "custom qwen35: a linear head's size (0: half the attention head)");
  app.add_option("--ssm-k-heads", o->custom.ssm_k_heads, "custom qwen35: linear key heads (0: the KV heads)");
  app.add_option("--ssm-v-heads", o->custom.ssm_v_heads, "custom qwen35: linear value heads (0: twice the key heads)");
  app.add_option("--full-attention-interval", o->custom.full_attention_interval,
                 "custom qwen35: every this many layers one is full attention (0: 4)");
  app.add_option("--rope-freqs-ctx", o->custom.rope_freqs_ctx,
                 "write Llama 3.1's rope_freqs tensor with this original context length (0: none)");
  app.add_option("--key", o->keys,
                 "write NAME=TYPE:VALUE under the architecture's prefix last, replacing what the shape wrote "
                 "(TYPE u32, i32, u64, f32, bool, str; u32s, i32s, f32s, bools: comma-separated arrays)");
  return [o]() {
    auto type = ParseTypeName(o->type);
    if (!type) {
      std::fprintf(stderr, "gale synth: unknown type '%s' (f32, f16, bf16, q8_0, q4_0)\n", o->type.c_str());
      return 1;
    }
    SynthShape shape = o->custom;
    if (o->shape != "custom") {
      auto named = NamedSynthShape(o->shape);
      if (!named.ok()) {
        std::fprintf(stderr, "gale synth: %s\n", named.status().message().c_str());
        return 1;
      }
      shape = *named;
      shape.rope_freqs_ctx = o->custom.rope_freqs_ctx;
      if (o->custom.yarn_factor > 0.0) {
        shape.yarn_factor = o->custom.yarn_factor;
        shape.yarn_orig_ctx = o->custom.yarn_orig_ctx;
      }
      if (o->custom.sliding_window > 0) shape.sliding_window = o->custom.sliding_window;
    }
    for (const std::string& spec : o->keys) {
      auto kv = ParseSynthKey(spec);
      if (!kv.ok()) {
        std::fprintf(stderr, "gale synth: %s\n", kv.status().message().c_str());
        return 1;
      }
      shape.keys.push_back(std::move(*kv));
    }
    if (!o->expert_type.empty()) {
      auto et = ParseTypeName(o->expert_type);
      if (!et) {
        std::fprintf(stderr, "gale synth: unknown expert type '%s'\n", o->expert_type.c_str());
        return 1;
      }
      shape.expert_type = *et;
    }
    if (!o->pooling.empty()) {
      auto p = ParsePooling(o->pooling);
      if (!p.ok()) {
        std::fprintf(stderr, "gale synth: %s\n", p.status().message().c_str());
        return 1;
      }
      shape.pooling_type = static_cast<int64_t>(*p);
    }
    std::optional<HfTokenizer> tokenizer;
    if (!o->tokenizer_dir.empty()) {
      auto t = ReadHfTokenizerDir(o->tokenizer_dir);
      if (!t.ok()) {
        std::fprintf(stderr, "gale synth: %s\n", t.status().message().c_str());
        return 1;
      }
      tokenizer = std::move(*t);
      shape.vocab_size = static_cast<int64_t>(tokenizer->tokens.size());
    }
    std::function<void(GgufWriter&)> write_tokenizer;
    if (tokenizer) write_tokenizer = [&](GgufWriter& w) { WriteHfTokenizer(*tokenizer, &w); };
    auto w = SynthesizeModel(shape, *type, o->seed, write_tokenizer);
    if (!w.ok()) {
      std::fprintf(stderr, "gale synth: %s\n", w.status().message().c_str());
      return 1;
    }
    if (Status s = w->WriteFile(o->out); !s.ok()) {
      std::fprintf(stderr, "gale synth: %s\n", s.ToString().c_str());
      return 1;
    }
    std::fprintf(stderr, "wrote %s (%s, %s)\n", o->out.c_str(), shape.name.c_str(), o->type.c_str());
    return 0;
  };
}

}  // namespace gale

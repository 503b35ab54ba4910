// Entry point of `gale`: parses the command line and dispatches to a subcommand.
#include <cstdio>
#include <vector>

#include "tools/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"gale: LLM inference engine"};
  app.require_subcommand(1);
  struct Entry {
    CLI::App* sub;
    gale::CommandFn fn;
  };
  std::vector<Entry> entries;
  auto add = [&](const char* name, const char* help, gale::CommandFn (*reg)(CLI::App&)) {
    CLI::App* sub = app.add_subcommand(name, help);
    entries.push_back({sub, reg(*sub)});
  };
  add("run", "generate text from a prompt", gale::RegisterRun);
  add("batch", "generate for many prompts at once (JSONL in, JSONL out) with continuous batching",
      gale::RegisterBatch);
  add("convert", "convert a llama2.c checkpoint or a Hugging Face checkpoint (Llama, Mistral, Qwen2/3, Phi-3, Gemma 2/3) to GGUF", gale::RegisterConvert);
  add("bench", "measure prefill and decode throughput against the roofline", gale::RegisterBench);
  add("serve", "serve the model over an OpenAI-compatible HTTP API", gale::RegisterServe);
  add("loadgen", "load-test an OpenAI-compatible server and report latency and throughput", gale::RegisterLoadgen);
  add("template", "render a chat template for a context (or print its error)", gale::RegisterTemplate);
  add("tokenize", "print the token ids of a text", gale::RegisterTokenize);
  add("quantize", "quantize an F32/F16/BF16 model's weights (llama.cpp's types, W8A8, W4A16, W4A8)",
      gale::RegisterQuantize);
  add("calibrate-kv", "add calibrated per-channel key statistics for int8/int4 KV caches to a model",
      gale::RegisterCalibrateKv);
  add("eval", "accuracy: perplexity, KL divergence against a base model", gale::RegisterEval);
  add("synth", "write a deterministic random-weight GGUF of any supported architecture (see --arch, --shape)", gale::RegisterSynth);
  CLI11_PARSE(app, argc, argv);
  for (auto& e : entries) {
    if (e.sub->parsed()) return e.fn();
  }
  return 1;
}

// Subcommands of the `gale` binary. Each registers its options on the CLI11 app and returns the
// callback to run when selected; main.cc only wires them together.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

#include "model/model.h"

namespace gale {

using CommandFn = std::function<int()>;

CommandFn RegisterRun(CLI::App& app);

// How to load model bytes: --mmap maps the file; --no-mmap reads it into huge-page memory (no TLB
// misses when weights stream, 1.5-2x faster decode of float models here, but a private copy);
// default: read into memory when the file is under 40% of the available memory (MemAvailable, or
// the memory cgroup's headroom where that is less), else map.
struct LoadOptions {
  bool force_mmap = false;
  bool force_copy = false;
  // Keep the file's copy of matrices that were packed for the kernels resident (commands that
  // read the file's tensors again, e.g. quantize); otherwise it is given back to the OS.
  bool keep_packed_sources = false;
  // --no-pack: run every matrix from the file's layout. Also the default when the file is larger
  // than 80% of MemAvailable: packing copies each matrix into anonymous memory (giving the file's
  // pages back as it goes), which would not fit; mapped and unpacked, the page cache keeps what
  // was read most recently (a mixture's hot experts) and reads the rest back from disk.
  bool no_pack = false;
  // --mlock: the weights locked in memory after loading (packed copies and the file's pages still
  // in use); a refusal by the OS is a warning, as llama.cpp's.
  bool mlock = false;
  // A pipeline stage (--pipeline-parallel): packs only its own layers (dist::StageLayers).
  int stage = 0, num_stages = 1;
  // A tensor-parallel rank (--tensor-parallel, --tensor-parallel-slices): keeps only its share.
  TensorSplit split{};
  void Register(CLI::App& app);
  bool CopyToMemory(const std::string& path) const;
  bool Pack(const std::string& path) const;
};
CommandFn RegisterConvert(CLI::App& app);
CommandFn RegisterSynth(CLI::App& app);
CommandFn RegisterBench(CLI::App& app);
CommandFn RegisterBatch(CLI::App& app);
CommandFn RegisterTemplate(CLI::App& app);
CommandFn RegisterServe(CLI::App& app);
CommandFn RegisterLoadgen(CLI::App& app);
// `gale bench serve`: registers the subcommand on bench; *run returns -1 when it was not chosen.
void RegisterBenchServe(CLI::App& bench, std::function<int()>* run);
CommandFn RegisterTokenize(CLI::App& app);
CommandFn RegisterEval(CLI::App& app);
CommandFn RegisterQuantize(CLI::App& app);
CommandFn RegisterCalibrateKv(CLI::App& app);

}  // namespace gale

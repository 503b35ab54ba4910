// Subcommands of the `gale` binary. Each registers its options on the CLI11 app and returns the
// callback to run when selected; main.cc only wires them together.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace gale {

using CommandFn = std::function<int()>;

CommandFn RegisterRun(CLI::App& app);
CommandFn RegisterConvert(CLI::App& app);
CommandFn RegisterSynth(CLI::App& app);
CommandFn RegisterBench(CLI::App& app);

}  // namespace gale

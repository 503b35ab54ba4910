#include "base/profiler.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "../test_util.h"
#include "model/model.h"

namespace gale {
namespace {

TEST(ProfilerTest, DisabledSpansRecordNothing) {
  SetProfiler(nullptr);
  { ProfileSpan span("x", "op"); }
  Profiler p;
  EXPECT_TRUE(p.events().empty());
}

// A forward pass under the profiler records every op of every layer, and the Chrome trace is
// valid JSON in the trace-event format with those spans.
TEST(ProfilerTest, ForwardPassTraceHasEveryOpOfEveryLayer) {
  auto f = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf");
  ASSERT_TRUE(f.ok());
  auto m = LoadModel(**f);
  ASSERT_TRUE(m.ok());
  Profiler prof;
  SetProfiler(&prof);
  ThreadPool pool(2);
  KvCache kv((*m)->hparams(), 16);
  Workspace ws;
  ForwardBatch b;
  b.tokens = {1, 403, 407};
  b.positions = {0, 1, 2};
  ASSERT_TRUE((*m)->Forward(b, kv, ws, pool).ok());
  SetProfiler(nullptr);
  std::map<std::string, int> counts;
  for (const auto& e : prof.events()) counts[e.name]++;
  const int layers = static_cast<int>((*m)->hparams().num_layers);
  for (const char* op : {"matmul_qkv", "rope_kv_write", "attention", "matmul_o", "matmul_gate_up", "silu_mul", "matmul_down"}) {
    EXPECT_EQ(counts[op], layers) << op;
  }
  EXPECT_EQ(counts["rms_norm"], 2 * layers);
  EXPECT_EQ(counts["lm_head"], 1);
  const auto path = test::TempPath("trace_test.json");
  ASSERT_TRUE(prof.WriteChromeTrace(path).ok());
  std::ifstream in(path);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["traceEvents"].size(), prof.events().size());
  for (const auto& e : j["traceEvents"]) {
    EXPECT_EQ(e["ph"], "X");
    EXPECT_GE(e["dur"].get<double>(), 0.0);
    EXPECT_TRUE(e["args"].contains("tokens"));
  }
  const std::string summary = prof.Summary();
  EXPECT_NE(summary.find("matmul_gate_up"), std::string::npos);
  EXPECT_NE(summary.find("GB/s"), std::string::npos);
  EXPECT_FALSE(prof.WriteChromeTrace("/nonexistent/dir/trace.json").ok());
}

}  // namespace
}  // namespace gale

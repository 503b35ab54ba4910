// gale quantize: which tensors are quantized, kept or turned to F16 (and reported), bit-exact
// blocks against the reference quantizer, --keep, the quantized model loads and runs, and bad
// inputs (an already-quantized model, a bad regex, an unsupported type) are clear errors.
#include "tools/quantize.h"

#include <gtest/gtest.h>

#include <cstring>

#include "../test_util.h"
#include "model/llama_model.h"

namespace gale {
namespace {

std::unique_ptr<GgufFile> Quantized(const GgufFile& in, const QuantizeOptions& o, QuantizeReport* report) {
  GgufWriter w;
  auto r = QuantizeModel(in, o, &w);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  *report = *r;
  return GgufFile::FromBytes(w.WriteToBytes()).value();
}

TEST(QuantizeTest, DefaultModelToQ8_0AndQ4_0) {
  auto in = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    QuantizeOptions o;
    o.type = type;
    QuantizeReport report;
    auto out = Quantized(*in, o, &report);
    EXPECT_EQ(out->GetInt("general.file_type").value(), type == GgmlType::kQ8_0 ? 7 : 2);
    EXPECT_EQ(report.to_f16.size(), 5u);  // ffn_down: rows of 172
    EXPECT_EQ(report.quantized, 30);
    EXPECT_LT(report.bytes_out, report.bytes_in / 2);
    for (const GgufTensorInfo& t : out->tensors()) {
      const GgufTensorInfo* src = in->FindTensor(t.name);
      ASSERT_NE(src, nullptr);
      if (t.name == "token_embd.weight" || t.shape.size() == 1) {
        EXPECT_EQ(t.type_id, src->type_id) << t.name;
        continue;
      }
      if (t.name.find("ffn_down") != std::string::npos) {
        EXPECT_EQ(t.type_id, static_cast<uint32_t>(GgmlType::kF16)) << t.name;
        continue;
      }
      ASSERT_EQ(t.type_id, static_cast<uint32_t>(type)) << t.name;
      // Bit-exact: each row is the reference quantizer's output for the f32 row.
      const int64_t cols = t.shape[0];
      std::vector<uint8_t> want(RowBytes(type, cols));
      for (int64_t r = 0; r < t.NumElements() / cols; ++r) {
        QuantizeRowRef(type, reinterpret_cast<const float*>(src->data) + r * cols, want.data(), cols);
        ASSERT_EQ(0, std::memcmp(want.data(), t.data + r * want.size(), want.size())) << t.name << " row " << r;
      }
    }
    // It loads and runs.
    auto model = LlamaModel::Load(*out);
    ASSERT_TRUE(model.ok()) << model.status().ToString();
    ThreadPool pool(1);
    KvCache kv((*model)->hparams(), 8);
    Workspace ws;
    ForwardBatch b;
    b.tokens = {1, 403, 407};
    b.positions = {0, 1, 2};
    ASSERT_TRUE((*model)->Forward(b, kv, ws, pool).ok());
    // Requantizing is refused.
    GgufWriter again;
    auto r = QuantizeModel(*out, o, &again);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("needs an F32, F16 or BF16 model"), std::string::npos);
  }
}

TEST(QuantizeTest, KeepAndErrors) {
  auto in = GgufFile::Open(test::SourceDir() + "/models/stories260K.gguf").value();
  QuantizeOptions o;
  o.keep = {"blk\\.0\\.", "attn_v"};
  QuantizeReport report;
  auto out = Quantized(*in, o, &report);
  for (const GgufTensorInfo& t : out->tensors()) {
    if (t.shape.size() != 2) continue;
    const bool kept = t.name.rfind("blk.0.", 0) == 0 || t.name.find("attn_v") != std::string::npos ||
                      t.name == "token_embd.weight";
    if (kept) {
      EXPECT_EQ(t.type_id, in->FindTensor(t.name)->type_id) << t.name;
    } else {
      EXPECT_NE(t.type_id, in->FindTensor(t.name)->type_id) << t.name;
    }
  }
  EXPECT_EQ(report.kept.size(), 1u + 7u + 4u);  // embedding, layer 0's 7 matrices, 4 more attn_v
  o.keep = {"("};
  GgufWriter w;
  EXPECT_NE(QuantizeModel(*in, o, &w).status().message().find("regular expression"), std::string::npos);
  o.keep.clear();
  o.type = GgmlType::kQ4_K;
  EXPECT_FALSE(QuantizeModel(*in, o, &w).ok());
}

}  // namespace
}  // namespace gale

// BERT (GGUF "bert"): the encoder of BGE, MiniLM, all-MiniLM and other sentence-embedding models,
// as llama.cpp's converter writes it and its graph runs it. Input rows are the token's embedding
// plus token type 0's row ("sentence A"; token_types.weight, where the file has it) plus the
// learned position embedding (position_embd.weight), through LayerNorm (token_embd_norm). Each
// layer is post-norm: Q, K, V with biases, attention over every token of the sequence (not
// causal; no RoPE), the output projection with its bias added to the layer's input, LayerNorm
// (attn_output_norm); then up (+ bias), GELU (tanh approximation), down (+ bias) added to that,
// LayerNorm (layer_output_norm). The last layer's rows are the hidden states the pooling reads;
// there is no final norm and no language-model head.
#include <cstring>

#include "model/arch/arch.h"
#include "model/synth.h"
#include "model/blocks.h"
#include "model/weights.h"

namespace gale {
namespace {

struct BertLayer {
  MatrixWeight wq, wk, wv, wo, up, down;
  TensorView bq, bk, bv, bo, b_up, b_down;
  TensorView attn_out_norm, attn_out_norm_b, out_norm, out_norm_b;
};

class BertModel final : public Model {
 public:
  static StatusOr<std::unique_ptr<Model>> Load(const GgufFile& file, ModelHParams hp) {
    std::unique_ptr<BertModel> m(new BertModel());
    m->hp_ = std::move(hp);
    ModelHParams& h = m->hp_;
    h.rope_style = RopeStyle::kNone;
    h.causal = false;  // attention.causal true is refused (CheckLoadedHParams)
    const GgufValue* eps = file.Find(h.arch + ".attention.layer_norm_epsilon");
    if (eps == nullptr) return InvalidArgument("bert: the file has no {}.attention.layer_norm_epsilon", h.arch);
    h.norm_eps = static_cast<float>(eps->AsDouble().value_or(-1.0));
    if (!(h.norm_eps > 0.0f)) return InvalidArgument("bert: attention.layer_norm_epsilon must be positive");
    if (h.num_kv_heads != h.num_heads) return InvalidArgument("bert: head_count_kv must equal head_count");
    TensorLoader tensors(file);
    RETURN_IF_ERROR(m->LoadCommon(file, tensors));
    RETURN_IF_ERROR(tensors.Get("position_embd.weight", {h.dim, h.context_length}, &m->pos_embd_));
    if (const GgufTensorInfo* types = file.FindTensor("token_types.weight"); types != nullptr) {
      if (types->shape.size() != 2 || types->shape[1] < 1) return InvalidArgument("bert: token_types.weight must be [dim, types]");
      RETURN_IF_ERROR(tensors.Get("token_types.weight", {h.dim, types->shape[1]}, &m->type_embd_));
    }
    RETURN_IF_ERROR(tensors.Vector("token_embd_norm.weight", h.dim, &m->embd_norm_));
    RETURN_IF_ERROR(tensors.Vector("token_embd_norm.bias", h.dim, &m->embd_norm_b_));
    if (tensors.Has("blk.0.attn_qkv.weight")) return Unimplemented("bert: a fused attn_qkv is not supported yet");
    m->layers_.resize(h.num_layers);
    for (int64_t l = 0; l < h.num_layers; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      BertLayer& w = m->layers_[l];
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_q.weight", h.dim, h.q_dim(), &w.wq));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_k.weight", h.dim, h.kv_dim(), &w.wk));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_v.weight", h.dim, h.v_dim(), &w.wv));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_q.bias", h.q_dim(), &w.bq));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_k.bias", h.kv_dim(), &w.bk));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_v.bias", h.v_dim(), &w.bv));
      RETURN_IF_ERROR(tensors.Matrix(b + "attn_output.weight", h.attn_out_dim(), h.dim, &w.wo));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_output.bias", h.dim, &w.bo));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_output_norm.weight", h.dim, &w.attn_out_norm));
      RETURN_IF_ERROR(tensors.Vector(b + "attn_output_norm.bias", h.dim, &w.attn_out_norm_b));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_up.weight", h.dim, h.ffn_dim, &w.up));
      RETURN_IF_ERROR(tensors.Vector(b + "ffn_up.bias", h.ffn_dim, &w.b_up));
      RETURN_IF_ERROR(tensors.Matrix(b + "ffn_down.weight", h.ffn_dim, h.dim, &w.down));
      RETURN_IF_ERROR(tensors.Vector(b + "ffn_down.bias", h.dim, &w.b_down));
      RETURN_IF_ERROR(tensors.Vector(b + "layer_output_norm.weight", h.dim, &w.out_norm));
      RETURN_IF_ERROR(tensors.Vector(b + "layer_output_norm.bias", h.dim, &w.out_norm_b));
    }
    m->FinishLoad(tensors);
    return std::unique_ptr<Model>(std::move(m));
  }

 protected:
  Status RunForward(const ForwardBatch& batch, KvStorage& kv, Workspace& ws, ThreadPool& pool) const override {
    ForwardPass f(hp_, batch, kv, ws, pool, nullptr);
    const int64_t n = f.num_tokens(), dim = hp_.dim;
    f.Embed(token_embd_);
    {
      // + token type 0's row, + the position's row (GetRows dequantizes any stored type).
      std::vector<float> row(static_cast<size_t>(n * dim));
      if (type_embd_.data != nullptr) {
        const int32_t zero = 0;
        kernels::GetRows(type_embd_, &zero, 1, row.data());
        for (int64_t t = 0; t < n; ++t) {
          for (int64_t d = 0; d < dim; ++d) ws.x[t * dim + d] += row[d];
        }
      }
      kernels::GetRows(pos_embd_, batch.positions.data(), n, row.data());
      for (int64_t i = 0; i < n * dim; ++i) ws.x[i] = row[i] + ws.x[i];
    }
    f.LayerNormRows(ws.x.data(), embd_norm_, embd_norm_b_, "embed_norm", -1);
    for (int64_t l = 0; l < hp_.num_layers; ++l) {
      const BertLayer& w = layers_[l];
      f.Products(l, ws.x.data(), dim, {{&w.wq, ws.q.data()}, {&w.wk, ws.k.data()}, {&w.wv, ws.v.data()}},
                 LinearInput::kAttnIn, "matmul_qkv");
      f.AddBias(ws.q.data(), w.bq, hp_.q_dim());
      f.AddBias(ws.k.data(), w.bk, hp_.kv_dim());
      f.AddBias(ws.v.data(), w.bv, hp_.v_dim());
      f.Attention(l, nullptr);
      f.OutputProjection(l, w.wo, nullptr, &w.bo);  // ws.x += attention's output + bias
      f.LayerNormRows(ws.x.data(), w.attn_out_norm, w.attn_out_norm_b, "attn_out_norm", l);
      f.Products(l, ws.x.data(), dim, {{&w.up, ws.hb.data()}}, LinearInput::kFfnIn, "matmul_up");
      f.AddBias(ws.hb.data(), w.b_up, hp_.ffn_dim);
      pool.ParallelFor(n, [&](int64_t begin, int64_t end) {
        kernels::GeluTanh(ws.hb.data() + begin * hp_.ffn_dim, (end - begin) * hp_.ffn_dim);
      });
      f.Products(l, ws.hb.data(), hp_.ffn_dim, {{&w.down, ws.xb2.data()}}, LinearInput::kFfnMid, "matmul_down");
      f.AddBias(ws.xb2.data(), w.b_down, dim);
      for (int64_t i = 0; i < n * dim; ++i) ws.x[i] += ws.xb2[i];
      f.LayerNormRows(ws.x.data(), w.out_norm, w.out_norm_b, "layer_out_norm", l);
    }
    f.EncoderOutput();
    return Status::Ok();
  }

  std::vector<MatrixWeight*> LayerMatrices(int64_t layer) override {
    BertLayer& l = layers_[layer];
    return {&l.wq, &l.wk, &l.wv, &l.wo, &l.up, &l.down};
  }

 private:
  BertModel() = default;
  TensorView pos_embd_, type_embd_, embd_norm_, embd_norm_b_;
  std::vector<BertLayer> layers_;
};

}  // namespace

StatusOr<std::unique_ptr<Model>> LoadBert(const GgufFile& file, ModelHParams hp) {
  return BertModel::Load(file, std::move(hp));
}

namespace {

// gale synth: an encoder (LayerNorm's epsilon, bidirectional attention, mean pooling unless the
// shape pools otherwise, two token types); learned positions and token types (f32, as llama.cpp's
// converter keeps them), the input's LayerNorm, post-norm layers with biases everywhere; no output
// norm or head.
Status SynthCheck(const SynthShape& s) {
  if (s.num_kv_heads != s.num_heads) return InvalidArgument("synth: bert has as many KV heads as heads and no experts");
  return Status::Ok();
}

Status SynthWrite(SynthWriter& w) {
  const SynthShape& s = w.s;
  w.w.SetU32(w.p + "pooling_type", static_cast<uint32_t>(s.pooling_type > 0 ? s.pooling_type : 1));
  w.w.SetF32(w.p + "attention.layer_norm_epsilon", 1e-12f);
  w.w.SetBool(w.p + "attention.causal", false);
  w.w.SetU32("tokenizer.ggml.token_type_count", 2);
  RETURN_IF_ERROR(w.Matrix("position_embd.weight", s.dim, s.context_length, GgmlType::kF32));
  RETURN_IF_ERROR(w.Matrix("token_types.weight", s.dim, 2, GgmlType::kF32));
  RETURN_IF_ERROR(w.Vector("token_embd_norm.weight", s.dim, 1.0f, 0.5f));
  RETURN_IF_ERROR(w.Vector("token_embd_norm.bias", s.dim, 0.0f, 0.5f));
  for (int64_t l = 0; l < s.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    RETURN_IF_ERROR(w.Qkv(b, /*biases=*/true));
    RETURN_IF_ERROR(w.Matrix(b + "attn_output.weight", w.o_dim, s.dim, w.type));
    RETURN_IF_ERROR(w.Vector(b + "attn_output.bias", s.dim, 0.0f, 0.2f));
    RETURN_IF_ERROR(w.Vector(b + "attn_output_norm.weight", s.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(w.Vector(b + "attn_output_norm.bias", s.dim, 0.0f, 0.2f));
    RETURN_IF_ERROR(w.Matrix(b + "ffn_up.weight", s.dim, s.ffn_dim, w.type));
    RETURN_IF_ERROR(w.Vector(b + "ffn_up.bias", s.ffn_dim, 0.0f, 0.5f));
    RETURN_IF_ERROR(w.Matrix(b + "ffn_down.weight", s.ffn_dim, s.dim, w.type));
    RETURN_IF_ERROR(w.Vector(b + "ffn_down.bias", s.dim, 0.0f, 0.2f));
    RETURN_IF_ERROR(w.Vector(b + "layer_output_norm.weight", s.dim, 1.0f, 0.5f));
    RETURN_IF_ERROR(w.Vector(b + "layer_output_norm.bias", s.dim, 0.0f, 0.2f));
  }
  return Status::Ok();
}

}  // namespace

const ArchSpec kBertArch = {.name = "bert", .load = LoadBert, .synth_check = SynthCheck, .synth_write = SynthWrite};

}  // namespace gale

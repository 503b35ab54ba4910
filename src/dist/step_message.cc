#include "dist/step_message.h"

#include <fmt/format.h>

namespace gale::dist {

std::string ModelSignature(const Model& m) {
  const ModelHParams& hp = m.hparams();
  const TensorSplit& t = m.tensor_split();
  return fmt::format("{} with {} layers, dim {}, vocab {}, KV {}x{}, {} weight bytes, tensor split over {} ranks in {} "
                     "slices", hp.arch, hp.num_layers, hp.dim, hp.vocab_size, hp.num_kv_heads, hp.head_dim,
                     m.weight_bytes(), t.ranks, t.slices);
}

Status SayHello(const Model& m, Communicator& comm) {
  Writer w;
  w.PutString(ModelSignature(m));
  return comm.Send(0, kTagHello, w.Take());
}

Status AwaitHellos(const Model& m, Communicator& comm, std::chrono::milliseconds timeout, const char* group) {
  const std::string mine = ModelSignature(m);
  for (int r = 1; r < comm.size(); ++r) {
    auto hello = comm.Recv(r, kTagHello, Wait{timeout, nullptr});
    if (!hello.ok()) return hello.status().WithContext(fmt::format("{} start-up", group));
    Reader rd(*hello);
    std::string theirs;
    RETURN_IF_ERROR(rd.GetString(&theirs));
    if (theirs != mine) {
      return InvalidArgument("{} rank {} loaded a different model or split ({}) from rank 0's ({})", group, r, theirs,
                             mine);
    }
  }
  return Status::Ok();
}

std::vector<uint8_t> EncodeStep(const ForwardBatch& b, const KvStorage& kv, int micro_batches) {
  Writer w;
  w.Put<uint8_t>(kStep);
  w.Put<int64_t>(kv.num_blocks());
  w.Put<int64_t>(kv.block_size());
  w.Put<uint8_t>(static_cast<uint8_t>(kv.k_type()));
  w.Put<uint8_t>(static_cast<uint8_t>(kv.v_type()));
  w.Put<uint8_t>(kv.key_channels() ? 1 : 0);
  const KvLayerGroups& g = kv.groups();
  w.Put<int64_t>(g.layers_per_block);
  w.PutVector<int32_t>(g.group_of);
  w.PutVector<int32_t>(g.slot_of);
  w.PutVector<int64_t>(g.window);
  w.Put<int32_t>(micro_batches);
  for (const std::vector<int32_t>* v : {&b.tokens, &b.positions, &b.seq_idx, &b.slots, &b.logit_rows, &b.hidden_rows}) {
    w.PutVector<int32_t>(*v);
  }
  w.Put<uint8_t>(b.all_logits ? 1 : 0);
  w.Put<int64_t>(static_cast<int64_t>(b.block_tables.size()));
  for (std::span<const int32_t> t : b.block_tables) w.PutVector<int32_t>(t);
  return w.Take();
}

Status DecodeStep(std::span<const uint8_t> bytes, StepPlan* p) {
  Reader r(bytes);
  uint8_t kind = 0;
  RETURN_IF_ERROR(r.Get(&kind));
  if (kind != kStep) return DataLoss("step plan of kind {}", kind);
  RETURN_IF_ERROR(r.Get(&p->num_blocks));
  RETURN_IF_ERROR(r.Get(&p->block_size));
  RETURN_IF_ERROR(r.Get(&p->k_type));
  RETURN_IF_ERROR(r.Get(&p->v_type));
  RETURN_IF_ERROR(r.Get(&p->key_channels));
  RETURN_IF_ERROR(r.Get(&p->groups.layers_per_block));
  RETURN_IF_ERROR(r.GetVector(&p->groups.group_of));
  RETURN_IF_ERROR(r.GetVector(&p->groups.slot_of));
  RETURN_IF_ERROR(r.GetVector(&p->groups.window));
  RETURN_IF_ERROR(r.Get(&p->micro_batches));
  ForwardBatch& b = p->batch;
  for (std::vector<int32_t>* v : {&b.tokens, &b.positions, &b.seq_idx, &b.slots, &b.logit_rows, &b.hidden_rows}) {
    RETURN_IF_ERROR(r.GetVector(v));
  }
  uint8_t all_logits = 0;
  RETURN_IF_ERROR(r.Get(&all_logits));
  b.all_logits = all_logits != 0;
  int64_t num_tables = 0;
  RETURN_IF_ERROR(r.Get(&num_tables));
  if (num_tables < 0 || num_tables > (1 << 24)) return DataLoss("step plan with {} block tables", num_tables);
  p->tables.resize(static_cast<size_t>(num_tables));
  for (auto& t : p->tables) RETURN_IF_ERROR(r.GetVector(&t));
  if (!r.done()) return DataLoss("step plan has trailing bytes");
  if (p->k_type > static_cast<uint8_t>(kernels::KvType::kInt4) || p->v_type > static_cast<uint8_t>(kernels::KvType::kInt4)) {
    return DataLoss("step plan: KV type {} / {}", p->k_type, p->v_type);
  }
  for (const auto& t : p->tables) b.block_tables.emplace_back(t);
  return Status::Ok();
}

Status CheckGroups(const KvLayerGroups& g, int64_t num_layers) {
  const int64_t num_groups = g.num_groups();
  if (g.num_layers() != num_layers || static_cast<int64_t>(g.slot_of.size()) != num_layers || num_groups <= 0 ||
      g.layers_per_block <= 0) {
    return DataLoss("step plan: KV layer groups for {} cache layers, the model has {}", g.num_layers(), num_layers);
  }
  for (int64_t l = 0; l < num_layers; ++l) {
    if (g.group_of[l] < 0 || g.group_of[l] >= num_groups || g.slot_of[l] < 0 || g.slot_of[l] >= g.layers_per_block) {
      return DataLoss("step plan: layer {} in group {} slot {}", l, g.group_of[l], g.slot_of[l]);
    }
  }
  return Status::Ok();
}

StatusOr<bool> NextStep(const Model& model, Communicator& comm, const Wait& flush_wait, StepPlan* plan,
                        std::unique_ptr<KvStorage>* kv) {
  ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, comm.Recv(0, kTagStep, Wait{}));
  if (!bytes.empty() && bytes[0] == kStop) {
    RETURN_IF_ERROR(comm.Flush(flush_wait));
    return false;
  }
  RETURN_IF_ERROR(DecodeStep(bytes, plan).WithContext(fmt::format("rank {}", comm.rank())));
  RETURN_IF_ERROR(CheckGroups(plan->groups, model.kv_layout().num_layers()));
  RETURN_IF_ERROR(StorageForStep(*plan, model.kv_layout(), kv));
  return true;
}

Status StorageForStep(const StepPlan& plan, const KvLayout& layout, std::unique_ptr<KvStorage>* kv) {
  const auto k_type = static_cast<kernels::KvType>(plan.k_type), v_type = static_cast<kernels::KvType>(plan.v_type);
  KvStorage* s = kv->get();
  if (s == nullptr || s->num_blocks() != plan.num_blocks || s->block_size() != plan.block_size ||
      s->k_type() != k_type || s->v_type() != v_type || s->groups() != plan.groups) {
    if (plan.num_blocks <= 0 || plan.block_size <= 0 || plan.num_blocks > (int64_t{1} << 31)) {
      return DataLoss("step plan: {} KV blocks of {}", plan.num_blocks, plan.block_size);
    }
    *kv = std::make_unique<KvStorage>(layout, plan.groups, plan.num_blocks, plan.block_size, k_type, v_type);
  }
  (*kv)->set_key_channels(plan.key_channels != 0);
  return Status::Ok();
}

}  // namespace gale::dist

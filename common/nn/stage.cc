// Stage: forward, head loss, backward and update for one block of layers.
#include "common/nn/stage.h"

#include <algorithm>

#include "common/core/check.h"
#include "common/core/rng.h"

namespace localpar {

uint64_t StageSeed(uint64_t model_seed, int stage_index) {
  return HashCombine(model_seed, 0x5eed0000ull + static_cast<uint64_t>(stage_index));
}

std::unique_ptr<Stage> Stage::Create(Backend& backend, const StageConfig& config, const Shape& in,
                                     int64_t classes, const OptimizerConfig& optimizer,
                                     uint64_t seed, std::string* error) {
  std::unique_ptr<Stage> st(new Stage(backend, optimizer));
  st->name_ = config.name;
  st->in_shape_ = in;
  st->lr_scale_ = config.lr_scale;
  Shape cur = in;
  for (size_t i = 0; i < config.layers.size(); ++i) {
    std::string e;
    auto layer = MakeLayer(backend, config.layers[i], cur, HashCombine(seed, i), &e);
    if (!layer) {
      *error = "layers[" + std::to_string(i) + "] " + e;
      return nullptr;
    }
    cur = layer->output_shape();
    st->layers_.push_back(std::move(layer));
  }
  st->out_shape_ = cur;
  FuseActivations(st->layers_);
  std::vector<LayerConfig> head_layers;
  if (!HeadLayers(config.head, cur, classes, &head_layers, error)) return nullptr;
  for (size_t i = 0; i < head_layers.size(); ++i) {
    std::string e;
    const bool tied = config.head.tie_embedding && i + 1 == head_layers.size();
    auto layer =
        tied ? (st->layers_.empty() ? nullptr
                                    : st->layers_[0]->MakeTiedOutput(backend, cur, classes, &e))
             : MakeLayer(backend, head_layers[i], cur, HashCombine(seed, 1000 + i), &e);
    if (tied && st->layers_.empty()) e = "tie_embedding: the stage has no layer to tie to";
    if (!layer) {
      *error = "head: " + e;
      return nullptr;
    }
    cur = layer->output_shape();
    st->head_.push_back(std::move(layer));
  }
  FuseActivations(st->head_);
  return st;
}

int64_t StageParameterCount(const StageConfig& config, const Shape& in, int64_t classes) {
  int64_t n = 0;
  Shape cur = in;
  std::string error;
  auto walk = [&](const std::vector<LayerConfig>& layers) {
    for (const LayerConfig& l : layers) {
      n = AddCounts(n, LayerParameterCount(l, cur));
      Shape next;
      if (!InferLayerShape(l, cur, &next, &error)) return false;
      cur = next;
    }
    return true;
  };
  if (!walk(config.layers)) return 0;
  const int64_t width = cur.empty() ? 0 : cur.back();
  std::vector<LayerConfig> head;
  if (!HeadLayers(config.head, cur, classes, &head, &error) || !walk(head)) return 0;
  // A tied output projection borrows the embedding's table: only its bias is its own.
  if (config.head.tie_embedding) n -= width * classes;
  return n;
}

StageFlops StageForwardFlops(const StageConfig& config, const Shape& in, int64_t classes) {
  StageFlops f;
  Shape cur = in;
  std::string error;
  auto walk = [&](const std::vector<LayerConfig>& layers, double* sum) {
    for (const LayerConfig& l : layers) {
      *sum += LayerForwardFlops(l, cur);
      Shape next;
      if (!InferLayerShape(l, cur, &next, &error)) return false;
      cur = next;
    }
    return true;
  };
  if (!walk(config.layers, &f.layers)) return {};
  std::vector<LayerConfig> head;
  if (!HeadLayers(config.head, cur, classes, &head, &error) || !walk(head, &f.head)) return {};
  return f;
}

Stage::Slot& Stage::slot(int i) {
  if (static_cast<size_t>(i) >= slots_.size()) slots_.resize(i + 1);
  return slots_[i];
}

const Tensor& Stage::Forward(const Tensor& x, int slot_index, const ForwardContext& ctx) {
  LP_CHECK_MSG(x.dtype() == input_dtype(), "stage %s: input of the wrong element type",
               name_.c_str());
  Slot& s = slot(slot_index);
  s.input = x;
  s.caches.resize(layers_.size());
  const Tensor* in = &s.input;
  for (size_t i = 0; i < layers_.size(); ++i) {
    layers_[i]->Forward(*in, s.caches[i], ctx);
    in = &s.caches[i].out;
  }
  return *in;
}

const Tensor& Stage::HeadLogits(int slot_index, const ForwardContext& ctx) {
  Slot& s = slot(slot_index);
  s.head_caches.resize(head_.size());
  const Tensor* in = &output(s);
  for (size_t i = 0; i < head_.size(); ++i) {
    head_[i]->Forward(*in, s.head_caches[i], ctx);
    in = &s.head_caches[i].out;
  }
  return *in;
}

const Tensor* Stage::DecodePositions(const Tensor& x, int64_t start, bool head,
                                     std::vector<DecodeCache>* caches) {
  const size_t n = layers_.size() + (head ? head_.size() : 0);
  caches->resize(std::max(caches->size(), n));
  const Tensor* in = &x;
  for (size_t i = 0; i < n; ++i) {
    Layer& l = i < layers_.size() ? *layers_[i] : *head_[i - layers_.size()];
    if (!l.ForwardPositions(*in, start, (*caches)[i])) return nullptr;
    in = &(*caches)[i].out;
  }
  return in;
}

HeadStats Stage::Head(int slot_index, const Tensor& labels, HeadMode mode, float grad_scale,
                      const ForwardContext& ctx) {
  Slot& s = slot(slot_index);
  s.head_caches.resize(head_.size());
  s.head_grads.resize(head_.size());
  const Tensor& features = output(s);
  const Tensor* in = &features;
  ForwardContext head_ctx = ctx;
  head_ctx.train = mode != HeadMode::kEval && ctx.train;
  for (size_t i = 0; i < head_.size(); ++i) {
    head_[i]->Forward(*in, s.head_caches[i], head_ctx);
    in = &s.head_caches[i].out;
  }
  const Tensor& logits = *in;
  // One prediction per row of the last dimension: per example, or per position.
  int64_t classes = logits.shape().back(), rows = logits.numel() / classes;
  LP_CHECK_MSG(labels.numel() == rows, "%lld labels for %lld predictions",
               static_cast<long long>(labels.numel()), static_cast<long long>(rows));
  s.row_loss.Ensure(backend_, {rows});
  s.row_correct.Ensure(backend_, {rows});
  bool train = mode != HeadMode::kEval;
  if (train) s.dlogits.Ensure(backend_, logits.shape());
  backend_.SoftmaxXent(logits.f32(), labels.i32(), rows, classes, grad_scale,
                       train ? s.dlogits.f32() : nullptr, s.row_loss.f32(), s.row_correct.f32());
  if (train) {
    const Tensor* g = &s.dlogits;
    for (size_t i = head_.size(); i-- > 0;) {
      const Tensor& hin = i == 0 ? features : s.head_caches[i - 1].out;
      bool want_dx = i > 0 || mode == HeadMode::kLocal;
      head_[i]->Backward(hin, *g, s.head_caches[i], want_dx ? &s.head_grads[i] : nullptr);
      g = &s.head_grads[i];
    }
    if (mode == HeadMode::kLocal) s.head_dx = s.head_grads[0];
  }
  // Summed on the host in a fixed order: identical on every run and every process.
  s.host_loss.resize(rows);
  s.host_correct.resize(rows);
  backend_.CopyToHost(s.host_loss.data(), s.row_loss.raw(), rows * sizeof(float));
  backend_.CopyToHost(s.host_correct.data(), s.row_correct.raw(), rows * sizeof(float));
  HeadStats st;
  for (int64_t r = 0; r < rows; ++r) {
    st.loss_sum += s.host_loss[r];
    st.correct += s.host_correct[r];
  }
  st.count = rows;
  return st;
}

void Stage::Backward(int slot_index, const Tensor& dy, Tensor* dx,
                     const std::function<void(int)>& layer_done) {
  BackwardLayers(slot(slot_index), dy, dx, false, layer_done);
}

void Stage::BackwardInput(int slot_index, const Tensor& dy, Tensor* dx) {
  Slot& s = slot(slot_index);
  if (layers_.empty()) {
    BackwardLayers(s, dy, dx, true, {});
    return;
  }
  // dy may be a port's buffer that the next message reuses: the weights half needs its own.
  s.kept_dy.Ensure(backend_, dy.shape());
  s.kept_dy.CopyFrom(dy);
  BackwardLayers(s, s.kept_dy, dx, true, {});
}

void Stage::BackwardLayers(Slot& s, const Tensor& dy, Tensor* dx, bool input_only,
                           const std::function<void(int)>& layer_done) {
  s.grads.resize(layers_.size());
  if (layers_.empty()) {
    if (dx) *dx = dy;
    return;
  }
  const Tensor* g = &dy;
  for (size_t i = layers_.size(); i-- > 0;) {
    const Tensor& in = i == 0 ? s.input : s.caches[i - 1].out;
    Tensor* out = i == 0 ? dx : &s.grads[i];
    if (input_only) {
      layers_[i]->BackwardInput(in, *g, s.caches[i], out);
    } else {
      layers_[i]->Backward(in, *g, s.caches[i], out);
    }
    if (layer_done) layer_done(static_cast<int>(i));
    g = out;
  }
}

void Stage::BackwardWeights(int slot_index, const std::function<void(int)>& layer_done) {
  Slot& s = slot(slot_index);
  for (size_t i = layers_.size(); i-- > 0;) {
    const Tensor& in = i == 0 ? s.input : s.caches[i - 1].out;
    const Tensor& dy = i + 1 == layers_.size() ? s.kept_dy : s.grads[i + 1];
    layers_[i]->BackwardWeights(in, dy, s.caches[i]);
    if (layer_done) layer_done(static_cast<int>(i));
  }
}

std::vector<Param*> Stage::head_params() {
  std::vector<Param*> out;
  for (auto& l : head_) {
    for (Param* p : l->params()) out.push_back(p);
  }
  return out;
}

void Stage::Step(float lr) { opt_.Step(params(), lr * lr_scale_); }

std::vector<Param*> Stage::params() {
  std::vector<Param*> out;
  for (auto& l : layers_) {
    for (Param* p : l->params()) out.push_back(p);
  }
  for (auto& l : head_) {
    for (Param* p : l->params()) out.push_back(p);
  }
  return out;
}

int64_t Stage::StateBytes() {
  int64_t n = 0;
  for (Param* p : params()) {
    for (const Tensor* t :
         {&p->value, &p->grad, &p->state1, &p->state2, &p->outer, &p->outer_momentum}) {
      if (t->defined()) n += static_cast<int64_t>(t->nbytes());
    }
  }
  return n;
}

int64_t Stage::ActivationBytesPerExample() const {
  int64_t floats = NumElements(in_shape_);
  for (const auto& l : layers_) floats += NumElements(l->output_shape());
  for (const auto& l : head_) floats += NumElements(l->output_shape());
  return floats * static_cast<int64_t>(sizeof(float));
}

int64_t Stage::num_parameters() {
  int64_t n = 0;
  for (Param* p : params()) n += p->value.numel();
  return n;
}

}  // namespace localpar

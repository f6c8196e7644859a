// A Stage: a block of layers, its auxiliary head and its optimizer. The unit a worker holds.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/nn/head.h"
#include "common/nn/layer.h"
#include "common/nn/optimizer.h"

namespace localpar {

struct StageConfig {
  std::string name;
  std::vector<LayerConfig> layers;
  HeadConfig head;
  Shape declared_input;   // optional: checked against what arrives (empty: anything)
  float lr_scale = 1.0f;  // multiplies every Step's learning rate
};

// Sums of a head's per-example loss and correct predictions over `count` examples.
struct HeadStats {
  double loss_sum = 0.0;
  double correct = 0.0;
  int64_t count = 0;
  void Add(const HeadStats& o) {
    loss_sum += o.loss_sum;
    correct += o.correct;
    count += o.count;
  }
  double mean_loss() const { return count ? loss_sum / count : 0.0; }  // nats per prediction
  double accuracy() const { return count ? correct / count : 0.0; }
};

enum class HeadMode {
  kEval,   // forward only
  kProbe,  // head parameters learn; nothing flows into the stage (BACKPROP's side heads)
  kLocal,  // head parameters learn and head_grad() receives d(loss)/d(stage output)
};

// Slots let several batches be in flight at once (micro-batches, pipelining): each slot
// keeps one batch's saved activations between its forward and backward passes.
class Stage {
 public:
  // `in` is the per-example input shape. Returns nullptr with *error on a shape mismatch.
  static std::unique_ptr<Stage> Create(Backend& backend, const StageConfig& config, const Shape& in,
                                       int64_t classes, const OptimizerConfig& optimizer,
                                       uint64_t seed, std::string* error);

  const std::string& name() const { return name_; }
  const Shape& input_shape() const { return in_shape_; }
  const Shape& output_shape() const { return out_shape_; }
  // The vocabulary of the token ids its first layer reads (an embedding), else 0.
  int64_t token_vocab() const { return layers_.empty() ? 0 : layers_[0]->token_vocab(); }
  // What x holds: int32 token ids in [0, token_vocab()) when the first layer reads them,
  // float32 values otherwise.
  DType input_dtype() const { return token_vocab() > 0 ? DType::kI32 : DType::kF32; }

  // Runs the layers on x (borrowed until Backward on this slot) and returns the output.
  const Tensor& Forward(const Tensor& x, int slot, const ForwardContext& ctx);
  // Runs the head on the slot's output. Loss gradients are scaled by grad_scale (1/batch
  // for a mean loss) and accumulate into the head's parameters unless mode is kEval.
  HeadStats Head(int slot, const Tensor& labels, HeadMode mode, float grad_scale,
                 const ForwardContext& ctx);
  // Runs the head forward only on the slot's output (after Forward) and returns its logits,
  // [N, classes] or [N, positions, classes]: what predict and export reproduce.
  const Tensor& HeadLogits(int slot, const ForwardContext& ctx);
  // Decoding one sequence (Layer::ForwardPositions): positions [start, start + count) of x
  // through the layers and, with `head`, the head; `caches` keeps one entry per layer and
  // head layer between calls. Returns the last output ([count, features], or the head's
  // logits), or nullptr when some layer has no decoding form.
  const Tensor* DecodePositions(const Tensor& x, int64_t start, bool head,
                                std::vector<DecodeCache>* caches);
  // d(head loss)/d(stage output) from the last kLocal Head call on this slot.
  const Tensor& head_grad(int slot) const { return slots_[slot].head_dx; }
  // Backpropagates dy (w.r.t. the slot's output) through the layers, accumulating
  // parameter gradients; when dx is non-null it receives d/d(input). `layer_done`, when
  // set, is called with each layer's index as soon as that layer's backward pass is done,
  // the last layer first.
  void Backward(int slot, const Tensor& dy, Tensor* dx,
                const std::function<void(int)>& layer_done = {});
  // Backward in two halves (zero-bubble schedules; Layer::BackwardInput): BackwardInput sets
  // dx and the parameter gradients of layers that do not split theirs, keeping dy and every
  // inner gradient on the slot; BackwardWeights then adds the other layers' parameter
  // gradients, before the slot's next forward pass. Together they equal Backward bitwise.
  void BackwardInput(int slot, const Tensor& dy, Tensor* dx);
  void BackwardWeights(int slot, const std::function<void(int)>& layer_done = {});
  // Applies the optimizer to every parameter (layers and head) at lr x the stage's
  // lr_scale, and clears gradients.
  void Step(float lr);

  std::vector<Param*> params();  // the layers' in order, then the head's
  int num_layers() const { return static_cast<int>(layers_.size()); }
  const Layer& layer(int i) const { return *layers_[i]; }
  int num_head_layers() const { return static_cast<int>(head_.size()); }
  const Layer& head_layer(int i) const { return *head_[i]; }
  std::vector<Param*> layer_params(int layer) { return layers_[layer]->params(); }
  std::vector<Param*> head_params();
  int64_t num_parameters();
  // Bytes of training state held now: every parameter's value, gradient and optimizer
  // state (the floor any worker holding this stage needs).
  int64_t StateBytes();
  // Bytes one example in flight needs between its forward and backward passes: the stage
  // input, every layer's and head layer's output (computed from shapes, no allocation).
  int64_t ActivationBytesPerExample() const;
  Optimizer& optimizer() { return opt_; }

 private:
  struct Slot {
    Tensor input;
    std::vector<LayerCache> caches;
    std::vector<Tensor> grads;  // grads[i]: gradient w.r.t. the input of layer i
    std::vector<LayerCache> head_caches;
    std::vector<Tensor> head_grads;
    Tensor head_dx;
    Tensor kept_dy;  // BackwardInput's dy, for BackwardWeights
    Tensor dlogits, row_loss, row_correct;
    std::vector<float> host_loss, host_correct;
  };
  Stage(Backend& backend, const OptimizerConfig& optimizer)
      : backend_(backend), opt_(backend, optimizer) {}
  Slot& slot(int i);
  // Every layer's backward pass on slot s, the last layer first: whole, or (input_only)
  // its input half. Backward and BackwardInput.
  void BackwardLayers(Slot& s, const Tensor& dy, Tensor* dx, bool input_only,
                      const std::function<void(int)>& layer_done);
  const Tensor& output(const Slot& s) const {
    return layers_.empty() ? s.input : s.caches.back().out;
  }

  Backend& backend_;
  std::string name_;
  Shape in_shape_, out_shape_;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::unique_ptr<Layer>> head_;
  Optimizer opt_;
  float lr_scale_ = 1.0f;
  std::vector<Slot> slots_;
};

// The parameter values a stage built from `config` for input `in` would hold, its head's
// included, from shapes alone (0 when the shapes do not fit).
int64_t StageParameterCount(const StageConfig& config, const Shape& in, int64_t classes);

// One example's forward FLOPs through a stage's layers and through its head, from shapes
// alone (LayerForwardFlops); both 0 when the shapes do not fit.
struct StageFlops {
  double layers = 0;
  double head = 0;
};
StageFlops StageForwardFlops(const StageConfig& config, const Shape& in, int64_t classes);

// Every participant derives a stage's seed the same way, so a worker that builds stage k
// alone gets the weights the reference trainer has.
uint64_t StageSeed(uint64_t model_seed, int stage_index);

}  // namespace localpar

// Layers: forward/backward units with parameters, built from plain config structs. Every
// layer kind lives in one family file under common/nn/layers/ and is found through the
// registry (layer_kind.h); nothing outside those files knows a kind by name.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/core/tensor.h"

namespace localpar {

// A trainable tensor, its gradient (accumulated by backward passes) and optimizer state.
struct Param {
  std::string name;
  Tensor value;
  Tensor grad;
  Tensor state1;  // momentum / Adam first moment
  Tensor state2;  // Adam second moment
  // Replicas that synchronise every few steps (replica_sync.h's OuterSync): the weights at
  // the last synchronisation and the outer step's momentum; undefined otherwise.
  Tensor outer;
  Tensor outer_momentum;
  // False for state that forward passes update but no optimizer touches (batch norm's
  // running statistics): no gradient, still saved in checkpoints and weights files.
  bool trainable = true;
};

// What one layer's forward pass saves for its backward pass, for one in-flight batch.
struct LayerCache {
  Tensor out;
  Tensor aux0, aux1;
  std::vector<LayerCache> sub;  // composite layers (residual blocks)
  std::vector<Tensor> sub_grads;
  std::vector<Tensor> saved;  // layers that keep more than two tensors (attention)
};

// What a layer keeps while one sequence is decoded a few positions at a time (sampling a
// language model): `out` is the last call's output [count, output features]; attention keeps
// every earlier position's keys and values in `kept`; composite layers their children's.
struct DecodeCache {
  Tensor out;
  std::vector<Tensor> kept;
  std::vector<DecodeCache> sub;
};

struct ForwardContext {
  bool train = true;
  uint64_t seed = 0;  // varies per step: drives dropout masks
};

// One layer as a job file describes it: its kind (job.proto's Layer field name) and its
// settings by job.proto's field names, numbers all (a float setting survives the trip
// through double exactly). A family reads the settings it has and ignores the rest.
struct LayerConfig {
  std::string kind;
  std::map<std::string, double> settings;
  std::vector<LayerConfig> body;  // composite kinds (residual)

  LayerConfig() = default;
  explicit LayerConfig(std::string k, std::map<std::string, double> s = {})
      : kind(std::move(k)), settings(std::move(s)) {}
  bool has(const std::string& name) const {
    Trace(name);
    return settings.count(name) > 0;
  }
  double Number(const std::string& name, double fallback = 0) const;
  int64_t Int(const std::string& name, int64_t fallback = 0) const;
  void Set(const std::string& name, double value) { settings[name] = value; }
  // Sets `name` to `value` when it is missing or 0 (a job file's "use the default").
  void Default(const std::string& name, double value);

  // For tests: while set, every setting any LayerConfig reads is recorded here as (kind,
  // name), so that a test can hold the names a family reads against job.proto's fields (a
  // misspelt name would silently read the default). Not for concurrent use.
  static std::set<std::pair<std::string, std::string>>* trace;

 private:
  void Trace(const std::string& name) const {
    if (trace != nullptr) trace->emplace(kind, name);
  }
};

// A parameter's layout as PyTorch stores it: its shape, and where each element comes from
// (element to_ours[i] of our tensor is element i of PyTorch's; empty: the same order).
struct ExportLayout {
  std::vector<int64_t> shape;
  std::vector<int64_t> to_ours;
};

class OnnxGraph;

// What a GEMM layer may apply in its epilogue on behalf of the activation after it.
enum class Epilogue { kNone, kRelu };

class Layer {
 public:
  virtual ~Layer() = default;
  // The kind's name (job.proto's Layer field)
  virtual const char* kind() const = 0;
  const Shape& input_shape() const { return in_shape_; }  // without the batch dimension
  const Shape& output_shape() const { return out_shape_; }

  // Writes cache.out (and whatever backward needs) for input x of shape [N, input...].
  virtual void Forward(const Tensor& x, LayerCache& cache, const ForwardContext& ctx) = 0;
  // dy is the gradient with respect to cache.out. Accumulates parameter gradients; when dx
  // is non-null, sets it to the gradient with respect to x (it may alias dy's storage).
  virtual void Backward(const Tensor& x, const Tensor& dy, LayerCache& cache, Tensor* dx) = 0;
  // Zero-bubble pipelines split Backward in two: BackwardInput sets dx (and a layer that does
  // not split also accumulates its parameter gradients there), and BackwardWeights, called
  // later with the same x, dy and cache (both still unchanged), accumulates the parameter
  // gradients of a layer that does. The two together compute what Backward computes, with
  // the same arithmetic, so gradients added in the same order are bitwise the same.
  virtual bool splits_backward() const { return false; }
  virtual void BackwardInput(const Tensor& x, const Tensor& dy, LayerCache& cache, Tensor* dx) {
    Backward(x, dy, cache, dx);
  }
  virtual void BackwardWeights(const Tensor&, const Tensor&, LayerCache&) {}
  virtual std::vector<Param*> params() { return {}; }
  // Decoding (evaluation semantics): the forward pass of positions [start, start + count)
  // of one sequence, from their inputs x [count, input features per position] (token ids for
  // an embedding) and what `cache` kept from the earlier ones; writes cache.out. Callers
  // either start a sequence (start 0) or add one position (count 1). A layer that acts on
  // each position alone keeps nothing. False: this layer has no such form (a sampler then
  // runs the whole window for every token).
  virtual bool ForwardPositions(const Tensor&, int64_t, DecodeCache&) { return false; }
  // Composite layers: the layers inside, in order (their parameters are this one's).
  virtual std::vector<const Layer*> children() const { return {}; }
  // The vocabulary of a layer that reads int32 token ids (an embedding), 0 for one that
  // reads float values: a network starting with one takes ids in [0, token_vocab()).
  virtual int64_t token_vocab() const { return 0; }
  // Weight tying: an output projection for input shape `in` to `classes` logits per
  // position whose weight is this layer's own (an embedding's table, transposed). nullptr
  // with *error for a layer that cannot lend one.
  virtual std::unique_ptr<Layer> MakeTiedOutput(Backend& backend, const Shape& in, int64_t classes,
                                                std::string* error);

  // Export: `p` (one of params()) in PyTorch's layout; default: as stored. `nchw_source`
  // is the [H, W, C] image this layer's input was flattened from, when a flatten layer came
  // first (empty otherwise): PyTorch flattens [C, H, W], so a layer reading features
  // one by one (a linear) takes them in that order.
  virtual ExportLayout TorchLayout(const Param& p, const Shape& nchw_source) const;
  // Export: `p`'s name as the PyTorch module would call it ("weight" for batch norm's
  // gamma, "qkv.weight" for attention's qkv_weight); default: its own name.
  virtual std::string TorchName(const Param& p) const { return p.name; }
  // Export: the name of composite child `j` inside this layer's module; default "j".
  virtual std::string TorchChildName(size_t j) const { return std::to_string(j); }
  // Export: true for batch norm, whose PyTorch module has a num_batches_tracked buffer.
  virtual bool tracks_batches() const { return false; }
  // Export: true for a layer that turns an [H, W, C] image into features in memory order
  // (flatten), so the layers after it see NHWC-ordered features.
  virtual bool flattens_image() const { return false; }
  // Emits this layer into an ONNX graph on input x (NHWC, as localpar computes); returns the
  // output's name. Evaluation semantics: dropout is the identity, batch norm uses its
  // running statistics.
  virtual std::string EmitOnnx(OnnxGraph& graph, const std::string& x) const = 0;

  // Fusion (FuseActivations): an activation says which epilogue it is; a GEMM layer that
  // can apply it takes it, and the activation then passes its input through.
  virtual Epilogue as_epilogue() const { return Epilogue::kNone; }
  virtual bool TakeEpilogue(Epilogue) { return false; }
  virtual void PassThrough() {}

 protected:
  Shape in_shape_, out_shape_;

 private:
  friend std::unique_ptr<Layer> MakeLayer(Backend&, const LayerConfig&, const Shape&, uint64_t,
                                          std::string*);
};

// A layer whose backward pass splits into an input half and a weight half (zero-bubble
// schedules): Backward is the two, the weight half first, with the same arithmetic.
class SplitBackwardLayer : public Layer {
 public:
  void Backward(const Tensor& x, const Tensor& dy, LayerCache& cache, Tensor* dx) final {
    BackwardWeights(x, dy, cache);
    BackwardInput(x, dy, cache, dx);
  }
  bool splits_backward() const final { return true; }
  void BackwardInput(const Tensor& x, const Tensor& dy, LayerCache& cache, Tensor* dx) override = 0;
  void BackwardWeights(const Tensor& x, const Tensor& dy, LayerCache& cache) override = 0;
};

// Builds a layer for per-example input shape `in`; on a shape mismatch returns nullptr and
// sets *error. `seed` makes the initial weights deterministic on every backend.
std::unique_ptr<Layer> MakeLayer(Backend& backend, const LayerConfig& config, const Shape& in,
                                 uint64_t seed, std::string* error);

// Lets each GEMM apply the activation right after it in its own epilogue (one pass over the
// output instead of two). Parameters, shapes and results are unchanged, so it is applied to
// every stage and head as built.
void FuseActivations(std::vector<std::unique_ptr<Layer>>& layers);

// Shape-only validation without allocating anything; errors start with the kind's name.
bool InferLayerShape(const LayerConfig& config, const Shape& in, Shape* out, std::string* error);

// How many values the layer's parameters hold (trainable or not) for input shape `in`,
// computed from shapes alone: what a worker checks before it allocates a stage.
int64_t LayerParameterCount(const LayerConfig& config, const Shape& in);

// Floating-point operations of one example's forward pass, from shapes alone: 2 per
// multiply-add of GEMM-like layers (composite layers add up their bodies). Elementwise
// layers, normalisation, pooling and lookups count 0.
double LayerForwardFlops(const LayerConfig& config, const Shape& in);

// Values one example keeps through the layer for its backward pass, from shapes alone: its
// output, and what the kind keeps besides (attention's scores, a residual body's outputs).
// For memory estimates.
double LayerActivationValues(const LayerConfig& config, const Shape& in);

// Kinds that are shorthand for several layers (a transformer block) replaced by them,
// inside composite bodies too; `*cur` follows the shapes. Every other kind is copied.
void ExpandLayer(const LayerConfig& config, Shape* cur, std::vector<LayerConfig>* out);

// A setting that is wrong whatever the shapes: the field (relative to the kind, "" for the
// kind as a whole) and why. Empty `why`: nothing wrong.
struct LayerIssue {
  std::string field;
  std::string why;
};
// The largest magnitude any layer setting may have (out_features, kernel, vocab, ...).
constexpr double kMaxLayerSetting = 2147483647.0;
// An unknown kind is an issue too (field "", naming the kinds there are). Every setting is
// finite and within kMaxLayerSetting.
LayerIssue CheckLayerSettings(const LayerConfig& config);
// Fills the kind's documented defaults for settings left at zero, in composite bodies too.
void ApplyLayerDefaults(LayerConfig& config);

}  // namespace localpar

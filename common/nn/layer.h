// Layers: forward/backward units with parameters, built from plain config structs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
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

struct ForwardContext {
  bool train = true;
  uint64_t seed = 0;  // varies per step: drives dropout masks
};

struct LayerConfig {
  enum class Kind {
    kLinear,
    kRelu,
    kGelu,
    kLayerNorm,
    kDropout,
    kConv2d,
    kMaxPool,
    kAvgPool,
    kGlobalAvgPool,
    kFlatten,
    kEmbedding,
    kResidual,
    kBatchNorm,            // per channel (last dimension) over the batch and positions
    kDense,                // linear over the last dimension only (per position)
    kPositionalEncoding,   // adds fixed sinusoids to [positions, dim]
    kCausalSelfAttention,  // multi-head, causal, with input and output projections
  };
  Kind kind = Kind::kLinear;
  int64_t out_features = 0;  // linear: output features; conv2d: output channels
  int64_t in_features = 0;   // linear: optional check against the incoming shape (0 = infer)
  int64_t kernel = 3;        // conv2d, pools
  int64_t stride = 1;
  int64_t padding = 0;
  float dropout = 0.0f;
  float eps = 1e-5f;
  int64_t vocab = 0;  // embedding
  int64_t dim = 0;
  int64_t heads = 1;              // attention
  float momentum = 0.1f;          // batch norm running statistics
  std::vector<LayerConfig> body;  // residual
};

const char* LayerKindName(LayerConfig::Kind kind);

// The positional_encoding layer's fixed sinusoids, [positions, dim] row-major:
// PE[t, 2i] = sin(t / 10000^(2i/dim)), PE[t, 2i+1] = cos(same).
std::vector<float> PositionalEncodingTable(int64_t positions, int64_t dim);

class Layer {
 public:
  virtual ~Layer() = default;
  virtual const char* kind() const = 0;
  const Shape& output_shape() const { return out_shape_; }  // without the batch dimension

  // Writes cache.out (and whatever backward needs) for input x of shape [N, input...].
  virtual void Forward(const Tensor& x, LayerCache& cache, const ForwardContext& ctx) = 0;
  // dy is the gradient with respect to cache.out. Accumulates parameter gradients; when dx
  // is non-null, sets it to the gradient with respect to x (it may alias dy's storage).
  virtual void Backward(const Tensor& x, const Tensor& dy, LayerCache& cache, Tensor* dx) = 0;
  virtual std::vector<Param*> params() { return {}; }

 protected:
  Shape out_shape_;
};

// Builds a layer for per-example input shape `in`; on a shape mismatch returns nullptr and
// sets *error. `seed` makes the initial weights deterministic on every backend.
std::unique_ptr<Layer> MakeLayer(Backend& backend, const LayerConfig& config, const Shape& in,
                                 uint64_t seed, std::string* error);

// Lets a Linear layer apply the ReLU right after it in its own GEMM epilogue (one pass over
// the output instead of two); the ReLU layer then passes its input through. Parameters,
// shapes and results are unchanged, so it is applied to every stage and head as built.
void FuseActivations(std::vector<std::unique_ptr<Layer>>& layers);

// Shape-only validation without allocating anything.
bool InferLayerShape(const LayerConfig& config, const Shape& in, Shape* out, std::string* error);

// How many values the layer's parameters hold (trainable or not) for input shape `in`,
// computed from shapes alone: what a worker checks before it allocates a stage.
int64_t LayerParameterCount(const LayerConfig& config, const Shape& in);

// Floating-point operations of one example's forward pass, from shapes alone: 2 per
// multiply-add of linear, dense, convolution and attention layers (residual blocks add up
// their bodies). Elementwise layers, normalisation, pooling and embedding lookups count 0.
double LayerForwardFlops(const LayerConfig& config, const Shape& in);

}  // namespace localpar

// `position_embedding`: a learned vector per position added to a sequence [positions, dim]
// (GPT-2's and nanoGPT's wpe). The table starts small and random, std 0.02 as in GPT-2.
#include <cmath>

#include "common/core/rng.h"
#include "common/nn/init.h"
#include "common/nn/layers/family.h"

namespace localpar {
namespace {

class PositionEmbedding final : public Layer {
 public:
  PositionEmbedding(Backend& b, const Shape& in, uint64_t seed) : backend_(b) {
    out_shape_ = in;
    // Uniform with standard deviation 0.02: bound 0.02 * sqrt(3).
    table_ =
        MakeParam(b, "table", UniformInit(b, in, 0.02f * std::sqrt(3.0f), HashCombine(seed, 1)));
  }
  const char* kind() const override { return "position_embedding"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out.Ensure(backend_, x.shape());
    c.out.CopyFrom(x);
    backend_.AddRowVector(c.out.f32(), table_.value.f32(), x.rows(), table_.value.numel());
  }
  void Backward(const Tensor&, const Tensor& dy, LayerCache&, Tensor* dx) override {
    backend_.SumRows(dy.f32(), table_.grad.f32(), dy.rows(), table_.value.numel());
    if (dx) *dx = dy;
  }
  bool ForwardPositions(const Tensor& x, int64_t start, DecodeCache& c) override {
    const int64_t dim = out_shape_[1], count = x.numel() / dim;
    if (start < 0 || start + count > out_shape_[0]) return false;
    c.out.Ensure(backend_, {count, dim});
    backend_.Add(x.f32(), table_.value.f32() + start * dim, c.out.f32(), count * dim);
    return true;
  }
  std::vector<Param*> params() override { return {&table_}; }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    return g.Op("Add", {x, g.Leading(g.Parameter(*this, table_), g.PositionsOf(x), {0})});
  }

 private:
  Backend& backend_;
  Param table_;
};

class PositionEmbeddingKind final : public LayerKind {
 public:
  const char* name() const override { return "position_embedding"; }
  std::string Infer(const LayerConfig&, const Shape& in, Shape* out) const override {
    *out = in;
    if (in.size() != 2) return "needs a sequence input [positions, dim], got " + ShapeString(in);
    return "";
  }
  std::unique_ptr<Layer> Make(Backend& b, const LayerConfig&, const Shape& in, uint64_t seed,
                              std::string*) const override {
    return std::make_unique<PositionEmbedding>(b, in, seed);
  }
  int64_t Parameters(const LayerConfig&, const Shape& in) const override { return NumElements(in); }
};

}  // namespace

const LayerKind& PositionEmbeddingLayerKind() {
  static const PositionEmbeddingKind kind;
  return kind;
}

}  // namespace localpar

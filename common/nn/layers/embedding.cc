// The embedding family, for token sequences: `embedding` (token ids [positions] to vectors
// [positions, dim], a learned table) and `positional_encoding` (fixed sinusoids added to
// [positions, dim], as in "Attention Is All You Need").
#include <cmath>

#include "common/core/rng.h"
#include "common/nn/init.h"
#include "common/nn/layers/family.h"

namespace localpar {
namespace {

// logits = x table^T + bias: the output projection tied to an embedding's table, whose
// gradient accumulates both uses.
class TiedOutput final : public Layer {
 public:
  TiedOutput(Backend& b, const Shape& in, const Layer& owner, Param* table)
      : backend_(b),
        owner_(owner),
        table_(table),
        width_(in.back()),
        vocab_(table->value.shape()[0]) {
    out_shape_ = in;
    out_shape_.back() = vocab_;
    bias_ = MakeParam(b, "bias", ConstantInit(b, {vocab_}, 0.0f));
  }
  const char* kind() const override { return "tied_output"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    const int64_t rows = x.numel() / width_;
    Shape s = x.shape();
    s.back() = vocab_;
    c.out.Ensure(backend_, s);
    backend_.Gemm(false, true, rows, vocab_, width_, 1.0f, x.f32(), table_->value.f32(), 0.0f,
                  c.out.f32());
    backend_.AddRowVector(c.out.f32(), bias_.value.f32(), rows, vocab_);
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor* dx) override {
    const int64_t rows = x.numel() / width_;
    backend_.Gemm(true, false, vocab_, width_, rows, 1.0f, dy.f32(), x.f32(), 1.0f,
                  table_->grad.f32());
    backend_.SumRows(dy.f32(), bias_.grad.f32(), rows, vocab_);
    if (dx) {
      dx->Ensure(backend_, x.shape());
      backend_.Gemm(false, false, rows, width_, vocab_, 1.0f, dy.f32(), table_->value.f32(), 0.0f,
                    dx->f32());
    }
  }
  bool ForwardPositions(const Tensor& x, int64_t, DecodeCache& c) override {
    const int64_t rows = x.numel() / width_;
    c.out.Ensure(backend_, {rows, vocab_});
    backend_.Gemm(false, true, rows, vocab_, width_, 1.0f, x.f32(), table_->value.f32(), 0.0f,
                  c.out.f32());
    backend_.AddRowVector(c.out.f32(), bias_.value.f32(), rows, vocab_);
    return true;
  }
  std::vector<Param*> params() override { return {&bias_}; }  // the table is its owner's
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    const std::string weight = g.Transpose(g.Parameter(owner_, *table_), {1, 0});
    return g.Op("Add", {g.Op("MatMul", {x, weight}), g.Parameter(*this, bias_)});
  }

 private:
  Backend& backend_;
  const Layer& owner_;
  Param* const table_;
  const int64_t width_, vocab_;
  Param bias_;
};

class Embedding final : public Layer {
 public:
  Embedding(Backend& b, const Shape& in, int64_t vocab, int64_t dim, uint64_t seed)
      : backend_(b), vocab_(vocab), dim_(dim) {
    out_shape_ = in;
    out_shape_.push_back(dim);
    table_ = MakeParam(b, "table", UniformInit(b, {vocab, dim}, 1.0f, HashCombine(seed, 1)));
  }
  const char* kind() const override { return "embedding"; }
  std::string TorchName(const Param&) const override { return "weight"; }  // nn.Embedding
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    Shape s = x.shape();
    s.push_back(dim_);
    c.out.Ensure(backend_, s);
    backend_.EmbeddingForward(x.i32(), table_.value.f32(), c.out.f32(), x.numel(), dim_, vocab_);
  }
  void Backward(const Tensor& x, const Tensor& dy, LayerCache&, Tensor*) override {
    // Token ids have no gradient.
    backend_.EmbeddingBackward(x.i32(), dy.f32(), table_.grad.f32(), x.numel(), dim_, vocab_);
  }
  bool ForwardPositions(const Tensor& x, int64_t, DecodeCache& c) override {
    c.out.Ensure(backend_, {x.numel(), dim_});
    backend_.EmbeddingForward(x.i32(), table_.value.f32(), c.out.f32(), x.numel(), dim_, vocab_);
    return true;
  }
  std::vector<Param*> params() override { return {&table_}; }
  int64_t token_vocab() const override { return vocab_; }
  std::unique_ptr<Layer> MakeTiedOutput(Backend& b, const Shape& in, int64_t classes,
                                        std::string* error) override {
    if (in.empty() || in.back() != dim_ || classes != vocab_) {
      *error = "the embedding (" + std::to_string(vocab_) + " x " + std::to_string(dim_) +
               ") cannot be tied to an output of " + ShapeString(in) + " to " +
               std::to_string(classes) + " classes";
      return nullptr;
    }
    auto out = std::make_unique<TiedOutput>(b, in, *this, &table_);
    return out;
  }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    return g.Op("Gather", {g.Parameter(*this, table_), x}, {IntAttr("axis", 0)});
  }

 private:
  Backend& backend_;
  int64_t vocab_, dim_;
  Param table_;
};

// PE[t, 2i] = sin(t / 10000^(2i/dim)), PE[t, 2i+1] = cos(same), [positions, dim] row-major.
std::vector<float> SinusoidTable(int64_t positions, int64_t dim) {
  std::vector<float> pe(static_cast<size_t>(positions * dim));
  for (int64_t p = 0; p < positions; ++p) {
    for (int64_t i = 0; i < dim; ++i) {
      double freq = std::pow(10000.0, -static_cast<double>(i - i % 2) / static_cast<double>(dim));
      double a = static_cast<double>(p) * freq;
      pe[p * dim + i] = static_cast<float>(i % 2 == 0 ? std::sin(a) : std::cos(a));
    }
  }
  return pe;
}

class PositionalEncoding final : public Layer {
 public:
  PositionalEncoding(Backend& b, const Shape& in) : backend_(b) {
    out_shape_ = in;
    table_ = Tensor::FromHost(b, {in[0] * in[1]}, SinusoidTable(in[0], in[1]));
  }
  const char* kind() const override { return "positional_encoding"; }
  void Forward(const Tensor& x, LayerCache& c, const ForwardContext&) override {
    c.out.Ensure(backend_, x.shape());
    c.out.CopyFrom(x);
    backend_.AddRowVector(c.out.f32(), table_.f32(), x.rows(), table_.numel());
  }
  void Backward(const Tensor&, const Tensor& dy, LayerCache&, Tensor* dx) override {
    if (dx) *dx = dy;
  }
  bool ForwardPositions(const Tensor& x, int64_t start, DecodeCache& c) override {
    const int64_t dim = out_shape_[1], count = x.numel() / dim;
    if (start < 0 || start + count > out_shape_[0]) return false;
    c.out.Ensure(backend_, {count, dim});
    backend_.Add(x.f32(), table_.f32() + start * dim, c.out.f32(), count * dim);
    return true;
  }
  std::string EmitOnnx(OnnxGraph& g, const std::string& x) const override {
    const std::string table = g.Floats("positional_encoding", {out_shape_[0], out_shape_[1]},
                                       SinusoidTable(out_shape_[0], out_shape_[1]));
    return g.Op("Add", {x, g.Leading(table, g.PositionsOf(x), {0})});
  }

 private:
  Backend& backend_;
  Tensor table_;
};

class EmbeddingKind final : public LayerKind {
 public:
  const char* name() const override { return "embedding"; }
  LayerIssue Check(const LayerConfig& c) const override {
    if (c.Int("vocab") <= 0) return {"vocab", "must be > 0"};
    if (c.Int("dim") <= 0) return {"dim", "must be > 0"};
    return {};
  }
  std::string Infer(const LayerConfig& c, const Shape& in, Shape* out) const override {
    if (c.Int("vocab") <= 0 || c.Int("dim") <= 0) return "vocab and dim must be > 0";
    *out = in;
    out->push_back(c.Int("dim"));
    return "";
  }
  std::unique_ptr<Layer> Make(Backend& b, const LayerConfig& c, const Shape& in, uint64_t seed,
                              std::string*) const override {
    return std::make_unique<Embedding>(b, in, c.Int("vocab"), c.Int("dim"), seed);
  }
  int64_t Parameters(const LayerConfig& c, const Shape&) const override {
    return CountFromDouble(c.Number("vocab") * c.Number("dim"));
  }
  std::string CanTieOutput(const LayerConfig& c, int64_t width, int64_t classes) const override {
    if (c.Int("dim") == width && c.Int("vocab") == classes) return "";
    return "the embedding (vocab " + std::to_string(c.Int("vocab")) + ", dim " +
           std::to_string(c.Int("dim")) + ") does not match the head's " + std::to_string(width) +
           " features to " + std::to_string(classes) + " classes";
  }
  int64_t TokenVocab(const LayerConfig& c) const override { return c.Int("vocab"); }
};

class PositionalEncodingKind final : public LayerKind {
 public:
  const char* name() const override { return "positional_encoding"; }
  std::string Infer(const LayerConfig&, const Shape& in, Shape* out) const override {
    *out = in;
    if (in.size() != 2) return "needs a sequence input [positions, dim], got " + ShapeString(in);
    return "";
  }
  std::unique_ptr<Layer> Make(Backend& b, const LayerConfig&, const Shape& in, uint64_t,
                              std::string*) const override {
    return std::make_unique<PositionalEncoding>(b, in);
  }
};

}  // namespace

const LayerKind& EmbeddingLayerKind() {
  static const EmbeddingKind kind;
  return kind;
}
const LayerKind& PositionalEncodingLayerKind() {
  static const PositionalEncodingKind kind;
  return kind;
}

}  // namespace localpar

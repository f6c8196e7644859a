// Decoding with a key-value cache (Stage::DecodePositions) against the whole-window forward
// pass: a prefill of some positions, then one position at a time, gives every position's
// logits as the whole window does.
#include <gtest/gtest.h>

#include <cmath>

#include "common/core/cpu_backend.h"
#include "common/nn/model.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::AllClose;

constexpr int kVocab = 11, kContext = 9;

LayerConfig L(const std::string& kind, std::map<std::string, double> s = {}) {
  return LayerConfig(kind, std::move(s));
}

// Every layer kind a language model decodes through: an embedding, both position kinds,
// attention in a pre-norm block, dense with ReLU and GELU, dropout; one head tied to the
// embedding, one not.
ModelConfig EverySequenceLayer() {
  ModelConfig m;
  m.input_shape = {kContext};
  m.classes = kVocab;
  m.seed = 17;
  LayerConfig attention = L("residual");
  attention.body = {L("layer_norm"), L("causal_self_attention", {{"heads", 2}})};
  LayerConfig mlp = L("residual");
  mlp.body = {L("layer_norm"),
              L("dense", {{"out_features", 24}}),
              L("relu"),
              L("dropout", {{"rate", 0.5}}),
              L("dense", {{"out_features", 12}}),
              L("gelu")};
  StageConfig s0, s1;
  s0.layers = {L("embedding", {{"vocab", kVocab}, {"dim", 12}}), L("position_embedding"),
               L("positional_encoding"), attention, mlp};
  s0.head.kind = HeadConfig::Kind::kLanguageModel;
  s0.head.tie_embedding = true;
  LayerConfig attention3 = L("residual");
  attention3.body = {L("layer_norm"), L("causal_self_attention", {{"heads", 3}})};
  s1.layers = {attention3, mlp};
  s1.head.kind = HeadConfig::Kind::kLanguageModel;
  m.stages = {s0, s1};
  return m;
}

// Each stage's logits for every position of `ids`, decoded: positions [0, prefill) at once,
// then one at a time.
std::vector<std::vector<float>> Decoded(Backend& be, Model& model, const std::vector<int32_t>& ids,
                                        int prefill) {
  std::vector<std::vector<DecodeCache>> caches(model.num_stages());
  std::vector<std::vector<float>> logits(model.num_stages());
  for (int from = 0; from < static_cast<int>(ids.size());) {
    const int count = from == 0 ? prefill : 1;
    Tensor x = Tensor::FromHostI32(
        be, {count}, std::vector<int32_t>(ids.begin() + from, ids.begin() + from + count));
    const Tensor* cur = &x;
    for (int k = 0; k < model.num_stages(); ++k) {
      const Tensor* head = model.stage(k).DecodePositions(*cur, from, true, &caches[k]);
      EXPECT_NE(head, nullptr);
      if (head == nullptr) return {};
      for (float v : head->ToHost()) logits[k].push_back(v);
      // The layers' output alone feeds the next stage (the head's layers come after them).
      cur = &caches[k][model.stage(k).num_layers() - 1].out;
    }
    from += count;
  }
  return logits;
}

void ExpectDecodingMatchesTheWindow(Backend& be) {
  std::string error;
  auto model = Model::Create(be, EverySequenceLayer(), &error);
  ASSERT_TRUE(model) << error;
  const std::vector<int32_t> ids = {3, 10, 0, 7, 7, 2, 9, 1, 5};
  Tensor x = Tensor::FromHostI32(be, {1, kContext}, ids);
  ForwardContext ctx;
  ctx.train = false;
  std::vector<std::vector<float>> whole;
  const Tensor* cur = &x;
  for (int k = 0; k < model->num_stages(); ++k) {
    cur = &model->stage(k).Forward(*cur, 0, ctx);
    whole.push_back(model->stage(k).HeadLogits(0, ctx).ToHost());
  }
  for (int prefill : {1, 4, kContext}) {
    std::vector<std::vector<float>> decoded = Decoded(be, *model, ids, prefill);
    ASSERT_EQ(decoded.size(), whole.size());
    for (size_t k = 0; k < whole.size(); ++k) {
      EXPECT_TRUE(AllClose(decoded[k], whole[k], 1e-5f, 1e-4f))
          << "stage " << k << ", prefill " << prefill;
    }
  }
}

TEST(Decode, PrefillThenOnePositionAtATimeGivesTheWholeWindowsLogits) {
  ExpectDecodingMatchesTheWindow(*MakeCpuBackend());
}

TEST(CudaParity, DecodingGivesTheWholeWindowsLogits) {
  LP_REQUIRE_CUDA(gpu);
  ExpectDecodingMatchesTheWindow(*gpu);
}

TEST(Decode, ALayerThatMixesPositionsHasNoDecodingForm) {
  auto cpu = MakeCpuBackend();
  ModelConfig m;
  m.input_shape = {4, 3};
  m.classes = 5;
  StageConfig s;
  s.layers = {L("linear", {{"out_features", 6}})};
  m.stages = {s};
  std::string error;
  auto model = Model::Create(*cpu, m, &error);
  ASSERT_TRUE(model) << error;
  Tensor x = Tensor::FromHost(*cpu, {4, 3}, std::vector<float>(12, 0.5f));
  std::vector<DecodeCache> caches;
  EXPECT_EQ(model->stage(0).DecodePositions(x, 0, false, &caches), nullptr);
}

TEST(Attention, CachedCausalSoftmaxRowsAreTheLastRowsOfTheCausalOne) {
  auto cpu = MakeCpuBackend();
  const int mats = 3, t = 6, queries = 2;
  std::vector<float> s = testing::RandomVector(mats * t * t, 41, -3, 3);
  Tensor full = Tensor::FromHost(*cpu, {mats * t * t}, s), pf = Tensor::Empty(*cpu, {mats * t * t});
  cpu->CausalSoftmaxForward(full.f32(), pf.f32(), mats, t, 0.6f);
  std::vector<float> last, pfh = pf.ToHost();
  for (int m = 0; m < mats; ++m) {
    for (int i = t - queries; i < t; ++i) {
      for (int j = 0; j < t; ++j) last.push_back(s[(m * t + i) * t + j]);
    }
  }
  Tensor st = Tensor::FromHost(*cpu, {mats * queries * t}, last);
  Tensor p = Tensor::Empty(*cpu, {mats * queries * t});
  cpu->CachedCausalSoftmaxForward(st.f32(), p.f32(), mats, queries, t, 0.6f);
  std::vector<float> ph = p.ToHost(), want;
  for (int m = 0; m < mats; ++m) {
    for (int i = t - queries; i < t; ++i) {
      for (int j = 0; j < t; ++j) want.push_back(pfh[(m * t + i) * t + j]);
    }
  }
  EXPECT_EQ(ph, want);
  // Backward, by finite differences of sum(p * w) through the scaled softmax.
  std::vector<float> w = testing::RandomVector(mats * queries * t, 42);
  Tensor wt = Tensor::FromHost(*cpu, {mats * queries * t}, w),
         ds = Tensor::Empty(*cpu, {mats * queries * t});
  cpu->CachedCausalSoftmaxBackward(p.f32(), wt.f32(), ds.f32(), mats, queries, t, 0.6f);
  std::vector<float> dsh = ds.ToHost();
  auto objective = [&](const std::vector<float>& scores) {
    Tensor a = Tensor::FromHost(*cpu, {mats * queries * t}, scores),
           b = Tensor::Empty(*cpu, {mats * queries * t});
    cpu->CachedCausalSoftmaxForward(a.f32(), b.f32(), mats, queries, t, 0.6f);
    double sum = 0;
    std::vector<float> bh = b.ToHost();
    for (size_t i = 0; i < bh.size(); ++i) sum += static_cast<double>(bh[i]) * w[i];
    return sum;
  };
  for (size_t i = 0; i < last.size(); i += 5) {
    std::vector<float> up = last, down = last;
    up[i] += 1e-3f;
    down[i] -= 1e-3f;
    EXPECT_NEAR(dsh[i], (objective(up) - objective(down)) / 2e-3, 2e-3) << i;
  }
}

TEST(CudaParity, CachedCausalSoftmax) {
  LP_REQUIRE_CUDA(gpu);
  auto cpu = MakeCpuBackend();
  const int mats = 4, queries = 3, t = 70;
  std::vector<float> s = testing::RandomVector(mats * queries * t, 43, -4, 4),
                     dp = testing::RandomVector(mats * queries * t, 44);
  auto run = [&](Backend& be) {
    Tensor st = Tensor::FromHost(be, {mats * queries * t}, s),
           p = Tensor::Empty(be, {mats * queries * t}),
           dpt = Tensor::FromHost(be, {mats * queries * t}, dp),
           ds = Tensor::Empty(be, {mats * queries * t});
    be.CachedCausalSoftmaxForward(st.f32(), p.f32(), mats, queries, t, 0.3f);
    be.CachedCausalSoftmaxBackward(p.f32(), dpt.f32(), ds.f32(), mats, queries, t, 0.3f);
    std::vector<float> all = p.ToHost(), d = ds.ToHost();
    all.insert(all.end(), d.begin(), d.end());
    return all;
  };
  EXPECT_TRUE(AllClose(run(*gpu), run(*cpu), 1e-6f, 1e-4f));
}

}  // namespace
}  // namespace localpar

// Benchmark: fashion_mlp training steps on one backend, reported as a fraction of the
// machine's SGEMM rate measured in the same run (absolute times on shared machines are
// noise; ratios are not). Core-only, so it also builds on the CUDA-only GPU machine.
//
//   step_bench [--device=cpu|cuda] [--rule=greedy|backprop] [--optimizer=adamw|sgd]
//              [--batch=128] [--width=1024] [--input=784] [--stages=4] [--layers=1]
//              [--precision=f32|tf32|bf16]   (GEMM precision, see GemmPrecision)
//              [--seconds=2]
//   step_bench --model=gpt [--device=...] [--batch=64] [--context=256] [--width=128]
//              [--blocks=4] [--heads=4] [--vocab=256]
//              (nanoGPT's shakespeare_char model, one stage, BACKPROP: its step against the
//              backend's GEMM rate on the step's own GEMMs, batched ones included)
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/core/rng.h"
#include "common/nn/trainer.h"

namespace localpar {
namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string device = "cpu";
  std::string rule = "greedy";
  std::string optimizer = "adamw";
  int64_t batch = 128;
  int64_t width = 1024;
  int64_t input = 784;
  int stages = 4;
  int layers = 1;  // Linear + ReLU pairs per stage
  std::string precision = "f32";
  double seconds = 2.0;
  std::string model = "mlp";  // or "gpt"
  int64_t context = 256;      // gpt
  int blocks = 4, heads = 4;
  int64_t vocab = 256;
};

bool Parse(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto val = [&](const char* key) -> const char* {
      size_t n = std::strlen(key);
      return s.compare(0, n, key) == 0 ? s.c_str() + n : nullptr;
    };
    if (const char* v = val("--device="))
      a->device = v;
    else if (const char* v = val("--rule="))
      a->rule = v;
    else if (const char* v = val("--optimizer="))
      a->optimizer = v;
    else if (const char* v = val("--batch="))
      a->batch = std::atoll(v);
    else if (const char* v = val("--width="))
      a->width = std::atoll(v);
    else if (const char* v = val("--input="))
      a->input = std::atoll(v);
    else if (const char* v = val("--stages="))
      a->stages = std::atoi(v);
    else if (const char* v = val("--layers="))
      a->layers = std::atoi(v);
    else if (const char* v = val("--model="))
      a->model = v;
    else if (const char* v = val("--context="))
      a->context = std::atoll(v);
    else if (const char* v = val("--blocks="))
      a->blocks = std::atoi(v);
    else if (const char* v = val("--heads="))
      a->heads = std::atoi(v);
    else if (const char* v = val("--vocab="))
      a->vocab = std::atoll(v);
    else if (const char* v = val("--precision="))
      a->precision = v;
    else if (const char* v = val("--seconds="))
      a->seconds = std::atof(v);
    else {
      std::fprintf(
          stderr,
          "usage: step_bench [--device=cpu|cuda] [--rule=greedy|backprop] [--optimizer=adamw|sgd] "
          "[--batch=N] [--width=N] [--input=N] [--stages=N] [--layers=N] "
          "[--precision=f32|tf32|bf16] [--seconds=S]\n");
      return false;
    }
  }
  if (a->precision != "f32" && a->precision != "tf32" && a->precision != "bf16") {
    std::fprintf(stderr, "step_bench: --precision=%s: expected f32, tf32 or bf16\n",
                 a->precision.c_str());
    return false;
  }
  return a->batch > 0 && a->width > 0 && a->input > 0 && a->stages > 0 && a->layers > 0 &&
         a->seconds > 0;
}

// Runs fn repeatedly for about `seconds`; returns the best time per call over 3 rounds.
template <typename F>
double BestSecondsPerCall(Backend& be, double seconds, F fn) {
  fn();
  be.Synchronize();
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    int64_t calls = 0;
    auto start = Clock::now();
    double el = 0;
    do {
      fn();
      ++calls;
      be.Synchronize();
      el = std::chrono::duration<double>(Clock::now() - start).count();
    } while (el < seconds / 3);
    best = std::min(best, el / calls);
  }
  return best;
}

struct GemmShape {
  bool ta, tb;
  int64_t m, n, k;
  int64_t batch = 1;  // > 1: GemmBatched over that many operands
};

double GemmRate(Backend& be, const std::vector<GemmShape>& shapes, double seconds) {
  std::vector<Tensor> a, b, c;
  double flops = 0;
  Rng rng(1);
  for (const GemmShape& s : shapes) {
    std::vector<float> ha(s.batch * s.m * s.k), hb(s.batch * s.k * s.n);
    for (float& v : ha) v = rng.NextUniform();
    for (float& v : hb) v = rng.NextUniform();
    a.push_back(Tensor::FromHost(be, {s.batch * s.m * s.k}, ha));
    b.push_back(Tensor::FromHost(be, {s.batch * s.k * s.n}, hb));
    c.push_back(Tensor::Zeros(be, {s.batch * s.m * s.n}));
    flops += 2.0 * s.batch * s.m * s.n * s.k;
  }
  double t = BestSecondsPerCall(be, seconds, [&] {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const GemmShape& s = shapes[i];
      if (s.batch > 1) {
        be.GemmBatched(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a[i].f32(), s.m * s.k, b[i].f32(),
                       s.k * s.n, 0.0f, c[i].f32(), s.m * s.n, s.batch);
      } else {
        be.Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a[i].f32(), b[i].f32(), 0.0f, c[i].f32());
      }
    }
  });
  return flops / t;
}

// nanoGPT's model (token and position embeddings, pre-norm blocks, a language-model head)
// as one BACKPROP stage: tokens per second, and the step against the backend's rate on the
// step's own GEMMs, the attention's batched ones included.
int RunGpt(const Args& args, Backend& be) {
  const int64_t B = args.batch, T = args.context, d = args.width, V = args.vocab;
  const int64_t h = args.heads, R = B * T, mats = B * h, dh = d / h;
  ModelConfig mc;
  mc.input_shape = {T};
  mc.classes = V;
  mc.seed = 1;
  mc.optimizer.clip_norm = 1.0f;
  StageConfig s;
  s.layers.push_back(LayerConfig(
      "embedding", {{"vocab", static_cast<double>(V)}, {"dim", static_cast<double>(d)}}));
  s.layers.push_back(LayerConfig("position_embedding"));
  for (int i = 0; i < args.blocks; ++i) {
    s.layers.push_back(LayerConfig("transformer_block", {{"heads", static_cast<double>(h)}}));
  }
  s.head.kind = HeadConfig::Kind::kLanguageModel;
  mc.stages.push_back(s);
  Shape cur = mc.input_shape;
  std::vector<LayerConfig> expanded;
  for (const LayerConfig& l : mc.stages[0].layers) ExpandLayer(l, &cur, &expanded);
  mc.stages[0].layers = expanded;
  std::string error;
  auto model = Model::Create(be, mc, &error);
  if (!model) {
    std::fprintf(stderr, "step_bench: %s\n", error.c_str());
    return 1;
  }
  StepSettings to;
  to.rule = UpdateRule::kBackprop;
  ReferenceTrainer trainer(*model, to);
  Rng rng(2);
  std::vector<int32_t> hx(R), hy(R);
  for (int32_t& v : hx) v = static_cast<int32_t>(rng.NextBelow(V));
  for (int32_t& v : hy) v = static_cast<int32_t>(rng.NextBelow(V));
  Tensor x = Tensor::FromHostI32(be, {B, T}, hx);
  Tensor y = Tensor::FromHostI32(be, {B, T}, hy);
  // A linear (m, n, k) forward also costs its weight gradient and its input gradient.
  std::vector<GemmShape> g;
  auto linear = [&](int64_t m, int64_t n, int64_t k) {
    g.push_back({false, false, m, n, k});
    g.push_back({true, false, k, n, m});
    g.push_back({false, true, m, k, n});
  };
  for (int i = 0; i < args.blocks; ++i) {
    linear(R, 3 * d, d);
    linear(R, d, d);
    linear(R, 4 * d, d);
    linear(R, d, 4 * d);
    // Scores and their weighted sum forward, four products of the same sizes backward.
    for (int j = 0; j < 3; ++j) g.push_back({false, true, T, T, dh, mats});
    for (int j = 0; j < 3; ++j) g.push_back({false, false, T, dh, T, mats});
  }
  linear(R, V, d);
  double step_flops = 0;
  for (const GemmShape& s2 : g) step_flops += 2.0 * s2.batch * s2.m * s2.n * s2.k;
  const double own = GemmRate(be, g, args.seconds);
  const double step = BestSecondsPerCall(be, args.seconds, [&] { trainer.TrainStep(x, y); });
  std::printf(
      "gpt training step: %s, BACKPROP, %lld parameters, batch %lld x context %lld, "
      "%d blocks of width %lld (%lld heads), vocabulary %lld\n",
      be.Describe().c_str(), static_cast<long long>(model->num_parameters()),
      static_cast<long long>(B), static_cast<long long>(T), args.blocks, static_cast<long long>(d),
      static_cast<long long>(h), static_cast<long long>(V));
  std::printf("  the step's own GEMMs alone (the GEMM library's rate): %.1f GFLOP/s, %.3f ms\n",
              own / 1e9, step_flops / own * 1e3);
  std::printf("  training step: %.3f ms, %.0f tokens/s, %.3f GFLOP of GEMMs -> %.1f GFLOP/s\n",
              step * 1e3, R / step, step_flops / 1e9, step_flops / step / 1e9);
  std::printf("  step rate / own-shape GEMM rate:   %.3f\n", step_flops / step / own);
  return 0;
}

int Run(const Args& args) {
  std::unique_ptr<Backend> be;
  if (args.device == "cuda") {
    be = MakeCudaBackend(0);
    if (!be) {
      std::printf("step_bench: no CUDA device; skipped\n");
      return 0;
    }
  } else {
    be = MakeCpuBackend();  // one GEMM thread
  }
  be->set_gemm_precision(args.precision == "bf16"   ? GemmPrecision::kBF16
                         : args.precision == "tf32" ? GemmPrecision::kTF32
                                                    : GemmPrecision::kF32);
  if (args.model == "gpt") return RunGpt(args, *be);
  const bool backprop = args.rule == "backprop";
  const int64_t B = args.batch, W = args.width, in = args.input, classes = 10;
  const int K = args.stages, L = args.layers;

  // By default the model of deploy/jobs/fashion_mlp.textproto: 4 stages of Linear(W) + ReLU
  // with linear heads. --stages=1 --layers=4 --input=W is one worker's wide stage.
  ModelConfig mc;
  mc.input_shape = {in};
  mc.classes = classes;
  mc.seed = 1;
  if (args.optimizer == "sgd") {
    mc.optimizer.kind = OptimizerConfig::Kind::kSgd;
    mc.optimizer.momentum = 0.9f;
  }
  for (int k = 0; k < K; ++k) {
    StageConfig s;
    LayerConfig lin, relu;
    lin.kind = "linear";
    lin.Set("out_features", W);
    relu.kind = "relu";
    for (int l = 0; l < L; ++l) {
      s.layers.push_back(lin);
      s.layers.push_back(relu);
    }
    mc.stages.push_back(s);
  }
  std::string error;
  auto model = Model::Create(*be, mc, &error);
  if (!model) {
    std::fprintf(stderr, "step_bench: %s\n", error.c_str());
    return 1;
  }
  StepSettings to;
  to.rule = backprop ? UpdateRule::kBackprop : UpdateRule::kGreedy;
  ReferenceTrainer trainer(*model, to);
  Rng rng(2);
  std::vector<float> hx(B * in);
  std::vector<int32_t> hy(B);
  for (float& v : hx) v = rng.NextUniform();
  for (int32_t& v : hy) v = static_cast<int32_t>(rng.NextBelow(classes));
  Tensor x = Tensor::FromHost(*be, {B, in}, hx);
  Tensor y = Tensor::FromHostI32(*be, {B}, hy);

  // The GEMMs one step performs (row-major, as the layers issue them).
  std::vector<GemmShape> step_gemms;
  for (int k = 0; k < K; ++k) {
    for (int l = 0; l < L; ++l) {
      int64_t fan_in = k == 0 && l == 0 ? in : W;
      step_gemms.push_back({false, false, B, W, fan_in});  // forward
      step_gemms.push_back({true, false, fan_in, W, B});   // weight gradient
      if (l > 0 || (backprop && k > 0)) step_gemms.push_back({false, true, B, fan_in, W});  // dx
    }
    bool head_dx = !backprop || k == K - 1;
    step_gemms.push_back({false, false, B, classes, W});
    step_gemms.push_back({true, false, W, classes, B});
    if (head_dx) step_gemms.push_back({false, true, B, W, classes});
  }
  double step_flops = 0;
  for (const GemmShape& s : step_gemms) step_flops += 2.0 * s.m * s.n * s.k;

  const int64_t S = be->device() == DeviceType::kCUDA ? 8192 : 1024;
  double peak = GemmRate(*be, {{false, false, S, S, S}}, args.seconds);
  double own = GemmRate(*be, step_gemms, args.seconds);
  double step = BestSecondsPerCall(*be, args.seconds, [&] { trainer.TrainStep(x, y); });
  double achieved = step_flops / step;

  std::printf(
      "training step: %s, %s, %s, batch %lld, input %lld, %d stage(s) of %d x Linear %lld\n",
      be->Describe().c_str(), backprop ? "BACKPROP" : "GREEDY",
      args.optimizer == "sgd" ? "SGD+momentum" : "AdamW", static_cast<long long>(B),
      static_cast<long long>(in), K, L, static_cast<long long>(W));
  std::printf("  SGEMM rate, %lldx%lldx%lld (same run):   %8.1f GFLOP/s\n",
              static_cast<long long>(S), static_cast<long long>(S), static_cast<long long>(S),
              peak / 1e9);
  std::printf("  SGEMM rate, the step's own GEMM shapes:  %8.1f GFLOP/s\n", own / 1e9);
  std::printf("  training step: %.3f ms, %.0f examples/s, %.3f GFLOP -> %.1f GFLOP/s\n", step * 1e3,
              B / step, step_flops / 1e9, achieved / 1e9);
  std::printf("  step rate / SGEMM rate:            %.3f\n", achieved / peak);
  if (be->device() == DeviceType::kCUDA) {
    int64_t state = 0;
    for (int k = 0; k < model->num_stages(); ++k) state += model->stage(k).StateBytes();
    std::printf(
        "  device memory held: %.1f MiB (training state %.1f MiB; the rest is activations,\n"
        "  the GEMM reference's operands, workspace and cached blocks)\n",
        be->DeviceBytesInUse() / 1048576.0, state / 1048576.0);
  }
  std::printf("  step rate / own-shape GEMM rate:   %.3f\n", achieved / own);
  return 0;
}

}  // namespace
}  // namespace localpar

int main(int argc, char** argv) {
  localpar::Args args;
  if (!localpar::Parse(argc, argv, &args)) return 2;
  return localpar::Run(args);
}

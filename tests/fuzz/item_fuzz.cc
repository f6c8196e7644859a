// Fuzz target: an item from a peer against the worker's checks, read both ways: as a
// localpar.v1.DownItem from upstream and as a localpar.v1.UpItem (a gradient) from
// downstream. Whatever a check accepts must be safe to use: its tensors decode to the sizes
// the job allows, every label is a class, a language model's stage 0 takes only token ids
// within its vocabulary (and other stages only floats), the micro-batch fits its step, and a
// gradient is the owed batch's shape with every value finite.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "common/nn/trainer.h"
#include "services/common/wire_codec.h"
#include "services/worker/item_check.h"

namespace {

constexpr int kTokenStage = 2;  // stage 0 of a language model

localpar::ItemLimits Limits(int which) {
  const int stage = which == kTokenStage ? 0 : which;
  localpar::ItemLimits l;
  l.stage = stage;
  l.token_vocab = which == kTokenStage ? 6 : 0;
  l.input_shape = {4, 2};
  l.wire_dtype = stage > 0 ? localpar::v1::BF16 : localpar::v1::F32;
  l.classes = 5;
  l.labels_per_example = stage > 0 ? 2 : 1;
  l.micro_batches = 3;
  l.batch_size = 16;
  l.eval_batch_size = 32;
  l.total_steps = 100;
  l.epochs = 3;
  return l;
}

void CheckUpItem(const uint8_t* data, size_t size, localpar::Backend& cpu) {
  localpar::v1::UpItem up;
  if (!up.ParseFromArray(data, static_cast<int>(size)) || !up.has_gradient()) return;
  const localpar::v1::Gradient& g = up.gradient();
  for (int64_t rows : {int64_t{1}, int64_t{3}}) {
    localpar::ItemCheck c = localpar::CheckGradient(g, g.seq() + size % 2, rows, {4, 2});
    if (c.verdict == localpar::ItemCheck::kReject && c.status.ok()) __builtin_trap();
    if (c.verdict != localpar::ItemCheck::kAccept) continue;
    if (size % 2 != 0) __builtin_trap();  // the gradient of another batch was taken
    localpar::Tensor grad;
    localpar::DecodeTensorInto(g.grad(), cpu, &grad);
    if (grad.numel() != rows * 8) __builtin_trap();
    for (int64_t i = 0; i < grad.numel(); ++i) {
      if (!std::isfinite(grad.f32()[i])) __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* cpu = localpar::MakeCpuBackend().release();
  CheckUpItem(data, size, *cpu);
  localpar::v1::DownItem item;
  if (!item.ParseFromArray(data, static_cast<int>(size))) return 0;
  for (int which : {0, 1, kTokenStage}) {
    const localpar::ItemLimits l = Limits(which);
    localpar::ItemCheck c = localpar::CheckDownItem(item, &l, size % 7);
    if (c.verdict == localpar::ItemCheck::kReject && c.status.ok()) __builtin_trap();
    if (c.verdict != localpar::ItemCheck::kAccept || !item.has_batch()) continue;
    localpar::v1::Batch b = item.batch();
    localpar::Tensor x, y;
    localpar::TakeActivations(b.mutable_activations(), *cpu, &x);
    localpar::DecodeTensorInto(b.labels(), *cpu, &y);
    const int64_t rows = x.rows();
    if (x.numel() != rows * 8 || y.numel() != rows * l.labels_per_example) __builtin_trap();
    if ((x.dtype() == localpar::DType::kI32) != (l.token_vocab > 0)) __builtin_trap();
    for (int64_t i = 0; l.token_vocab > 0 && i < x.numel(); ++i) {
      if (x.i32()[i] < 0 || x.i32()[i] >= l.token_vocab) __builtin_trap();
    }
    for (int64_t i = 0; i < y.numel(); ++i) {
      if (y.i32()[i] < 0 || y.i32()[i] >= l.classes) __builtin_trap();
    }
    if (b.phase() == localpar::v1::TRAIN) {
      const int parts = localpar::StepMicroBatches(l.micro_batches, b.batch_rows());
      int64_t begin, count;
      localpar::MicroBatchRange(b.batch_rows(), parts, b.micro_batch(), &begin, &count);
      if (count != rows || b.step() < 0 || b.step() >= l.total_steps) __builtin_trap();
    } else if (rows > l.eval_batch_size) {
      __builtin_trap();
    }
  }
  return 0;
}

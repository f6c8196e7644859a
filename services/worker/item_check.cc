// Validation of items arriving on a worker's upstream link.
#include "services/worker/item_check.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_io/tensor_proto.h"
#include "common/nn/step.h"

namespace localpar {
namespace {

ItemCheck Refuse(const char* reason, absl::Status status) {
  return ItemCheck{ItemCheck::kReject, reason, std::move(status)};
}

ItemCheck Bad(const char* reason, const std::string& message) {
  return Refuse(reason, absl::InvalidArgumentError(message));
}

uint64_t SeqOf(const v1::DownItem& item) {
  return item.has_batch() ? item.batch().seq() : item.control().seq();
}

bool SensibleHead(const v1::HeadStatistics& h) {
  return h.count() >= 0 && std::isfinite(h.correct()) && h.correct() >= 0 &&
         h.correct() <= static_cast<double>(h.count()) && !std::isinf(h.loss_sum());
}

// An END_OF_EVAL marker arrives at stage k with the figures of stages 0..k-1, in order.
ItemCheck CheckScores(const v1::Control& c, const ItemLimits& limits) {
  if (c.scores_size() > 0 && c.kind() != v1::Control::END_OF_EVAL) {
    return Bad("bad_scores", "control.scores: only an END_OF_EVAL marker carries figures");
  }
  if (c.kind() != v1::Control::END_OF_EVAL) return ItemCheck();
  if (c.scores_size() != limits.stage) {
    return Bad("bad_scores",
               absl::StrCat("control.scores: ", c.scores_size(),
                            " stages' figures arrived at stage ", limits.stage,
                            ", which expects those of the ", limits.stage, " stages before it"));
  }
  for (int i = 0; i < c.scores_size(); ++i) {
    const v1::StageScore& s = c.scores(i);
    if (s.stage() != i || !SensibleHead(s.eval()) || !SensibleHead(s.train()) ||
        !(s.train_seconds() >= 0) || !std::isfinite(s.train_seconds())) {
      return Bad("bad_scores", absl::StrCat("control.scores[", i, "]: not stage ", i,
                                            "'s figures, or they make no sense"));
    }
  }
  if (c.step() < 0 || c.step() > limits.total_steps) {
    return Bad("bad_scores",
               absl::StrCat("control.step: ", c.step(), " is outside 0..", limits.total_steps));
  }
  return ItemCheck();
}

ItemCheck CheckControl(const v1::Control& c, const ItemLimits& limits) {
  if (!v1::Control::Kind_IsValid(c.kind()) || c.kind() == v1::Control::KIND_UNSPECIFIED) {
    return Bad("unknown_control",
               absl::StrCat("control.kind: unknown control item ", static_cast<int>(c.kind())));
  }
  if (c.kind() == v1::Control::CHECKPOINT && c.checkpoint_id() == 0) {
    return Bad("unknown_control", "control.checkpoint_id: a CHECKPOINT needs an id >= 1");
  }
  return CheckScores(c, limits);
}

// The first NaN or Inf, in whichever format the activations travel; -1 when none.
int64_t FirstNonFinite(const v1::Tensor& t) {
  const std::string& bytes = t.data();
  if (t.dtype() == v1::I32) return -1;  // token ids
  if (t.dtype() == v1::F32) {
    const float* x = reinterpret_cast<const float*>(bytes.data());
    for (int64_t i = 0, n = static_cast<int64_t>(bytes.size() / 4); i < n; ++i) {
      if (!std::isfinite(x[i])) return i;
    }
    return -1;
  }
  // All-ones exponent: bf16 0x7f80, f16 0x7c00.
  const uint16_t mask = t.dtype() == v1::BF16 ? 0x7f80 : 0x7c00;
  const uint16_t* h = reinterpret_cast<const uint16_t*>(bytes.data());
  for (int64_t i = 0, n = static_cast<int64_t>(bytes.size() / 2); i < n; ++i) {
    if ((h[i] & mask) == mask) return i;
  }
  return -1;
}

// Where the batch sits in the run: phase, step, epoch, rows and micro-batch, against the job.
ItemCheck CheckPlacement(const v1::Batch& b, const ItemLimits& l, int64_t rows) {
  if (b.phase() != v1::TRAIN && b.phase() != v1::EVAL) {
    return Bad("unknown_phase", "batch.phase: must be TRAIN or EVAL");
  }
  const bool train = b.phase() == v1::TRAIN;
  if (b.epoch() < 1 || b.epoch() > l.epochs) {
    return Bad("bad_position",
               absl::StrCat("batch.epoch: ", b.epoch(), " is outside 1..", l.epochs));
  }
  const int64_t last_step = train ? l.total_steps - 1 : l.total_steps;
  if (b.step() < 0 || b.step() > last_step) {
    return Bad("bad_position",
               absl::StrCat("batch.step: ", b.step(), " is outside 0..", last_step));
  }
  if (!train) {
    if (rows > l.eval_batch_size) {
      return Bad("wrong_shape",
                 absl::StrCat("batch.activations.shape: ", rows,
                              " rows exceed the job's eval_batch_size ", l.eval_batch_size));
    }
    return ItemCheck();
  }
  if (b.batch_rows() < 1 || b.batch_rows() > l.batch_size) {
    return Bad("bad_micro_batch", absl::StrCat("batch.batch_rows: ", b.batch_rows(),
                                               " is outside 1..", l.batch_size, " (batch_size)"));
  }
  // With replicas, this stage holds one share of the step, split into its micro-batches.
  const int64_t share = ReplicaRows(b.batch_rows(), l.replicas, l.replica);
  const std::string of_share =
      l.replicas > 1 ? absl::StrCat(" (replica ", l.replica, "'s share: ", share, " rows)") : "";
  if (share < 1) {
    return Bad("bad_micro_batch", absl::StrCat("batch.batch_rows: ", b.batch_rows(),
                                               " rows leave replica ", l.replica, " none"));
  }
  const int want = StepMicroBatches(l.micro_batches, share);
  const int got = b.micro_batches() == 0 ? 1 : b.micro_batches();
  if (got != want || b.micro_batch() < 0 || b.micro_batch() >= want) {
    return Bad("bad_micro_batch",
               absl::StrCat("batch.micro_batch: ", b.micro_batch(), " of ", b.micro_batches(),
                            " does not fit the job's ", want, " micro-batch(es) of a ",
                            b.batch_rows(), "-row step", of_share));
  }
  int64_t begin, count;
  MicroBatchRange(share, want, b.micro_batch(), &begin, &count);
  if (rows != count) {
    return Bad("wrong_shape", absl::StrCat("batch.activations.shape: ", rows,
                                           " rows, but micro-batch ", b.micro_batch(), " of a ",
                                           b.batch_rows(), "-row step", of_share, " has ", count));
  }
  return ItemCheck();
}

ItemCheck CheckTensors(const v1::Batch& b, const ItemLimits& l) {
  if (absl::Status s = CheckWireTensor(b.activations(), "batch.activations"); !s.ok()) {
    return Refuse("malformed_tensor", s);
  }
  const v1::DType dtype = b.activations().dtype();
  if (l.token_vocab > 0 && dtype != v1::I32) {
    return Bad("wrong_dtype", absl::StrCat("batch.activations.dtype: this stage takes I32 token "
                                           "ids, got ",
                                           v1::DType_Name(dtype)));
  }
  if (l.token_vocab == 0 && dtype != v1::F32 && (l.stage == 0 || dtype != l.wire_dtype)) {
    return Bad("wrong_dtype", absl::StrCat("batch.activations.dtype: this stage takes F32",
                                           l.stage > 0 && l.wire_dtype != v1::F32
                                               ? absl::StrCat(" or ", v1::DType_Name(l.wire_dtype))
                                               : "",
                                           " activations, got ", v1::DType_Name(dtype)));
  }
  const auto& shape = b.activations().shape();
  // Rows first: with at least one row, the per-example product is bounded by the data that
  // CheckWireTensor matched the shape to (with no rows it could overflow).
  bool fits = shape[0] > 0;
  int64_t per_example = 1;
  for (int i = 1; fits && i < shape.size(); ++i) per_example *= shape[i];  // fits: no overflow
  if (!fits || per_example != NumElements(l.input_shape)) {
    return Bad("wrong_shape", absl::StrCat("batch.activations.shape: [", absl::StrJoin(shape, ","),
                                           "] does not fit stage ", l.stage, "'s input ",
                                           ShapeString(l.input_shape)));
  }
  if (absl::Status s = CheckWireTensor(b.labels(), "batch.labels"); !s.ok()) {
    return Refuse("malformed_tensor", s);
  }
  const auto& lshape = b.labels().shape();
  const int64_t want_labels = shape[0] * l.labels_per_example;
  if (b.labels().dtype() != v1::I32 || lshape[0] != shape[0] ||
      NumElements(Shape(lshape.begin(), lshape.end())) != want_labels) {
    return Bad("wrong_labels", absl::StrCat("batch.labels: need I32 with ", l.labels_per_example,
                                            " label(s) for each of the ", shape[0],
                                            " examples, got ", v1::DType_Name(b.labels().dtype()),
                                            " [", absl::StrJoin(lshape, ","), "]"));
  }
  const int32_t* labels = reinterpret_cast<const int32_t*>(b.labels().data().data());
  for (int64_t i = 0; i < want_labels; ++i) {
    if (labels[i] < 0 || labels[i] >= l.classes) {
      return Bad("label_out_of_range", absl::StrCat("batch.labels[", i, "] = ", labels[i],
                                                    " is outside 0..", l.classes - 1));
    }
  }
  if (l.token_vocab == 0) return ItemCheck();
  const int32_t* ids = reinterpret_cast<const int32_t*>(b.activations().data().data());
  for (int64_t i = 0, n = shape[0] * per_example; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= l.token_vocab) {
      return Bad("token_out_of_range",
                 absl::StrCat("batch.activations[", i, "] = ", ids[i], " is not a token id in 0..",
                              l.token_vocab - 1));
    }
  }
  return ItemCheck();
}

}  // namespace

ItemCheck CheckGradient(const v1::Gradient& g, uint64_t seq, int64_t rows,
                        const Shape& output_shape) {
  if (g.seq() != seq) {
    return Bad("bad_gradient", absl::StrCat("gradient.seq: ", g.seq(),
                                            ", but the gradient owed "
                                            "next is for batch ",
                                            seq));
  }
  if (absl::Status s = CheckWireTensor(g.grad(), "gradient.grad"); !s.ok()) {
    return Refuse("bad_gradient", s);
  }
  Shape want{rows};
  want.insert(want.end(), output_shape.begin(), output_shape.end());
  Shape got(g.grad().shape().begin(), g.grad().shape().end());
  if (g.grad().dtype() != v1::F32 || got != want) {
    return Bad("bad_gradient",
               absl::StrCat("gradient.grad: need F32 ", ShapeString(want), " for batch ", seq,
                            ", got ", v1::DType_Name(g.grad().dtype()), " ", ShapeString(got)));
  }
  if (int64_t bad = FirstNonFinite(g.grad()); bad >= 0) {
    return Bad("bad_gradient", absl::StrCat("gradient.grad: non-finite value at index ", bad));
  }
  return ItemCheck();
}

ItemCheck CheckDownItem(const v1::DownItem& item, const ItemLimits* limits, uint64_t last_seq) {
  if (!limits) {
    return Refuse("before_configure", absl::FailedPreconditionError(absl::StrCat(
                                          "item seq ", SeqOf(item), " arrived before Configure")));
  }
  if (!item.has_batch() && !item.has_control()) {
    return Bad("empty_item", "item: neither batch nor control is set");
  }
  if (SeqOf(item) <= last_seq) {
    return Bad("bad_position", absl::StrCat("seq: ", SeqOf(item), " is not after the last item's ",
                                            last_seq, " (seq increases strictly)"));
  }
  if (item.has_control()) return CheckControl(item.control(), *limits);
  const v1::Batch& b = item.batch();
  if (ItemCheck c = CheckTensors(b, *limits); c.verdict != ItemCheck::kAccept) return c;
  const int64_t rows = b.activations().shape(0);
  if (ItemCheck c = CheckPlacement(b, *limits, rows); c.verdict != ItemCheck::kAccept) return c;
  const int64_t bad = FirstNonFinite(b.activations());
  if (bad < 0) return ItemCheck();
  if (limits->non_finite == v1::ConfigureRequest::SKIP) {
    return ItemCheck{ItemCheck::kSkip, "non_finite_skipped", absl::OkStatus()};
  }
  return Bad("non_finite", absl::StrCat("batch.activations: non-finite value at index ", bad));
}

}  // namespace localpar

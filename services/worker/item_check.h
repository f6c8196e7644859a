// The check every item from a peer passes before the worker uses any of it: a pure function
// of the item and what the configured job allows, fuzzed directly (tests/fuzz/).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/core/shape.h"
#include "proto/localpar.pb.h"
#include "services/common/peer_text.h"

namespace localpar {

// What the configured job allows on this stage's upstream link.
struct ItemLimits {
  int stage = 0;
  Shape input_shape;               // per example
  v1::DType wire_dtype = v1::F32;  // what a previous stage may send besides F32
  // Stage 0 of a language model: its input is I32 token ids in [0, token_vocab), not F32.
  int64_t token_vocab = 0;
  int32_t classes = 0;
  int64_t labels_per_example = 1;
  int micro_batches = 1;  // the job's; 1 for rules that do not split batches
  int replica = 0;        // this stage's replica: it gets that share of every batch
  int replicas = 1;
  int64_t batch_size = 0;       // rows of a training step, at most
  int64_t eval_batch_size = 0;  // rows of an evaluation batch, at most
  int64_t total_steps = 0;
  int32_t epochs = 0;
  v1::ConfigureRequest::NonFinite non_finite = v1::ConfigureRequest::REJECT;
  // The largest serialised item the job allows (its largest batch, plus slack); anything
  // longer is refused before it is parsed.
  int64_t max_item_bytes = 0;
};

struct ItemCheck {
  enum Verdict { kAccept, kReject, kSkip };
  Verdict verdict = kAccept;
  std::string reason;   // the `reason` label of localpar_rejected_total
  absl::Status status;  // what the peer is told (kReject)
};

// A gradient returned from downstream for the training batch `seq` of `rows` rows: a
// float32 tensor of shape [rows, output_shape...] whose bytes match, every value finite.
ItemCheck CheckGradient(const v1::Gradient& gradient, uint64_t seq, int64_t rows,
                        const Shape& output_shape);

// `limits` is null before Configure. `last_seq` is the last accepted item's seq (0: none):
// seq must increase strictly.
ItemCheck CheckDownItem(const v1::DownItem& item, const ItemLimits* limits, uint64_t last_seq);

}  // namespace localpar

// The worker's item check: every field a peer sends is checked against the job before use.
#include "services/worker/item_check.h"

#include <gtest/gtest.h>

#include <cmath>

namespace localpar {
namespace {

ItemLimits Limits() {
  ItemLimits l;
  l.stage = 1;
  l.input_shape = {6};
  l.classes = 3;
  l.micro_batches = 3;
  l.batch_size = 8;
  l.eval_batch_size = 10;
  l.total_steps = 50;
  l.epochs = 2;
  return l;
}

// Micro-batch 0 of a 7-row step: 3 rows (7 = 3 + 2 + 2).
v1::DownItem Batch(uint64_t seq = 1, int rows = 3) {
  v1::DownItem item;
  v1::Batch* b = item.mutable_batch();
  b->set_seq(seq);
  b->set_epoch(1);
  b->set_phase(v1::TRAIN);
  b->set_step(4);
  b->set_batch_rows(7);
  b->set_micro_batches(3);
  std::vector<float> x(static_cast<size_t>(rows) * 6, 0.25f);
  std::vector<int32_t> y(static_cast<size_t>(rows), 2);
  b->mutable_activations()->set_dtype(v1::F32);
  b->mutable_activations()->add_shape(rows);
  b->mutable_activations()->add_shape(6);
  b->mutable_activations()->set_data(x.data(), x.size() * 4);
  b->mutable_labels()->set_dtype(v1::I32);
  b->mutable_labels()->add_shape(rows);
  b->mutable_labels()->set_data(y.data(), y.size() * 4);
  return item;
}

void ExpectRefused(const v1::DownItem& item, const char* reason, const char* text,
                   uint64_t last_seq = 0) {
  ItemLimits l = Limits();
  ItemCheck c = CheckDownItem(item, &l, last_seq);
  EXPECT_EQ(c.verdict, ItemCheck::kReject) << text;
  EXPECT_EQ(c.reason, reason) << c.status;
  EXPECT_NE(c.status.message().find(text), std::string::npos) << c.status;
}

TEST(ItemCheck, AcceptsAMicroBatchThatFitsTheJob) {
  ItemLimits l = Limits();
  EXPECT_EQ(CheckDownItem(Batch(), &l, 0).verdict, ItemCheck::kAccept);
}

TEST(ItemCheck, RefusesEverythingBeforeConfigure) {
  ItemCheck c = CheckDownItem(Batch(), nullptr, 0);
  EXPECT_EQ(c.reason, "before_configure");
  EXPECT_EQ(c.status.code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ItemCheck, RangeChecksEveryIntegerAgainstTheJob) {
  v1::DownItem item = Batch();
  item.mutable_batch()->set_micro_batch(7);
  ExpectRefused(item, "bad_micro_batch", "batch.micro_batch: 7 of 3");
  item.mutable_batch()->set_micro_batch(-1);
  ExpectRefused(item, "bad_micro_batch", "batch.micro_batch: -1");
  item = Batch();
  item.mutable_batch()->set_micro_batches(0);  // treated as 1: the job wants 3
  item.mutable_batch()->set_micro_batch(100000);
  ExpectRefused(item, "bad_micro_batch", "batch.micro_batch: 100000");
  item = Batch();
  item.mutable_batch()->set_step(-1);
  ExpectRefused(item, "bad_position", "batch.step: -1 is outside 0..49");
  item.mutable_batch()->set_step(50);
  ExpectRefused(item, "bad_position", "batch.step: 50");
  item = Batch();
  item.mutable_batch()->set_epoch(3);
  ExpectRefused(item, "bad_position", "batch.epoch: 3 is outside 1..2");
  item = Batch();
  item.mutable_batch()->set_batch_rows(9);
  ExpectRefused(item, "bad_micro_batch", "batch.batch_rows: 9 is outside 1..8");
}

TEST(ItemCheck, RowsMustBeThoseOfTheMicroBatch) {
  ExpectRefused(Batch(1, 2), "wrong_shape", "2 rows, but micro-batch 0 of a 7-row step has 3");
}

TEST(ItemCheck, SeqMustIncrease) {
  ExpectRefused(Batch(5), "bad_position", "seq: 5 is not after the last item's 5", 5);
  ItemLimits l = Limits();
  EXPECT_EQ(CheckDownItem(Batch(6), &l, 5).verdict, ItemCheck::kAccept);
}

TEST(ItemCheck, TensorsAndLabelsAreChecked) {
  v1::DownItem item = Batch();
  item.mutable_batch()->mutable_activations()->mutable_data()->resize(10);
  ExpectRefused(item, "malformed_tensor", "batch.activations.data: 10 bytes");
  item = Batch();
  int32_t seven = 7;
  item.mutable_batch()->mutable_labels()->mutable_data()->replace(
      4, 4, reinterpret_cast<char*>(&seven), 4);
  ExpectRefused(item, "label_out_of_range", "batch.labels[1] = 7 is outside 0..2");
  item = Batch();
  float nan = std::nanf("");
  item.mutable_batch()->mutable_activations()->mutable_data()->replace(
      8, 4, reinterpret_cast<char*>(&nan), 4);
  ExpectRefused(item, "non_finite", "non-finite value at index 2");
  ItemLimits l = Limits();
  l.non_finite = v1::ConfigureRequest::SKIP;
  ItemCheck c = CheckDownItem(item, &l, 0);
  EXPECT_EQ(c.verdict, ItemCheck::kSkip);
  EXPECT_EQ(c.reason, "non_finite_skipped");
}

TEST(ItemCheck, EvaluationBatchesAreBoundedByTheEvalBatchSize) {
  v1::DownItem item = Batch(1, 10);
  item.mutable_batch()->set_phase(v1::EVAL);
  ItemLimits l = Limits();
  EXPECT_EQ(CheckDownItem(item, &l, 0).verdict, ItemCheck::kAccept);
  item = Batch(1, 11);
  item.mutable_batch()->set_phase(v1::EVAL);
  ExpectRefused(item, "wrong_shape", "11 rows exceed the job's eval_batch_size 10");
}

// Stage 0 of a language model takes I32 token ids below its vocabulary, and nothing else;
// any other stage refuses them.
TEST(ItemCheck, ALanguageModelsFirstStageTakesTokenIdsWithinItsVocabulary) {
  ItemLimits l = Limits();
  l.stage = 0;
  l.token_vocab = 5;
  v1::DownItem item = Batch();
  v1::Tensor* x = item.mutable_batch()->mutable_activations();
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 4, 0, 1, 2, 3, 4, 4, 0, 1, 2, 3, 4, 4};
  x->set_dtype(v1::I32);
  x->set_data(ids.data(), ids.size() * 4);
  EXPECT_EQ(CheckDownItem(item, &l, 0).verdict, ItemCheck::kAccept);
  ids[7] = 5;
  x->set_data(ids.data(), ids.size() * 4);
  ItemCheck c = CheckDownItem(item, &l, 0);
  EXPECT_EQ(c.reason, "token_out_of_range");
  EXPECT_NE(c.status.message().find("batch.activations[7] = 5 is not a token id in 0..4"),
            std::string::npos)
      << c.status;
  ids[7] = -1;
  x->set_data(ids.data(), ids.size() * 4);
  EXPECT_EQ(CheckDownItem(item, &l, 0).reason, "token_out_of_range");
  c = CheckDownItem(Batch(), &l, 0);  // float values
  EXPECT_EQ(c.reason, "wrong_dtype");
  EXPECT_NE(c.status.message().find("takes I32 token ids, got F32"), std::string::npos) << c.status;
  ids[7] = 1;
  x->set_data(ids.data(), ids.size() * 4);
  ExpectRefused(item, "wrong_dtype", "this stage takes F32 activations, got I32");
}

TEST(ItemCheck, ControlItemsNeedAKnownKind) {
  v1::DownItem item;
  item.mutable_control()->set_seq(1);
  item.mutable_control()->set_kind(static_cast<v1::Control::Kind>(42));
  ExpectRefused(item, "unknown_control", "control.kind: unknown control item 42");
  ExpectRefused(v1::DownItem(), "empty_item", "neither batch nor control");
}

}  // namespace
}  // namespace localpar

// A run's outputs: metrics.jsonl lines, the report's checks, the progress printer.
#include "common/run/report.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/run/metrics_log.h"
#include "common/run/progress.h"

namespace localpar {
namespace {

TEST(MetricsLog, OneJsonObjectALineWithNullForANonFiniteLoss) {
  MetricsPoint p;
  p.kind = "test";
  p.step = 14;
  p.epoch = 2;
  p.wall_seconds = 3.5;
  p.lr = 0.001;
  EXPECT_EQ(MetricsLog::Line(p, 1, HeadStats{2.0, 3.0, 4}),
            "{\"kind\":\"test\",\"step\":14,\"epoch\":2,\"stage\":1,\"loss\":0.5,"
            "\"accuracy\":0.75,\"examples\":4,\"lr\":0.001,\"examples_per_second\":0,"
            "\"wall_seconds\":3.5}");
  EXPECT_NE(MetricsLog::Line(p, 0, HeadStats{std::nan(""), 0, 1}).find("\"loss\":null"),
            std::string::npos);
}

// A run that trained nothing, or diverged, is a failed run.
TEST(RunReport, ARunThatTrainedNothingOrDivergedIsRefused) {
  v1::RunReport r;
  v1::EpochFigures* e = r.add_epochs();
  e->set_epoch(1);
  for (int k = 0; k < 2; ++k) {
    v1::HeadFigures* f = e->add_train();
    f->set_stage(k);
    f->set_loss(0.5);
    f->set_examples(k == 0 ? 0 : 64);  // a stage without a head scores nothing: fine
    *e->add_test() = *f;
  }
  EXPECT_TRUE(CheckRunTrained(r).ok()) << CheckRunTrained(r);
  // A resumed run's epoch whose training came before the restart: fine, as long as the run
  // trained somewhere.
  v1::RunReport resumed = r;
  *resumed.add_epochs() = r.epochs(0);
  resumed.mutable_epochs(1)->set_epoch(2);
  resumed.mutable_epochs(1)->mutable_train(1)->set_examples(0);
  EXPECT_TRUE(CheckRunTrained(resumed).ok()) << CheckRunTrained(resumed);
  v1::RunReport nothing = r;
  nothing.mutable_epochs(0)->mutable_train(1)->set_examples(0);
  EXPECT_EQ(CheckRunTrained(nothing).message(),
            "the run trained on nothing: no stage's head scored a single training example, so "
            "every batch was refused or lost (see the errors above); the weights are untrained");
  v1::RunReport diverged = r;
  diverged.mutable_epochs(0)->mutable_test(1)->set_loss(std::nan(""));
  EXPECT_EQ(CheckRunTrained(diverged).message(),
            "stage 1's test loss is NaN in epoch 1: training diverged (lower the learning rate, "
            "or add warm-up); the weights are not usable");
  diverged.mutable_epochs(0)->mutable_test(1)->set_loss(INFINITY);
  EXPECT_NE(CheckRunTrained(diverged).message().find("is infinite"), std::string::npos);
}

TEST(ProgressPrinter, ShowsElapsedTimeAndAnEtaFromTheStepsSinceTheFirstLine) {
  std::ostringstream out;
  ProgressPrinter printer(out, /*live=*/false, /*enabled=*/true);
  HeadStats s0{/*loss_sum=*/2.0, /*correct=*/0, /*count=*/4}, none;
  ProgressLine line{1, 2, 100, 1000, 512, {s0, none}, 30.0};
  EXPECT_EQ(printer.Format(line),
            "epoch 1/2 [##                  ] step 100/1000 512 ex/s 30s loss s0 0.500 s1 -");
  line.step = 200;
  line.elapsed_seconds = 40.0;  // 100 steps in 10 s: 800 to go take 80 s
  EXPECT_EQ(printer.Format(line),
            "epoch 1/2 [####                ] step 200/1000 512 ex/s 40s ETA 1m20s loss s0 0.500 "
            "s1 -");
  EXPECT_EQ(FormatDuration(7384), "2h03m");
  line.evaluating = true;
  EXPECT_NE(printer.Format(line).find(" ETA 1m20s evaluating; loss s0 0.500 s1 -"),
            std::string::npos)
      << printer.Format(line);
}

TEST(ProgressPrinter, ALineWiderThanTheTerminalNarrowsUntilItFits) {
  std::ostringstream out;
  std::vector<HeadStats> eight;
  for (int k = 0; k < 8; ++k) eight.push_back(HeadStats{1.0 + 0.1 * k, 0, 1});
  eight[5].loss_sum = 0.25;
  ProgressLine line{2, 3, 50, 100, 2000, eight, 754.0};
  ProgressPrinter wide(out, /*live=*/false, /*enabled=*/true, /*width=*/200);
  EXPECT_EQ(wide.Format(line),
            "epoch 2/3 [##########          ] step 50/100 2000 ex/s 12m34s loss s0 1.000 s1 1.100 "
            "s2 1.200 s3 1.300 s4 1.400 s5 0.250 s6 1.600 s7 1.700");
  // 79 columns (an 80-column terminal): the lowest and the highest stage loss instead.
  ProgressPrinter terminal(out, false, true, 79);
  EXPECT_EQ(terminal.Format(line),
            "epoch 2/3 [##########          ] step 50/100 2000 ex/s 12m34s loss 0.250-1.700");
  ProgressPrinter narrower(out, false, true, 70);
  EXPECT_EQ(narrower.Format(line),
            "epoch 2/3 [#####     ] step 50/100 2000 ex/s 12m34s loss 0.250-1.700");
  ProgressPrinter no_bar(out, false, true, 55);
  EXPECT_EQ(no_bar.Format(line), "epoch 2/3 step 50/100 2000 ex/s 12m34s loss 0.250-1.700");
  ProgressPrinter tiny(out, false, true, 20);
  EXPECT_EQ(tiny.Format(line), "epoch 2/3 step 50/10");
}

TEST(ProgressPrinter, EpochResultShowsAccuracyAndLossAndADashForAStageWithoutFigures) {
  std::ostringstream out;
  ProgressPrinter printer(out, /*live=*/false, /*enabled=*/true);
  HeadStats answered{/*loss_sum=*/1.0, /*correct=*/3.0, /*count=*/4};
  printer.EpochResult(2, {answered, HeadStats{}}, 1.5);
  EXPECT_EQ(out.str(), "epoch 2: test accuracy s0 75.00% s1 -; loss s0 0.2500 s1 - (1.5s)\n");
}

}  // namespace
}  // namespace localpar

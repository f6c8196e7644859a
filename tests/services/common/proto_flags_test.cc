// Flags filled from configuration messages: every value type, the errors a user meets, the
// help text, and the arguments a launcher passes on.
#include "services/common/proto_flags.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "services/common/exit_codes.h"
#include "services/common/program_config.h"

namespace localpar {
namespace {

absl::StatusOr<ParsedFlags> Parse(std::vector<std::string> args, google::protobuf::Message* m,
                                  const FlagOptions& o = {}) {
  return ParseFlags(args, m, o);
}

TEST(ProtoFlags, FillsEveryKindOfFieldIncludingFlattenedMessages) {
  v1::RunCommand r = RunDefaults();
  absl::StatusOr<ParsedFlags> p =
      Parse({"job.textproto", "--threads=2", "--checkpoint_dir", "/tmp/c", "--quiet",
             "--checkpoint_every_seconds=1.5", "--non_finite=skip", "--rule=OVERLAP", "--seed=0",
             "--tls_ca=ca.pem", "--notrace"},
            &r);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->positional, std::vector<std::string>{"job.textproto"});
  EXPECT_EQ(r.compute().threads(), 2);
  EXPECT_EQ(r.coordinator().checkpoint_dir(), "/tmp/c");
  EXPECT_TRUE(r.coordinator().quiet());
  EXPECT_FALSE(r.coordinator().trace());
  EXPECT_EQ(r.coordinator().checkpoint_every_seconds(), 1.5);
  EXPECT_EQ(r.coordinator().non_finite(), v1::ConfigureRequest::SKIP);
  EXPECT_EQ(r.coordinator().overrides().rule(), "OVERLAP");
  EXPECT_TRUE(r.coordinator().overrides().has_seed());  // seed 0 is an override too
  EXPECT_EQ(r.coordinator().security().tls_ca(), "ca.pem");
  EXPECT_EQ(r.coordinator().keep_checkpoints(), 3) << "defaults stay";
}

TEST(ProtoFlags, RepeatedFieldsTakeACommaSeparatedList) {
  v1::CoordinatorConfig c;
  ASSERT_TRUE(Parse({"--workers=a:1,b:2,c:3"}, &c).ok());
  EXPECT_EQ(c.workers_size(), 3);
  EXPECT_EQ(c.workers(2), "c:3");
}

TEST(ProtoFlags, ErrorsNameTheFlagAndSuggestTheNearestOne) {
  v1::RunCommand r = RunDefaults();
  absl::StatusOr<ParsedFlags> p = Parse({"--checkpont_dir=x"}, &r);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().message(), "unknown flag --checkpont_dir; did you mean --checkpoint_dir?");
  p = Parse({"--epochs=-1"}, &r);
  EXPECT_EQ(p.status().message(), "--epochs: must be >= 0, got -1");
  p = Parse({"--threads=two"}, &r);
  EXPECT_EQ(p.status().message(), "--threads: expected an integer, got 'two'");
  p = Parse({"--non_finite=drop"}, &r);
  EXPECT_EQ(p.status().message(), "--non_finite: expected one of REJECT, SKIP, got 'drop'");
  p = Parse({"--threads"}, &r);
  EXPECT_EQ(p.status().message(), "--threads: needs a value");
}

TEST(ProtoFlags, ExcludedFieldsAreNoFlags) {
  v1::RunCommand r = RunDefaults();
  FlagOptions o;
  o.exclude = {"coordinator.workers"};
  EXPECT_FALSE(Parse({"--workers=a:1"}, &r, o).ok());
  ASSERT_TRUE(Parse({"--resume=/ckpt"}, &r, o).ok()) << "one --resume, the coordinator's";
  EXPECT_EQ(r.coordinator().resume(), "/ckpt");
}

TEST(ProtoFlags, ConfigFileComesFirstAndFlagsOverrideIt) {
  std::string path = ::testing::TempDir() + "/coordinator.config";
  std::ofstream(path) << "job: \"a.textproto\" keep_checkpoints: 7 quiet: true\n";
  v1::CoordinatorConfig c = CoordinatorDefaults();
  FlagOptions o;
  o.config_flag = true;
  ASSERT_TRUE(Parse({"--keep_checkpoints=9", "--config=" + path}, &c, o).ok());
  EXPECT_EQ(c.job(), "a.textproto");
  EXPECT_EQ(c.keep_checkpoints(), 9);
  EXPECT_TRUE(c.quiet());
  std::ofstream(path) << "not a config {";
  EXPECT_FALSE(Parse({"--config=" + path}, &c, o).ok());
}

TEST(ProtoFlags, HelpListsFlagsWithDefaultsButNotTestingOnes) {
  v1::RunCommand r = RunDefaults();
  absl::StatusOr<ParsedFlags> p = Parse({"-h"}, &r);
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p->help);
  std::string help = FlagHelp(RunDefaults());
  EXPECT_NE(help.find("--keep_checkpoints=N"), std::string::npos) << help;
  EXPECT_NE(help.find("committed checkpoints to keep (default 3)"), std::string::npos) << help;
  EXPECT_NE(help.find("--checkpoint_dir=DIR"), std::string::npos) << help;
  EXPECT_EQ(help.find("slow_ms"), std::string::npos) << help;
  EXPECT_EQ(help.find("port_file"), std::string::npos) << help;
}

TEST(ProtoFlags, CheckFlagsIsOnlyForProgramsThatTakeIt) {
  v1::WorkerConfig w = WorkerDefaults();
  absl::StatusOr<ParsedFlags> p = Parse({"--check_flags", "--threads=3"}, &w);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_TRUE(p->check_flags);
  EXPECT_EQ(w.compute().threads(), 3);
  std::vector<std::string> positional;
  std::ostringstream out;
  bool check = false;
  w = WorkerDefaults();
  absl::StatusOr<bool> go =
      ParseProgramFlags("worker", "usage", {"--check_flags"}, &w, {}, &positional, out, &check);
  ASSERT_TRUE(go.ok()) << go.status();
  EXPECT_TRUE(*go);
  EXPECT_TRUE(check);
  // A command without the mode refuses it as a usage error instead of running.
  go = ParseProgramFlags("cmd", "usage", {"--check_flags"}, &w, {}, &positional, out);
  ASSERT_FALSE(go.ok());
  EXPECT_EQ(ExitCodeOf(go.status()), 2);
  EXPECT_NE(go.status().message().find("(see cmd --help)"), std::string::npos) << go.status();
}

TEST(ProtoFlags, HostPortsAreCheckedNamingTheFlag) {
  EXPECT_TRUE(CheckHostPort("0.0.0.0:0", "--listen", true).ok());
  EXPECT_TRUE(CheckHostPort("localpar-stage-1-0-1.localpar:50051", "--workers", false).ok());
  EXPECT_TRUE(CheckHostPort("[::1]:50051", "--workers", false).ok());
  for (const char* bad :
       {"host", "host:", ":50051", "host:0", "host:65536", "host:5x", "a b:1", "[::1:5"}) {
    absl::Status s = CheckHostPort(bad, "--workers", false);
    EXPECT_FALSE(s.ok()) << bad;
    EXPECT_NE(s.message().find(std::string("--workers=") + bad), std::string::npos) << s;
  }
}

TEST(ProtoFlags, ToFlagArgsReproducesTheMessage) {
  v1::WorkerConfig w = WorkerDefaults();
  w.set_listen("127.0.0.1:5000");
  w.mutable_compute()->set_threads(3);
  w.mutable_security()->set_mtls(true);
  w.mutable_security()->set_tls_cert("/a b/cert.pem");
  std::vector<std::string> args = ToFlagArgs(w, WorkerDefaults());
  v1::WorkerConfig back = WorkerDefaults();
  ASSERT_TRUE(Parse(args, &back).ok());
  EXPECT_EQ(back.SerializeAsString(), w.SerializeAsString());
  EXPECT_EQ(args.size(), 4u) << "only what differs from the defaults";
}

}  // namespace
}  // namespace localpar

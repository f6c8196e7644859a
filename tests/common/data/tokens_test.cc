// Token files written here in nanoGPT's and llm.c's layouts: read window by window, their
// bad forms refused naming the file and the offset, and resident memory that does not grow
// with the file.
#include "common/data/tokens.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <set>

#include "common/data/dataset.h"
#include "common/run/job_data.h"
#include "tests/common/test_util.h"

namespace localpar {
namespace {

using testing::DataDir;

// uint16 ids as nanoGPT's raw .bin.
void WriteRaw(const std::string& path, const std::vector<uint16_t>& ids) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(ids.data()),
             static_cast<std::streamsize>(ids.size() * 2));
}

// An llm.c shard: 256 int32 (magic, version, count), then uint16 ids.
void WriteShard(const std::string& path, const std::vector<uint16_t>& ids, int32_t magic = 20240520,
                int32_t version = 1) {
  std::vector<int32_t> header(256, 0);
  header[0] = magic;
  header[1] = version;
  header[2] = static_cast<int32_t>(ids.size());
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header.data()), 256 * 4);
  out.write(reinterpret_cast<const char*>(ids.data()),
            static_cast<std::streamsize>(ids.size() * 2));
}

std::vector<uint16_t> Ramp(int n, int vocab) {
  std::vector<uint16_t> ids(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) ids[i] = static_cast<uint16_t>((i * 37) % vocab);
  return ids;
}

int64_t ResidentKiB() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

TEST(TokenData, NanoGptAndLlmcFilesGiveTheNextTokenAsEveryPositionsLabel) {
  DataDir dir;
  const std::vector<uint16_t> train = Ramp(5000, 300), val = Ramp(700, 300);
  WriteRaw(dir.file("train.bin"), train);
  WriteShard(dir.file("val.bin"), val);
  TokenDataOptions o;
  o.train_paths = {dir.file("train.bin")};
  o.validation_paths = {dir.file("val.bin")};
  o.seq_len = 16;
  o.seed = 3;
  absl::StatusOr<DataSplit> s = LoadTokenData(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.classes, 300);  // the largest id + 1
  EXPECT_EQ(s->train.size(), 5000 / 16);
  EXPECT_EQ(s->test.size(), (700 - 1) / 16);
  EXPECT_TRUE(s->normalization.tokens);
  BatchAssembler batch(s->train, 4);
  ASSERT_TRUE(batch.Gather({}, 0, 4, /*epoch=*/2).ok());
  for (int r = 0; r < 4; ++r) {
    const int64_t at = s->train.windows->Start(2, r);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(batch.ids()[r * 16 + i], train[at + i]);
      EXPECT_EQ(batch.y()[r * 16 + i], train[at + i + 1]);
    }
  }
  BatchAssembler held(s->test, 1);
  ASSERT_TRUE(held.Gather({}, 2, 1).ok());
  EXPECT_EQ(held.ids()[0], val[32]);  // consecutive windows, in order
  EXPECT_EQ(held.y()[15], val[48]);
  // tokens_per_epoch sets an epoch's windows; vocab given is checked, not read.
  o.tokens_per_epoch = 1600;
  o.vocab = 512;
  s = LoadTokenData(o);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->train.size(), 100);
  EXPECT_EQ(s->train.classes, 512);
}

TEST(TokenData, BadFilesAreRefusedNamingTheFileAndTheOffset) {
  DataDir dir;
  TokenDataOptions o;
  o.seq_len = 16;
  auto error = [&](const std::vector<std::string>& train, const std::vector<std::string>& val) {
    o.train_paths = train;
    o.validation_paths = val;
    absl::StatusOr<DataSplit> s = LoadTokenData(o);
    EXPECT_FALSE(s.ok());
    return s.ok() ? std::string() : std::string(s.status().message());
  };
  WriteRaw(dir.file("ok.bin"), Ramp(2000, 50));
  WriteShard(dir.file("magic.bin"), Ramp(100, 50), /*magic=*/12345);
  o.format = TokenFileFormat::kLlmcU16;
  EXPECT_EQ(error({dir.file("magic.bin")}, {}),
            dir.file("magic.bin") + ": byte offset 0: magic 12345, not llm.c's 20240520");
  WriteShard(dir.file("version.bin"), Ramp(100, 50), 20240520, /*version=*/2);
  EXPECT_NE(error({dir.file("version.bin")}, {}).find("byte offset 4: version 2"),
            std::string::npos);
  o.format = TokenFileFormat::kAuto;
  std::vector<uint16_t> bad = Ramp(2000, 50);
  bad[777] = 60;
  WriteRaw(dir.file("big.bin"), bad);
  o.vocab = 50;
  EXPECT_EQ(
      error({dir.file("ok.bin")}, {dir.file("big.bin")}),
      dir.file("big.bin") + ": token at byte offset 1554 is 60, not below the vocabulary of 50");
  o.vocab = 0;
  WriteRaw(dir.file("short.bin"), Ramp(10, 50));
  EXPECT_NE(error({dir.file("short.bin")}, {}).find(dir.file("short.bin")), std::string::npos);
  EXPECT_NE(error({dir.file("ok.bin")}, {dir.file("short.bin")}).find("validation tokens (10)"),
            std::string::npos);
  std::ofstream(dir.file("odd.bin"), std::ios::binary).write("abc", 3);
  EXPECT_NE(error({dir.file("odd.bin")}, {}).find("byte offset 2 is half a token"),
            std::string::npos);
  EXPECT_NE(error({dir.file("missing.bin")}, {}).find(dir.file("missing.bin") + ": no such file"),
            std::string::npos);
}

// Memory does not grow with the file: the vocabulary scan and 5000 random windows of
// a 64 MiB file leave resident memory within a few MB of where it was.
// A file truncated while a run reads it (or a FIFO given as one) ends with an error naming
// the file, never SIGBUS (reading a mapping past the file's new end) or a hang.
TEST(TokenData, AFileThatShrinksOrIsAFifoIsANamedErrorNotASignal) {
  DataDir dir;
  const std::vector<uint16_t> ids = Ramp(1 << 20, 300);  // 2 MiB: pages past the cut
  WriteRaw(dir.file("train.bin"), ids);
  absl::StatusOr<std::shared_ptr<TokenCorpus>> c =
      TokenCorpus::Map({dir.file("train.bin")}, TokenFileFormat::kRawU16);
  ASSERT_TRUE(c.ok()) << c.status();
  std::vector<int32_t> x(64), y(64);
  ASSERT_TRUE((*c)->Window((1 << 20) - 100, 64, x.data(), y.data()).ok());
  EXPECT_EQ(x[0], ids[(1 << 20) - 100]);
  for (off_t size : {off_t{1} << 20, off_t{0}}) {
    ASSERT_EQ(truncate(dir.file("train.bin").c_str(), size), 0);
    absl::Status s = (*c)->Window((1 << 20) - 100, 64, x.data(), y.data());
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
    EXPECT_NE(s.message().find(dir.file("train.bin") + ": shrank from 2097152 to " +
                               std::to_string(size) + " bytes while the run read it"),
              std::string::npos)
        << s;
  }
  ASSERT_EQ(mkfifo(dir.file("fifo.bin").c_str(), 0600), 0);
  absl::StatusOr<std::shared_ptr<TokenCorpus>> fifo =
      TokenCorpus::Map({dir.file("fifo.bin")}, TokenFileFormat::kRawU16);
  ASSERT_FALSE(fifo.ok());
  EXPECT_NE(fifo.status().message().find(dir.file("fifo.bin") + ": not a regular file"),
            std::string::npos)
      << fifo.status();
}

TEST(TokenData, ResidentMemoryDoesNotGrowWithTheFile) {
  DataDir dir;
  std::vector<uint16_t> ids = Ramp(32 << 20, 4000);  // 64 MiB
  WriteRaw(dir.file("big.bin"), ids);
  ids.clear();
  ids.shrink_to_fit();
  const int64_t before = ResidentKiB();
  TokenDataOptions o;
  o.train_paths = {dir.file("big.bin")};
  o.seq_len = 64;
  absl::StatusOr<DataSplit> s = LoadTokenData(o);
  ASSERT_TRUE(s.ok()) << s.status();
  BatchAssembler batch(s->train, 100);
  for (int step = 0; step < 50; ++step) ASSERT_TRUE(batch.Gather({}, step * 100, 100, step).ok());
  const int64_t grown = ResidentKiB() - before;
  // AddressSanitizer keeps freed blocks in quarantine, so they stay resident; the plain
  // build holds the 8 MiB bound, the sanitizer build (LOCALPAR_SANITIZE) a looser one.
#ifdef LOCALPAR_SANITIZE
  const int64_t bound_kib = 16 * 1024;
#else
  const int64_t bound_kib = 8 * 1024;
#endif
  EXPECT_LT(grown, bound_kib) << "resident memory grew by " << grown << " KiB";
}

}  // namespace
}  // namespace localpar

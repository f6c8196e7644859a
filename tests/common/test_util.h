// Helpers shared by the tests: random data, tolerance checks, optional CUDA backend.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/core/backend.h"

namespace localpar::testing {

std::vector<float> RandomVector(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// Element-wise |a - e| <= atol + rtol * |e|; reports the first few offenders.
::testing::AssertionResult AllClose(const std::vector<float>& actual,
                                    const std::vector<float>& expected, float atol, float rtol);

// A fresh directory under the system temp dir, removed with everything in it on scope exit.
class DataDir {
 public:
  DataDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("localpar_data_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~DataDir() { std::filesystem::remove_all(path_); }
  DataDir(const DataDir&) = delete;
  DataDir& operator=(const DataDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string path_string() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// A CUDA backend, or nullptr when this machine has no usable GPU.
std::unique_ptr<Backend> MaybeCuda();

}  // namespace localpar::testing

// Skips (never fails) the current test when no GPU is present.
#define LP_REQUIRE_CUDA(var)                   \
  auto var = ::localpar::testing::MaybeCuda(); \
  if (!var) GTEST_SKIP() << "no CUDA device on this machine"

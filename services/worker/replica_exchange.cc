// The replicas' exchange thread.
#include "services/worker/replica_exchange.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace localpar {

ReplicaExchange::ReplicaExchange(Stage& stage, ReplicaGroup& group, int replicas, Backend& backend)
    : group_(group),
      replicas_(replicas),
      backend_(backend),
      on_device_(backend.device() == DeviceType::kCUDA && ReplicaGroup::DeviceAvailable()),
      overlap_(backend.device() == DeviceType::kCPU),
      layout_(GroupParams(stage)) {
  if (overlap_) {
    for (const std::vector<Param*>& params : layout_.groups) {
      Group g;
      g.bucket = std::make_unique<ReplicaBucket>(params);
      groups_.push_back(std::move(g));
    }
  } else {
    whole_ = std::make_unique<ReplicaBucket>(stage);
  }
  thread_ = std::thread([this] { Loop(); });
}

ReplicaExchange::~ReplicaExchange() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ReplicaExchange::StartLocked(int g) {
  if (g == kWhole) {
    whole_started_ = true;
  } else {
    groups_[static_cast<size_t>(g)].started = true;
  }
  ++pending_;
  queue_.push_back(g);
  cv_.notify_all();
}

void ReplicaExchange::Final(int layer) {
  if (!overlap_) return;
  const int g = layer < 0 ? layout_.head : layout_.layer[static_cast<size_t>(layer)];
  if (g < 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!groups_[static_cast<size_t>(g)].started) StartLocked(g);
}

absl::Status ReplicaExchange::Finish() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!overlap_) {
    if (!whole_started_) StartLocked(kWhole);
  } else {
    for (size_t g = 0; g < groups_.size(); ++g) {
      if (!groups_[g].started) StartLocked(static_cast<int>(g));
    }
  }
  cv_.wait(lock, [&] { return pending_ == 0; });
  for (Group& g : groups_) g.started = false;
  whole_started_ = false;
  return failed_;
}

void ReplicaExchange::Reset() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_ == 0; });
  for (Group& g : groups_) g.started = false;
  whole_started_ = false;
}

void ReplicaExchange::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, nothing left
    const int g = queue_.front();
    queue_.pop_front();
    const bool skip = !failed_.ok();
    lock.unlock();
    absl::Status s = skip ? absl::OkStatus() : Exchange(g);
    lock.lock();
    if (!s.ok() && failed_.ok()) failed_ = s;
    --pending_;
    cv_.notify_all();
  }
}

// Every replica's part of a bucket is checked as a stream gradient is: one non-finite value
// and no replica steps. Each chunk's owner checks the parts of its chunk and sends its
// verdict with the sum, so every replica decides alike, and the message names the replica
// the values came from.
absl::Status NonFiniteError(const NonFiniteParts& bad, int stage, int64_t n,
                            const std::string& what) {
  if (bad.replica < 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("replica ", bad.replica, " of stage ", stage, " sent ",
                                          what, " with ", bad.count, " non-finite value",
                                          bad.count == 1 ? "" : "s", " (the first at index ",
                                          bad.first, " of ", n, "); no replica takes this step"));
}

absl::Status ReplicaExchange::Exchange(int g) {
  if (g == kWhole && on_device_) {
    const int64_t n = whole_->size();
    if (!device_send_.defined()) {
      device_send_ = Tensor::Empty(backend_, {n});
      device_gathered_ = Tensor::Empty(backend_, {n * replicas_});
      device_sum_ = Tensor::Empty(backend_, {n});
    }
    whole_->PackOnDevice(device_send_.f32());
    absl::Status s =
        group_.AllGatherOnDevice(device_send_.f32(), n, device_gathered_.f32(), backend_);
    if (!s.ok()) return s;
    if (int r = FirstNonFiniteReplica(backend_, device_gathered_.f32(), replicas_, n); r >= 0) {
      return absl::DataLossError(absl::StrCat(
          "replica ", r, " of stage ", group_.options().stage,
          " sent a gradient bucket with non-finite values (found on the device, among ", n,
          "); no replica takes this step"));
    }
    whole_->UnpackOnDevice(device_gathered_.f32(), replicas_, device_sum_.f32());
    return s;
  }
  ReplicaBucket& bucket = g == kWhole ? *whole_ : *groups_[static_cast<size_t>(g)].bucket;
  std::vector<float>& send = g == kWhole ? whole_send_ : groups_[static_cast<size_t>(g)].send;
  std::vector<float>& sum = g == kWhole ? whole_sum_ : groups_[static_cast<size_t>(g)].sum;
  send.resize(static_cast<size_t>(bucket.size()));
  sum.resize(static_cast<size_t>(bucket.size()));
  bucket.Pack(send.data());
  NonFiniteParts bad;
  absl::Status s = group_.AllReduce(send.data(), bucket.size(), sum.data(), &bad);
  if (s.ok()) s = NonFiniteError(bad, group_.options().stage, bucket.size(), "a gradient bucket");
  if (s.ok()) bucket.UnpackSum(sum.data(), replicas_);
  return s;
}

}  // namespace localpar

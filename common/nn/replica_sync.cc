// The replicas' exchange bucket.
#include "common/nn/replica_sync.h"

#include <algorithm>
#include <cmath>

#include "common/core/check.h"
#include "common/core/dtype.h"

namespace localpar {

void SumInReplicaOrder(const float* parts, int replicas, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = parts[i];
  for (int r = 1; r < replicas; ++r) {
    const float* p = parts + static_cast<int64_t>(r) * n;
    for (int64_t i = 0; i < n; ++i) out[i] += p[i];
  }
}

int FirstNonFiniteReplica(Backend& backend, const float* gathered, int replicas, int64_t n) {
  for (int r = 0; r < replicas; ++r) {
    if (!std::isfinite(backend.SquaredNorm(gathered + static_cast<int64_t>(r) * n, n))) return r;
  }
  return -1;
}

ParamGroups GroupParams(Stage& stage) {
  ParamGroups g;
  if (std::vector<Param*> head = stage.head_params(); !head.empty()) {
    g.head = 0;
    g.groups.push_back(std::move(head));
  }
  g.layer.assign(static_cast<size_t>(stage.num_layers()), -1);
  for (int i = stage.num_layers(); i-- > 0;) {
    std::vector<Param*> p = stage.layer_params(i);
    if (p.empty()) continue;
    g.layer[static_cast<size_t>(i)] = static_cast<int>(g.groups.size());
    g.groups.push_back(std::move(p));
  }
  return g;
}

ReplicaBucket::ReplicaBucket(Stage& stage) : ReplicaBucket(stage.params()) {}

ReplicaBucket::ReplicaBucket(const std::vector<Param*>& all) {
  for (bool trainable : {true, false}) {
    for (Param* p : all) {
      if (p->trainable != trainable) continue;
      LP_CHECK_MSG(p->value.dtype() == DType::kF32, "parameter %s is not float32", p->name.c_str());
      params_.push_back(p);
      size_ += p->value.numel();
      if (trainable) trainable_ += p->value.numel();
    }
  }
}

void ReplicaBucket::Pack(float* out) {
  for (Param* p : params_) {
    const Tensor& t = p->trainable ? p->grad : p->value;
    LP_CHECK(t.defined() && t.numel() == p->value.numel());
    t.backend().CopyToHost(out, t.raw(), t.nbytes());
    out += t.numel();
  }
}

void ReplicaBucket::Unpack(const float* gathered, int replicas) {
  LP_CHECK(replicas >= 1);
  host_.resize(static_cast<size_t>(size_));
  SumInReplicaOrder(gathered, replicas, size_, host_.data());
  UnpackSum(host_.data(), replicas);
}

void ReplicaBucket::UnpackSum(const float* sum, int replicas) {
  LP_CHECK(replicas >= 1);
  const float inv = 1.0f / static_cast<float>(replicas);
  const float* at = sum;
  for (Param* p : params_) {
    Tensor& t = p->trainable ? p->grad : p->value;
    const int64_t n = t.numel();
    if (p->trainable) {
      t.backend().CopyFromHost(t.raw(), at, t.nbytes());
    } else {
      mean_.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) mean_[static_cast<size_t>(i)] = at[i] * inv;
      t.backend().CopyFromHost(t.raw(), mean_.data(), t.nbytes());
    }
    at += n;
  }
}

OuterSync::OuterSync(Stage& stage, float lr, float momentum, bool bf16)
    : lr_(lr), momentum_(momentum), bf16_(bf16) {
  for (bool trainable : {true, false}) {
    for (Param* p : stage.params()) {
      if (p->trainable != trainable) continue;
      LP_CHECK_MSG(p->value.dtype() == DType::kF32, "parameter %s is not float32", p->name.c_str());
      params_.push_back(p);
      size_ += p->value.numel();
      if (trainable) trainable_ += p->value.numel();
    }
  }
}

void OuterSync::Start(Stage& stage) {
  for (Param* p : stage.params()) {
    if (!p->trainable) continue;
    if (!p->outer.defined()) {
      p->outer = Tensor::Zeros(p->value.backend(), p->value.shape());
      p->outer.CopyFrom(p->value);
    }
    if (!p->outer_momentum.defined()) {
      p->outer_momentum = Tensor::Zeros(p->value.backend(), p->value.shape());
    }
  }
}

namespace {
void ToHost(const Tensor& t, std::vector<float>* out) {
  out->resize(static_cast<size_t>(t.numel()));
  if (t.numel() > 0) t.backend().CopyToHost(out->data(), t.raw(), t.nbytes());
}
void FromHost(const std::vector<float>& in, Tensor* t) {
  if (t->numel() > 0) t->backend().CopyFromHost(t->raw(), in.data(), t->nbytes());
}
}  // namespace

void OuterSync::Pack(float* out) {
  for (Param* p : params_) {
    if (!p->trainable) {
      ToHost(p->value, &value_);
      std::copy(value_.begin(), value_.end(), out);
      out += value_.size();
      continue;
    }
    LP_CHECK_MSG(p->outer.defined(), "OuterSync::Start was not called for %s", p->name.c_str());
    ToHost(p->value, &value_);
    ToHost(p->outer, &outer_);
    for (size_t i = 0; i < value_.size(); ++i) out[i] = outer_[i] - value_[i];
    if (bf16_) {
      for (size_t i = 0; i < value_.size(); ++i) out[i] = Bf16ToFloat(FloatToBf16(out[i]));
    }
    out += value_.size();
  }
}

void OuterSync::Apply(const float* gathered, int replicas) {
  LP_CHECK(replicas >= 1);
  host_.resize(static_cast<size_t>(size_));
  SumInReplicaOrder(gathered, replicas, size_, host_.data());
  ApplySum(host_.data(), replicas);
}

void OuterSync::ApplySum(const float* sum, int replicas) {
  LP_CHECK(replicas >= 1);
  const float inv = 1.0f / static_cast<float>(replicas);
  const float* at = sum;
  for (Param* p : params_) {
    const size_t n = static_cast<size_t>(p->value.numel());
    if (!p->trainable) {
      value_.resize(n);
      for (size_t i = 0; i < n; ++i) value_[i] = at[i] * inv;
      FromHost(value_, &p->value);
      at += n;
      continue;
    }
    ToHost(p->outer, &outer_);
    ToHost(p->outer_momentum, &momentum_host_);
    for (size_t i = 0; i < n; ++i) {
      const float g = (bf16_ ? Bf16ToFloat(FloatToBf16(at[i])) : at[i]) * inv;
      const float m = momentum_ * momentum_host_[i] + g;
      momentum_host_[i] = m;
      outer_[i] = outer_[i] - lr_ * (g + momentum_ * m);
    }
    FromHost(outer_, &p->outer);
    FromHost(momentum_host_, &p->outer_momentum);
    FromHost(outer_, &p->value);
    at += n;
  }
}

void ReplicaBucket::PackOnDevice(float* out) {
  for (Param* p : params_) {
    const Tensor& t = p->trainable ? p->grad : p->value;
    t.backend().CopyWithin(out, t.raw(), t.nbytes());
    out += t.numel();
  }
}

void ReplicaBucket::UnpackOnDevice(const float* gathered, int replicas, float* scratch) {
  LP_CHECK(replicas >= 1);
  if (params_.empty()) return;
  Backend& b = params_[0]->value.backend();
  b.CopyWithin(scratch, gathered, static_cast<size_t>(size_) * sizeof(float));
  for (int r = 1; r < replicas; ++r) b.Add(scratch, gathered + r * size_, scratch, size_);
  // Running statistics are few: their mean goes through the host.
  host_.resize(static_cast<size_t>(size_ - trainable_));
  if (!host_.empty()) {
    b.CopyToHost(host_.data(), scratch + trainable_, host_.size() * sizeof(float));
    const float inv = 1.0f / static_cast<float>(replicas);
    for (float& v : host_) v *= inv;
  }
  const float* at = scratch;
  const float* stats = host_.data();
  for (Param* p : params_) {
    Tensor& t = p->trainable ? p->grad : p->value;
    if (p->trainable) {
      b.CopyWithin(t.raw(), at, t.nbytes());
    } else {
      b.CopyFromHost(t.raw(), stats, t.nbytes());
      stats += t.numel();
    }
    at += t.numel();
  }
}

}  // namespace localpar

// Stage snapshots (stage_snapshot.h).
#include "common/model_io/stage_snapshot.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/io/atomic_file.h"
#include "common/model_io/checkpoint.h"
#include "common/model_io/checkpoint_file.h"
#include "common/model_io/tensor_proto.h"

namespace localpar {
namespace {

// Stage snapshots, format 2, streamed: [8-byte magic][u32 2][u64 payload bytes][payload]
// [u32 CRC-32 of payload], the payload being [u64 n][n bytes: the StageCheckpoint without
// tensor data, its tensors' names and shapes only][every tensor's float32 values, in the
// header's order: params, state1, state2]. A stage of any size is written and read a tensor
// at a time (format 1, one protobuf, stopped at 2 GiB: it is still read).
constexpr uint32_t kStreamedVersion = 2;
constexpr size_t kStreamedHeader = 8 + 4 + 8;

using List = google::protobuf::RepeatedPtrField<v1::NamedTensor>;
// Every tensor a snapshot holds of a parameter, in the order a file stores them, with the
// checkpoint's list of each.
constexpr Tensor Param::*kFields[] = {&Param::value, &Param::state1, &Param::state2, &Param::outer,
                                      &Param::outer_momentum};
constexpr size_t kNumFields = sizeof(kFields) / sizeof(kFields[0]);
std::array<const List*, kNumFields> Lists(const v1::StageCheckpoint& c) {
  return {&c.params(), &c.state1(), &c.state2(), &c.outer(), &c.outer_momentum()};
}
std::array<List*, kNumFields> MutableLists(v1::StageCheckpoint* c) {
  return {c->mutable_params(), c->mutable_state1(), c->mutable_state2(), c->mutable_outer(),
          c->mutable_outer_momentum()};
}

// The snapshot's header, and the tensors whose values follow it, in order.
std::vector<const Tensor*> DescribeSnapshot(Stage& stage, v1::StageCheckpoint* head) {
  std::vector<Param*> params = stage.params();
  std::vector<const Tensor*> order;
  auto add = [&](Tensor Param::*field, google::protobuf::RepeatedPtrField<v1::NamedTensor>* out) {
    for (size_t i = 0; i < params.size(); ++i) {
      const Tensor& t = params[i]->*field;
      if (!t.defined()) continue;
      v1::NamedTensor* nt = out->Add();
      nt->set_name(absl::StrCat(i, ".", params[i]->name));
      nt->mutable_tensor()->set_dtype(v1::F32);
      for (int64_t d : t.shape()) nt->mutable_tensor()->add_shape(d);
      order.push_back(&t);
    }
  };
  const std::array<List*, kNumFields> lists = MutableLists(head);
  for (size_t f = 0; f < kNumFields; ++f) add(kFields[f], lists[f]);
  return order;
}

// Writes format 2; *bytes and *crc receive the file's size and the payload's checksum.
absl::Status WriteStreamedSnapshot(Stage& stage, v1::StageCheckpoint head, const std::string& path,
                                   int64_t* bytes, uint32_t* crc) {
  for (List* list : MutableLists(&head)) list->Clear();
  const std::vector<const Tensor*> order = DescribeSnapshot(stage, &head);
  const std::string described = head.SerializeAsString();
  uint64_t payload = 8 + described.size();
  for (const Tensor* t : order) payload += t->nbytes();
  std::string header(kCheckpointMagic, sizeof(kCheckpointMagic));
  PutRaw<uint32_t>(&header, kStreamedVersion);
  PutRaw<uint64_t>(&header, payload);
  uint32_t c = Crc32({});  // the empty string's: where a running CRC starts
  absl::Status s = WriteFileAtomicallyFrom(path, [&](const ByteSink& sink) {
    auto out = [&](std::string_view piece, bool in_payload) {
      if (in_payload) c = Crc32More(c, piece);
      return sink(piece);
    };
    if (absl::Status e = out(header, false); !e.ok()) return e;
    std::string n;
    PutRaw<uint64_t>(&n, described.size());
    if (absl::Status e = out(n, true); !e.ok()) return e;
    if (absl::Status e = out(described, true); !e.ok()) return e;
    std::string host;
    for (const Tensor* t : order) {
      host.resize(t->nbytes());
      if (t->nbytes() > 0) t->backend().CopyToHost(host.data(), t->raw(), t->nbytes());
      if (absl::Status e = out(host, true); !e.ok()) return e;
    }
    std::string trailer;
    PutRaw<uint32_t>(&trailer, c);
    return out(trailer, false);
  });
  if (!s.ok()) return s;
  *bytes = static_cast<int64_t>(kStreamedHeader + payload + 4);
  *crc = c;
  return absl::OkStatus();
}

// A stage snapshot file, checked whole (size, checksum, header) before anything is used.
struct StageFile {
  std::string path;
  uint32_t version = 0;
  v1::StageCheckpoint head;  // format 2: names and shapes only; format 1: with the values
  uint32_t crc = 0;          // of the payload
  uint64_t data_at = 0;      // format 2: where the first tensor's values start
};

absl::StatusOr<StageFile> OpenStageFile(const std::string& path) {
  StageFile f;
  f.path = path;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  in.seekg(0, std::ios::end);
  const uint64_t size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  std::string header(kStreamedHeader, '\0');
  if (size < kStreamedHeader || !in.read(header.data(), kStreamedHeader) ||
      std::memcmp(header.data(), kCheckpointMagic, sizeof(kCheckpointMagic)) != 0) {
    return absl::DataLossError(absl::StrCat(path, ": not a localpar checkpoint file"));
  }
  f.version = GetRaw<uint32_t>(header, 8);
  if (f.version == kCheckpointFormatVersion) {  // format 1: one protobuf
    absl::StatusOr<std::string> payload = ReadChecksummedFile(path);
    if (!payload.ok()) return payload.status();
    if (!f.head.ParseFromString(*payload)) {
      return absl::DataLossError(absl::StrCat(path, ": payload is not a stage checkpoint"));
    }
    f.crc = Crc32(*payload);
    return f;
  }
  if (f.version != kStreamedVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, ": format version ", f.version, ", this build reads 1 and 2"));
  }
  const uint64_t length = GetRaw<uint64_t>(header, 12);
  if (size < kStreamedHeader + 4 || length != size - kStreamedHeader - 4 || length < 8) {
    return absl::DataLossError(absl::StrCat(
        path, ": truncated or padded: header says ", length, " payload bytes, file has ",
        size < kStreamedHeader + 4 ? 0 : size - kStreamedHeader - 4));
  }
  // The checksum first, streamed: nothing of a damaged file is used.
  uint32_t c = Crc32({});  // the empty string's: where a running CRC starts
  std::string chunk;
  for (uint64_t left = length; left > 0;) {
    chunk.resize(static_cast<size_t>(std::min<uint64_t>(left, 16 << 20)));
    if (!in.read(chunk.data(), static_cast<std::streamsize>(chunk.size()))) {
      return absl::DataLossError(absl::StrCat(path, ": cannot read its payload"));
    }
    c = Crc32More(c, chunk);
    left -= chunk.size();
  }
  std::string trailer(4, '\0');
  if (!in.read(trailer.data(), 4) || GetRaw<uint32_t>(trailer, 0) != c) {
    return absl::DataLossError(absl::StrCat(path, ": checksum mismatch (corrupt file)"));
  }
  f.crc = c;
  std::string n(8, '\0');
  in.seekg(kStreamedHeader);
  in.read(n.data(), 8);
  const uint64_t described = GetRaw<uint64_t>(n, 0);
  if (described > length - 8 || described > (uint64_t{64} << 20)) {
    return absl::DataLossError(absl::StrCat(path, ": its header claims ", described, " bytes"));
  }
  std::string head(static_cast<size_t>(described), '\0');
  if (!in.read(head.data(), static_cast<std::streamsize>(described)) ||
      !f.head.ParseFromString(head)) {
    return absl::DataLossError(absl::StrCat(path, ": payload is not a stage checkpoint"));
  }
  // Every tensor's values, by its shape, must fill the rest exactly.
  uint64_t values = 0;
  for (const List* list : Lists(f.head)) {
    for (const v1::NamedTensor& nt : *list) {
      uint64_t count = 1;
      for (int64_t d : nt.tensor().shape()) {
        if (d < 0 || (d > 0 && count > (uint64_t{1} << 40) / static_cast<uint64_t>(d))) {
          return absl::DataLossError(absl::StrCat(path, ": ", nt.name(), " has extent ", d));
        }
        count *= static_cast<uint64_t>(d);
      }
      values += count * sizeof(float);
    }
  }
  if (values != length - 8 - described) {
    return absl::DataLossError(absl::StrCat(path, ": its tensors' shapes give ", values,
                                            " bytes of values, the file holds ",
                                            length - 8 - described));
  }
  f.data_at = kStreamedHeader + 8 + described;
  return f;
}

// Restores `stage` from `f`, all or nothing as RestoreStageState: every tensor is checked
// against the stage before any is read in.
absl::Status RestoreFromStageFile(Stage& stage, const StageFile& f, const std::string& source) {
  if (f.version == kCheckpointFormatVersion) return RestoreStageState(stage, f.head, source);
  std::vector<Param*> params = stage.params();
  if (f.head.params_size() != static_cast<int>(params.size())) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": has ", f.head.params_size(),
                                                   " parameters, the stage has ", params.size()));
  }
  for (const List* list : Lists(f.head)) {
    std::vector<bool> seen(params.size(), false);
    for (const v1::NamedTensor& nt : *list) {
      size_t i = std::strtoul(nt.name().c_str(), nullptr, 10);
      if (i >= params.size() || nt.name() != absl::StrCat(i, ".", params[i]->name) || seen[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": unknown or repeated tensor ", nt.name()));
      }
      seen[i] = true;
      Shape got(nt.tensor().shape().begin(), nt.tensor().shape().end());
      if (nt.tensor().dtype() != v1::F32 || got != params[i]->value.shape()) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", nt.name(), " is ",
                                                       ShapeString(got), ", the stage has F32 ",
                                                       ShapeString(params[i]->value.shape())));
      }
    }
  }
  std::ifstream in(f.path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(f.data_at));
  std::string host;
  auto apply = [&](const List& list, Tensor Param::*field) -> absl::Status {
    for (const v1::NamedTensor& nt : list) {
      Param* p = params[std::strtoul(nt.name().c_str(), nullptr, 10)];
      Tensor& t = p->*field;
      if (!t.defined()) t = Tensor::Zeros(p->value.backend(), p->value.shape());
      host.resize(t.nbytes());
      if (!in.read(host.data(), static_cast<std::streamsize>(host.size()))) {
        return absl::DataLossError(absl::StrCat(source, ": cannot read ", nt.name()));
      }
      if (!host.empty()) t.backend().CopyFromHost(t.raw(), host.data(), host.size());
    }
    return absl::OkStatus();
  };
  const std::array<const List*, kNumFields> lists = Lists(f.head);
  for (size_t i = 0; i < kNumFields; ++i) {
    if (absl::Status s = apply(*lists[i], kFields[i]); !s.ok()) return s;
  }
  stage.optimizer().set_steps(f.head.optimizer_steps());
  return absl::OkStatus();
}

void AddTensors(const std::vector<Param*>& params, Tensor Param::*field,
                google::protobuf::RepeatedPtrField<v1::NamedTensor>* out) {
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& t = params[i]->*field;
    if (!t.defined()) continue;
    v1::NamedTensor* nt = out->Add();
    nt->set_name(absl::StrCat(i, ".", params[i]->name));
    EncodeTensor(t, nt->mutable_tensor());
  }
}

}  // namespace

v1::StageCheckpoint SnapshotStageState(Stage& stage, int index, int64_t step) {
  v1::StageCheckpoint c;
  c.set_stage(index);
  c.set_step(step);
  c.set_optimizer_steps(stage.optimizer().steps());
  std::vector<Param*> params = stage.params();
  const std::array<List*, kNumFields> lists = MutableLists(&c);
  for (size_t f = 0; f < kNumFields; ++f) AddTensors(params, kFields[f], lists[f]);
  return c;
}

absl::Status RestoreStageState(Stage& stage, const v1::StageCheckpoint& c,
                               const std::string& source) {
  std::vector<Param*> params = stage.params();
  if (c.params_size() != static_cast<int>(params.size())) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": has ", c.params_size(),
                                                   " parameters, the stage has ", params.size()));
  }
  // Check every tensor first and apply only if all pass: a bad file never leaves the stage
  // half restored.
  auto check = [&](const List& list) -> absl::Status {
    std::vector<bool> seen(params.size(), false);
    for (const v1::NamedTensor& nt : list) {
      size_t i = std::strtoul(nt.name().c_str(), nullptr, 10);
      if (i >= params.size() || nt.name() != absl::StrCat(i, ".", params[i]->name)) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": unknown tensor ", nt.name()));
      }
      if (seen[i]) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", nt.name(), " appears twice"));
      }
      seen[i] = true;
      if (absl::Status s = CheckWireTensor(nt.tensor(), nt.name()); !s.ok()) {
        return absl::DataLossError(absl::StrCat(source, ": ", s.message()));
      }
      if (nt.tensor().dtype() != v1::F32) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", nt.name(), " is not F32"));
      }
      Shape want = params[i]->value.shape();
      Shape got(nt.tensor().shape().begin(), nt.tensor().shape().end());
      if (got != want) {
        return absl::InvalidArgumentError(absl::StrCat(source, ": ", nt.name(), " has shape ",
                                                       ShapeString(got), ", the stage has ",
                                                       ShapeString(want)));
      }
    }
    return absl::OkStatus();
  };
  const std::array<const List*, kNumFields> lists = Lists(c);
  for (const List* list : lists) {
    if (absl::Status s = check(*list); !s.ok()) return s;
  }
  auto apply = [&](const List& list, Tensor Param::*field) {
    for (const v1::NamedTensor& nt : list) {
      Param* p = params[std::strtoul(nt.name().c_str(), nullptr, 10)];
      Tensor& t = p->*field;
      if (!t.defined()) t = Tensor::Zeros(p->value.backend(), p->value.shape());
      Tensor decoded;
      DecodeTensorInto(nt.tensor(), p->value.backend(), &decoded);
      t.CopyFrom(decoded);
    }
  };
  for (size_t f = 0; f < kNumFields; ++f) apply(*lists[f], kFields[f]);
  stage.optimizer().set_steps(c.optimizer_steps());
  return absl::OkStatus();
}

absl::Status SaveStageFile(Stage& stage, int index, int64_t step, const std::string& path) {
  v1::StageCheckpoint head;
  head.set_stage(index);
  head.set_step(step);
  head.set_optimizer_steps(stage.optimizer().steps());
  int64_t bytes = 0;
  uint32_t crc = 0;
  return WriteStreamedSnapshot(stage, head, path, &bytes, &crc);
}

absl::Status LoadStageFile(Stage& stage, const std::string& path) {
  absl::StatusOr<StageFile> f = OpenStageFile(path);
  if (!f.ok()) return f.status();
  return RestoreFromStageFile(stage, *f, path);
}

// The file name of a stage's snapshot within a checkpoint directory.
static std::string SnapshotName(int stage, int replica) {
  return replica > 0 ? absl::StrCat("stage-", stage, "-replica-", replica, ".ckpt")
                     : absl::StrCat("stage-", stage, ".ckpt");
}

const v1::StageSnapshot* FindSnapshot(const v1::CheckpointManifest& m, int stage, int replica) {
  if (replica == 0) return stage >= 0 && stage < m.stages_size() ? &m.stages(stage) : nullptr;
  for (const v1::StageSnapshot& s : m.replica_stages()) {
    if (s.stage() == stage && s.replica() == replica) return &s;
  }
  return nullptr;
}

absl::StatusOr<v1::StageSnapshot> SaveStageSnapshot(Stage& stage, int index, int64_t step,
                                                    const EpochProgress& progress,
                                                    const std::string& fingerprint,
                                                    const std::string& root, uint64_t id,
                                                    int replica) {
  const std::string rel = absl::StrCat(CheckpointDirName(id), "/", SnapshotName(index, replica));
  std::error_code ec;
  std::filesystem::create_directories(root + "/" + CheckpointDirName(id), ec);
  if (ec) {
    return absl::PermissionDeniedError(
        absl::StrCat(root, "/", CheckpointDirName(id), ": cannot create: ", ec.message()));
  }
  v1::StageCheckpoint c;
  c.set_stage(index);
  c.set_step(step);
  c.set_optimizer_steps(stage.optimizer().steps());
  c.set_fingerprint(fingerprint);
  c.set_recent_loss_sum(progress.head.loss_sum);
  c.set_recent_correct(progress.head.correct);
  c.set_recent_count(progress.head.count);
  c.set_recent_train_seconds(progress.train_seconds);
  int64_t bytes = 0;
  uint32_t crc = 0;
  if (absl::Status s = WriteStreamedSnapshot(stage, c, root + "/" + rel, &bytes, &crc); !s.ok()) {
    return s;
  }
  v1::StageSnapshot snap;
  snap.set_stage(index);
  snap.set_replica(replica);
  snap.set_checkpoint_id(id);
  snap.set_file(rel);
  snap.set_bytes(bytes);
  snap.set_crc32(crc);
  return snap;
}

absl::Status RestoreStageSnapshot(Stage* stage, int index, const std::string& root,
                                  const v1::StageSnapshot& want, const std::string& fingerprint,
                                  EpochProgress* progress, int replica) {
  const std::string path = absl::StrCat(root, "/", CheckpointDirName(want.checkpoint_id()), "/",
                                        SnapshotName(index, replica));
  const std::string at =
      absl::StrCat("stage ", index, replica > 0 ? absl::StrCat(" replica ", replica) : "",
                   ", checkpoint ", want.checkpoint_id(), ": ");
  std::error_code ec;
  const uintmax_t bytes = std::filesystem::file_size(path, ec);
  if (ec) return absl::DataLossError(absl::StrCat(at, path, ": ", ec.message()));
  if (static_cast<int64_t>(bytes) != want.bytes()) {
    return absl::DataLossError(
        absl::StrCat(at, path, ": ", bytes, " bytes, the manifest says ", want.bytes()));
  }
  absl::StatusOr<StageFile> file = OpenStageFile(path);
  if (!file.ok()) return absl::DataLossError(absl::StrCat(at, file.status().message()));
  if (file->crc != want.crc32()) {
    return absl::DataLossError(
        absl::StrCat(at, path, ": checksum ", file->crc, ", the manifest says ", want.crc32()));
  }
  const v1::StageCheckpoint& c = file->head;
  if (c.fingerprint() != fingerprint) {
    return absl::DataLossError(absl::StrCat(at, path, ": written by another run (fingerprint ",
                                            c.fingerprint(), ", this run's ", fingerprint, ")"));
  }
  if (stage != nullptr) {
    if (absl::Status s = RestoreFromStageFile(*stage, *file, path); !s.ok()) {
      return absl::DataLossError(absl::StrCat(at, s.message()));
    }
  }
  progress->head = HeadStats{c.recent_loss_sum(), c.recent_correct(), c.recent_count()};
  progress->train_seconds = c.recent_train_seconds();
  return absl::OkStatus();
}

void PruneSnapshots(const std::string& root, const std::vector<uint64_t>& keep) {
  for (const auto& [id, dir] : CheckpointDirectories(root)) {
    if (std::find(keep.begin(), keep.end(), id) != keep.end()) continue;
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

}  // namespace localpar

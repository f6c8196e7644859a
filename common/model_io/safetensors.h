// safetensors (https://github.com/huggingface/safetensors): an 8-byte little-endian header
// length, a JSON header, then raw little-endian data. Names are ParamInfo::readable and
// layouts are PyTorch's (each layer's TorchLayout): linear and dense weights [out, in], conv
// weights [out_channels, in_channels, kh, kw], attention's qkv_weight [3*dim, dim] (q, k, v
// rows, heads contiguous) and out_weight [dim, dim]; vectors and tables as they are.
// __metadata__ holds the job as text, the input transform, the input shape and the classes.
//
// A model too large for one file is written as shards in Hugging Face's convention: a
// directory of model-00001-of-0000N.safetensors files (each with the same __metadata__) and
// model.safetensors.index.json, whose "weight_map" names each tensor's shard. Files are
// written tensor by tensor and read tensor by tensor: neither side holds a whole file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/model_io/model_file.h"

namespace localpar {

inline constexpr char kSafetensorsIndex[] = "model.safetensors.index.json";

// A file's first bytes say whether it is one: the header length, then '{'.
bool LooksLikeSafetensors(const std::string& first_bytes);

// One safetensors file, or a sharded set, opened for reading by tensor name. Only the
// headers are read when it is opened; each tensor is read from its file when asked for.
// Every header field is checked before use: offsets inside the file, sizes that match
// the dtype and shape, shard names that are plain file names beside the index.
class SafetensorsReader {
 public:
  struct Entry {
    std::string file;  // the path it is read from
    std::string dtype;
    std::vector<int64_t> shape;
    uint64_t offset = 0;  // of its first byte in `file`
    uint64_t bytes = 0;
  };
  // `path`: a .safetensors file, an index (NAME.index.json), or a directory holding
  // model.safetensors.index.json or a single model.safetensors.
  static absl::StatusOr<SafetensorsReader> Open(const std::string& path);

  const std::map<std::string, Entry>& tensors() const { return tensors_; }
  // The first shard's __metadata__ (every shard localpar writes carries the same).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& source() const { return source_; }
  int files() const { return files_; }
  // Reads an F32 tensor's values.
  absl::Status ReadFloats(const std::string& name, const Entry& e, std::vector<float>* out) const;

 private:
  absl::Status AddFile(const std::string& path, bool keep_metadata);
  std::string source_;
  std::map<std::string, Entry> tensors_;
  std::map<std::string, std::string> metadata_;
  int files_ = 0;
};

// The parameters `model` (built from `config`) has, read from the tensors by their readable
// names and converted to localpar's layouts, as a weights message. A head the file has no
// tensors for (a stage boundary it did not have) keeps the model's own seeded values, and
// is listed in notes->fresh_heads; the file's heads the network has no boundary for are
// listed in notes->unused_heads. Any other difference (a missing layer, a tensor the network
// does not have, a shape) is an error naming the tensor.
absl::StatusOr<v1::ModelWeights> ReadSafetensors(const SafetensorsReader& file,
                                                 const ModelConfig& config, Model& model,
                                                 InitNotes* notes);

// The class names as a JSON list of strings ("[]" when the weights have none): the
// metadata value safetensors and ONNX files carry them in.
std::string ClassNamesJson(const v1::ModelWeights& weights);

// One file at `path`, written tensor by tensor (the values come from params' Param).
absl::Status WriteSafetensors(const std::vector<ParamInfo>& params, const v1::ModelWeights& weights,
                              const std::string& path);

// Shards in directory `dir` (created if missing): one per stage, a stage split further
// where its tensors pass `shard_bytes` (0: no limit; a tensor larger than the limit gets a
// shard of its own), then the index. Returns the shard file names, in order.
absl::StatusOr<std::vector<std::string>> WriteShardedSafetensors(
    const std::vector<ParamInfo>& params, const v1::ModelWeights& weights, const std::string& dir,
    int64_t shard_bytes);

}  // namespace localpar

// Trained models on disk: what a weights file says beside the parameters, loading it into a
// model (checked parameter by parameter), readable parameter names, and safetensors files.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/dataset.h"
#include "common/nn/model.h"
#include "proto/job.pb.h"
#include "proto/tensor.pb.h"

namespace localpar {

// Records beside `weights`' parameters what using them needs: the input transform, the
// per-example input shape, the class count (and names, when the data has them) and the
// normalised job as text.
void DescribeWeights(const v1::Job& job, const InputNormalization& norm,
                     const std::vector<std::string>& class_names, v1::ModelWeights* weights);
InputNormalization WeightsNormalization(const v1::ModelWeights& weights);

// One parameter of a model, as a weights file and a safetensors file name it.
struct ParamInfo {
  int stage = 0;
  std::string file_name;  // the weights file's name within its stage: "3.weight"
  // PyTorch's state_dict name: layers numbered through the whole network whatever the
  // split ("layers.7.weight", "layers.3.body.0.weight" inside a residual block), and each
  // stage's head by the layer it follows ("heads.7.0.weight").
  std::string readable;
  const Layer* layer = nullptr;  // the (innermost) layer it belongs to: its export layout
  Shape nchw_source;             // the image its layer's input was flattened from (TorchLayout)
  bool head = false;             // it belongs to the stage's auxiliary head
  Param* value = nullptr;
};
// Every parameter of stages 0..last_stage in weights-file order (layers, then the head's).
std::vector<ParamInfo> DescribeParams(const ModelConfig& config, Model& model, int last_stage);
// The same for stage `k` alone, built on its own: *global is the number of layers before it
// (advanced past its own), *nchw the image its input was flattened from (start both at zero
// and empty for stage 0, and carry them from stage to stage).
std::vector<ParamInfo> DescribeStageParams(Stage& stage, int k, int* global, Shape* nchw);
// Every stage's parameters as a worker names them ("3.weight") with their shapes, each stage
// built alone on the CPU and freed before the next (so at most one stage's parameters are
// held): what a coordinator checks the weights it collects against.
struct TensorSpec {
  std::string name;
  Shape shape;
};
absl::StatusOr<std::vector<std::vector<TensorSpec>>> StageTensorSpecs(const ModelConfig& config);
// "heads.3" for a head's tensor ("heads.3.0.weight"); "" for a layer's.
std::string HeadName(const std::string& readable);

// What --init_from changed to fit the job's stages: heads (named by the layer they follow,
// "heads.3") the file had none for, which start from the job's seeded initialisation, and
// the file's heads at boundaries the job does not have, which are left out.
struct InitNotes {
  std::vector<std::string> fresh_heads;
  std::vector<std::string> unused_heads;
  int file_stages = 0;  // the stage count the file was trained with (0: not known)
};

// The parameters of `model` as a weights message, each found by its readable name through
// `lookup` (which fills localpar's layout and returns false when the source has no such
// tensor). A missing head keeps the model's seeded values (notes->fresh_heads); a missing
// layer is an error. `source_names` are every tensor the source holds: a head among them
// the model has no boundary for goes to notes->unused_heads, anything else unused is an
// error (another network). Errors name `source` and the tensor.
using ParamLookup = std::function<absl::StatusOr<bool>(const ParamInfo&, std::vector<float>*)>;
absl::StatusOr<v1::ModelWeights> GatherParams(const std::string& source, const ModelConfig& config,
                                              Model& model,
                                              const std::vector<std::string>& source_names,
                                              const ParamLookup& lookup, InitNotes* notes);

// Copies `weights` (read from `source`, for messages) into `model`, stage by stage. Refuses a
// different stage count, parameter name or shape, naming the first parameter that differs.
absl::Status LoadWeights(const v1::ModelWeights& weights, const std::string& source,
                         const ModelConfig& config, Model& model);

// A trained model ready to predict: the job's network built on `backend` with the weights in.
struct TrainedModel {
  Backend* backend = nullptr;
  ModelConfig config;
  std::unique_ptr<Model> model;
  v1::ModelWeights weights;  // as read (the parameters' values are in `model`)
  InputNormalization normalization;
  // Set when the weights were trained with another stage split than the job's and the model
  // took theirs ("trained as 1 stage: ..."), for the console.
  std::string layout_note;
};
// The job's network with `weights_path` in. The weights carry their layout: trained with
// another stage split, the model takes theirs (never a head it would have to start fresh),
// unless `stages_asked` (the user named the split with --stages), which is then refused
// naming the heads that would be untrained.
absl::StatusOr<TrainedModel> OpenTrainedModel(const v1::Job& job, const std::string& weights_path,
                                              Backend& backend, bool stages_asked = false);

// Reads a weights file for `model` (built from `config`; its values are not changed): a
// safetensors file (recognised by its content, whatever the name), a sharded set (its
// directory or its .index.json), or localpar's weights.pb. Parameters are matched by
// readable name, so a file trained with another stage split of the same network fits: the
// layers carry over exactly, a head whose boundary the job keeps carries over, and a new
// boundary's head starts fresh (seeded). `notes`, when given, says which.
absl::StatusOr<v1::ModelWeights> ReadAnyWeightsFile(const std::string& path,
                                                    const ModelConfig& config, Model& model,
                                                    InitNotes* notes = nullptr);
// The bytes of the parameters `weights` hold.
int64_t WeightsBytes(const v1::ModelWeights& weights);
// "3221 MB in 12.3 s, 262 MB/s": how a whole-model operation went, for the console.
std::string TransferFigures(int64_t bytes, double seconds);

// Frees every parameter's gradient: a model built only to check, name or lay out weights
// (never to train) then holds its parameters alone.
void DropGradients(Model& model);

// A run's final weights in `dir`: weights.pb while their bytes stay within `pb_limit`
// (protobuf holds at most 2 GiB in one file), else sharded safetensors with Hugging Face's
// index in dir/weights/ (a shard per stage). `model`, built from `config`, gives the
// shards' names and layouts; null: one is built on the CPU for it. Returns the path written.
inline constexpr int64_t kWeightsPbLimitBytes = int64_t{3} << 29;  // 1.5 GiB
absl::StatusOr<std::string> WriteRunWeights(const v1::ModelWeights& weights,
                                            const ModelConfig& config, Model* model,
                                            const std::string& dir,
                                            int64_t pb_limit = kWeightsPbLimitBytes);

// A line for the console saying what InitNotes holds ("" when nothing changed).
std::string DescribeInitNotes(const InitNotes& notes, int stages);

// A parameter's values in PyTorch's layout (the layer's TorchLayout; ONNX's Conv takes the
// same [out_channels, in_channels, kh, kw]); *shape receives that layout's shape.
std::vector<float> TorchOrder(const ParamInfo& param, std::vector<int64_t>* shape);

}  // namespace localpar

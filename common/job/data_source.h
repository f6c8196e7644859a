// A data source: everything about one kind of job data (job.proto's Data `source` oneof),
// in its file under common/job/sources/ and listed once in common/job/sources/registry.cc.
// Defaults, validation, paths, the example shape and classes, the memory it holds, loading
// and which split scores the epochs all reach a source through here; nothing outside those
// files names one.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/core/shape.h"
#include "common/data/dataset.h"
#include "proto/job.pb.h"

namespace localpar {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // job.proto's Data field for the source.
  virtual const char* name() const = 0;

  // Documented defaults for what the job file left unset.
  virtual void Defaults(v1::Data*) const {}
  // The source's own fields, checked before anything is read; errors name the field.
  virtual absl::Status Validate(const v1::Data&) const { return absl::OkStatus(); }
  // Every file or folder the source names: `visit(field, path)` for each, in field order;
  // the path may be rewritten (resolved against the job file's directory).
  virtual void Paths(
      v1::Data*, const std::function<void(const std::string& field, std::string* path)>&) const {}
  // What to add after "no such file" for one of its paths (where the file comes from).
  virtual std::string MissingPathHint(const std::string&) const { return ""; }
  // --data_path: the files to train on instead of the job's; an error when the source has
  // no such list.
  virtual absl::Status SetTrainPaths(const std::vector<std::string>& paths, v1::Data*) const;
  // Reads what the job leaves to the files (the example shape, the classes, a vocabulary),
  // or checks what it states against them; errors are data errors naming the field.
  virtual absl::Status ResolveShape(const v1::Job&, v1::Data*) const { return absl::OkStatus(); }

  // One example's shape and the class (or vocabulary) count, as the job states them.
  virtual Shape InputShape(const v1::Data&) const = 0;
  virtual int32_t Classes(const v1::Data&) const = 0;
  // Labels per example: 1, or one per position for a language model's windows.
  virtual int64_t LabelsPerExample(const v1::Data&) const { return 1; }
  // A language corpus of bytes: its figures are also given in bits per byte.
  virtual bool ByteTokens() const { return false; }
  // The examples are int32 token ids (Dataset::input_dtype), read by an embedding.
  virtual bool TokenIds() const { return false; }
  // The source holds out its own validation split (data.holdout_fraction is not for it).
  virtual bool OwnValidation() const { return false; }
  // Whether an epoch visits the examples in a seeded shuffled order (a sequence source
  // drawing random windows needs none).
  virtual bool ShufflesExamples(const v1::Data&) const { return true; }
  // Bytes the examples take in memory before training, when they are made rather than
  // read (0 otherwise), and the field that sets them.
  virtual double MemoryBytes(const v1::Data&, const Shape& input) const {
    (void)input;
    return 0;
  }
  virtual std::string MemoryField(const v1::Data&) const { return ""; }

  // The examples, train and test (or validation) split, with `job`'s limits and seed. Any
  // error is a data error (IsDataError).
  virtual absl::StatusOr<DataSplit> Load(const v1::Job& job) const = 0;
};

// The source `data` sets (Fashion-MNIST when none is set, as the defaults fill it in).
const DataSource& DataSourceOf(const v1::Data& data);
// The source of that field name, or nullptr.
const DataSource* FindDataSource(const std::string& name);
// Every source, in the registry's order.
const std::vector<const DataSource*>& AllDataSources();

}  // namespace localpar

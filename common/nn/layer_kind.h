// A layer kind: everything about one kind of layer, implemented in its family's file under
// common/nn/layers/ and listed once in common/nn/layers/registry.cc. Job parsing, shape
// checks, parameter counts, FLOPs, construction and export all reach a kind through here.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/nn/layer.h"

namespace localpar {

class LayerKind {
 public:
  virtual ~LayerKind() = default;
  // job.proto's Layer field for the kind; also the kind's name in parameter names.
  virtual const char* name() const = 0;
  // Documented defaults for settings a job file left at zero.
  virtual void Defaults(LayerConfig&) const {}
  // Settings checked before any shape is known (LayerIssue).
  virtual LayerIssue Check(const LayerConfig&) const { return {}; }
  // The output shape for per-example input `in`; "" when it fits, else why not.
  virtual std::string Infer(const LayerConfig& config, const Shape& in, Shape* out) const = 0;
  // Shorthand kinds (a transformer block) return the layers they stand for, given the
  // input shape; the core builds those instead and never calls Make for this kind.
  virtual bool expands() const { return false; }
  virtual std::vector<LayerConfig> Expand(const LayerConfig&, const Shape&) const { return {}; }
  // The layer, for an input shape Infer accepted; nullptr with *error otherwise.
  virtual std::unique_ptr<Layer> Make(Backend& backend, const LayerConfig& config, const Shape& in,
                                      uint64_t seed, std::string* error) const = 0;
  virtual int64_t Parameters(const LayerConfig&, const Shape&) const { return 0; }
  // Weight tying: "" when a layer of this config can lend an output projection from `width`
  // features to `classes` logits (Layer::MakeTiedOutput), else why not.
  virtual std::string CanTieOutput(const LayerConfig&, int64_t width, int64_t classes) const {
    (void)width;
    (void)classes;
    return std::string("a ") + name() + " layer has no table to tie an output projection to";
  }
  virtual double Flops(const LayerConfig&, const Shape&) const { return 0; }
  // The vocabulary of a kind that reads int32 token ids (an embedding; 0 for the others): it
  // can only be a model's first layer, fed token ids (Layer::token_vocab, built).
  virtual int64_t TokenVocab(const LayerConfig&) const { return 0; }
  // Values one example keeps for the backward pass beyond the layer's output
  // (LayerActivationValues).
  virtual double SavedValues(const LayerConfig&, const Shape&) const { return 0; }
};

// The kind of that name, or nullptr.
const LayerKind* FindLayerKind(std::string_view name);
// Every kind, in the registry's order.
const std::vector<const LayerKind*>& AllLayerKinds();
// "linear, relu, ..." for messages.
std::string LayerKindList();

}  // namespace localpar

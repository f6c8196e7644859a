// Model construction and shape validation.
#include "common/nn/model.h"

#include "common/nn/layer_kind.h"

namespace localpar {
namespace {

std::string StageLabel(const ModelConfig& c, size_t k) {
  std::string label = "stages[" + std::to_string(k) + "]";
  if (!c.stages[k].name.empty()) label += " (" + c.stages[k].name + ")";
  return label;
}

// Whether `l`, or a layer in its body, reads token ids.
bool HasTokenReader(const LayerConfig& l) {
  const LayerKind* kind = FindLayerKind(l.kind);
  if (kind && kind->TokenVocab(l) > 0) return true;
  for (const LayerConfig& b : l.body) {
    if (HasTokenReader(b)) return true;
  }
  return false;
}

}  // namespace

bool ValidateModel(const ModelConfig& config, std::string* error) {
  if (config.stages.empty()) {
    *error = "stages: a model needs at least one stage";
    return false;
  }
  *error = config.input_shape.empty() ? "input shape [] is empty"
                                      : ExampleShapeError("input shape", config.input_shape);
  if (!error->empty()) return false;
  if (config.classes < 1 || config.classes > kMaxClasses) {
    *error = "classes: " + std::to_string(config.classes) + " is not in 1.." +
             std::to_string(kMaxClasses);
    return false;
  }
  Shape cur = config.input_shape;
  for (size_t k = 0; k < config.stages.size(); ++k) {
    const StageConfig& st = config.stages[k];
    std::string source = k == 0 ? "the data" : "the output of " + StageLabel(config, k - 1);
    if (!st.declared_input.empty() && st.declared_input != cur) {
      *error = StageLabel(config, k) + ".input_shape " + ShapeString(st.declared_input) +
               " does not match " + ShapeString(cur) + ", " + source;
      return false;
    }
    for (size_t i = 0; i < st.layers.size(); ++i) {
      const LayerKind* kind = FindLayerKind(st.layers[i].kind);
      const bool first = k == 0 && i == 0 && kind && kind->TokenVocab(st.layers[i]) > 0;
      if (!first && HasTokenReader(st.layers[i])) {
        *error = StageLabel(config, k) + ".layers[" + std::to_string(i) +
                 "]: an embedding reads token ids, so it can only be the model's first layer";
        return false;
      }
      Shape next;
      std::string e;
      if (!InferLayerShape(st.layers[i], cur, &next, &e) ||
          !(e = ExampleShapeError("output", next)).empty()) {
        std::string from = i == 0 ? source : "the previous layer";
        *error = StageLabel(config, k) + ".layers[" + std::to_string(i) + "] " + e + " (input " +
                 ShapeString(cur) + " from " + from + ")";
        return false;
      }
      cur = next;
    }
    std::vector<LayerConfig> head;
    std::string e;
    if (!HeadLayers(st.head, cur, config.classes, &head, &e)) {
      *error = StageLabel(config, k) + ".head: " + e;
      return false;
    }
    if (st.head.tie_embedding) {
      const LayerKind* first = st.layers.empty() ? nullptr : FindLayerKind(st.layers[0].kind);
      std::string why = st.head.kind != HeadConfig::Kind::kLanguageModel
                            ? "only a LANGUAGE_MODEL head ties its output to an embedding"
                        : !first ? "the stage has no first layer to tie the output projection to"
                                 : first->CanTieOutput(st.layers[0], cur.empty() ? 0 : cur.back(),
                                                       config.classes);
      if (!why.empty()) {
        *error = StageLabel(config, k) + ".head.tie_embedding: " + why;
        return false;
      }
    }
    Shape h = cur;
    for (const LayerConfig& l : head) {
      Shape next;
      if (!InferLayerShape(l, h, &next, &e) || !(e = ExampleShapeError("output", next)).empty()) {
        *error = StageLabel(config, k) + ".head: " + e;
        return false;
      }
      h = next;
    }
  }
  return true;
}

Shape StageInputShape(const ModelConfig& config, int k) {
  Shape cur = config.input_shape;
  for (int s = 0; s < k; ++s) {
    for (const LayerConfig& l : config.stages[s].layers) {
      Shape next;
      std::string e;
      LP_CHECK_MSG(InferLayerShape(l, cur, &next, &e), "%s", e.c_str());
      cur = next;
    }
  }
  return cur;
}

std::unique_ptr<Model> Model::Create(Backend& backend, const ModelConfig& config,
                                     std::string* error,
                                     const std::function<void(int, Stage&)>& built) {
  if (!ValidateModel(config, error)) return nullptr;
  auto model = std::make_unique<Model>();
  Shape cur = config.input_shape;
  for (size_t k = 0; k < config.stages.size(); ++k) {
    std::string e;
    auto st = Stage::Create(backend, config.stages[k], cur, config.classes, config.optimizer,
                            StageSeed(config.seed, static_cast<int>(k)), &e);
    if (!st) {
      *error = StageLabel(config, k) + ": " + e;
      return nullptr;
    }
    cur = st->output_shape();
    if (built) built(static_cast<int>(k), *st);
    model->stages_.push_back(std::move(st));
  }
  return model;
}

int64_t Model::num_parameters() {
  int64_t n = 0;
  for (auto& s : stages_) n += s->num_parameters();
  return n;
}

void Model::CopyStateFrom(Model& from) {
  for (int k = 0; k < num_stages(); ++k) {
    std::vector<Param*> src = from.stage(k).params(), dst = stage(k).params();
    for (size_t i = 0; i < src.size(); ++i) {
      for (Tensor Param::*t :
           {&Param::value, &Param::state1, &Param::state2, &Param::outer, &Param::outer_momentum}) {
        const Tensor& a = (*src[i]).*t;
        Tensor& b = (*dst[i]).*t;
        if (!a.defined()) continue;
        if (!b.defined()) b = Tensor::Zeros(src[i]->value.backend(), src[i]->value.shape());
        b.CopyFrom(a);
      }
    }
    stage(k).optimizer().set_steps(from.stage(k).optimizer().steps());
  }
}

}  // namespace localpar

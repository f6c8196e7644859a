// Every layer kind, one line each: the function its family file defines. Adding a kind is
// its family file (or a new one) plus a line here, and its field in job.proto's Layer.
#include <algorithm>

#include "common/nn/layer_kind.h"

namespace localpar {

#define LOCALPAR_LAYER_KINDS(X)   \
  X(LinearLayerKind)              \
  X(ReluLayerKind)                \
  X(GeluLayerKind)                \
  X(LayerNormLayerKind)           \
  X(DropoutLayerKind)             \
  X(Conv2dLayerKind)              \
  X(MaxPoolLayerKind)             \
  X(AvgPoolLayerKind)             \
  X(GlobalAvgPoolLayerKind)       \
  X(FlattenLayerKind)             \
  X(EmbeddingLayerKind)           \
  X(ResidualLayerKind)            \
  X(BatchNormLayerKind)           \
  X(DenseLayerKind)               \
  X(PositionalEncodingLayerKind)  \
  X(CausalSelfAttentionLayerKind) \
  X(TransformerBlockLayerKind)    \
  X(PositionEmbeddingLayerKind)

#define LOCALPAR_DECLARE_KIND(f) const LayerKind& f();
LOCALPAR_LAYER_KINDS(LOCALPAR_DECLARE_KIND)
#undef LOCALPAR_DECLARE_KIND

const std::vector<const LayerKind*>& AllLayerKinds() {
#define LOCALPAR_LIST_KIND(f) &f(),
  static const std::vector<const LayerKind*> kinds = {LOCALPAR_LAYER_KINDS(LOCALPAR_LIST_KIND)};
#undef LOCALPAR_LIST_KIND
  return kinds;
}

const LayerKind* FindLayerKind(std::string_view name) {
  const std::vector<const LayerKind*>& kinds = AllLayerKinds();
  auto it = std::find_if(kinds.begin(), kinds.end(),
                         [&](const LayerKind* k) { return name == k->name(); });
  return it == kinds.end() ? nullptr : *it;
}

std::string LayerKindList() {
  std::string out;
  for (const LayerKind* k : AllLayerKinds())
    out += (out.empty() ? "" : ", ") + std::string(k->name());
  return out;
}

}  // namespace localpar

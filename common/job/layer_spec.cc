// Layer specs by reflection over job.proto's Layer.
#include "common/job/layer_spec.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/nn/layer_kind.h"

namespace localpar {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::Message;

// The one field of Layer's `kind` oneof that is set, or nullptr.
const FieldDescriptor* KindField(const v1::Layer& layer) {
  const google::protobuf::OneofDescriptor* oneof = v1::Layer::descriptor()->FindOneofByName("kind");
  return layer.GetReflection()->GetOneofFieldDescriptor(layer, oneof);
}

bool IsLayerList(const FieldDescriptor* f) {
  return f->is_repeated() && f->message_type() == v1::Layer::descriptor();
}

}  // namespace

LayerConfig LayerFromSpec(const v1::Layer& layer) {
  LayerConfig c;
  const FieldDescriptor* kind = KindField(layer);
  if (!kind) return c;
  c.kind = kind->name();
  const Message& m = layer.GetReflection()->GetMessage(layer, kind);
  const google::protobuf::Reflection* r = m.GetReflection();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (IsLayerList(f)) {
      for (int j = 0; j < r->FieldSize(m, f); ++j) {
        c.body.push_back(
            LayerFromSpec(static_cast<const v1::Layer&>(r->GetRepeatedMessage(m, f, j))));
      }
      continue;
    }
    if (f->is_repeated() || !r->HasField(m, f)) continue;  // zero: the kind's default
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        c.Set(f->name(), r->GetInt32(m, f));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        c.Set(f->name(), static_cast<double>(r->GetInt64(m, f)));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        c.Set(f->name(), r->GetUInt32(m, f));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        c.Set(f->name(), static_cast<double>(r->GetUInt64(m, f)));
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        c.Set(f->name(), r->GetFloat(m, f));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        c.Set(f->name(), r->GetDouble(m, f));
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        c.Set(f->name(), r->GetBool(m, f) ? 1 : 0);
        break;
      default:
        break;
    }
  }
  return c;
}

void LayerToSpec(const LayerConfig& c, v1::Layer* layer) {
  const FieldDescriptor* kind = v1::Layer::descriptor()->FindFieldByName(c.kind);
  if (!kind || !kind->message_type()) return;
  Message* m = layer->GetReflection()->MutableMessage(layer, kind);
  const google::protobuf::Reflection* r = m->GetReflection();
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (IsLayerList(f)) {
      r->ClearField(m, f);
      for (const LayerConfig& b : c.body) {
        LayerToSpec(b, static_cast<v1::Layer*>(r->AddMessage(m, f)));
      }
      continue;
    }
    if (f->is_repeated() || !c.has(f->name())) continue;
    const double v = c.Number(f->name());
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_INT32:
        r->SetInt32(m, f, static_cast<int32_t>(v));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        r->SetInt64(m, f, c.Int(f->name()));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(m, f, static_cast<uint32_t>(v));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(m, f, static_cast<uint64_t>(v));
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        r->SetFloat(m, f, static_cast<float>(v));
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(m, f, v);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(m, f, v != 0);
        break;
      default:
        break;
    }
  }
}

void ApplyLayerSpecDefaults(v1::Layer* layer) {
  if (!KindField(*layer)) return;
  LayerConfig c = LayerFromSpec(*layer);
  ApplyLayerDefaults(c);
  LayerToSpec(c, layer);
}

int LayerSpecNesting(const v1::Layer& layer) {
  const FieldDescriptor* kind = KindField(layer);
  if (!kind) return 1;
  const Message& m = layer.GetReflection()->GetMessage(layer, kind);
  const google::protobuf::Reflection* r = m.GetReflection();
  const google::protobuf::Descriptor* d = m.GetDescriptor();
  int deepest = 0;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (!IsLayerList(f)) continue;
    for (int j = 0; j < r->FieldSize(m, f); ++j) {
      deepest = std::max(
          deepest, LayerSpecNesting(static_cast<const v1::Layer&>(r->GetRepeatedMessage(m, f, j))));
    }
  }
  return 1 + deepest;
}

absl::Status ValidateLayerSpec(const v1::Layer& layer, const std::string& at) {
  const LayerConfig c = LayerFromSpec(layer);
  const LayerIssue issue = CheckLayerSettings(c);
  if (issue.why.empty()) return absl::OkStatus();
  std::string field = at;
  if (!c.kind.empty()) absl::StrAppend(&field, ".", c.kind);
  if (!issue.field.empty()) absl::StrAppend(&field, ".", issue.field);
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", issue.why));
}

}  // namespace localpar

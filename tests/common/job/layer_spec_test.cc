// job.proto's Layer and the layer registry agree: every field of Layer's `kind` is a
// registered kind and every kind has its field; settings travel by field name both ways;
// the kinds' checks name the field.
#include "common/job/layer_spec.h"

#include <gtest/gtest.h>

#include <memory>
#include <set>
#include <string>
#include <utility>

#include "common/core/backend.h"
#include "common/nn/layer_kind.h"
#include "google/protobuf/text_format.h"

namespace localpar {
namespace {

TEST(LayerSpec, EveryLayerFieldIsARegisteredKindAndEveryKindHasItsField) {
  const google::protobuf::OneofDescriptor* oneof = v1::Layer::descriptor()->FindOneofByName("kind");
  ASSERT_NE(oneof, nullptr);
  std::set<std::string> fields;
  for (int i = 0; i < oneof->field_count(); ++i) {
    fields.insert(oneof->field(i)->name());
    EXPECT_NE(FindLayerKind(oneof->field(i)->name()), nullptr)
        << oneof->field(i)->name() << " has no kind in common/nn/layers/registry.cc";
  }
  std::set<std::string> kinds;
  for (const LayerKind* k : AllLayerKinds()) {
    EXPECT_TRUE(kinds.insert(k->name()).second) << k->name() << " is registered twice";
    EXPECT_TRUE(fields.count(k->name())) << k->name() << " has no field in job.proto's Layer";
  }
}

TEST(LayerSpec, SettingsTravelByFieldNameBothWaysBodiesIncluded) {
  v1::Layer l;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "residual { body { conv2d { out_channels: 8 kernel: 5 padding: 2 } } "
      "body { batch_norm { momentum: 0.25 } } }",
      &l));
  LayerConfig c = LayerFromSpec(l);
  EXPECT_EQ(c.kind, "residual");
  ASSERT_EQ(c.body.size(), 2u);
  EXPECT_EQ(c.body[0].kind, "conv2d");
  EXPECT_EQ(c.body[0].Int("out_channels"), 8);
  EXPECT_EQ(c.body[0].Int("kernel"), 5);
  EXPECT_FALSE(c.body[0].has("stride"));  // zero: left to the kind's default
  EXPECT_FLOAT_EQ(static_cast<float>(c.body[1].Number("momentum")), 0.25f);
  ApplyLayerSpecDefaults(&l);
  EXPECT_EQ(l.residual().body(0).conv2d().stride(), 1);
  EXPECT_EQ(l.residual().body(0).conv2d().kernel(), 5);
  EXPECT_FLOAT_EQ(l.residual().body(1).batch_norm().eps(), 1e-5f);
  EXPECT_FLOAT_EQ(l.residual().body(1).batch_norm().momentum(), 0.25f);
  v1::Layer back;
  LayerToSpec(LayerFromSpec(l), &back);
  EXPECT_EQ(back.SerializeAsString(), l.SerializeAsString());
}

TEST(LayerSpec, ChecksNameTheKindAndTheField) {
  v1::Layer l;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "residual { body { relu {} } body { dropout { rate: 1.5 } } }", &l));
  absl::Status s = ValidateLayerSpec(l, "stages[0].layers[3]");
  EXPECT_EQ(s.message(), "stages[0].layers[3].residual.body[1].dropout.rate: must be in [0, 1)");
  EXPECT_NE(ValidateLayerSpec(v1::Layer(), "x").message().find("no layer kind set"),
            std::string::npos);
}

// Every setting a family reads is a field of its kind's message in job.proto: a name spelt
// otherwise in a family file would silently read its default. Each kind goes through every
// step a job takes it through (defaults, checks, shapes, expansion or construction,
// parameter, FLOP and memory counts, weight tying) with the reads recorded.
TEST(LayerSpec, FamiliesReadOnlySettingsThatAreFieldsOfTheirMessage) {
  struct Case {
    const char* layer;
    Shape in;
  };
  const Case cases[] = {
      {"linear { out_features: 4 }", {6}},
      {"dense { out_features: 4 }", {6}},
      {"relu {}", {6}},
      {"gelu {}", {6}},
      {"dropout { rate: 0.1 }", {6}},
      {"flatten {}", {2, 2, 3}},
      {"layer_norm {}", {6}},
      {"batch_norm { momentum: 0.2 }", {4, 4, 2}},
      {"conv2d { out_channels: 3 kernel: 3 stride: 1 padding: 1 }", {5, 5, 2}},
      {"max_pool { kernel: 2 stride: 2 }", {4, 4, 2}},
      {"avg_pool { kernel: 2 stride: 1 padding: 1 }", {4, 4, 2}},
      {"global_avg_pool {}", {4, 4, 2}},
      {"embedding { vocab: 10 dim: 8 }", {5}},
      {"positional_encoding {}", {5, 8}},
      {"position_embedding {}", {5, 8}},
      {"causal_self_attention { heads: 2 }", {5, 8}},
      {"transformer_block { heads: 2 mlp_hidden: 16 }", {5, 8}},
      {"residual { body { linear { out_features: 6 } } body { relu {} } }", {6}},
  };
  std::set<std::pair<std::string, std::string>> reads;
  LayerConfig::trace = &reads;
  std::unique_ptr<Backend> cpu = MakeCpuBackend();
  std::set<std::string> covered;
  for (const Case& c : cases) {
    v1::Layer l;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(c.layer, &l)) << c.layer;
    ApplyLayerSpecDefaults(&l);
    ASSERT_TRUE(ValidateLayerSpec(l, "layer").ok()) << c.layer;
    LayerConfig config = LayerFromSpec(l);
    const LayerKind* kind = FindLayerKind(config.kind);
    ASSERT_NE(kind, nullptr) << c.layer;
    covered.insert(kind->name());
    kind->Defaults(config);
    EXPECT_TRUE(kind->Check(config).field.empty()) << c.layer;
    Shape out;
    ASSERT_EQ(kind->Infer(config, c.in, &out), "") << c.layer;
    if (kind->expands()) {
      EXPECT_FALSE(kind->Expand(config, c.in).empty()) << c.layer;
    } else {
      std::string error;
      EXPECT_NE(kind->Make(*cpu, config, c.in, 1, &error), nullptr) << c.layer << ": " << error;
    }
    kind->Parameters(config, c.in);
    kind->Flops(config, c.in);
    kind->SavedValues(config, c.in);
    kind->CanTieOutput(config, 8, 10);
  }
  LayerConfig::trace = nullptr;
  for (const LayerKind* k : AllLayerKinds()) {
    EXPECT_TRUE(covered.count(k->name())) << k->name() << ": add a case above";
  }
  const google::protobuf::OneofDescriptor* oneof = v1::Layer::descriptor()->FindOneofByName("kind");
  for (const auto& [kind, name] : reads) {
    const google::protobuf::FieldDescriptor* field = nullptr;
    for (int i = 0; i < oneof->field_count(); ++i) {
      if (oneof->field(i)->name() == kind) field = oneof->field(i);
    }
    ASSERT_NE(field, nullptr) << "a setting read for kind '" << kind << "', which has no field";
    const google::protobuf::Descriptor* message = field->message_type();
    EXPECT_TRUE(message != nullptr && message->FindFieldByName(name) != nullptr)
        << kind << " reads the setting '" << name << "', which is no field of its message "
        << (message ? message->full_name() : std::string("(none)"));
  }
  EXPECT_GT(reads.size(), 10u) << "the trace recorded too little to mean anything";
}

}  // namespace
}  // namespace localpar

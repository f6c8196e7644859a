// job.proto's Layer and the layer registry agree: every field of Layer's `kind` is a
// registered kind and every kind has its field; settings travel by field name both ways;
// the kinds' checks name the field.
#include "common/job/layer_spec.h"

#include <gtest/gtest.h>

#include <set>

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

}  // namespace
}  // namespace localpar

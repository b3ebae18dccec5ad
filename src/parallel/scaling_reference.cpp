// The published architectures of docs/SCALING.md's comparison, as the scaling model needs them:
// each layer's parameter tensors (forward order) and backward FLOPs at ImageNet's 224 x 224.
// Layer shapes follow torchvision (ResNet v1.5: the stride sits on the 3x3 convolution); the
// parameter totals are checked against torchvision's in tests/parallel/test_scaling_model.cpp.
#include <cmath>

#include "lockstep/core/error.hpp"
#include "lockstep/parallel/scaling_model.hpp"

namespace lockstep::parallel::scaling {
namespace {

struct Builder {
  std::vector<LayerCost> layers;
  double forward_flops = 0.0;
  bool first = true;  // the first layer computes no input gradient

  // k x k convolution cin -> cout producing an out x out map, optionally with bias.
  void conv(std::int64_t cin, std::int64_t cout, std::int64_t k, std::int64_t out, bool bias) {
    const double flops =
        2.0 * static_cast<double>(k * k * cin * cout) * static_cast<double>(out * out);
    LayerCost layer;
    layer.param_numel.push_back(k * k * cin * cout);
    if (bias) layer.param_numel.push_back(cout);
    add(std::move(layer), flops);
  }
  void batchnorm(std::int64_t channels) {
    layers.push_back(LayerCost{{channels, channels}, 0.0});  // weight and bias, no FLOPs counted
  }
  void linear(std::int64_t in, std::int64_t out) {
    add(LayerCost{{out * in, out}, 0.0}, 2.0 * static_cast<double>(in * out));
  }
  void add(LayerCost layer, double flops) {
    forward_flops += flops;
    layer.backward_flops = flops * (first ? 1.0 : 2.0);
    first = false;
    layers.push_back(std::move(layer));
  }
};

// torchvision resnet50 / resnet101: bottleneck blocks, expansion 4.
ReferenceModel resnet(const std::string& name, const std::vector<int>& blocks) {
  Builder b;
  b.conv(3, 64, 7, 112, false);
  b.batchnorm(64);
  std::int64_t in = 64, size = 56;  // after the 3x3 max pool
  const std::int64_t widths[4] = {64, 128, 256, 512};
  for (int stage = 0; stage < 4; ++stage) {
    const std::int64_t width = widths[stage], out_ch = 4 * widths[stage];
    for (int i = 0; i < blocks[static_cast<std::size_t>(stage)]; ++i) {
      const bool down = i == 0 && stage > 0;
      const std::int64_t out = down ? size / 2 : size;
      b.conv(in, width, 1, size, false);
      b.batchnorm(width);
      b.conv(width, width, 3, out, false);
      b.batchnorm(width);
      b.conv(width, out_ch, 1, out, false);
      b.batchnorm(out_ch);
      if (i == 0) {  // projection shortcut
        b.conv(in, out_ch, 1, out, false);
        b.batchnorm(out_ch);
      }
      in = out_ch;
      size = out;
    }
  }
  b.linear(2048, 1000);
  return {name, std::move(b.layers), b.forward_flops};
}

// torchvision vgg16 (configuration D, no batch norm).
ReferenceModel vgg16() {
  Builder b;
  const int cfg[] = {64, 64, 0, 128, 128, 0, 256, 256, 256, 0, 512, 512, 512, 0, 512, 512, 512, 0};
  std::int64_t in = 3, size = 224;
  for (int c : cfg) {
    if (c == 0) {
      size /= 2;
      continue;
    }
    b.conv(in, c, 3, size, true);
    in = c;
  }
  b.linear(512 * 7 * 7, 4096);
  b.linear(4096, 4096);
  b.linear(4096, 1000);
  return {"vgg16", std::move(b.layers), b.forward_flops};
}

// Inception V3 has 23,851,784 parameters (Keras, with its 1000-way top) and about 5.7 GMAC at
// 299 x 299. Its many branches are not modelled: resnet50's profile (parameters concentrated in
// the last stage and the classifier, as in Inception V3) is scaled to those totals.
ReferenceModel inception3() {
  ReferenceModel r = resnet("inception3", {3, 4, 6, 3});
  const double param_scale = 23851784.0 / static_cast<double>(r.parameters());
  const double flop_scale = 2.0 * 5.7e9 / r.forward_flops;
  for (LayerCost& layer : r.layers) {
    for (std::int64_t& n : layer.param_numel)
      n = std::max<std::int64_t>(1, std::llround(static_cast<double>(n) * param_scale));
    layer.backward_flops *= flop_scale;
  }
  r.forward_flops *= flop_scale;
  return r;
}

}  // namespace

std::int64_t ReferenceModel::parameters() const {
  std::int64_t n = 0;
  for (const LayerCost& layer : layers)
    for (std::int64_t k : layer.param_numel)
      n += k;
  return n;
}

std::vector<std::string> reference_model_names() {
  return {"resnet50", "resnet101", "vgg16", "inception3"};
}

ReferenceModel reference_model(const std::string& name) {
  if (name == "resnet50") return resnet(name, {3, 4, 6, 3});
  if (name == "resnet101") return resnet(name, {3, 4, 23, 3});
  if (name == "vgg16") return vgg16();
  if (name == "inception3") return inception3();
  LOCKSTEP_FAIL_HINT("resnet50, resnet101, vgg16 or inception3",
                     "scaling model: unknown reference model '", name, "'");
}

}  // namespace lockstep::parallel::scaling

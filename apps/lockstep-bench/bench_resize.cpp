// lockstep-bench resize: the image resampler alone, as the loader's random-resized crop runs it
// (docs/IMAGES.md, "The resampler's AVX-512 code").
//   lockstep-bench resize [--image=PATH] [--crops=1000] [--side=224] [--reps=7]
// Takes --crops random-resized crops as the loader draws them (data::encoded_crop: torchvision's
// area 8-100%, width/height 3/4 to 4/3) of an image (--image: a JPEG or PNG; by default a
// generated 500x375 image of smooth colours and noise) and resizes each to side x side with
// resize_region, --reps times with the resampler's AVX-512 code allowed and forbidden in turn
// (interleaved; where the CPU lacks AVX-512F or BW both run the same code). Reports each one's time
// per crop (the minimum and the median of the repetitions), the ratio of the minimums, and whether
// both gave the same bytes (they must).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "bench.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/data/augment.hpp"
#include "lockstep/data/image.hpp"

namespace lockstep::bench {
namespace {

using Clock = std::chrono::steady_clock;

// Smooth colour ramps plus noise: every tap of the filter sees varying values.
data::Image generated_image(std::int64_t w, std::int64_t h) {
  data::Image img{w, h, std::vector<std::uint8_t>(static_cast<std::size_t>(w * h * 3))};
  std::mt19937 rng(7);
  for (std::int64_t y = 0; y < h; ++y)
    for (std::int64_t x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const double ramp = 127.5 + 100 * std::sin(0.02 * static_cast<double>(x * (c + 1) + y));
        const double v = ramp + static_cast<double>(rng() % 41) - 20;
        img.rgb[static_cast<std::size_t>((y * w + x) * 3 + c)] =
            static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0));
      }
  return img;
}

struct Crop {
  double top, left, h, w;
};

int run(const Args& args) {
  const std::string path = args.get("image", "");
  const std::int64_t crops = args.get_int("crops", 1000);
  const std::int64_t side = args.get_int("side", 224);
  const int reps = static_cast<int>(args.get_int("reps", 7));
  LOCKSTEP_CHECK(crops >= 1, "--crops must be at least 1, got ", crops);
  LOCKSTEP_CHECK(side >= 1, "--side must be at least 1, got ", side);
  LOCKSTEP_CHECK(reps >= 1, "--reps must be at least 1, got ", reps);
  const data::Image img = path.empty() ? generated_image(500, 375) : data::read_image(path);

  // The loader's own random-resized crops (the training draws of samples 0 .. crops - 1), on the
  // full-size image: no reduced-scale JPEG decode, as for photos whose crops are under 2 x side.
  data::AugmentOptions augment;
  augment.random_resized_crop = true;
  const data::EncodedImageInfo info{img.width, img.height, false};
  std::vector<Crop> drawn;
  for (std::int64_t i = 0; i < crops; ++i) {
    const data::EncodedCrop c = data::encoded_crop(info, side, augment, 0, i);
    drawn.push_back({static_cast<double>(c.top), static_cast<double>(c.left),
                     static_cast<double>(c.height), static_cast<double>(c.width)});
  }

  const std::size_t sample = static_cast<std::size_t>(3 * side * side);
  std::vector<std::uint8_t> out[2] = {std::vector<std::uint8_t>(sample * drawn.size()),
                                      std::vector<std::uint8_t>(sample * drawn.size())};
  std::vector<double> us[2];
  const bool before = data::allow_avx512_resampler(true);
  for (int rep = 0; rep < reps; ++rep)
    for (int allow : {1, 0}) {
      data::allow_avx512_resampler(allow != 0);
      const auto t0 = Clock::now();
      for (std::size_t i = 0; i < drawn.size(); ++i)
        data::resize_region(img, drawn[i].top, drawn[i].left, drawn[i].h, drawn[i].w, side, side,
                            out[allow].data() + i * sample);
      us[allow].push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() /
                          static_cast<double>(drawn.size()));
    }
  data::allow_avx512_resampler(before);
  const bool same = out[0] == out[1];
  const double min_with = *std::min_element(us[1].begin(), us[1].end());
  const double min_without = *std::min_element(us[0].begin(), us[0].end());
  std::fprintf(stderr,
               "resize: %lld crops of %lldx%lld to %lld: %.1f us a crop with the AVX-512 code "
               "allowed, %.1f without (minimums of %d; medians %.1f, %.1f): %.2fx; same bytes: "
               "%s\n",
               static_cast<long long>(crops), static_cast<long long>(img.height),
               static_cast<long long>(img.width), static_cast<long long>(side), min_with,
               min_without, reps, median(us[1]), median(us[0]), min_with / min_without,
               same ? "yes" : "NO");
  write_output(args,
               str("{\"benchmark\": \"resize\", \"machine\": ", machine_json(), ", \"image\": \"",
                   path.empty() ? "generated" : path, "\", \"height\": ", img.height,
                   ", \"width\": ", img.width, ", \"crops\": ", crops, ", \"side\": ", side,
                   ", \"reps\": ", reps, ", \"us_per_crop_min\": {\"avx512_allowed\": ", min_with,
                   ", \"avx512_forbidden\": ", min_without,
                   "}, \"us_per_crop_median\": {\"avx512_allowed\": ", median(us[1]),
                   ", \"avx512_forbidden\": ", median(us[0]), "}, \"allowed_over_forbidden\": ",
                   min_with / min_without, ", \"same_bytes\": ", same ? "true" : "false", "}\n"));
  LOCKSTEP_CHECK(same, "the resampler gave different bytes with and without its AVX-512 code");
  return 0;
}

}  // namespace

LOCKSTEP_BENCH("resize",
               "the image resampler alone on random-resized crops, with and without its AVX-512 "
               "code (--crops=1000 --side=224 --reps=7)",
               "crops image reps side", run);

}  // namespace lockstep::bench

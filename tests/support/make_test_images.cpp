// Test data for tests/scripts/image_folder.sh, written with libjpeg-turbo and libpng:
//   make_test_images folder ROOT PER_CLASS SEED
//       an ImageFolder of four classes that differ by colour (blue, green, red, yellow, with
//       noise, random brightness and random sizes), JPEG and PNG alternately
//   make_test_images bad DIR
//       the bad-file table of docs/IMAGES.md, one file each, plus files that must decode
//   make_test_images photos DIR COUNT [444|420]
//       COUNT 500x375 JPEGs of quality 90 with smooth shapes and mild noise, about the size and
//       entropy of an ImageNet photo, for measuring conversion (docs/IMAGES.md); chroma at full
//       resolution (444, the default) or halved both ways (420, as most cameras and web JPEGs)
//   make_test_images cifar DIR 10|100 PER_BATCH
//       CIFAR binary batches (CIFAR-10: five training batches and a test batch of PER_BATCH
//       records; CIFAR-100: train.bin and test.bin) whose labels follow the image's red value
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "support/image_files.hpp"

using namespace lockstep::test;
namespace fs = std::filesystem;

namespace {

struct ClassColor {
  const char* name;
  int r, g, b;
};
// Created in this order, labelled in name order (blue 0, green 1, red 2, yellow 3): the listing
// must sort.
constexpr ClassColor kClasses[] = {
    {"red", 220, 40, 40}, {"green", 40, 200, 60}, {"blue", 40, 60, 220}, {"yellow", 220, 210, 40}};

int make_folder(const std::string& root, int per_class, unsigned seed) {
  std::mt19937 rng(seed);
  auto uniform = [&](int lo, int hi) { return lo + static_cast<int>(rng() % (hi - lo + 1)); };
  for (const auto& c : kClasses) {
    const fs::path dir = fs::path(root) / c.name;
    fs::create_directories(dir);
    for (int i = 0; i < per_class; ++i) {
      const int w = uniform(20, 64), h = uniform(20, 64);
      const int bright = uniform(60, 100);
      std::vector<std::uint8_t> px(static_cast<std::size_t>(w) * h * 3);
      for (std::size_t p = 0; p < px.size(); p += 3) {
        const int base[3] = {c.r, c.g, c.b};
        for (int k = 0; k < 3; ++k)
          px[p + k] = static_cast<std::uint8_t>(
              std::clamp(base[k] * bright / 100 + uniform(-40, 40), 0, 255));
      }
      char name[32];
      if (i % 2 == 0) {
        std::snprintf(name, sizeof name, "img%03d.jpg", i);
        write_bytes((dir / name).string(), encode_jpeg(w, h, px));
      } else {
        std::snprintf(name, sizeof name, "img%03d.png", i);
        write_png((dir / name).string(), w, h, PNG_COLOR_TYPE_RGB, 8, px);
      }
    }
  }
  return 0;
}

int make_bad(const std::string& dir) {
  fs::create_directories(dir);
  auto at = [&](const char* name) { return (fs::path(dir) / name).string(); };
  const auto good = encode_jpeg(32, 24, solid(32, 24, 200, 30, 30));
  write_bytes(at("good.jpg"), good);
  // Must decode: a grayscale JPEG, a CMYK JPEG (inverted, as Photoshop writes it: pure red is
  // C=0 M=255 Y=255 K=0 in ink, stored as 255 0 0 255), a 16-bit and a palette PNG, and an
  // EXIF-rotated JPEG (stored 32 wide and 16 high, left half red; orientation 6 shows it 16 wide
  // and 32 high, top half red).
  std::vector<std::uint8_t> gray(32 * 24, 128);
  write_bytes(at("gray.jpg"), encode_jpeg(32, 24, gray, TJPF_GRAY));
  std::vector<std::uint8_t> cmyk(32 * 24 * 4);
  for (std::size_t i = 0; i < cmyk.size(); i += 4)
    cmyk[i] = 255, cmyk[i + 1] = 0, cmyk[i + 2] = 0, cmyk[i + 3] = 255;
  write_bytes(at("cmyk.jpg"), encode_jpeg(32, 24, cmyk, TJPF_CMYK));
  std::vector<std::uint8_t> deep(32 * 24 * 3 * 2);
  for (std::size_t i = 0; i < deep.size(); i += 6)
    deep[i] = 0xC8, deep[i + 1] = 0x00, deep[i + 2] = 0x1E, deep[i + 4] = 0x1E;  // ~(200,30,30)
  write_png(at("deep16.png"), 32, 24, PNG_COLOR_TYPE_RGB, 16, deep);
  write_png(at("palette.png"), 32, 24, PNG_COLOR_TYPE_PALETTE, 8,
            std::vector<std::uint8_t>(32 * 24, 1), {0, 0, 0, 200, 30, 30});
  std::vector<std::uint8_t> half(32 * 16 * 3, 0);
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x)
      half[static_cast<std::size_t>((y * 32 + x) * 3)] = 255;
  write_bytes(at("exif6.jpg"), with_exif_orientation(encode_jpeg(32, 16, half), 6));
  // Must fail, naming the file.
  std::mt19937 rng(3);
  std::vector<std::uint8_t> noise(96 * 96 * 3);
  for (auto& v : noise)
    v = static_cast<std::uint8_t>(rng());
  const auto big = encode_jpeg(96, 96, noise);  // mostly scan data: the cut falls inside it
  write_bytes(at("truncated.jpg"),
              std::vector<std::uint8_t>(big.begin(), big.begin() + big.size() * 3 / 4));
  auto corrupt = good;
  for (std::size_t i = 3; i < 40 && i < corrupt.size(); ++i)
    corrupt[i] = 0x5A;  // the headers after SOI: no valid marker left
  write_bytes(at("corrupt.jpg"), corrupt);
  write_bytes(at("empty.jpg"), {});
  const std::string text = "these are notes, not an image\n";
  write_bytes(at("notes.png"), std::vector<std::uint8_t>(text.begin(), text.end()));
  fs::create_symlink("does-not-exist.jpg", at("dangling.jpg"));
  return 0;
}

int make_photos(const std::string& dir, int count, int subsamp) {
  fs::create_directories(dir);
  std::mt19937 rng(11);
  const int w = 500, h = 375;
  for (int i = 0; i < count; ++i) {
    const double fx = 0.01 + (rng() % 100) * 1e-4, fy = 0.01 + (rng() % 100) * 1e-4;
    const int cx = static_cast<int>(rng() % w), cy = static_cast<int>(rng() % h);
    std::vector<std::uint8_t> px(static_cast<std::size_t>(w) * h * 3);
    for (int y = 0; y < h; ++y)
      for (int x = 0; x < w; ++x)
        for (int c = 0; c < 3; ++c) {
          const double d = std::hypot(x - cx, y - cy);
          const double v = 128 + 60 * std::sin(fx * x * (c + 1) + fy * y) +
                           40 * std::cos(d / (20 + 10 * c)) + static_cast<int>(rng() % 17) - 8;
          px[static_cast<std::size_t>((y * w + x) * 3 + c)] =
              static_cast<std::uint8_t>(std::clamp(v, 0.0, 255.0));
        }
    char name[32];
    std::snprintf(name, sizeof name, "photo%04d.jpg", i);
    write_bytes((fs::path(dir) / name).string(), encode_jpeg(w, h, px, TJPF_RGB, 90, subsamp));
  }
  return 0;
}

int make_cifar(const std::string& dir, int kind, int per_batch) {
  fs::create_directories(dir);
  std::mt19937 rng(7);
  const int label_bytes = kind == 10 ? 1 : 2, classes = kind == 10 ? 10 : 100;
  auto batch = [&](const std::string& name) {
    std::vector<std::uint8_t> bytes;
    for (int r = 0; r < per_batch; ++r) {
      const int label = static_cast<int>(rng() % classes);
      if (label_bytes == 2) bytes.push_back(static_cast<std::uint8_t>(label / 5));  // coarse
      bytes.push_back(static_cast<std::uint8_t>(label));
      for (int p = 0; p < 3072; ++p)  // red plane = label, green = record number, blue = 7
        bytes.push_back(static_cast<std::uint8_t>(p < 1024 ? label : p < 2048 ? r : 7));
    }
    write_bytes((fs::path(dir) / name).string(), bytes);
  };
  if (kind == 10) {
    for (int b = 1; b <= 5; ++b)
      batch("data_batch_" + std::to_string(b) + ".bin");
    batch("test_batch.bin");
    std::string names = "airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\nhorse\nship\ntruck\n\n";
    write_bytes((fs::path(dir) / "batches.meta.txt").string(),
                std::vector<std::uint8_t>(names.begin(), names.end()));
  } else {
    batch("train.bin");
    batch("test.bin");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string cmd = argc > 1 ? argv[1] : "";
  if (cmd == "folder" && argc == 5)
    return make_folder(argv[2], std::atoi(argv[3]), static_cast<unsigned>(std::atoi(argv[4])));
  if (cmd == "bad" && argc == 3) return make_bad(argv[2]);
  if (cmd == "photos" && (argc == 4 || argc == 5)) {
    const std::string sampling = argc == 5 ? argv[4] : "444";
    if (sampling == "444" || sampling == "420")
      return make_photos(argv[2], std::atoi(argv[3]), sampling == "444" ? TJSAMP_444 : TJSAMP_420);
  }
  if (cmd == "cifar" && argc == 5)
    return make_cifar(argv[2], std::atoi(argv[3]), std::atoi(argv[4]));
  std::fprintf(stderr,
               "usage: make_test_images folder ROOT PER_CLASS SEED | bad DIR | "
               "photos DIR COUNT [444|420] | cifar DIR 10|100 PER_BATCH\n");
  return 2;
}

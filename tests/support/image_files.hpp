// Writes the JPEG and PNG files the image importer's tests read (tests/data/test_image.cpp,
// tests/support/make_test_images.cpp), with the libraries lockstep decodes them with: any layout
// the tests need (grayscale, CMYK, 16-bit, palette, an EXIF orientation) without a binary in git.
#pragma once

#include <png.h>
#include <turbojpeg.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace lockstep::test {

inline void write_bytes(const std::string& path, const std::vector<std::uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw std::runtime_error("cannot write " + path);
}

// pixels: w*h*channels of `format` (TJPF_RGB, TJPF_GRAY, TJPF_CMYK as inverted CMYK); subsamp
// TJSAMP_444 unless given (TJSAMP_420: a camera's usual), flags e.g. TJFLAG_PROGRESSIVE.
inline std::vector<std::uint8_t> encode_jpeg(int w, int h, const std::vector<std::uint8_t>& pixels,
                                             int format = TJPF_RGB, int quality = 95,
                                             int subsamp = TJSAMP_444, int flags = 0) {
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  if (format == TJPF_GRAY) subsamp = TJSAMP_GRAY;
  if (tjCompress2(tj, pixels.data(), w, 0, h, format, &out, &size, subsamp, quality, flags) != 0)
    throw std::runtime_error(std::string("tjCompress2: ") + tjGetErrorStr2(tj));
  std::vector<std::uint8_t> bytes(out, out + size);
  tjFree(out);
  tjDestroy(tj);
  return bytes;
}

// The same JPEG with an APP1 Exif segment after SOI saying orientation `o` (little-endian TIFF).
inline std::vector<std::uint8_t> with_exif_orientation(const std::vector<std::uint8_t>& jpeg,
                                                       int o) {
  const std::vector<std::uint8_t> tiff = {
      'I',
      'I',
      42,
      0,
      8,
      0,
      0,
      0,  // header, IFD0 at 8
      1,
      0,  // one entry
      0x12,
      0x01,
      3,
      0,
      1,
      0,
      0,
      0,  // tag 0x0112, SHORT, count 1
      static_cast<std::uint8_t>(o),
      0,
      0,
      0,
      0,
      0,
      0,
      0  // value, next IFD 0
  };
  std::vector<std::uint8_t> app1 = {0xFF, 0xE1, 0, 0, 'E', 'x', 'i', 'f', 0, 0};
  app1.insert(app1.end(), tiff.begin(), tiff.end());
  const std::size_t len = app1.size() - 2;
  app1[2] = static_cast<std::uint8_t>(len >> 8);
  app1[3] = static_cast<std::uint8_t>(len & 0xFF);
  std::vector<std::uint8_t> out = jpeg;
  out.insert(out.begin() + 2, app1.begin(), app1.end());
  return out;
}

// color_type: PNG_COLOR_TYPE_GRAY/RGB/RGB_ALPHA/PALETTE; bit_depth 8 or 16 (samples big-endian
// in `rows` as PNG stores them); palette: RGB triples for PNG_COLOR_TYPE_PALETTE.
inline void write_png(const std::string& path, int w, int h, int color_type, int bit_depth,
                      const std::vector<std::uint8_t>& data,
                      const std::vector<std::uint8_t>& palette = {}) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    std::fclose(f);
    throw std::runtime_error("libpng failed writing " + path);
  }
  png_init_io(png, f);
  png_set_IHDR(png, info, static_cast<png_uint_32>(w), static_cast<png_uint_32>(h), bit_depth,
               color_type, PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  std::vector<png_color> colors;
  for (std::size_t i = 0; i + 2 < palette.size(); i += 3)
    colors.push_back(png_color{palette[i], palette[i + 1], palette[i + 2]});
  if (color_type == PNG_COLOR_TYPE_PALETTE)
    png_set_PLTE(png, info, colors.data(), static_cast<int>(colors.size()));
  png_write_info(png, info);
  const int channels = color_type == PNG_COLOR_TYPE_RGB         ? 3
                       : color_type == PNG_COLOR_TYPE_RGB_ALPHA ? 4
                                                                : 1;
  const std::size_t row = static_cast<std::size_t>(w) * channels * (bit_depth / 8);
  for (int y = 0; y < h; ++y)
    png_write_row(png, data.data() + row * static_cast<std::size_t>(y));
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  std::fclose(f);
}

// w*h RGB pixels of one colour.
inline std::vector<std::uint8_t> solid(int w, int h, std::uint8_t r, std::uint8_t g,
                                       std::uint8_t b) {
  std::vector<std::uint8_t> px(static_cast<std::size_t>(w) * h * 3);
  for (std::size_t i = 0; i < px.size(); i += 3)
    px[i] = r, px[i + 1] = g, px[i + 2] = b;
  return px;
}

}  // namespace lockstep::test

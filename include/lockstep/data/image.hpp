// Image files to samples: JPEG (libjpeg-turbo, through libjpeg's own API) and PNG (libpng) decoded
// to 8-bit RGB, then resized to the fixed square u8 [3, S, S] samples an image shard holds
// (docs/IMAGES.md). Every decoded image is RGB whatever the file stores, as torchvision's
// ImageFolder makes it with PIL's convert("RGB"): grayscale is replicated, CMYK/YCCK JPEG
// converted, 16-bit PNG scaled to 8 bits, palettes expanded, alpha dropped. Unlike PIL, a JPEG's
// EXIF orientation is applied, so a sample is upright as a viewer shows it. Any file that cannot be
// decoded completely (empty, truncated, corrupt, not an image) is a lockstep::Error naming the file
// and what is wrong. A JPEG region decodes only what the region needs, to the same pixels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::data {

struct Image {
  std::int64_t width = 0, height = 0;
  std::vector<std::uint8_t> rgb;  // height * width * 3: rows top to bottom, pixels R,G,B
};

// Decodes a file (JPEG or PNG, told by its first bytes, not its name). min_side > 0 allows a JPEG
// to be decoded at a reduced DCT scale (1/2, 1/4, 1/8) as long as its shorter side stays at least
// min_side: the resize that follows then reads up to 64 times fewer pixels.
Image read_image(const std::string& path, std::int64_t min_side = 0);
// The same over bytes in memory; `where` names them in errors.
Image decode_image(const std::uint8_t* data, std::size_t size, const std::string& where,
                   std::int64_t min_side = 0);
// A JPEG decoded at 1/denominator of its size (1, 2, 4 or 8; each side rounded up, as
// libjpeg-turbo scales); a PNG always at full size.
Image decode_image_scaled(const std::uint8_t* data, std::size_t size, const std::string& where,
                          int denominator);
// A rectangle of whole pixels: rows [top, top + height), columns [left, left + width).
struct PixelRect {
  std::int64_t top = 0, left = 0, height = 0, width = 0;
};

// Part of a decoded image: `image` holds pixels [top, top + image.height) x [left, left +
// image.width) of the whole decoded image.
struct ImageRegion {
  Image image;
  std::int64_t top = 0, left = 0;
};

// At least the upright pixels `wanted` of the image decode_image_scaled(data, size, where,
// denominator) gives, bit for bit the same values, into `out` (whose buffer is reused). A JPEG
// decodes only the rows and columns the region needs, plus what libjpeg decodes with them (whole
// blocks at the left, a pixel of margin so that chroma upsampling sees the same neighbours) and
// stops after the region's last row, so corruption below the region goes unnoticed: for bytes
// that decode_image has checked once already (an encoded shard's). A PNG is decoded whole.
void decode_image_region(const std::uint8_t* data, std::size_t size, const std::string& where,
                         int denominator, const PixelRect& wanted, ImageRegion& out);

// Buffers a thread keeps from image to image (decoder output, resampler rows), so that a loader
// thread allocates nothing per sample, are freed instead after an outsized image has grown one
// past this: a thread does not hold a 100-megapixel photo's worth of memory for its lifetime.
inline constexpr std::size_t kKeptBufferBytes = std::size_t{32} << 20;
template <class T>
void release_if_outsized(std::vector<T>& buffer) {
  if (buffer.capacity() * sizeof(T) > kKeptBufferBytes) std::vector<T>().swap(buffer);
}

// The file's bytes, with the errors read_image gives for a file it cannot read.
std::vector<std::uint8_t> read_image_bytes(const std::string& path);

// The JPEG `data` re-encoded losslessly: the same DCT coefficients, quantisation and sampling, so
// the same pixels from any decoder, as one baseline scan with optimised Huffman tables (usually
// smaller than the original) and restart markers every few MCUs, tiling each MCU row, so that
// decode_image_region reads only the entropy-coded data a region touches (docs/IMAGES.md). EXIF,
// ICC and comments are kept. Empty when `data` is not a JPEG it can re-encode (not 8-bit, corrupt):
// the caller keeps the original bytes then.
std::vector<std::uint8_t> jpeg_with_restarts(const std::uint8_t* data, std::size_t size);

// The upright size of an encoded image (EXIF orientation applied) from its header alone, so the
// loader can place a crop before it decodes. Throws as decode_image for what is not an image.
struct EncodedImageInfo {
  std::int64_t width = 0, height = 0;
  bool jpeg = false;  // only a JPEG can be decoded at a reduced scale
};
EncodedImageInfo encoded_image_info(const std::uint8_t* data, std::size_t size,
                                    const std::string& where);

// The reduced scale decode_image picks: the largest of 1, 2, 4, 8 that keeps the shorter side of
// a w x h region (full-size pixels) at least min_side pixels (1 when min_side <= 0).
int jpeg_scale_denominator(std::int64_t w, std::int64_t h, std::int64_t min_side);

// How a non-square image becomes side x side: CenterCrop scales the shorter side to `side` and
// cuts the middle of the longer one (torchvision's Resize(S) + CenterCrop(S)); Pad scales the
// longer side to `side` and fills the rest with black, keeping the whole image.
enum class ImageFit { CenterCrop, Pad };
ImageFit image_fit_from_name(const std::string& name);  // "crop" or "pad"
const char* image_fit_name(ImageFit fit);

// Resizes with an antialiasing triangle filter (PIL's bilinear: the filter widens by the
// downscaling factor, so every source pixel counts) and writes u8 [3, side, side] (channel-major,
// as the shard stores it) to out. Deterministic: the same bytes on every rank of one build.
void resize_to_square(const Image& image, std::int64_t side, ImageFit fit, std::uint8_t* out);

// Resizes the region [top, top + h) x [left, left + w) of a decoded image to u8 [3, out_h, out_w]
// with the same filter, reading nothing outside the pixels it touches (as cropping first would):
// the loader's random-resized-crop of an encoded sample (lockstep/data/augment.hpp). The region
// may have fractional edges: a crop of the full-size photo placed on a JPEG decoded at 1/2.
void resize_region(const Image& image, double top, double left, double h, double w,
                   std::int64_t out_h, std::int64_t out_w, std::uint8_t* out);

// Resizes the region [top, top + h) x [left, left + w) of a channel-major u8 [channels, H, W]
// sample to [channels, out_h, out_w] with the same filter: the loader's
// random-resized-crop (lockstep/data/augment.hpp).
void resize_region(const std::uint8_t* in, std::int64_t channels, std::int64_t H, std::int64_t W,
                   std::int64_t top, std::int64_t left, std::int64_t h, std::int64_t w,
                   std::int64_t out_h, std::int64_t out_w, std::uint8_t* out);

// Whether the resizes above may use their AVX-512 code where the CPU has AVX-512F and AVX-512BW
// (the default): it gives the same bytes as the code every x86-64 CPU runs, which `false` forces.
// Returns the setting before. For tests (both paths on one machine) and benchmarks.
bool allow_avx512_resampler(bool allow);

}  // namespace lockstep::data

#include "lockstep/data/image.hpp"

#include <png.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <utility>

#include <jpeglib.h>  // after <cstdio>: it needs FILE and size_t declared
#ifdef __SSE2__
#include <emmintrin.h>  // in every x86-64 build: the rounding's clamps and packs
#endif
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>  // the resampler's AVX-512 code, run where the CPU has AVX-512F and BW
#define LOCKSTEP_RESAMPLE_AVX512 1
#endif

#include "lockstep/core/error.hpp"
#include "lockstep/core/file.hpp"
#include "lockstep/core/simd_clones.hpp"

namespace lockstep::data {

namespace {

constexpr const char* kBadFileHint = "replace or remove the file, or pass --skip-bad to skip it";
// The largest image decoded (2^28 pixels, 768 MiB as RGB): a corrupt header cannot make a rank
// allocate more.
constexpr std::int64_t kMaxPixels = std::int64_t{1} << 28;

}  // namespace

std::vector<std::uint8_t> read_image_bytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  LOCKSTEP_CHECK_HINT(f, kBadFileHint, path, ": cannot open: ", errno_text());
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> closer(f, std::fclose);
  std::vector<std::uint8_t> bytes;
  std::uint8_t buf[1 << 16];
  for (;;) {
    std::size_t n = std::fread(buf, 1, sizeof buf, f);
    bytes.insert(bytes.end(), buf, buf + n);
    if (n < sizeof buf) break;
  }
  LOCKSTEP_CHECK_HINT(!std::ferror(f), kBadFileHint, path, ": cannot read: ", errno_text());
  return bytes;
}

int jpeg_scale_denominator(std::int64_t w, std::int64_t h, std::int64_t min_side) {
  // Only 1/2, 1/4, 1/8: libjpeg-turbo's SIMD has those scaled IDCTs; the others (3/8, 5/8, ...)
  // decoded 500x375 JPEGs more slowly than full size did (docs/IMAGES.md). A side scales as
  // libjpeg-turbo scales it (TJSCALED: rounded up).
  if (min_side <= 0) return 1;
  const std::int64_t shorter = std::min(w, h);
  int best = 1;
  for (int d : {2, 4, 8})
    if ((shorter + d - 1) / d >= min_side) best = d;
  return best;
}

namespace {

// ---- JPEG header segments: visit(marker, at, payload, payload_size) for each segment after SOI
// (`at`: its 0xFF), fill bytes skipped, up to and including SOS; a visit returning false stops the
// walk. Returns where the entropy-coded data starts (after SOS), or 0 when the walk stopped or the
// headers end (EOI, the data's end, a malformed segment) before a scan.
template <typename Visit>
std::size_t walk_jpeg_headers(const std::uint8_t* d, std::size_t n, Visit&& visit) {
  for (std::size_t p = 2;;) {  // after SOI
    while (p + 1 < n && d[p] == 0xFF && d[p + 1] == 0xFF)
      ++p;
    if (p + 4 > n || d[p] != 0xFF || d[p + 1] == 0xD9) return 0;
    const int marker = d[p + 1];
    const std::size_t len = std::size_t{d[p + 2]} << 8 | d[p + 3];
    if (len < 2 || p + 2 + len > n || !visit(marker, p, d + p + 4, len - 2)) return 0;
    p += 2 + len;
    if (marker == 0xDA) return p;
  }
}

// ---- EXIF orientation: tag 0x0112 of IFD0 in an APP1 "Exif" segment, 1 (upright) when absent.
int exif_orientation(const std::uint8_t* d, std::size_t n) {
  int orientation = 1;
  walk_jpeg_headers(d, n, [&](int marker, std::size_t, const std::uint8_t* s, std::size_t sn) {
    if (marker != 0xE1 || sn < 14 || std::memcmp(s, "Exif\0\0", 6) != 0) return true;
    // The first Exif segment decides.
    const std::uint8_t* t = s + 6;  // the TIFF header
    const std::size_t tn = sn - 6;
    const bool le = t[0] == 'I' && t[1] == 'I';
    if (!le && !(t[0] == 'M' && t[1] == 'M')) return false;
    auto u16 = [&](std::size_t o) { return le ? t[o] | t[o + 1] << 8 : t[o] << 8 | t[o + 1]; };
    auto u32 = [&](std::size_t o) {
      return le ? std::uint32_t(u16(o)) | std::uint32_t(u16(o + 2)) << 16
                : std::uint32_t(u16(o)) << 16 | std::uint32_t(u16(o + 2));
    };
    const std::size_t ifd = u32(4);
    if (ifd + 2 > tn) return false;
    const int entries = u16(ifd);
    for (int e = 0; e < entries; ++e) {
      const std::size_t o = ifd + 2 + 12 * static_cast<std::size_t>(e);
      if (o + 12 > tn) break;
      if (u16(o) == 0x0112) {
        const int v = u16(o + 8);
        orientation = v >= 1 && v <= 8 ? v : 1;
        break;
      }
    }
    return false;
  });
  return orientation;
}

// Turns the stored pixels upright as EXIF orientation `o` says a viewer must show them.
void apply_orientation(Image& img, int o) {
  if (o == 1) return;
  const std::int64_t w = img.width, h = img.height;
  const bool swap = o >= 5;
  Image out;
  out.width = swap ? h : w;
  out.height = swap ? w : h;
  out.rgb.resize(img.rgb.size());
  for (std::int64_t y = 0; y < out.height; ++y) {
    for (std::int64_t x = 0; x < out.width; ++x) {
      std::int64_t sx = x, sy = y;
      switch (o) {
        case 2:
          sx = w - 1 - x;
          break;
        case 3:
          sx = w - 1 - x, sy = h - 1 - y;
          break;
        case 4:
          sy = h - 1 - y;
          break;
        case 5:
          sx = y, sy = x;
          break;  // transpose
        case 6:
          sx = y, sy = h - 1 - x;
          break;  // rotate 90 clockwise
        case 7:
          sx = w - 1 - y, sy = h - 1 - x;
          break;  // transverse
        case 8:
          sx = w - 1 - y, sy = x;
          break;  // rotate 90 counter-clockwise
      }
      std::memcpy(&out.rgb[static_cast<std::size_t>((y * out.width + x) * 3)],
                  &img.rgb[static_cast<std::size_t>((sy * w + sx) * 3)], 3);
    }
  }
  img = std::move(out);
}

// ---- JPEG through libjpeg's own API (libjpeg-turbo's): unlike TurboJPEG 2.1 it can decode a
// region, jpeg_crop_scanline for the columns and jpeg_skip_scanlines for the rows above. Every
// decode uses the settings tjDecompress2 used (RGB or CMYK out, the accurate integer IDCT, fancy
// upsampling), so the pixels are the ones the TurboJPEG decode gave.

// libjpeg reports an error, or a warning (which fails a decode here too: a truncated file's
// "Premature end of JPEG file", corrupt data that libjpeg papers over with grey: a half-grey
// sample is a silently wrong sample), by calling these, which keep libjpeg's words and longjmp
// back to JpegDecoder::guarded.
struct JpegErrors {
  jpeg_error_mgr mgr;  // first: libjpeg hands back a pointer to it
  std::jmp_buf jump;
  bool warning;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void jpeg_on_error(j_common_ptr cinfo) {
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  errors->warning = false;
  cinfo->err->format_message(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

void jpeg_on_message(j_common_ptr cinfo, int level) {
  if (level >= 0) return;  // trace messages
  auto* errors = reinterpret_cast<JpegErrors*>(cinfo->err);
  errors->warning = true;
  cinfo->err->format_message(cinfo, errors->message);
  std::longjmp(errors->jump, 1);
}

// One per thread, reused image after image (a decompressor is a few allocations and tables).
class JpegDecoder {
 public:
  JpegDecoder() {
    cinfo_.err = jpeg_std_error(&errors_.mgr);
    errors_.mgr.error_exit = jpeg_on_error;
    errors_.mgr.emit_message = jpeg_on_message;
    if (setjmp(errors_.jump) != 0)
      LOCKSTEP_FAIL("cannot start the JPEG decoder: ", errors_.message);
    jpeg_create_decompress(&cinfo_);
  }
  ~JpegDecoder() { jpeg_destroy_decompress(&cinfo_); }
  JpegDecoder(const JpegDecoder&) = delete;
  JpegDecoder& operator=(const JpegDecoder&) = delete;

  static JpegDecoder& for_this_thread() {
    thread_local JpegDecoder decoder;
    return decoder;
  }

  jpeg_decompress_struct* cinfo() { return &cinfo_; }
  const JpegErrors& errors() const { return errors_; }

  // Runs fn, which calls libjpeg, with its error exits aimed here: false (and the decompressor
  // reset for the next image) when libjpeg reported an error or a warning. The longjmp skips
  // fn's frame and libjpeg's, so fn must hold nothing with a destructor (only pointers and
  // numbers): the buffers it fills are made before.
  template <class Fn>
  bool guarded(Fn&& fn) {
    if (setjmp(errors_.jump) != 0) {
      jpeg_abort_decompress(&cinfo_);
      return false;
    }
    fn();
    return true;
  }

  // Reads the header of `data`: the image's size and colour space, ready for a decode; throws
  // as decode_image for what is not a JPEG it can decode. A decode that throws after this leaves
  // the decompressor mid-image: the next read_header resets it.
  void read_header(const std::uint8_t* data, std::size_t size, const std::string& where) {
    jpeg_abort_decompress(&cinfo_);  // whatever the last image left (a throw after its header)
    const bool ok = guarded([&] {
      jpeg_mem_src(&cinfo_, data, static_cast<unsigned long>(size));
      jpeg_read_header(&cinfo_, TRUE);
    });
    LOCKSTEP_CHECK_HINT(ok, kBadFileHint, where, ": corrupt JPEG header: ", errors_.message);
    const std::int64_t w = cinfo_.image_width, h = cinfo_.image_height;
    const J_COLOR_SPACE cs = cinfo_.jpeg_color_space;
    const bool known =
        cs == JCS_GRAYSCALE || cs == JCS_RGB || cs == JCS_YCbCr || cs == JCS_CMYK || cs == JCS_YCCK;
    LOCKSTEP_CHECK_HINT(known, kBadFileHint, where,
                        ": corrupt JPEG header: an unknown colour space of ", cinfo_.num_components,
                        " components");
    LOCKSTEP_CHECK_HINT(w >= 1 && h >= 1, kBadFileHint, where,
                        ": corrupt JPEG header: an image of ", w, "x", h, " pixels");
    // A few bytes of header can claim 65535 x 65535 pixels (12 GiB): refuse what no photo needs.
    LOCKSTEP_CHECK_HINT(w * h <= kMaxPixels, kBadFileHint, where, ": claims ", w, "x", h,
                        " pixels, more than ", kMaxPixels, " (corrupt, or not a photo)");
  }

  bool cmyk() const {
    return cinfo_.jpeg_color_space == JCS_CMYK || cinfo_.jpeg_color_space == JCS_YCCK;
  }

 private:
  jpeg_decompress_struct cinfo_{};
  JpegErrors errors_{};
};

// The stored pixels that upright pixels `r` of an image shown with EXIF orientation `o` come
// from, in an image stored w x h (apply_orientation's mapping, taken at two corners).
PixelRect stored_rect(const PixelRect& r, int o, std::int64_t w, std::int64_t h) {
  auto stored = [&](std::int64_t x, std::int64_t y) {
    switch (o) {
      case 2:
        return std::pair{w - 1 - x, y};
      case 3:
        return std::pair{w - 1 - x, h - 1 - y};
      case 4:
        return std::pair{x, h - 1 - y};
      case 5:
        return std::pair{y, x};
      case 6:
        return std::pair{y, h - 1 - x};
      case 7:
        return std::pair{w - 1 - y, h - 1 - x};
      case 8:
        return std::pair{w - 1 - y, x};
      default:
        return std::pair{x, y};
    }
  };
  const auto [ax, ay] = stored(r.left, r.top);
  const auto [bx, by] = stored(r.left + r.width - 1, r.top + r.height - 1);
  return {std::min(ay, by), std::min(ax, bx), std::abs(by - ay) + 1, std::abs(bx - ax) + 1};
}

// ---- Restart markers. A JPEG's entropy-coded data must be read from its start up to the last
// row a decode wants (jpeg_skip_scanlines skips the rest of the work but not that), and whole rows
// of it: the Huffman decode of the rows above a crop and the columns beside it was most of a
// random-resized-crop's cost. Restart markers (RSTn) cut the data into intervals of a fixed
// number of MCUs that decode independently (each starts its DC prediction afresh). When the
// intervals tile every MCU row (the interval divides the MCUs a row holds), the intervals a region
// touches form a smaller JPEG of their own: the headers with the smaller size, those intervals in
// order with their markers renumbered. lockstep-shard --store=encoded re-encodes each JPEG with
// such markers (jpeg_with_restarts, losslessly); any JPEG that has them is cut this way.

// Where a baseline JPEG's restart intervals lie, when they tile its MCU rows.
struct RestartIndex {
  std::size_t sof = 0;   // the SOF marker
  std::size_t scan = 0;  // the first byte of the entropy-coded data
  std::int64_t width = 0, height = 0, mcu_w = 0, mcu_h = 0, mcus_per_row = 0, mcu_rows = 0;
  std::int64_t interval = 0;  // MCUs per restart interval
  // The margin a cut keeps beside a region, in pixels: an MCU across a direction in which some
  // component is subsampled (chroma upsampling reads its neighbour sample there), else none.
  std::int64_t margin_x = 0, margin_y = 0;
  std::vector<std::size_t> begin, end;  // interval k's bytes [begin[k], end[k])
};

// True, with `ix` filled in, when `d` is a sequential Huffman-coded JPEG of one scan that holds
// every component, with restart intervals that tile its MCU rows: what jpeg_with_restarts writes.
// False for anything else (which then decodes as it always did), corrupt markers included.
bool index_restarts(const std::uint8_t* d, std::size_t n, RestartIndex& ix) {
  ix.sof = ix.scan = 0;
  ix.interval = 0;
  int components = 0, hmax = 1, vmax = 1, hmin = 4, vmin = 4;
  ix.scan = walk_jpeg_headers(
      d, n, [&](int marker, std::size_t at, const std::uint8_t* s, std::size_t sn) {
        if (marker == 0xC0 || marker == 0xC1) {  // baseline or extended sequential, Huffman
          if (sn < 6 || s[0] != 8) return false;
          ix.sof = at;
          ix.height = s[1] << 8 | s[2];
          ix.width = s[3] << 8 | s[4];
          components = s[5];
          if (components < 1 || sn < 6 + 3 * std::size_t(components)) return false;
          for (int c = 0; c < components; ++c) {
            hmax = std::max(hmax, s[7 + 3 * c] >> 4);
            vmax = std::max(vmax, s[7 + 3 * c] & 15);
            hmin = std::min(hmin, s[7 + 3 * c] >> 4);
            vmin = std::min(vmin, s[7 + 3 * c] & 15);
          }
          return true;
        }
        if ((marker >= 0xC2 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 &&
             marker != 0xCC) ||
            marker == 0xDC)
          return false;  // progressive, lossless or arithmetic-coded; a DNL-defined height
        if (marker == 0xDD) {
          if (sn != 2) return false;
          ix.interval = s[0] << 8 | s[1];
        }
        // One scan of every component, or not ours.
        return marker != 0xDA || (ix.sof != 0 && sn >= 1 && s[0] == components);
      });
  if (ix.scan == 0 || ix.interval <= 0 || ix.width < 1 || ix.height < 1) return false;
  // One component is not interleaved: its MCU is one 8x8 block whatever its sampling factors.
  ix.mcu_w = components == 1 ? 8 : 8 * hmax;
  ix.mcu_h = components == 1 ? 8 : 8 * vmax;
  ix.margin_x = components > 1 && hmin < hmax ? ix.mcu_w : 0;
  ix.margin_y = components > 1 && vmin < vmax ? ix.mcu_h : 0;
  ix.mcus_per_row = (ix.width + ix.mcu_w - 1) / ix.mcu_w;
  ix.mcu_rows = (ix.height + ix.mcu_h - 1) / ix.mcu_h;
  if (ix.mcus_per_row % ix.interval != 0) return false;
  const auto count = static_cast<std::size_t>(ix.mcus_per_row / ix.interval * ix.mcu_rows);
  ix.begin.clear();
  ix.end.clear();
  ix.begin.push_back(ix.scan);
  // The markers in the data: 0xFF 0x00 is a stuffed 0xFF, 0xFF 0xFF fill, RSTn ends an interval
  // (n counting 0 to 7 and round), EOI the last; any other marker (a second scan) is not ours.
  for (std::size_t q = ix.scan;;) {
    const auto* f = static_cast<const std::uint8_t*>(std::memchr(d + q, 0xFF, n - q));
    if (!f || f + 1 >= d + n) return false;
    q = static_cast<std::size_t>(f - d);
    const int b = d[q + 1];
    if (b == 0x00) {
      q += 2;
    } else if (b == 0xFF) {
      q += 1;
    } else if (b >= 0xD0 && b <= 0xD7) {
      if (b - 0xD0 != static_cast<int>((ix.end.size()) & 7) || ix.begin.size() >= count)
        return false;
      ix.end.push_back(q);
      ix.begin.push_back(q + 2);
      q += 2;
    } else if (b == 0xD9) {
      ix.end.push_back(q);
      break;
    } else {
      return false;
    }
  }
  return ix.begin.size() == count;
}

// A JPEG of the restart intervals that stored pixels `want` (at 1/denominator) of the image `ix`
// indexes need, with a margin of an MCU where chroma is subsampled (so that its upsampling, and
// the decoder's context rows for it, see what they see in the whole image), into `out`; (top,
// left): where its first pixel lies in the image at 1/denominator. False when that would be the
// whole image.
bool restart_region(const std::uint8_t* d, const RestartIndex& ix, const PixelRect& want,
                    int denominator, std::vector<std::uint8_t>& out, std::int64_t& top,
                    std::int64_t& left) {
  const std::int64_t first_row = want.top * denominator;
  const std::int64_t last_row = std::min(ix.height, (want.top + want.height) * denominator) - 1;
  const std::int64_t first_col = want.left * denominator;
  const std::int64_t last_col = std::min(ix.width, (want.left + want.width) * denominator) - 1;
  const std::int64_t span = ix.interval * ix.mcu_w;  // pixels an interval covers in a row
  const std::int64_t per_row = ix.mcus_per_row / ix.interval;
  const std::int64_t r0 = std::max<std::int64_t>(0, first_row - ix.margin_y) / ix.mcu_h;
  const std::int64_t r1 = std::min(ix.height - 1, last_row + ix.margin_y) / ix.mcu_h + 1;
  const std::int64_t s0 = std::max<std::int64_t>(0, first_col - ix.margin_x) / span;
  const std::int64_t s1 = std::min(ix.width - 1, last_col + ix.margin_x) / span + 1;
  if (r0 == 0 && r1 == ix.mcu_rows && s0 == 0 && s1 == per_row) return false;
  const std::int64_t y = r0 * ix.mcu_h, x = s0 * span;
  const std::int64_t h = std::min(ix.height, r1 * ix.mcu_h) - y;
  const std::int64_t w = std::min(ix.width, s1 * span) - x;
  out.assign(d, d + ix.scan);  // the headers, then the size in the SOF
  out[ix.sof + 5] = static_cast<std::uint8_t>(h >> 8);
  out[ix.sof + 6] = static_cast<std::uint8_t>(h);
  out[ix.sof + 7] = static_cast<std::uint8_t>(w >> 8);
  out[ix.sof + 8] = static_cast<std::uint8_t>(w);
  int marker = 0;
  for (std::int64_t r = r0; r < r1; ++r) {
    for (std::int64_t s = s0; s < s1; ++s) {
      if (r != r0 || s != s0) {
        out.push_back(0xFF);
        out.push_back(static_cast<std::uint8_t>(0xD0 + (marker++ & 7)));
      }
      const auto k = static_cast<std::size_t>(r * per_row + s);
      out.insert(out.end(), d + ix.begin[k], d + ix.end[k]);
    }
  }
  out.push_back(0xFF);
  out.push_back(0xD9);  // EOI
  // Multiples of 8 (an MCU's side) over a denominator of at most 8: whole pixels.
  top = y / denominator;
  left = x / denominator;
  return true;
}

// Decodes the upright pixels `wanted` (nullptr: all) of a JPEG at 1/denominator (0: the scale
// jpeg_scale_denominator allows for min_side) into out. A decode of the whole image reads it to
// its end and checks it all; a region's stops after the region's last row.
void decode_jpeg(const std::uint8_t* data, std::size_t size, const std::string& where,
                 std::int64_t min_side, int denominator, const PixelRect* wanted,
                 ImageRegion& out) {
  JpegDecoder& dec = JpegDecoder::for_this_thread();
  jpeg_decompress_struct* cinfo = dec.cinfo();
  dec.read_header(data, size, where);
  const std::int64_t full_w = cinfo->image_width, full_h = cinfo->image_height;
  if (denominator == 0) denominator = jpeg_scale_denominator(full_w, full_h, min_side);
  LOCKSTEP_CHECK(denominator == 1 || denominator == 2 || denominator == 4 || denominator == 8,
                 where, ": JPEG scale 1/", denominator, " is not one of 1, 1/2, 1/4, 1/8");
  const bool cmyk = dec.cmyk();
  auto settings = [&] {
    cinfo->out_color_space = cmyk ? JCS_CMYK : JCS_EXT_RGB;
    cinfo->scale_num = 1;
    cinfo->scale_denom = static_cast<unsigned>(denominator);
    cinfo->dct_method = JDCT_ISLOW;
    cinfo->do_fancy_upsampling = TRUE;
  };
  settings();
  // Sides scaled as libjpeg scales them (rounded up: TurboJPEG's TJSCALED).
  std::int64_t sw = (full_w + denominator - 1) / denominator;
  std::int64_t sh = (full_h + denominator - 1) / denominator;
  const int orientation = exif_orientation(data, size);
  const bool swap = orientation >= 5;
  const std::int64_t uw = swap ? sh : sw, uh = swap ? sw : sh;  // upright
  const PixelRect all{0, 0, uh, uw};
  const PixelRect up = wanted ? *wanted : all;
  const bool in_image = up.top >= 0 && up.left >= 0 && up.height >= 1 && up.width >= 1 &&
                        up.top + up.height <= uh && up.left + up.width <= uw;
  LOCKSTEP_CHECK(in_image, where, ": region ", up.height, "x", up.width, " at (", up.top, ", ",
                 up.left, ") is outside the ", uh, "x", uw, " image decoded at 1/", denominator);
  PixelRect want = stored_rect(up, orientation, sw, sh);
  const bool whole = want.width == sw && want.height == sh;
  // A region of a JPEG with restart markers decodes from a JPEG of the intervals it touches,
  // whose first pixel is (cut_top, cut_left) of the image: the same pixels (the cut keeps the
  // margin chroma upsampling needs), from less entropy-coded data.
  std::int64_t cut_top = 0, cut_left = 0;
  thread_local RestartIndex index;
  thread_local std::vector<std::uint8_t> cut;
  if (!whole && index_restarts(data, size, index) &&
      restart_region(data, index, want, denominator, cut, cut_top, cut_left)) {
    dec.read_header(cut.data(), cut.size(), where);
    settings();
    sw = (static_cast<std::int64_t>(cinfo->image_width) + denominator - 1) / denominator;
    sh = (static_cast<std::int64_t>(cinfo->image_height) + denominator - 1) / denominator;
    want.top -= cut_top;
    want.left -= cut_left;
  }
  // Fancy (smooth) chroma upsampling reads the chroma sample beside the pixel's: at the edge of a
  // cropped decode libjpeg repeats the edge sample instead, so the columns next to the crop's
  // edges come out differently from the full decode's. One column of margin on either side keeps
  // the wanted ones identical (rows need none: jpeg_skip_scanlines keeps the context rows;
  // test_image.cpp's ARegionDecodesToTheWholeDecodesPixelsAndLittleMore checks both).
  const std::int64_t x0 = std::max<std::int64_t>(0, want.left - 1);
  const std::int64_t x1 = std::min(sw, want.left + want.width + 1);
  const int channels = cmyk ? 4 : 3;
  // Pixels straight into out when they need no conversion; else through a buffer.
  const bool direct = !cmyk && orientation == 1;
  thread_local std::vector<std::uint8_t> converted;
  std::vector<std::uint8_t>& buffer = direct ? out.image.rgb : converted;
  buffer.resize(static_cast<std::size_t>((x1 - x0) + 32) * want.height * channels);
  thread_local std::vector<JSAMPROW> rows;
  rows.resize(static_cast<std::size_t>(want.height));
  JDIMENSION xoffset = static_cast<JDIMENSION>(x0), width = static_cast<JDIMENSION>(x1 - x0);
  const bool ok = dec.guarded([&] {
    jpeg_start_decompress(cinfo);
    // Moves xoffset left to a block boundary and widens `width` to match: at most 32 columns
    // more (an iMCU: 8 pixels times a sampling factor of at most 4), which the buffer allows.
    jpeg_crop_scanline(cinfo, &xoffset, &width);
    const std::size_t pitch = static_cast<std::size_t>(width) * channels;
    for (std::size_t y = 0; y < rows.size(); ++y)
      rows[y] = buffer.data() + y * pitch;
    if (want.top > 0) jpeg_skip_scanlines(cinfo, static_cast<JDIMENSION>(want.top));
    const auto end = static_cast<JDIMENSION>(want.top + want.height);
    while (cinfo->output_scanline < end)
      jpeg_read_scanlines(cinfo, &rows[cinfo->output_scanline - want.top],
                          end - cinfo->output_scanline);
    if (whole) {
      jpeg_finish_decompress(cinfo);
    } else {
      jpeg_abort_decompress(cinfo);
    }
  });
  if (!ok) {
    LOCKSTEP_FAIL_HINT(
        kBadFileHint, where,
        dec.errors().warning ? ": truncated or corrupt JPEG data: " : ": cannot decode the JPEG: ",
        dec.errors().message);
  }
  const auto decoded_w = static_cast<std::int64_t>(width);
  if (direct) {
    out.image.width = decoded_w;
    out.image.height = want.height;
    out.image.rgb.resize(static_cast<std::size_t>(decoded_w * want.height * 3));
    out.top = cut_top + want.top;
    out.left = cut_left + static_cast<std::int64_t>(xoffset);
    release_if_outsized(cut);
    return;
  }
  // The stored pixels `want` as RGB, then turned upright: exactly the region asked for.
  Image& img = out.image;
  img.width = want.width;
  img.height = want.height;
  img.rgb.resize(static_cast<std::size_t>(want.width * want.height * 3));
  const std::int64_t skip = want.left - static_cast<std::int64_t>(xoffset);
  for (std::int64_t y = 0; y < want.height; ++y) {
    const std::uint8_t* src = buffer.data() + (y * decoded_w + skip) * channels;
    std::uint8_t* dst = img.rgb.data() + y * want.width * 3;
    if (!cmyk) {
      std::memcpy(dst, src, static_cast<std::size_t>(want.width * 3));
      continue;
    }
    // Inverted CMYK, as Photoshop stores it and libjpeg-turbo reads it: a channel times K.
    for (std::int64_t x = 0; x < want.width; ++x) {
      const int k = src[x * 4 + 3];
      for (int c = 0; c < 3; ++c)
        dst[x * 3 + c] = static_cast<std::uint8_t>((src[x * 4 + c] * k + 127) / 255);
    }
  }
  release_if_outsized(converted);
  release_if_outsized(cut);
  apply_orientation(img, orientation);
  out.top = up.top;
  out.left = up.left;
}

Image decode_jpeg_whole(const std::uint8_t* data, std::size_t size, const std::string& where,
                        std::int64_t min_side, int denominator) {
  ImageRegion region;
  decode_jpeg(data, size, where, min_side, denominator, nullptr, region);
  return std::move(region.image);
}

// libpng reports errors by longjmp: the decode runs in a function without C++ objects that
// need destructors between setjmp and the calls that may jump.
struct PngSource {
  const std::uint8_t* data;
  std::size_t size, pos;
  char message[256];
  std::jmp_buf jump;
};

void png_read_bytes(png_structp png, png_bytep out, png_size_t n) {
  auto* src = static_cast<PngSource*>(png_get_io_ptr(png));
  if (n > src->size - src->pos) png_error(png, "the file ends early (truncated)");
  std::memcpy(out, src->data + src->pos, n);
  src->pos += n;
}
void png_on_error(png_structp png, png_const_charp message) {
  auto* src = static_cast<PngSource*>(png_get_error_ptr(png));
  std::snprintf(src->message, sizeof src->message, "%s", message);
  std::longjmp(src->jump, 1);
}
void png_on_warning(png_structp, png_const_charp) {}  // e.g. an incorrect sRGB profile: harmless

// Fills width/height/rows; returns false with src->message set on a libpng error.
bool png_decode_raw(PngSource* src, png_uint_32* width, png_uint_32* height,
                    std::vector<std::uint8_t>* rgb) {
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, src, png_on_error, png_on_warning);
  if (!png) {
    std::snprintf(src->message, sizeof src->message, "out of memory");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  // volatile: set after setjmp and read after the longjmp, so it must live in memory, not in a
  // register that the jump restores (else the row table leaks; LeakSanitizer caught it).
  png_bytep* volatile rows = nullptr;
  if (setjmp(src->jump)) {
    std::free(rows);
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  if (!info) png_error(png, "out of memory");
  png_set_read_fn(png, src, png_read_bytes);
  png_read_info(png, info);
  *width = png_get_image_width(png, info);
  *height = png_get_image_height(png, info);
  if (std::int64_t(*width) * *height > kMaxPixels)
    png_error(png, "claims more than 2^28 pixels (corrupt, or not a photo)");
  png_set_expand(png);    // palette -> RGB, gray < 8 bits -> 8 bits, tRNS -> alpha
  png_set_scale_16(png);  // 16 -> 8 bits, rounded
  png_set_strip_alpha(png);
  png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != std::size_t(*width) * 3) png_error(png, "unexpected layout");
  rgb->resize(std::size_t(*width) * *height * 3);
  rows =
      static_cast<png_bytep*>(std::malloc(sizeof(png_bytep) * std::max<png_uint_32>(*height, 1)));
  if (!rows) png_error(png, "out of memory");
  for (png_uint_32 y = 0; y < *height; ++y)
    rows[y] = rgb->data() + std::size_t(y) * *width * 3;
  png_read_image(png, rows);
  png_read_end(png, nullptr);
  std::free(rows);
  png_destroy_read_struct(&png, &info, nullptr);
  return true;
}

Image decode_png(const std::uint8_t* data, std::size_t size, const std::string& where) {
  PngSource src{data, size, 0, {}, {}};
  png_uint_32 w = 0, h = 0;
  std::vector<std::uint8_t> rgb;
  LOCKSTEP_CHECK_HINT(png_decode_raw(&src, &w, &h, &rgb), kBadFileHint, where,
                      ": cannot decode the PNG: ", src.message);
  return Image{w, h, std::move(rgb)};
}

// Sampling weights of one axis: output position o (of size(), shifted by `offset` in the scaled
// image) takes input positions first[o] .. first[o] + taps(o) - 1 with weights
// weights[begin[o] ...] (flat: one allocation per axis, not one per output).
struct AxisWeights {
  std::vector<std::int64_t> first;
  std::vector<std::int64_t> begin{0};
  std::vector<float> weights;

  std::int64_t size() const { return static_cast<std::int64_t>(first.size()); }
  std::int64_t taps(std::int64_t o) const {
    return begin[static_cast<std::size_t>(o + 1)] - begin[static_cast<std::size_t>(o)];
  }
  const float* weights_of(std::int64_t o) const {
    return weights.data() + begin[static_cast<std::size_t>(o)];
  }
  // The input positions [lo, hi) that some output reads.
  std::pair<std::int64_t, std::int64_t> span() const {
    std::int64_t lo = std::numeric_limits<std::int64_t>::max(), hi = 0;
    for (std::int64_t o = 0; o < size(); ++o) {
      lo = std::min(lo, first[static_cast<std::size_t>(o)]);
      hi = std::max(hi, first[static_cast<std::size_t>(o)] + taps(o));
    }
    return {lo, hi};
  }
};

AxisWeights axis_weights(std::int64_t in_len, double scale, double offset, std::int64_t out_len) {
  // scale = input pixels per output pixel; the triangle's radius grows with it when shrinking.
  const double support = std::max(scale, 1.0);
  AxisWeights a;
  a.first.reserve(static_cast<std::size_t>(out_len));
  a.begin.reserve(static_cast<std::size_t>(out_len + 1));
  for (std::int64_t o = 0; o < out_len; ++o) {
    // o + offset is exact for whole offsets, so resize_to_square's weights do not depend on
    // offset being a double (fractional ones are resize_region's).
    const double center = (static_cast<double>(o) + offset + 0.5) * scale;
    std::int64_t lo =
        std::max<std::int64_t>(0, static_cast<std::int64_t>(std::floor(center - support)));
    std::int64_t hi =
        std::min<std::int64_t>(in_len, static_cast<std::int64_t>(std::ceil(center + support)));
    const std::size_t b = a.weights.size();
    double total = 0;
    for (std::int64_t i = lo; i < hi; ++i) {
      const double d = std::abs((static_cast<double>(i) + 0.5 - center) / support);
      const double v = std::max(0.0, 1.0 - d);
      a.weights.push_back(static_cast<float>(v));
      total += v;
    }
    if (total <= 0) {  // outside the image (cannot happen for in-range o): nearest pixel
      lo = std::clamp<std::int64_t>(static_cast<std::int64_t>(center), 0, in_len - 1);
      a.weights.resize(b);
      a.weights.push_back(1.0f);
      total = 1;
    }
    for (std::size_t k = b; k < a.weights.size(); ++k)
      a.weights[k] = static_cast<float>(a.weights[k] / total);
    a.first.push_back(lo);
    a.begin.push_back(static_cast<std::int64_t>(a.weights.size()));
  }
  return a;
}

// ---- The resampler: a horizontal pass over the source rows the output needs, then a vertical
// one, in float. Every output value sums its taps in order from 0, one multiply and one add at a
// time (no FMA: lockstep_data builds with -ffp-contract=off), as the plain loops did before they
// were vectorised, so the bytes are the same in every SIMD clone and as they were (test_image.cpp
// keeps those loops as the reference). The vectors run across what shares a weight instead of
// along a sum: in the horizontal pass the channels of one pixel in kRows rows (4 lanes each:
// R, G, B and one unused), in the vertical pass a row's consecutive values.

// Rows of pixels of 1 to 4 channels: channel c of pixel i of row y is at
// base[y * row_stride + i * pixel_stride + c * channel_stride].
struct PixelRows {
  const std::uint8_t* base;
  std::int64_t row_stride, pixel_stride, channel_stride;
  int channels;
};

constexpr int kRows = 4;
using Lanes = float __attribute__((vector_size(kRows * 4 * sizeof(float))));
using Floats4 = float __attribute__((vector_size(16)));
using Ints4 = std::int32_t __attribute__((vector_size(16)));
using Shorts8 = std::uint16_t __attribute__((vector_size(16)));
using Bytes16 = std::uint8_t __attribute__((vector_size(16)));

// Four bytes to four floats: zero-extended by interleaving with zeros (pmovzx on AVX2: GCC 12
// turns __builtin_convertvector from bytes into scalar code), then converted.
inline Floats4 widen4(std::uint32_t word) {
  const auto bytes = reinterpret_cast<Bytes16>(Ints4{static_cast<std::int32_t>(word), 0, 0, 0});
  const auto shorts = reinterpret_cast<Shorts8>(__builtin_shuffle(
      bytes, Bytes16{}, Bytes16{0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23}));
  return __builtin_convertvector(reinterpret_cast<Ints4>(__builtin_shuffle(
                                     shorts, Shorts8{}, Shorts8{0, 8, 1, 9, 2, 10, 3, 11})),
                                 Floats4);
}

// P[((i - lo) * kRows + r) * 4 + c] = channel c of pixel i of row ys[r], for i in [lo, hi).
LOCKSTEP_SIMD_CLONES void widen_rows(const PixelRows& src, const std::int64_t* ys, std::int64_t lo,
                                     std::int64_t hi, float* P) {
  for (int r = 0; r < kRows; ++r) {
    const std::uint8_t* row = src.base + ys[r] * src.row_stride;
    float* p = P + r * 4;
    if (src.channels == 3 && src.pixel_stride == 3 && src.channel_stride == 1) {
      // RGB: four bytes a pixel (the fourth is the next pixel's red, weighed into the unused
      // lane), four pixels from one 16-byte load while it stays inside the row, then one at a
      // time; the last pixel's fourth byte may lie past the image.
      std::int64_t i = lo;
      for (; i + 6 <= hi; i += 4) {
        Bytes16 b;
        std::memcpy(&b, row + i * 3, sizeof b);
        for (std::uint8_t q = 0; q < 4; ++q, p += kRows * 4) {
          const std::uint8_t f = 3 * q, z = 16;  // z: a byte of the zero vector
          const Bytes16 spread = {f,
                                  z,
                                  z,
                                  z,
                                  std::uint8_t(f + 1),
                                  z,
                                  z,
                                  z,
                                  std::uint8_t(f + 2),
                                  z,
                                  z,
                                  z,
                                  std::uint8_t(f + 3),
                                  z,
                                  z,
                                  z};
          const Floats4 v = __builtin_convertvector(
              reinterpret_cast<Ints4>(__builtin_shuffle(b, Bytes16{}, spread)), Floats4);
          std::memcpy(p, &v, sizeof v);
        }
      }
      for (; i + 1 < hi; ++i, p += kRows * 4) {
        std::uint32_t word;
        std::memcpy(&word, row + i * 3, 4);
        const Floats4 v = widen4(word);
        std::memcpy(p, &v, sizeof v);
      }
      const std::uint8_t* last = row + i * 3;
      const Floats4 v = widen4(std::uint32_t{last[0]} | std::uint32_t{last[1]} << 8 |
                               std::uint32_t{last[2]} << 16);
      std::memcpy(p, &v, sizeof v);
      continue;
    }
    for (std::int64_t i = lo; i < hi; ++i, p += kRows * 4) {
      Ints4 q = {};
      for (int c = 0; c < src.channels; ++c)
        q[c] = row[i * src.pixel_stride + c * src.channel_stride];
      const Floats4 v = __builtin_convertvector(q, Floats4);
      std::memcpy(p, &v, sizeof v);
    }
  }
}

// The horizontal pass over kRows widened rows: channel c of output pixel x of row r goes to
// dst[r][x * channels + c]. Each store writes 4 floats, the last one into the next pixel (written
// next) or into the row's padding of 4.
LOCKSTEP_SIMD_CLONES void horizontal_taps(const float* P, const AxisWeights& ax, std::int64_t lo,
                                          float* const* dst, int channels) {
  // Locals, so that the stores below do not make the compiler reload them for every pixel.
  const std::int64_t* first = ax.first.data();
  const std::int64_t* begin = ax.begin.data();
  const float* weights = ax.weights.data();
  float* out[kRows];
  for (int r = 0; r < kRows; ++r)
    out[r] = dst[r];
  for (std::int64_t x = 0, nx = ax.size(); x < nx; ++x) {
    const float* w = weights + begin[x];
    const float* p = P + (first[x] - lo) * kRows * 4;
    Lanes acc = {};
    for (std::int64_t k = 0, n = begin[x + 1] - begin[x]; k < n; ++k, p += kRows * 4) {
      Lanes v;
      std::memcpy(&v, p, sizeof v);
      acc += w[k] * v;
    }
    float sums[kRows * 4];
    std::memcpy(sums, &acc, sizeof sums);
    for (int r = 0; r < kRows; ++r)
      std::memcpy(out[r] + x * channels, sums + r * 4, 4 * sizeof(float));
  }
}

// acc[j] = sum over k < n of w[k] * rows[k * stride + j], for j < len.
LOCKSTEP_SIMD_CLONES void vertical_taps(const float* rows, std::int64_t stride, std::int64_t len,
                                        const float* w, std::int64_t n, float* acc) {
  constexpr std::int64_t kLanes = sizeof(Lanes) / sizeof(float);
  std::int64_t j = 0;
  for (; j + kLanes <= len; j += kLanes) {
    Lanes a = {};
    for (std::int64_t k = 0; k < n; ++k) {
      Lanes v;
      std::memcpy(&v, rows + k * stride + j, sizeof v);
      a += w[k] * v;
    }
    std::memcpy(acc + j, &a, sizeof a);
  }
  for (; j < len; ++j) {
    float a = 0;
    for (std::int64_t k = 0; k < n; ++k)
      a += w[k] * rows[k * stride + j];
    acc[j] = a;
  }
}

// clamp(lround(v), 0, 255) of four floats without the library call: v - trunc(v) is exact for
// the |v| < 2^23 of a pixel sum, so the halves round away from zero as lround's do. As vector
// code because GCC keeps the scalar loop's branches (-ftrapping-math) and does not vectorise it.
inline Ints4 round4(Floats4 v) {
  const Floats4 zero = {}, top = zero + 255.0f, half = zero + 0.5f;
#ifdef __SSE2__
  v = _mm_min_ps(_mm_max_ps(v, zero), top);  // the clamps exactly: a NaN becomes 0, as before
#else
  v = v > zero ? v : zero;
  v = v < top ? v : top;
#endif
  const Ints4 whole = __builtin_convertvector(v, Ints4);
  return whole - (v - __builtin_convertvector(whole, Floats4) >= half);  // true is -1
}

// Sixteen floats rounded, in order, to sixteen bytes.
inline Bytes16 round16(const float* v) {
  Floats4 x[4];
  std::memcpy(x, v, sizeof x);
  Ints4 q[4];
  for (int i = 0; i < 4; ++i)
    q[i] = round4(x[i]);
#ifdef __SSE2__
  // Packed with saturation, which changes nothing: the values are 0 to 255.
  const auto m = [&](int i) { return reinterpret_cast<__m128i>(q[i]); };
  return reinterpret_cast<Bytes16>(
      _mm_packus_epi16(_mm_packs_epi32(m(0), m(1)), _mm_packs_epi32(m(2), m(3))));
#else
  Bytes16 b[4];
  for (int i = 0; i < 4; ++i)
    b[i] = reinterpret_cast<Bytes16>(q[i]);  // byte 0 of each four holds the value
  const Bytes16 pick = {0, 4, 8, 12, 16, 20, 24, 28, 0, 0, 0, 0, 0, 0, 0, 0};
  return __builtin_shuffle(__builtin_shuffle(b[0], b[1], pick), __builtin_shuffle(b[2], b[3], pick),
                           Bytes16{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23});
#endif
}

inline std::uint8_t round1(float v) {
  return static_cast<std::uint8_t>(round4(Floats4{v, 0, 0, 0})[0]);
}

// out[j] = v[j] rounded, for j < n.
LOCKSTEP_SIMD_CLONES void round_to_u8(const float* v, std::int64_t n, std::uint8_t* out) {
  std::int64_t j = 0;
  for (; j + 16 <= n; j += 16) {
    const Bytes16 b = round16(v + j);
    std::memcpy(out + j, &b, sizeof b);
  }
  for (; j < n; ++j)
    out[j] = round1(v[j]);
}

// Channel c of sixteen RGB pixels from the 48 bytes a, b, d hold in order: byte 3k + c of the 48
// to byte k, in two two-vector shuffles (the first gathers what lies in a and b).
template <int c>
inline Bytes16 channel_of_48(Bytes16 a, Bytes16 b, Bytes16 d) {
  static constexpr std::uint8_t kFirst[3][16] = {
      {0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0, 0, 0, 0, 0},
      {1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 0, 0, 0, 0, 0},
      {2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0, 0, 0, 0, 0, 0}};
  static constexpr std::uint8_t kSecond[3][16] = {
      {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 20, 23, 26, 29},
      {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 18, 21, 24, 27, 30},
      {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 19, 22, 25, 28, 31}};
  Bytes16 first, second;
  std::memcpy(&first, kFirst[c], 16);
  std::memcpy(&second, kSecond[c], 16);
  return __builtin_shuffle(__builtin_shuffle(a, b, first), d, second);
}

// Channel c of the n interleaved RGB pixels v, rounded, to out[c * plane + x].
LOCKSTEP_SIMD_CLONES void round_rgb_to_planes(const float* v, std::int64_t n, std::uint8_t* out,
                                              std::int64_t plane) {
  std::int64_t x = 0;
  for (; x + 16 <= n; x += 16) {
    const Bytes16 a = round16(v + x * 3), b = round16(v + x * 3 + 16), d = round16(v + x * 3 + 32);
    const Bytes16 r = channel_of_48<0>(a, b, d), g = channel_of_48<1>(a, b, d),
                  bl = channel_of_48<2>(a, b, d);
    std::memcpy(out + x, &r, sizeof r);
    std::memcpy(out + plane + x, &g, sizeof g);
    std::memcpy(out + 2 * plane + x, &bl, sizeof bl);
  }
  for (; x < n; ++x)
    for (int c = 0; c < 3; ++c)
      out[c * plane + x] = round1(v[x * 3 + c]);
}

#ifdef LOCKSTEP_RESAMPLE_AVX512
// GCC 12 warns falsely of the _mm512_undefined_* inside some intrinsics below (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// AVX-512 versions of widen_rows (for RGB rows), horizontal_taps and round_rgb_to_planes: the
// same values from the same operations in the same order, with whole-register loads, shuffles
// and stores where the clones above move a pixel or four floats at a time. On 500x375 photos'
// random-resized crops to 224 the resampler took 0.73x its time with them (docs/IMAGES.md);
// test_image.cpp checks both against the plain loops, byte for byte.

// widen_rows' P for RGB rows, pixels [lo, end) where end is returned (the rest is widen_rows'):
// the 16 bytes at pixel i of each of the kRows rows side by side in one register, then for each
// of the four pixels i + q one in-lane byte shuffle gives, in lane r, row r's R, G, B and the
// next pixel's red: P's pixel-major order directly, converted, one store a pixel.
__attribute__((target("avx512f,avx512bw"))) std::int64_t widen_rgb_rows_avx512(
    const PixelRows& src, const std::int64_t* ys, std::int64_t lo, std::int64_t hi, float* P) {
  static_assert(kRows == 4, "a 512-bit register holds 16 bytes of each of 4 rows");
  const std::uint8_t* rows[kRows];
  for (int r = 0; r < kRows; ++r)
    rows[r] = src.base + ys[r] * src.row_stride;
  __m512i pick[4];
  for (int q = 0; q < 4; ++q) {
    const char z = -128, b = static_cast<char>(3 * q);  // z: the shuffle writes a zero
    pick[q] = _mm512_broadcast_i32x4(_mm_setr_epi8(b, z, z, z, static_cast<char>(b + 1), z, z, z,
                                                   static_cast<char>(b + 2), z, z, z,
                                                   static_cast<char>(b + 3), z, z, z));
  }
  auto load = [&](int r, std::int64_t i) {
    return _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[r] + i * 3));
  };
  std::int64_t i = lo;
  // The 16 bytes at pixel i stay inside the row; i stops at most hi - 2, so widen_rows is left
  // at least one pixel (its last, whose fourth byte it does not read).
  for (; i + 6 <= hi; i += 4) {
    __m512i z = _mm512_zextsi128_si512(load(0, i));
    z = _mm512_inserti32x4(z, load(1, i), 1);
    z = _mm512_inserti32x4(z, load(2, i), 2);
    z = _mm512_inserti32x4(z, load(3, i), 3);
    float* p = P + (i - lo) * kRows * 4;
    for (int q = 0; q < 4; ++q)
      _mm512_storeu_ps(p + q * kRows * 4, _mm512_cvtepi32_ps(_mm512_shuffle_epi8(z, pick[q])));
  }
  return i;
}

// The sum over k < n of w[k] times the k-th 16 floats from p, as horizontal_taps takes an output
// pixel's sums for the kRows rows: from 0, each tap a multiply then an add.
__attribute__((target("avx512f"))) inline __m512 taps_avx512(const float* p, const float* w,
                                                             std::int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (std::int64_t k = 0; k < n; ++k, p += kRows * 4)
    acc = _mm512_add_ps(acc, _mm512_mul_ps(_mm512_set1_ps(w[k]), _mm512_loadu_ps(p)));
  return acc;
}

// horizontal_taps for four output pixels at a time: each pixel's sums for the kRows rows, then
// the four registers transposed in 128-bit blocks to one register a row, its four pixels' lanes
// packed to `channels` each, and one masked store a row instead of four narrow ones a pixel
// (the stores, not the arithmetic, bounded the pass: 0.54x its time without them).
__attribute__((target("avx512f"))) void horizontal_taps_avx512(const float* P,
                                                               const AxisWeights& ax,
                                                               std::int64_t lo, float* const* dst,
                                                               int channels) {
  static_assert(kRows == 4, "four rows of four lanes in a 512-bit register");
  // Locals, so that the stores below do not make the compiler reload them for every pixel.
  const std::int64_t* first = ax.first.data();
  const std::int64_t* begin = ax.begin.data();
  const float* weights = ax.weights.data();
  auto sums = [=](std::int64_t x) __attribute__((target("avx512f"))) {
    return taps_avx512(P + (first[x] - lo) * kRows * 4, weights + begin[x],
                       begin[x + 1] - begin[x]);
  };
  float* out[kRows];
  for (int r = 0; r < kRows; ++r)
    out[r] = dst[r];
  alignas(64) std::int32_t pick[16];
  for (int j = 0; j < 16; ++j)
    pick[j] = j < 4 * channels ? j / channels * 4 + j % channels : 0;
  const __m512i pack = _mm512_load_si512(pick);
  const auto keep = static_cast<__mmask16>((1u << (4 * channels)) - 1);
  const std::int64_t nx = ax.size();
  std::int64_t x = 0;
  for (; x + 4 <= nx; x += 4) {
    const __m512 a0 = sums(x), a1 = sums(x + 1), a2 = sums(x + 2), a3 = sums(x + 3);
    // a_q holds pixel x + q of rows 0-3 in its four blocks; row r's pixels x .. x + 3 are block
    // r of each.
    const __m512 t0 = _mm512_shuffle_f32x4(a0, a1, 0x44), t1 = _mm512_shuffle_f32x4(a0, a1, 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(a2, a3, 0x44), t3 = _mm512_shuffle_f32x4(a2, a3, 0xEE);
    const __m512 rows[kRows] = {
        _mm512_shuffle_f32x4(t0, t2, 0x88), _mm512_shuffle_f32x4(t0, t2, 0xDD),
        _mm512_shuffle_f32x4(t1, t3, 0x88), _mm512_shuffle_f32x4(t1, t3, 0xDD)};
    for (int r = 0; r < kRows; ++r)
      _mm512_mask_storeu_ps(out[r] + x * channels, keep, _mm512_permutexvar_ps(pack, rows[r]));
  }
  for (; x < nx; ++x) {
    alignas(64) float lanes[kRows * 4];
    _mm512_store_ps(lanes, sums(x));
    for (int r = 0; r < kRows; ++r)
      std::memcpy(out[r] + x * channels, lanes + r * 4, static_cast<std::size_t>(channels) * 4);
  }
}

// round4's values, sixteen at a time.
__attribute__((target("avx512f"))) inline __m512i round16_avx512(const float* p) {
  const __m512 v =
      _mm512_min_ps(_mm512_max_ps(_mm512_loadu_ps(p), _mm512_setzero_ps()), _mm512_set1_ps(255.0f));
  const __m512i whole = _mm512_cvttps_epi32(v);
  const __mmask16 up = _mm512_cmp_ps_mask(_mm512_sub_ps(v, _mm512_cvtepi32_ps(whole)),
                                          _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  return _mm512_mask_add_epi32(whole, up, whole, _mm512_set1_epi32(1));
}

// round_rgb_to_planes, sixteen pixels at a time: channel c of the 48 values a, b, d hold in
// order is every third from c, gathered by two two-register permutes.
__attribute__((target("avx512f"))) void round_rgb_to_planes_avx512(const float* v, std::int64_t n,
                                                                   std::uint8_t* out,
                                                                   std::int64_t plane) {
  // From a and b (values 0-31): the channel's values below 32; then from that and d (32-47).
  const __m512i first[3] = {
      _mm512_setr_epi32(0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30, 0, 0, 0, 0, 0),
      _mm512_setr_epi32(1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31, 0, 0, 0, 0, 0),
      _mm512_setr_epi32(2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 0, 0, 0, 0, 0, 0)};
  const __m512i second[3] = {
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 17, 20, 23, 26, 29),
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 18, 21, 24, 27, 30),
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 16, 19, 22, 25, 28, 31)};
  std::int64_t x = 0;
  for (; x + 16 <= n; x += 16) {
    const __m512i a = round16_avx512(v + x * 3), b = round16_avx512(v + x * 3 + 16),
                  d = round16_avx512(v + x * 3 + 32);
    for (int c = 0; c < 3; ++c) {
      const __m512i ch =
          _mm512_permutex2var_epi32(_mm512_permutex2var_epi32(a, first[c], b), second[c], d);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + c * plane + x), _mm512_cvtepi32_epi8(ch));
    }
  }
  for (; x < n; ++x)
    for (int c = 0; c < 3; ++c)
      out[c * plane + x] = round1(v[x * 3 + c]);
}

#pragma GCC diagnostic pop
#endif

std::atomic<bool> avx512_resampler_allowed{true};

bool resample_avx512() {
#ifdef LOCKSTEP_RESAMPLE_AVX512
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has && avx512_resampler_allowed.load(std::memory_order_relaxed);
#else
  return false;
#endif
}

// Resamples `src` with the weights ax (columns) and ay (rows): output pixel (y, x), y < ay's
// size and x < ax's, channel c goes to out[(c * out_h + y0 + y) * out_w + x0 + x].
void resample(const PixelRows& src, const AxisWeights& ax, const AxisWeights& ay,
              std::int64_t out_h, std::int64_t out_w, std::int64_t y0, std::int64_t x0,
              std::uint8_t* out) {
  const int C = src.channels;
  const std::int64_t nx = ax.size(), ny = ay.size();
  const auto [col_lo, col_hi] = ax.span();
  const auto [row_lo, row_hi] = ay.span();
  const std::int64_t row_len = nx * C, stride = row_len + 4;
  // Scratch kept by each thread, so that a loader thread allocates nothing per image.
  struct Scratch {
    std::vector<float> widened, rows, acc;
    std::vector<std::uint8_t> rounded;
  };
  thread_local Scratch s;
  auto fit = [](auto& v, std::int64_t n) {
    if (static_cast<std::int64_t>(v.size()) < n) v.resize(static_cast<std::size_t>(n));
  };
  fit(s.widened, (col_hi - col_lo) * kRows * 4);
  fit(s.rows, (row_hi - row_lo + 1) * stride);  // + 1: where the rows past row_hi go
  fit(s.acc, row_len);
  fit(s.rounded, row_len);
  float* const spare = s.rows.data() + (row_hi - row_lo) * stride;
  // AVX-512 code where the CPU has it (and allow_avx512_resampler has not forbidden it).
  [[maybe_unused]] const bool avx512 = resample_avx512();
  [[maybe_unused]] const bool rgb = C == 3 && src.pixel_stride == 3 && src.channel_stride == 1;
  for (std::int64_t y = row_lo; y < row_hi; y += kRows) {
    std::int64_t ys[kRows];
    float* dst[kRows];
    for (int r = 0; r < kRows; ++r) {
      ys[r] = std::min(y + r, row_hi - 1);
      dst[r] = y + r < row_hi ? s.rows.data() + (y + r - row_lo) * stride : spare;
    }
#ifdef LOCKSTEP_RESAMPLE_AVX512
    if (rgb && avx512) {
      const std::int64_t done = widen_rgb_rows_avx512(src, ys, col_lo, col_hi, s.widened.data());
      widen_rows(src, ys, done, col_hi, s.widened.data() + (done - col_lo) * kRows * 4);
    } else
#endif
      widen_rows(src, ys, col_lo, col_hi, s.widened.data());
#ifdef LOCKSTEP_RESAMPLE_AVX512
    if (avx512) {
      horizontal_taps_avx512(s.widened.data(), ax, col_lo, dst, C);
      continue;
    }
#endif
    horizontal_taps(s.widened.data(), ax, col_lo, dst, C);
  }
  for (std::int64_t y = 0; y < ny; ++y) {
    vertical_taps(s.rows.data() + (ay.first[static_cast<std::size_t>(y)] - row_lo) * stride, stride,
                  row_len, ay.weights_of(y), ay.taps(y), s.acc.data());
    std::uint8_t* o = out + (y0 + y) * out_w + x0;
    if (C == 1) {
      round_to_u8(s.acc.data(), row_len, o);
    } else if (C == 3) {
#ifdef LOCKSTEP_RESAMPLE_AVX512
      if (avx512) {
        round_rgb_to_planes_avx512(s.acc.data(), nx, o, out_h * out_w);
        continue;
      }
#endif
      round_rgb_to_planes(s.acc.data(), nx, o, out_h * out_w);
    } else {
      round_to_u8(s.acc.data(), row_len, s.rounded.data());
      for (int c = 0; c < C; ++c, o += out_h * out_w)
        for (std::int64_t x = 0; x < nx; ++x)
          o[x] = s.rounded[static_cast<std::size_t>(x * C + c)];
    }
  }
  for (auto* v : {&s.widened, &s.rows, &s.acc})
    release_if_outsized(*v);
  release_if_outsized(s.rounded);
}

PixelRows rgb_rows(const Image& img) {
  return {img.rgb.data(), img.width * 3, 3, 1, 3};
}

}  // namespace

namespace {

bool is_jpeg(const std::uint8_t* data, std::size_t size) {
  return size >= 2 && data[0] == 0xFF && data[1] == 0xD8;  // SOI
}
bool is_png(const std::uint8_t* data, std::size_t size) {
  static const std::uint8_t kPngSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  return size >= 8 && std::memcmp(data, kPngSignature, 8) == 0;
}

// Empty files and files of another kind, with the error decode_image gives.
void require_image(const std::uint8_t* data, std::size_t size, const std::string& where) {
  LOCKSTEP_CHECK_HINT(size > 0, kBadFileHint, where, ": empty file (0 bytes)");
  if (is_jpeg(data, size) || is_png(data, size)) return;
  std::string head;
  for (std::size_t i = 0; i < std::min<std::size_t>(size, 8); ++i) {
    char b[4];
    std::snprintf(b, sizeof b, "%02x", data[i]);
    if (i) head += ' ';  // appended apart: GCC 12 warns falsely on "lit" + std::string&&
    head += b;
  }
  LOCKSTEP_FAIL_HINT(kBadFileHint, where, ": not a JPEG or PNG file (it starts with bytes ", head,
                     ")");
}

}  // namespace

Image decode_image(const std::uint8_t* data, std::size_t size, const std::string& where,
                   std::int64_t min_side) {
  require_image(data, size, where);
  if (is_jpeg(data, size)) return decode_jpeg_whole(data, size, where, min_side, 0);
  return decode_png(data, size, where);
}

Image decode_image_scaled(const std::uint8_t* data, std::size_t size, const std::string& where,
                          int denominator) {
  require_image(data, size, where);
  if (is_jpeg(data, size)) return decode_jpeg_whole(data, size, where, 0, denominator);
  return decode_png(data, size, where);
}

void decode_image_region(const std::uint8_t* data, std::size_t size, const std::string& where,
                         int denominator, const PixelRect& wanted, ImageRegion& out) {
  require_image(data, size, where);
  if (is_jpeg(data, size)) {
    decode_jpeg(data, size, where, 0, denominator, &wanted, out);
    return;
  }
  out.image = decode_png(data, size, where);
  out.top = out.left = 0;
  LOCKSTEP_CHECK(wanted.top >= 0 && wanted.left >= 0 && wanted.height >= 1 && wanted.width >= 1 &&
                     wanted.top + wanted.height <= out.image.height &&
                     wanted.left + wanted.width <= out.image.width,
                 where, ": region ", wanted.height, "x", wanted.width, " at (", wanted.top, ", ",
                 wanted.left, ") is outside the ", out.image.height, "x", out.image.width,
                 " image");
}

namespace {

// libjpeg's output into a vector that grows (the vector outlives any longjmp out of libjpeg).
struct VectorDestination {
  jpeg_destination_mgr mgr;  // first: libjpeg hands back a pointer to it
  std::vector<std::uint8_t>* bytes;
};

void vector_init(j_compress_ptr cinfo) {
  auto* d = reinterpret_cast<VectorDestination*>(cinfo->dest);
  d->bytes->resize(std::size_t{1} << 16);
  d->mgr.next_output_byte = d->bytes->data();
  d->mgr.free_in_buffer = d->bytes->size();
}

boolean vector_grow(j_compress_ptr cinfo) {  // libjpeg's "empty_output_buffer": the buffer is full
  auto* d = reinterpret_cast<VectorDestination*>(cinfo->dest);
  const std::size_t used = d->bytes->size();
  d->bytes->resize(2 * used);
  d->mgr.next_output_byte = d->bytes->data() + used;
  d->mgr.free_in_buffer = d->bytes->size() - used;
  return TRUE;
}

void vector_term(j_compress_ptr cinfo) {
  auto* d = reinterpret_cast<VectorDestination*>(cinfo->dest);
  d->bytes->resize(d->bytes->size() - d->mgr.free_in_buffer);
}

}  // namespace

std::vector<std::uint8_t> jpeg_with_restarts(const std::uint8_t* data, std::size_t size) {
  if (!is_jpeg(data, size)) return {};
  // Plain structs only between setjmp and the longjmps of libjpeg's errors.
  struct Transcoder {
    jpeg_decompress_struct in;
    jpeg_compress_struct out;
    JpegErrors errors;
    VectorDestination destination;
  };
  auto t = std::make_unique<Transcoder>();
  t->in.err = jpeg_std_error(&t->errors.mgr);
  t->out.err = &t->errors.mgr;
  t->errors.mgr.error_exit = jpeg_on_error;
  t->errors.mgr.emit_message = jpeg_on_message;  // a warning (corrupt data) gives up too
  if (setjmp(t->errors.jump) != 0) return {};
  jpeg_create_decompress(&t->in);
  jpeg_create_compress(&t->out);
  t->destination.mgr.init_destination = vector_init;
  t->destination.mgr.empty_output_buffer = vector_grow;
  t->destination.mgr.term_destination = vector_term;
  std::vector<std::uint8_t> result;
  const bool ok = [&] {
    if (setjmp(t->errors.jump) != 0) return false;
    jpeg_mem_src(&t->in, data, static_cast<unsigned long>(size));
    // Every APPn (EXIF orientation, ICC profiles) and comment travels with the image.
    for (int m = 0; m < 16; ++m)
      jpeg_save_markers(&t->in, JPEG_APP0 + m, 0xFFFF);
    jpeg_save_markers(&t->in, JPEG_COM, 0xFFFF);
    jpeg_read_header(&t->in, TRUE);
    if (t->in.data_precision != 8) return false;
    jvirt_barray_ptr* coefficients = jpeg_read_coefficients(&t->in);
    jpeg_copy_critical_parameters(&t->in, &t->out);
    // The interval: the most MCUs that span at most 24 pixels and divide a row's MCUs, so that
    // the intervals tile the rows (index_restarts) and a crop's cut reads little beside it. On
    // 500x375 4:4:4 photos (8-pixel MCUs) a loader's crop took 0.80x the CPU time of the file's
    // own bytes at 24 pixels, 0.8-0.9x at 8 and 0.9x at 64 (docs/IMAGES.md).
    const int mcu_w = t->in.num_components == 1 ? 8 : 8 * t->in.max_h_samp_factor;
    const long per_row = (static_cast<long>(t->in.image_width) + mcu_w - 1) / mcu_w;
    unsigned interval = 1;
    for (long i = 1; i <= per_row && i * mcu_w <= 24; ++i)
      if (per_row % i == 0) interval = static_cast<unsigned>(i);
    t->out.restart_interval = interval;
    t->out.optimize_coding = TRUE;  // lossless too, and smaller than most encoders' tables
    t->destination.bytes = &result;
    t->out.dest = &t->destination.mgr;
    jpeg_write_coefficients(&t->out, coefficients);
    for (jpeg_saved_marker_ptr m = t->in.marker_list; m; m = m->next) {
      // The JFIF and Adobe headers are written anew for the colour space, as jpegtran does.
      const bool jfif =
          m->marker == JPEG_APP0 && m->data_length >= 5 && std::memcmp(m->data, "JFIF", 5) == 0;
      const bool adobe = m->marker == JPEG_APP0 + 14 && m->data_length >= 5 &&
                         std::memcmp(m->data, "Adobe", 5) == 0;
      if ((jfif && t->out.write_JFIF_header) || (adobe && t->out.write_Adobe_marker)) continue;
      jpeg_write_marker(&t->out, m->marker, m->data, m->data_length);
    }
    jpeg_finish_compress(&t->out);
    jpeg_finish_decompress(&t->in);
    return true;
  }();
  if (!ok) result.clear();
  jpeg_destroy_compress(&t->out);
  jpeg_destroy_decompress(&t->in);
  return result;
}

EncodedImageInfo encoded_image_info(const std::uint8_t* data, std::size_t size,
                                    const std::string& where) {
  require_image(data, size, where);
  EncodedImageInfo info;
  if (is_jpeg(data, size)) {
    JpegDecoder& dec = JpegDecoder::for_this_thread();
    dec.read_header(data, size, where);
    const std::int64_t w = dec.cinfo()->image_width, h = dec.cinfo()->image_height;
    jpeg_abort_decompress(dec.cinfo());
    const bool swap = exif_orientation(data, size) >= 5;  // turned a quarter: upright is h x w
    info.width = swap ? h : w;
    info.height = swap ? w : h;
    info.jpeg = true;
    return info;
  }
  // PNG: the IHDR chunk comes first, right after the signature (length, "IHDR", width, height).
  LOCKSTEP_CHECK_HINT(size >= 24 && std::memcmp(data + 12, "IHDR", 4) == 0, kBadFileHint, where,
                      ": cannot decode the PNG: no IHDR chunk at its start");
  auto be32 = [&](std::size_t o) {
    return std::int64_t{data[o]} << 24 | std::int64_t{data[o + 1]} << 16 |
           std::int64_t{data[o + 2]} << 8 | std::int64_t{data[o + 3]};
  };
  info.width = be32(16);
  info.height = be32(20);
  return info;
}

Image read_image(const std::string& path, std::int64_t min_side) {
  const auto bytes = read_image_bytes(path);
  return decode_image(bytes.data(), bytes.size(), path, min_side);
}

ImageFit image_fit_from_name(const std::string& name) {
  if (name == "crop") return ImageFit::CenterCrop;
  if (name == "pad") return ImageFit::Pad;
  LOCKSTEP_FAIL_HINT("crop (scale the shorter side, cut the middle) or pad (scale the longer side)",
                     "unknown fit '", name, "'");
}
const char* image_fit_name(ImageFit fit) {
  return fit == ImageFit::CenterCrop ? "crop" : "pad";
}

void resize_to_square(const Image& img, std::int64_t side, ImageFit fit, std::uint8_t* out) {
  LOCKSTEP_CHECK(side >= 1 && img.width >= 1 && img.height >= 1, "cannot resize a ", img.width, "x",
                 img.height, " image to ", side, "x", side);
  const std::int64_t w = img.width, h = img.height;
  const std::int64_t shorter = std::min(w, h), longer = std::max(w, h);
  // Scaled size of the whole image, and where the side x side window sits in it.
  const double scale = static_cast<double>(fit == ImageFit::CenterCrop ? shorter : longer) /
                       static_cast<double>(side);
  const std::int64_t reference = fit == ImageFit::CenterCrop ? shorter : longer;
  auto scaled = [&](std::int64_t n) {
    if (n == reference) return side;  // exact, whatever the rounding of scale
    return std::max<std::int64_t>(1, static_cast<std::int64_t>(std::llround(n / scale)));
  };
  const std::int64_t sw = scaled(w), sh = scaled(h);
  // CenterCrop: window offset (scaled - side) / 2 >= 0 in the scaled image. Pad: the scaled image
  // sits at (side - scaled) / 2 in the window; positions outside it stay black.
  const std::int64_t ow = sw - side, oh = sh - side;
  const std::int64_t x0 = ow >= 0 ? 0 : -ow / 2, y0 = oh >= 0 ? 0 : -oh / 2;
  const std::int64_t nx = std::min(side, sw), ny = std::min(side, sh);
  const auto ax =
      axis_weights(w, static_cast<double>(w) / static_cast<double>(sw), ow >= 0 ? ow / 2 : 0, nx);
  const auto ay =
      axis_weights(h, static_cast<double>(h) / static_cast<double>(sh), oh >= 0 ? oh / 2 : 0, ny);
  std::fill(out, out + 3 * side * side, std::uint8_t{0});
  resample(rgb_rows(img), ax, ay, side, side, y0, x0, out);
}

void resize_region(const Image& img, double top, double left, double h, double w,
                   std::int64_t out_h, std::int64_t out_w, std::uint8_t* out) {
  LOCKSTEP_CHECK(top >= 0 && left >= 0 && h > 0 && w > 0 &&
                     top + h <= static_cast<double>(img.height) &&
                     left + w <= static_cast<double>(img.width) && out_h >= 1 && out_w >= 1,
                 "resize_region: region ", h, "x", w, " at (", top, ", ", left, ") of ", img.height,
                 "x", img.width);
  // The weights over the pixels the region touches alone (so the filter never reads outside
  // it, as cropping first would), then moved to their place in the image.
  auto region = [](double start, double len, std::int64_t out_len) {
    const auto first = static_cast<std::int64_t>(std::floor(start));
    const auto end = static_cast<std::int64_t>(std::ceil(start + len));
    const double scale = len / static_cast<double>(out_len);
    auto a =
        axis_weights(end - first, scale, (start - static_cast<double>(first)) / scale, out_len);
    for (auto& f : a.first)
      f += first;
    return a;
  };
  resample(rgb_rows(img), region(left, w, out_w), region(top, h, out_h), out_h, out_w, 0, 0, out);
}

void resize_region(const std::uint8_t* in, std::int64_t channels, std::int64_t H, std::int64_t W,
                   std::int64_t top, std::int64_t left, std::int64_t h, std::int64_t w,
                   std::int64_t out_h, std::int64_t out_w, std::uint8_t* out) {
  LOCKSTEP_CHECK(top >= 0 && left >= 0 && h >= 1 && w >= 1 && top + h <= H && left + w <= W &&
                     out_h >= 1 && out_w >= 1,
                 "resize_region: region ", h, "x", w, " at (", top, ", ", left, ") of ", H, "x", W);
  const auto ax = axis_weights(w, static_cast<double>(w) / static_cast<double>(out_w), 0, out_w);
  const auto ay = axis_weights(h, static_cast<double>(h) / static_cast<double>(out_h), 0, out_h);
  // Planes in groups of up to four channels, the most one pass widens.
  for (std::int64_t c = 0; c < channels; c += 4) {
    const PixelRows planes{in + c * H * W + top * W + left, W, 1, H * W,
                           static_cast<int>(std::min<std::int64_t>(4, channels - c))};
    resample(planes, ax, ay, out_h, out_w, 0, 0, out + c * out_h * out_w);
  }
}

bool allow_avx512_resampler(bool allow) {
  return avx512_resampler_allowed.exchange(allow);
}

}  // namespace lockstep::data

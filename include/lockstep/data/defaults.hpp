// Every default of the data layer that matters for speed or memory, in one place, with why.
// The loader, the dataset reader, the shard writer and lockstep-shard all take these unless told
// otherwise; docs/PERFORMANCE.md ("Data loader") has the measurements behind them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::data {

// Batches the loader thread assembles ahead of the consumer. Assembling one batch takes far less
// than a training step, so a few are enough to hide jitter (a slow disk read, a descheduled
// thread); each costs one batch of host memory.
inline constexpr int kDefaultPrefetchDepth = 4;

// Threads per loader that decode encoded image samples (JPEG/PNG bytes in the shard). Decoding a
// 224 sample costs about a millisecond of a core (docs/IMAGES.md), so a rank training on more
// than a few hundred images a second needs more than its loader thread: raise it where the node
// has cores beyond its ranks.
inline constexpr int kDefaultDecodeThreads = 1;

// A set whose samples and labels fit in this many bytes is read into memory once at open; a
// larger one is read on demand, chunk by chunk. 4 GiB holds ImageNet-64 u8 (3.7 GB) but not
// ImageNet-1k at full size, which is where on-demand reading starts to pay.
inline constexpr std::int64_t kDefaultMemoryBudgetBytes = std::int64_t{4} << 30;

// Target size of one /x chunk when writing. HDF5 reads (and decompresses) whole chunks, so in
// on-demand mode a random sample costs one chunk read: small chunks keep that cheap, large chunks
// compress better. 64 KiB is 83 Fashion-MNIST images.
inline constexpr std::int64_t kDefaultChunkBytes = std::int64_t{64} << 10;

// /y is tiny and always read whole, so it gets large chunks.
inline constexpr std::int64_t kLabelChunkSamples = 16384;

// Per-shard HDF5 chunk cache in on-demand mode: holds the chunks of the current batch's runs so
// neighbouring samples are not read twice; 64 chunks of the default size.
inline constexpr std::size_t kDefaultChunkCacheBytes = std::size_t{4} << 20;
// Hash slots of that cache (HDF5 advises a prime about 100x the number of chunks it holds).
inline constexpr std::size_t kChunkCacheSlots = 6421;

// Deflate level lockstep-shard uses when --deflate is not given: off, because a gzip'd chunk must
// be inflated on every on-demand read, and Fashion-MNIST-sized sets are small anyway.
inline constexpr int kDefaultDeflateLevel = 0;

}  // namespace lockstep::data

// Checkpoints: everything needed to continue a run exactly (step, sampler position, parameters,
// buffers, optimizer state, RNG), in one HDF5 file per save, DIR/ckpt-<step>.h5.
// A file under a final name is always complete: it is written to DIR/.tmp-*, fsynced, renamed and
// the folder fsynced; a text header in the HDF5 user block carries a checksum of the whole file,
// verified before HDF5 parses a byte, so a truncated or corrupted file is an Error, never a crash.
// Layout and resume semantics: docs/CHECKPOINTS.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lockstep/core/tensor.hpp"

namespace lockstep::train {

// Format version written to new files; readers accept exactly this version.
inline constexpr int kCheckpointVersion = 1;

struct CheckpointState {
  std::int64_t step = 0;                     // optimizer steps completed
  std::int64_t epoch = 0;                    // epoch in progress
  std::int64_t batch_in_epoch = 0;           // batches of that epoch already consumed (per rank)
  std::int64_t world_size = 1;               // ranks that wrote it (resume may use another count)
  std::string config_ini;                    // the resolved config (to_ini)
  std::string model_structure;               // nn::Model::structure() text
  std::map<std::string, std::string> attrs;  // anything else ("rng", "parallel", ...)
  // Tensors by name: "param/<name>", "buffer/<name>", "optim/<name>"; any dtype, any device
  // (copied to the host to write). Names are unique and non-empty; order is preserved.
  std::vector<std::pair<std::string, Tensor>> tensors;

  // The tensor called `name`, or an Error naming the checkpoint's tensors.
  const Tensor& tensor(const std::string& name) const;
};

// Writes `state` to `path` atomically (see above). Stale DIR/.tmp-* files of an earlier crashed
// write are removed first: one writer per folder (rank 0) is the contract.
void write_checkpoint(const std::string& path, const CheckpointState& state);

// Reads and verifies a checkpoint (header, size, whole-file checksum, format, version, "complete"
// marker, content checksum); throws lockstep::Error naming the file and what is wrong.
CheckpointState read_checkpoint(const std::string& path);

// DIR/ckpt-00001234.h5 (at least 8 digits, so names sort by step).
std::string checkpoint_path(const std::string& dir, std::int64_t step);

// A checkpoint file found in a folder by its name, DIR/ckpt-<step>.h5.
struct CheckpointFile {
  std::int64_t step;
  std::string path;
};
// Every ckpt-<digits>.h5 in `dir` (none when it does not exist), highest step first; nothing is
// read but the names.
std::vector<CheckpointFile> list_checkpoints(const std::string& dir);

// The highest-step checkpoint in `dir` that reads back completely; each partial or corrupt one is
// skipped with warn("<file>: <reason>, skipped"). nullopt when there is none (or no folder).
std::optional<std::string> find_latest_checkpoint(
    const std::string& dir, const std::function<void(const std::string&)>& warn);

// Deletes every complete checkpoint older than the newest `keep` (>= 1) complete ones, and stale
// .tmp-* files. "Complete" here is the cheap check (header of this format version present, size
// matches); files that fail it are never deleted (evidence, or another version's files).
void prune_checkpoints(const std::string& dir, int keep);

// A plain HDF5 file for other tools: datasets /parameters/<name> and /buffers/<name> (their dtype
// and shape, each with a "name" attribute holding the unescaped name) and one string attribute on
// the root per entry of `attrs` (e.g. model_spec, structure). Written atomically like checkpoints.
void export_parameters(const std::string& path,
                       const std::vector<std::pair<std::string, Tensor>>& params,
                       const std::vector<std::pair<std::string, Tensor>>& buffers,
                       const std::map<std::string, std::string>& attrs);

// Reads a file written by export_parameters (for evaluation tools and tests).
struct ExportedParameters {
  std::vector<std::pair<std::string, Tensor>> params;
  std::vector<std::pair<std::string, Tensor>> buffers;
  std::map<std::string, std::string> attrs;
};
ExportedParameters read_exported_parameters(const std::string& path);

// Where to resume inside the epoch when the samples per loader batch over all ranks (local batch
// x world size = global batch / accumulation) changed between save and resume. World-size changes
// with a fixed train.global_batch and accumulation keep batch_in_epoch as is. The position is kept
// in samples: floor(batch_in_epoch * old_samples / new_samples), so no sample is skipped and at
// most one new batch worth is seen twice.
std::int64_t rescale_batch_in_epoch(std::int64_t batch_in_epoch, std::int64_t old_samples_per_batch,
                                    std::int64_t new_samples_per_batch);

namespace detail {
// CRC-32 (zlib's, as Python's zlib.crc32) continued from `crc`; 0 starts a new one.
std::uint32_t crc32(const void* data, std::size_t bytes, std::uint32_t crc = 0);
// Recomputes and rewrites the user-block header of an existing checkpoint file so that its
// file checksum matches its bytes again. Only for tests that build inconsistent files on purpose.
void reseal_checkpoint_for_test(const std::string& path);
}  // namespace detail

}  // namespace lockstep::train

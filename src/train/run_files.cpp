#include "lockstep/train/run_files.hpp"

#include <filesystem>
#include <regex>
#include <set>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/train/checkpoint_lock.hpp"
#include "lockstep/train/state.hpp"

namespace fs = std::filesystem;

namespace lockstep::train {
namespace {

// A path a run reads or writes, and the setting it came from ("data.train = data/train").
struct RunPath {
  std::string key, value;
  fs::path path;
  std::string setting() const { return key + " = " + value; }
};

// The path with symbolic links and ".." resolved as far as it exists.
fs::path resolved(const fs::path& p) {
  std::error_code ec;
  fs::path out = fs::weakly_canonical(fs::absolute(p, ec), ec);
  return ec ? fs::absolute(p).lexically_normal() : out;
}

bool same_path(const fs::path& a, const fs::path& b) {
  std::error_code ec;
  const bool a_exists = fs::exists(a, ec), b_exists = fs::exists(b, ec);
  if (a_exists != b_exists) return false;
  if (a_exists) return fs::equivalent(a, b, ec) && !ec;
  return resolved(a) == resolved(b);
}

fs::path folder_of(const fs::path& file) {
  return file.has_parent_path() ? file.parent_path() : fs::path(".");
}

// The shard files of a data key and their folders. A spec that names nothing is left to the data
// layer's own error when the set is opened.
void add_data_inputs(std::vector<RunPath>& files, std::vector<RunPath>& folders,
                     const std::string& key, const std::string& spec) {
  std::vector<std::string> shards;
  try {
    shards = data::resolve_shard_files(spec);
  } catch (const Error&) {
    return;
  }
  std::set<std::string> seen;  // one glob's matches share their folder's spelling
  for (const std::string& shard : shards) {
    files.push_back({key, spec, shard});
    if (seen.insert(folder_of(shard).string()).second)
      folders.push_back({key, spec, folder_of(shard)});
  }
}

}  // namespace

bool is_checkpoint_dir_file(const std::string& name) {
  static const std::regex checkpoint(R"(ckpt-\d+\.h5)");
  return std::regex_match(name, checkpoint) || name == kCheckpointLockFile ||
         name.rfind(".tmp-", 0) == 0;
}

void check_outputs_are_not_inputs(const Config& config, comm::Communicator& comm, bool eval_only) {
  on_rank0(comm, [&]() -> std::string {
    std::vector<RunPath> inputs, data_folders;
    const std::string& resume = config.train_resume;
    if (!resume.empty() && resume != "auto" && resume != "fresh")
      inputs.push_back({"train.resume", resume, resume});
    add_data_inputs(inputs, data_folders, "data.train", config.data_train);
    if (!config.data_test.empty() && (config.train_eval || eval_only))
      add_data_inputs(inputs, data_folders, "data.test", config.data_test);
    inputs.insert(inputs.end(), data_folders.begin(), data_folders.end());

    std::vector<RunPath> outputs;
    if (!config.log_metrics.empty())
      outputs.push_back({"log.metrics", config.log_metrics, config.log_metrics});
    if (!config.log_trace.empty())
      outputs.push_back({"log.trace", config.log_trace, config.log_trace});
    if (!config.checkpoint_export.empty())
      outputs.push_back({"checkpoint.export", config.checkpoint_export, config.checkpoint_export});

    const std::string& dir = config.checkpoint_dir;
    for (std::size_t o = 0; o < outputs.size(); ++o) {
      const RunPath& out = outputs[o];
      const std::string hint = "set " + out.key + " to another file";
      for (const RunPath& in : inputs)
        LOCKSTEP_CHECK_HINT(!same_path(out.path, in.path), hint, out.setting(), " and ",
                            in.setting(), " name the same ",
                            fs::is_directory(in.path) ? "folder" : "file", " (", in.path.string(),
                            "): the run would write over what it reads");
      // With train.resume = auto the checkpoint read is any of checkpoint.dir's; every one of its
      // files is written or pruned by the run that holds it.
      LOCKSTEP_CHECK_HINT(dir.empty() || !((same_path(folder_of(out.path), dir) &&
                                            is_checkpoint_dir_file(out.path.filename().string())) ||
                                           same_path(out.path, dir)),
                          hint, out.setting(), " is a file of checkpoint.dir = ", dir,
                          ", whose checkpoints the run reads and writes (", out.path.string(), ")");
      for (std::size_t other = 0; other < o; ++other)
        LOCKSTEP_CHECK_HINT(!same_path(out.path, outputs[other].path), hint, out.setting(), " and ",
                            outputs[other].setting(), " name the same file");
    }
    // The folder is written (checkpoints, the lock, temporary files) and pruned: not among the
    // shards it reads, whose folder a later run would read as a set holding checkpoints.
    if (!dir.empty() && !eval_only) {
      for (const RunPath& folder : data_folders)
        LOCKSTEP_CHECK_HINT(!same_path(dir, folder.path),
                            "set checkpoint.dir to a folder of its own", "checkpoint.dir = ", dir,
                            " is the folder of the shards of ", folder.setting(),
                            ": checkpoints are written and pruned there");
    }
    return "";
  });
}

}  // namespace lockstep::train

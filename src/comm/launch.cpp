// The MPI-free parts of bootstrap.hpp: launcher classification and GPU assignment.
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "lockstep/comm/bootstrap.hpp"
#include "lockstep/core/error.hpp"

extern char** environ;

namespace lockstep::comm {
namespace {

bool recorded(const std::string& key) {
  for (const char* prefix : {"SLURM_", "OMPI_COMM_WORLD_", "PMIX_RANK", "PMIX_NAMESPACE",
                             "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"}) {
    if (key.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

}  // namespace

const char* thread_level_name(ThreadLevel level) {
  switch (level) {
    case ThreadLevel::Single:
      return "MPI_THREAD_SINGLE";
    case ThreadLevel::Funneled:
      return "MPI_THREAD_FUNNELED";
    case ThreadLevel::Serialized:
      return "MPI_THREAD_SERIALIZED";
    case ThreadLevel::Multiple:
      return "MPI_THREAD_MULTIPLE";
  }
  return "MPI_THREAD_?";
}

LaunchInfo LaunchInfo::from_variables(const std::map<std::string, std::string>& variables) {
  LaunchInfo info;
  for (const auto& [key, value] : variables) {
    if (recorded(key)) info.env[key] = value;
  }
  // mpirun sets OMPI_COMM_WORLD_*; srun (PMIx) sets SLURM_STEP_ID and PMIX_RANK but no
  // OMPI_COMM_WORLD_*. A Slurm job id without a step means mpirun inside an allocation, where
  // SLURM_PROCID is 0 on every rank.
  const bool ompi = info.env.count("OMPI_COMM_WORLD_RANK") > 0;
  const bool slurm_job = info.env.count("SLURM_JOB_ID") > 0;
  const bool slurm_step = info.env.count("SLURM_STEP_ID") > 0 || info.env.count("SLURM_STEPID") > 0;
  if (ompi && slurm_job) {
    info.launcher = "mpirun inside Slurm job " + info.env["SLURM_JOB_ID"];
  } else if (ompi) {
    info.launcher = "mpirun";
  } else if (slurm_step) {
    info.launcher = "srun";
  } else {
    info.launcher = "singleton";
  }
  return info;
}

LaunchInfo LaunchInfo::from_environment() {
  std::map<std::string, std::string> variables;
  for (char** e = environ; e && *e; ++e) {
    std::string entry(*e);
    auto eq = entry.find('=');
    if (eq != std::string::npos) variables[entry.substr(0, eq)] = entry.substr(eq + 1);
  }
  return from_variables(variables);
}

std::optional<std::string> LaunchInfo::get(const std::string& key) const {
  auto it = env.find(key);
  if (it == env.end()) return std::nullopt;
  return it->second;
}

std::optional<int> LaunchInfo::get_int(const std::string& key) const {
  auto value = get(key);
  if (!value || value->empty()) return std::nullopt;
  char* end = nullptr;
  long parsed = std::strtol(value->c_str(), &end, 10);
  if (*end != '\0') return std::nullopt;
  return static_cast<int>(parsed);
}

std::string LaunchInfo::describe() const {
  std::ostringstream out;
  out << "launcher=" << (launcher.find(' ') == std::string::npos ? launcher : '"' + launcher + '"');
  for (const char* key :
       {"SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS",
        "SLURM_NODEID", "SLURM_CPUS_PER_TASK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_RANK", "CUDA_VISIBLE_DEVICES"}) {
    if (auto value = get(key)) out << ' ' << key << '=' << *value;
  }
  return out.str();
}

GpuChoice GpuChoice::parse(const std::string& text) {
  GpuChoice choice;
  if (text == "auto") return choice;
  if (text == "local_rank") {
    choice.kind = Kind::LocalRank;
    return choice;
  }
  if (text == "first_visible") {
    choice.kind = Kind::FirstVisible;
    return choice;
  }
  const bool digits = !text.empty() && text.size() <= 4 &&
                      text.find_first_not_of("0123456789") == std::string::npos;
  LOCKSTEP_CHECK_HINT(digits, "use auto, local_rank, first_visible or a device index such as 0",
                      "key train.gpu: '", text, "' is not a GPU choice");
  choice.kind = Kind::Index;
  choice.index = std::stoi(text);
  return choice;
}

std::string GpuChoice::str() const {
  switch (kind) {
    case Kind::Auto:
      return "auto";
    case Kind::LocalRank:
      return "local_rank";
    case Kind::FirstVisible:
      return "first_visible";
    case Kind::Index:
      return std::to_string(index);
  }
  return "?";
}

std::vector<int> choose_gpus(const GpuChoice& choice, const std::vector<VisibleGpus>& views) {
  const int n = static_cast<int>(views.size());
  std::vector<int> device(static_cast<std::size_t>(n), 0);
  for (int r = 0; r < n; ++r) {
    const VisibleGpus& mine = views[r];
    const int seen = static_cast<int>(mine.size());
    LOCKSTEP_CHECK_HINT(seen >= 1,
                        "check CUDA_VISIBLE_DEVICES and the job's --gpus request, or set "
                        "train.device = cpu",
                        "local rank ", r, " sees no GPU");
    switch (choice.kind) {
      case GpuChoice::Kind::Auto: {
        int position = 0, sharing = 0;
        for (int q = 0; q < n; ++q) {
          if (views[q] != mine) continue;
          ++sharing;
          if (q < r) ++position;
        }
        LOCKSTEP_CHECK_HINT(
            sharing <= seen,
            str("start at most ", seen,
                " ranks per node (mpirun -np / srun --ntasks-per-node), or make more GPUs visible"),
            sharing, " ranks on this node but only ", seen,
            " GPUs visible to them: ranks would share GPUs");
        device[r] = position;
        break;
      }
      case GpuChoice::Kind::LocalRank:
        LOCKSTEP_CHECK_HINT(r < seen,
                            "when the launcher gives each rank its own GPU (srun "
                            "--gpus-per-task), use train.gpu = auto or first_visible",
                            "train.gpu = local_rank: local rank ", r, " sees only ", seen,
                            " GPU(s)");
        device[r] = r;
        break;
      case GpuChoice::Kind::FirstVisible:
        device[r] = 0;
        break;
      case GpuChoice::Kind::Index:
        LOCKSTEP_CHECK_HINT(choice.index < seen, "use train.gpu = auto, or a smaller index",
                            "train.gpu = ", choice.index, ": local rank ", r, " sees only ", seen,
                            " GPU(s)");
        device[r] = choice.index;
        break;
    }
  }
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < r; ++q) {
      const std::string& gpu = views[r][static_cast<std::size_t>(device[r])];
      LOCKSTEP_CHECK_HINT(gpu != views[q][static_cast<std::size_t>(device[q])],
                          "give every rank its own GPU: train.gpu = auto, fewer ranks per node, "
                          "or more GPUs per rank",
                          "train.gpu = ", choice.str(), ": local ranks ", q, " and ", r,
                          " would both drive ", gpu, " (device ", device[q], " of rank ", q,
                          ", device ", device[r], " of rank ", r, ")");
    }
  }
  return device;
}

}  // namespace lockstep::comm

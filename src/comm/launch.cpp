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

int gpu_for_local_rank(int local_rank, int local_size, int visible_devices,
                       bool shared_visibility) {
  LOCKSTEP_CHECK(local_size >= 1 && local_rank >= 0 && local_rank < local_size, "local rank ",
                 local_rank, " is outside [0, ", local_size, ")");
  LOCKSTEP_CHECK_HINT(visible_devices >= 1,
                      "check CUDA_VISIBLE_DEVICES and the job's --gpus request, or run with "
                      "--device=cpu",
                      "local rank ", local_rank, " sees no GPU");
  if (!shared_visibility) return 0;
  LOCKSTEP_CHECK_HINT(
      local_size <= visible_devices,
      str("start at most ", visible_devices,
          " ranks per node (mpirun -np / srun --ntasks-per-node), or make more GPUs visible"),
      local_size, " ranks on this node but only ", visible_devices,
      " GPUs visible: ranks would share GPUs");
  return local_rank;
}

}  // namespace lockstep::comm

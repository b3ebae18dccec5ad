#include "lockstep/comm/gpu_select.hpp"

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <vector>

#include "lockstep/core/error.hpp"

namespace lockstep::comm {
namespace detail {
#ifdef LOCKSTEP_HAVE_CUDA
VisibleGpus cuda_visible_gpus();  // src/comm/cuda/gpu_ids.cpp
#endif
}  // namespace detail

namespace {

// Ranks with the same identity share a node's GPUs. The boot id tells two hosts apart even when
// containers give them the same hostname; the hostname tells apart two VMs booted alike.
std::string node_identity() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(host) + "/" + boot;
}

std::string join(const VisibleGpus& gpus) {
  std::string out;
  for (const std::string& g : gpus)
    out += (out.empty() ? "" : ",") + g;
  return out;
}

VisibleGpus split(const std::string& text) {
  VisibleGpus out;
  std::stringstream in(text);
  for (std::string g; std::getline(in, g, ',');)
    if (!g.empty()) out.push_back(g);
  return out;
}

}  // namespace

VisibleGpus visible_gpus() {
#ifdef LOCKSTEP_HAVE_CUDA
  return detail::cuda_visible_gpus();
#else
  return {};
#endif
}

int select_local_gpu(Communicator& comm, const GpuChoice& choice, const VisibleGpus& visible) {
  // One line per rank: "node\tgpu,gpu,...". UUIDs hold no tabs or commas.
  const std::vector<std::string> all = comm.allgather(node_identity() + "\t" + join(visible));
  const std::string mine = all[static_cast<std::size_t>(comm.rank())];
  const std::string node = mine.substr(0, mine.find('\t'));
  std::vector<VisibleGpus> local_views;
  int me = -1;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    const std::string& line = all[static_cast<std::size_t>(r)];
    const std::size_t tab = line.find('\t');
    if (line.substr(0, tab) != node) continue;
    if (r == comm.rank()) me = static_cast<int>(local_views.size());
    local_views.push_back(split(line.substr(tab + 1)));
  }
  std::vector<int> devices;
  try {
    devices = choose_gpus(choice, local_views);
  } catch (const Error& e) {
    throw Error(str("rank ", comm.rank(), " (local rank ", me, " of ", local_views.size(),
                    " on this node): ", e.message()),
                e.hint(), e.file(), e.line());
  }
  return devices[static_cast<std::size_t>(me)];
}

Device select_gpu(Communicator& comm, const std::string& train_gpu) {
  return Device::cuda(select_local_gpu(comm, GpuChoice::parse(train_gpu), visible_gpus()));
}

}  // namespace lockstep::comm

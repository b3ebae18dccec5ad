#include "lockstep/train/doctor.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "lockstep/comm/gpu_select.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/data/dataset.hpp"
#include "lockstep/data/token_dataset.hpp"
#include "lockstep/ops/build_info.hpp"
#include "lockstep/train/setup.hpp"
#include "lockstep/train/token_data.hpp"

namespace lockstep::train {
namespace {

namespace fs = std::filesystem;

// One rank's answers, gathered as key_value_lines.
using Record = std::map<std::string, std::string>;

// Free and total bytes of the file system holding `path`, or nullopt when it does not exist.
std::optional<std::pair<std::uint64_t, std::uint64_t>> space(const std::string& path) {
  struct statvfs s = {};
  if (statvfs(path.c_str(), &s) != 0) return std::nullopt;
  return std::pair{static_cast<std::uint64_t>(s.f_bavail) * s.f_frsize,
                   static_cast<std::uint64_t>(s.f_blocks) * s.f_frsize};
}

// "eth0 10.0.0.5, ib0 10.1.0.5": the IPv4 interfaces that are up with a link (running),
// loopback excluded.
std::string interfaces() {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::string out;
  for (struct ifaddrs* a = list; a; a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || (a->ifa_flags & IFF_LOOPBACK) ||
        !(a->ifa_flags & IFF_UP) || !(a->ifa_flags & IFF_RUNNING))
      continue;
    char address[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<struct sockaddr_in*>(a->ifa_addr)->sin_addr, address,
              sizeof address);
    out += (out.empty() ? "" : ", ") + std::string(a->ifa_name) + " " + address;
  }
  freeifaddrs(list);
  return out;
}

// "ib0 eth1": the interfaces that exist but are down (a cable out, a port disabled).
std::string interfaces_down() {
  struct ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "";
  std::set<std::string> down;
  for (struct ifaddrs* a = list; a; a = a->ifa_next)
    if (!(a->ifa_flags & IFF_UP) || !(a->ifa_flags & IFF_RUNNING)) down.insert(a->ifa_name);
  freeifaddrs(list);
  std::string out;
  for (const std::string& name : down)
    out += (out.empty() ? "" : " ") + name;
  return out;
}

bool has_interface(const std::string& list, const std::string& name) {
  return (", " + list).find(", " + name + " ") != std::string::npos;
}

int infiniband_devices() {
  std::error_code ec;
  int n = 0;
  for (auto it = fs::directory_iterator("/sys/class/infiniband", ec);
       !ec && it != fs::directory_iterator(); it.increment(ec))
    ++n;
  return n;
}

// "" when the set opens, else the data layer's message (it names the files).
std::string check_data(const Config& config, const std::string& spec) {
  try {
    if (uses_token_data(config))
      data::TokenDataset::open(spec, 1, 0);
    else
      data::ShardedDataset::open(spec, 0);
    return "";
  } catch (const std::exception& e) {
    return e.what();
  }
}

// The nearest folder of `path` that exists (checkpoint.dir may not exist yet).
std::string existing_ancestor(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  while (!p.empty() && !fs::exists(p, ec) && p != p.parent_path())
    p = p.parent_path();
  return p.string();
}

Record probe(const Config& config, comm::Communicator& comm, const std::string& describe) {
  Record r;
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  r["host"] = host;
  r["pid"] = std::to_string(getpid());
  r["local"] = str(comm.local_rank(), "/", comm.local_size());
  r["launch"] = describe;
  if (auto shm = space("/dev/shm")) {
    r["shm_free"] = std::to_string(shm->first);
    r["shm_total"] = std::to_string(shm->second);
  }
  r["interfaces"] = interfaces();
  r["interfaces_down"] = interfaces_down();
  r["infiniband"] = std::to_string(infiniband_devices());
  for (const char* variable :
       {"NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include",
        "OMPI_MCA_btl", "OMPI_MCA_pml", "NCCL_IB_DISABLE", "UCX_NET_DEVICES"})
    if (const char* value = std::getenv(variable)) r[std::string("env.") + variable] = value;
  std::string libraries;
  std::istringstream info(ops::build_info());
  for (std::string line; std::getline(info, line);)
    if (line.rfind("  CUDA:", 0) == 0 || line.rfind("  cuDNN:", 0) == 0 ||
        line.rfind("  NCCL:", 0) == 0)
      libraries += (libraries.empty() ? "" : "; ") + line.substr(2);
  r["libraries"] = libraries;
  const comm::VisibleGpus gpus = comm::visible_gpus();
  r["gpus"] = std::to_string(gpus.size());
  if (config.train_device.rfind("cuda", 0) == 0) {
    try {
      Device device = comm::select_gpu(comm, config.train_gpu);
      r["gpu"] = str(device.index, " ", gpus.at(static_cast<std::size_t>(device.index)));
    } catch (const std::exception& e) {
      r["gpu_error"] = e.what();
    }
  }
  if (!config.checkpoint_dir.empty()) {
    const std::string folder = existing_ancestor(config.checkpoint_dir);
    r["ckpt_folder"] = folder;
    if (auto s = space(folder)) r["ckpt_free"] = std::to_string(s->first);
    r["ckpt_writable"] = access(folder.c_str(), W_OK) == 0 ? "1" : "0";
  }
  r["data.train"] = check_data(config, config.data_train);
  if (!config.data_test.empty()) r["data.test"] = check_data(config, config.data_test);
  return r;
}

}  // namespace

std::uint64_t shm_bytes_needed(int local_ranks) {
  return static_cast<std::uint64_t>(std::max(1, local_ranks)) * (64ull << 20);
}

std::vector<DoctorFinding> run_doctor(const Config& config, comm::Communicator& comm,
                                      const std::string& describe) {
  std::vector<DoctorFinding> findings;
  auto error = [&](std::string m) { findings.push_back({true, std::move(m)}); };
  auto warn = [&](std::string m) { findings.push_back({false, std::move(m)}); };

  // Collectives first, in the same order on every rank.
  try {
    check_config_agrees(comm, config);
  } catch (const Error& e) {
    error(e.message());
  }
  Record mine = probe(config, comm, describe);
  comm.barrier();
  mine["clock"] = str(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
  std::vector<Record> all;
  for (const std::string& text : comm.allgather(key_value_lines(mine)))
    all.push_back(parse_key_value_lines(text));

  auto who = [&](std::size_t r) { return str("rank ", r, " (", all[r]["host"], ")"); };
  std::set<std::string> hosts;
  std::map<std::string, std::vector<std::size_t>> gpu_users;  // "host uuid" -> ranks
  double skew = 0;
  const double clock0 = std::atof(all[0]["clock"].c_str());
  for (std::size_t r = 0; r < all.size(); ++r) {
    Record& a = all[r];
    hosts.insert(a["host"]);
    skew = std::max(skew, std::abs(std::atof(a["clock"].c_str()) - clock0));
    const int local_size = std::atoi(a["local"].substr(a["local"].find('/') + 1).c_str());
    if (a.count("shm_free") == 0) {
      error(str(who(r),
                ": /dev/shm is missing; Open MPI and NCCL keep shared-memory segments "
                "there"));
    } else if (std::stoull(a["shm_free"]) < shm_bytes_needed(local_size)) {
      error(str(who(r), ": /dev/shm has ", format_bytes(std::stoull(a["shm_free"])), " free of ",
                format_bytes(std::stoull(a["shm_total"])), ", but ", local_size,
                " rank(s) on this node need at least ", format_bytes(shm_bytes_needed(local_size)),
                " (hint: a container needs --shm-size, e.g. docker run --shm-size=1g)"));
    }
    for (const char* variable :
         {"NCCL_SOCKET_IFNAME", "OMPI_MCA_btl_tcp_if_include", "OMPI_MCA_oob_tcp_if_include"}) {
      auto it = a.find(std::string("env.") + variable);
      if (it == a.end()) continue;
      // A list ("eth0,ib0"); a leading ^ excludes, = asks for an exact name: check plain names.
      std::string value = it->second;
      if (value.empty() || value[0] == '^') continue;
      if (value[0] == '=') value = value.substr(1);
      std::istringstream names(value);
      for (std::string name; std::getline(names, name, ',');)
        if (!name.empty() && name.find('/') == std::string::npos &&
            !has_interface(a["interfaces"], name))
          error(str(who(r), ": ", variable, "=", it->second, " names interface '", name,
                    (" " + a["interfaces_down"] + " ").find(" " + name + " ") != std::string::npos
                        ? "', which is down on this host (its interfaces that are up: "
                        : "', which this host does not have (it has: ",
                    a["interfaces"].empty() ? "none" : a["interfaces"], ")"));
    }
    if (a.count("gpu_error")) error(str(who(r), ": ", a["gpu_error"]));
    if (a.count("gpu"))
      gpu_users[a["host"] + " " + a["gpu"].substr(a["gpu"].find(' ') + 1)].push_back(r);
    if (a.count("ckpt_folder")) {
      if (a["ckpt_writable"] != "1")
        error(str(who(r), ": checkpoint.dir = ", config.checkpoint_dir, ": ", a["ckpt_folder"],
                  " is not writable by this user"));
      else if (a.count("ckpt_free") && std::stoull(a["ckpt_free"]) < (1ull << 30))
        warn(str(who(r), ": checkpoint.dir = ", config.checkpoint_dir, ": only ",
                 format_bytes(std::stoull(a["ckpt_free"])), " free in ", a["ckpt_folder"]));
    }
    for (const char* key : {"data.train", "data.test"})
      if (a.count(key) && !a[key].empty())
        error(str(who(r), ": ", key, " cannot be read there: ", a[key]));
  }
  for (const auto& [gpu, ranks] : gpu_users)
    if (ranks.size() > 1) {
      std::string list;
      for (std::size_t r : ranks)
        list += (list.empty() ? "" : ", ") + std::to_string(r);
      error(str("ranks ", list, " on ", gpu.substr(0, gpu.find(' ')), " would all drive GPU ",
                gpu.substr(gpu.find(' ') + 1), " (hint: one GPU per rank; check train.gpu and ",
                "CUDA_VISIBLE_DEVICES)"));
    }
  if (skew > 1.0)
    warn(str("clocks differ by up to ", skew,
             " s between ranks: timestamps in logs and checkpoint ages will disagree (NTP?)"));
  if (hosts.size() > 1) {
    int fast = 0;
    for (Record& a : all)
      fast += std::atoi(a["infiniband"].c_str()) > 0;
    if (fast == 0) {
      warn(str("MPI between the ", hosts.size(),
               " nodes runs over TCP: no InfiniBand/RoCE device on any node; gradient allreduce "
               "is bound by the Ethernet link"));
    } else {
      for (std::size_t r = 0; r < all.size(); ++r) {
        auto btl = all[r].find("env.OMPI_MCA_btl");
        auto ib = all[r].find("env.NCCL_IB_DISABLE");
        if (std::atoi(all[r]["infiniband"].c_str()) > 0 && btl != all[r].end() &&
            btl->second.find("tcp") != std::string::npos &&
            btl->second.find("openib") == std::string::npos &&
            btl->second.find("uct") == std::string::npos)
          warn(str(who(r), ": has an InfiniBand device but OMPI_MCA_btl=", btl->second,
                   " keeps MPI on TCP"));
        if (std::atoi(all[r]["infiniband"].c_str()) > 0 && ib != all[r].end() && ib->second == "1")
          warn(str(who(r),
                   ": has an InfiniBand device but NCCL_IB_DISABLE=1 keeps NCCL on "
                   "sockets"));
      }
    }
  }

  if (comm.rank() == 0) {
    std::string out =
        str("lockstep doctor: ", all.size(), " rank(s) on ", hosts.size(), " node(s)\n");
    for (std::size_t r = 0; r < all.size(); ++r) {
      Record& a = all[r];
      out += str(
          "  rank ", r, ": ", a["host"], " pid ", a["pid"], ", local ", a["local"], ", /dev/shm ",
          a.count("shm_free") ? format_bytes(std::stoull(a["shm_free"])) + " free" : "missing",
          ", net ", a["interfaces"].empty() ? "none" : a["interfaces"], ", infiniband ",
          a["infiniband"], ", GPUs ", a["gpus"], a.count("gpu") ? " (drives " + a["gpu"] + ")" : "",
          a.count("ckpt_free")
              ? ", checkpoint.dir free " + format_bytes(std::stoull(a["ckpt_free"]))
              : "",
          ", data ",
          a["data.train"].empty() && (!a.count("data.test") || a["data.test"].empty())
              ? "readable"
              : "NOT readable",
          "\n");
    }
    out += str("  libraries (rank 0): ", all[0]["libraries"], "\n");
    out += str("  clock skew between ranks: at most ", skew * 1000.0, " ms\n");
    int errors = 0;
    for (const DoctorFinding& f : findings) {
      out += str(f.error ? "error: " : "warning: ", f.message, "\n");
      errors += f.error;
    }
    out += errors ? str("lockstep doctor: ", errors, " error(s): the job would fail as launched\n")
                  : std::string("lockstep doctor: no errors\n");
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }
  return findings;
}

}  // namespace lockstep::train

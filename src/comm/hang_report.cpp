#include "comm/hang_report.hpp"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "lockstep/core/error.hpp"

namespace lockstep::comm::detail {
namespace {

std::string seconds(double s) {
  char buffer[32];
  std::snprintf(buffer, sizeof buffer, "%.1f s", s);
  return buffer;
}

std::string collective(const RankStatus& s) {
  return str("#", s.seq, " ", s.name());
}

// "1, 3, 5-9": ranks in increasing order, runs collapsed.
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1)
      ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(ranks[i]);
    if (j > i) out += (j == i + 1 ? ", " : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// Where `peer` stands relative to `mine`, for the report line; empty when it arrived (waits in
// the same collective) or is already past it, i.e. is not the reason for the wait.
std::string missing_reason(const RankStatus& mine, const RankStatus& peer) {
  if (peer.seq >= mine.seq) return "";
  if (peer.in_flight)
    return str("still in collective ", collective(peer), " (", step_phrase(peer.step), "), for ",
               seconds(peer.seconds));
  return str("not in a collective: ",
             peer.seq > 0 ? str("finished ", collective(peer), " ", seconds(peer.seconds), " ago")
                          : std::string("none issued yet"),
             " and is ", step_phrase(peer.current_step),
             ", stuck outside communication (data loading, the file system, a deadlock, a long "
             "computation?)");
}

}  // namespace

std::chrono::microseconds WaitPolicy::pause_after(std::chrono::microseconds waited) const {
  if (waited < spin) return std::chrono::microseconds(0);
  auto share = std::chrono::microseconds(
      static_cast<std::int64_t>(static_cast<double>(waited.count()) * fraction));
  return std::clamp(share, min_sleep, max_sleep);
}

void RankStatus::set_what(const std::string& name) {
  std::memset(what, 0, sizeof what);
  std::memcpy(what, name.data(), std::min(name.size(), sizeof what - 1));
}

std::string RankStatus::name() const {
  return std::string(what, strnlen(what, sizeof what));
}

std::string step_phrase(std::int64_t step) {
  return step > 0 ? str("at training step ", step) : std::string("before the first training step");
}

std::string place_host(const std::string& place) {
  return place.substr(0, place.find(','));
}

std::string timeout_report(int my_rank, const RankStatus& mine,
                           const std::vector<std::optional<RankStatus>>& peers, double timeout_s,
                           double grace_s, int first, const std::vector<std::string>& places) {
  std::vector<int> missing, arrived;
  std::vector<std::string> lines;
  auto who = [&](int r) {
    return r < static_cast<int>(places.size()) ? str("rank ", r, " (", places[r], ")")
                                               : str("rank ", r);
  };
  for (int r = 0; r < static_cast<int>(peers.size()); ++r) {
    if (r == my_rank) continue;
    if (!peers[r]) {
      missing.push_back(r);
      lines.push_back(str(who(r), ": no answer within ", seconds(grace_s),
                          ": stopped (SIGSTOP, a debugger), dead, or its communication thread is "
                          "blocked"));
      continue;
    }
    const RankStatus& peer = *peers[r];
    std::string reason = missing_reason(mine, peer);
    if (!reason.empty()) {
      missing.push_back(r);
      lines.push_back(str(who(r), ": ", reason));
    } else if (peer.seq == mine.seq && peer.in_flight) {
      arrived.push_back(r);
    } else {
      lines.push_back(str(who(r), ": already past it, ",
                          peer.in_flight ? "in collective " : "finished ", collective(peer)));
    }
  }
  const std::string prefix = str("rank ", my_rank, ": ");
  std::string out = prefix;
  out += str("error: collective ", collective(mine), " ", step_phrase(mine.step),
             " did not complete within dist.timeout_s = ", timeout_s, " s");
  if (first >= 0)
    out += str(" (rank ", first, "'s expired first; this rank waited ", seconds(mine.seconds), ")");
  out += "; ";
  out += missing.empty()
             ? std::string("every rank reached it, so the transport itself is stuck (network, MPI)")
             : str("rank", missing.size() > 1 ? "s " : " ", rank_list(missing), " did not arrive");
  out += "\n";
  for (const std::string& line : lines)
    out += prefix + "  " + line + "\n";
  if (!arrived.empty())
    out += prefix + "  waiting in it too: rank" + (arrived.size() > 1 ? "s " : " ") +
           rank_list(arrived) + "\n";
  std::vector<std::string> hosts;
  for (int r : missing)
    if (r < static_cast<int>(places.size())) hosts.push_back(place_host(places[r]));
  std::sort(hosts.begin(), hosts.end());
  hosts.erase(std::unique(hosts.begin(), hosts.end()), hosts.end());
  if (!hosts.empty()) {
    out += prefix + "  suspect hosts:";
    for (const std::string& host : hosts)
      out += " " + host;
    out += " (of rank" + std::string(missing.size() > 1 ? "s " : " ") + rank_list(missing) + ")\n";
  }
  return out;
}

std::string behind_report(int my_rank, const RankStatus& mine, int asker, const RankStatus& asked) {
  std::string where = mine.in_flight ? str("is in collective ", collective(mine), " (",
                                           step_phrase(mine.step), ") for ", seconds(mine.seconds))
                                     : str("is not in a collective (",
                                           mine.seq > 0 ? str("finished ", collective(mine), " ",
                                                              seconds(mine.seconds), " ago")
                                                        : std::string("none issued yet"),
                                           ") and is ", step_phrase(mine.current_step));
  return str("rank ", my_rank, ": rank ", asker, " timed out in collective ", collective(asked),
             " (", step_phrase(asked.step), ") waiting for this rank, which ", where, "\n");
}

}  // namespace lockstep::comm::detail

// CPU fused ops over flat buffers: each op is one parallel loop over the buffer's chunks, so the
// thread pool is woken once per step instead of once per parameter.
//
// Chunks are kReduceBlock elements of one segment, counted from the segment's start: exactly the
// blocks sum_squares uses on that tensor alone, which is what makes flat_sum_squares give the
// per-tensor results bit for bit (partials added in block order per segment, then segments in
// slot order). The updates use the per-tensor ops' element loops (optim_loops.hpp), so any cut
// gives the same bits; work is split between threads by element count, at chunk boundaries.
#include <algorithm>
#include <vector>

#include "lockstep/core/error.hpp"
#include "lockstep/ops/step_verdict.hpp"
#include "ops/cpu/cpu_backend.hpp"
#include "ops/cpu/optim_loops.hpp"
#include "ops/cpu/parallel.hpp"
#include "ops/cpu/reduce.hpp"

namespace lockstep::ops::cpu {
namespace {

struct Chunk {
  std::int64_t begin, end;
  std::int32_t slot;
  bool decay;
};

class CpuFlatPlan final : public FlatPlan {
 public:
  CpuFlatPlan(std::vector<FlatSegment> segments, std::int64_t numel)
      : FlatPlan(std::move(segments), numel, Device::cpu()) {
    for (const FlatSegment& s : this->segments()) {
      for (std::int64_t b = s.offset; b < s.offset + s.numel; b += kReduceBlock)
        chunks.push_back({b, std::min(b + kReduceBlock, s.offset + s.numel), s.slot, s.decay});
    }
    before.assign(chunks.size() + 1, 0);
    for (std::size_t c = 0; c < chunks.size(); ++c)
      before[c + 1] = before[c] + (chunks[c].end - chunks[c].begin);
  }

  // The chunks that overlap `range`: [first, last).
  std::pair<std::size_t, std::size_t> chunks_in(FlatRange range) const {
    if (range.begin >= range.end) return {0, 0};
    auto lo = std::partition_point(chunks.begin(), chunks.end(),
                                   [&](const Chunk& c) { return c.end <= range.begin; });
    auto hi =
        std::partition_point(lo, chunks.end(), [&](const Chunk& c) { return c.begin < range.end; });
    return {static_cast<std::size_t>(lo - chunks.begin()),
            static_cast<std::size_t>(hi - chunks.begin())};
  }

  std::vector<Chunk> chunks;         // by offset
  std::vector<std::int64_t> before;  // before[c]: elements in chunks [0, c)
};

const CpuFlatPlan& cpu_plan(const FlatPlan& plan) {
  const auto* p = dynamic_cast<const CpuFlatPlan*>(&plan);
  LOCKSTEP_CHECK(p != nullptr, "a flat plan made by another backend was given to the CPU backend");
  return *p;
}

// Runs f(chunk index, begin, end) for every chunk overlapping `range`, clipped to it: on the
// calling thread when there are fewer than `grain` elements per thread, else one contiguous run
// of chunks per thread holding about the same number of elements.
template <class F>
void for_chunks(ThreadPool& pool, const CpuFlatPlan& plan, FlatRange range, std::int64_t grain,
                const F& f) {
  auto [c0, c1] = plan.chunks_in(range);
  auto run = [&](std::size_t first, std::size_t last) {
    for (std::size_t c = first; c < last; ++c) {
      const Chunk& k = plan.chunks[c];
      f(c, std::max(k.begin, range.begin), std::min(k.end, range.end));
    }
  };
  const std::int64_t total = plan.before[c1] - plan.before[c0];
  const std::int64_t parts =
      std::min<std::int64_t>(pool.size(), total / std::max<std::int64_t>(grain, 1));
  if (parts <= 1) {
    run(c0, c1);
    return;
  }
  // Part p starts at the first chunk with at least total * p / parts elements before it.
  auto start = [&](std::int64_t p) {
    const std::int64_t target = plan.before[c0] + total * p / parts;
    return static_cast<std::size_t>(
        std::lower_bound(plan.before.begin() + static_cast<std::ptrdiff_t>(c0),
                         plan.before.begin() + static_cast<std::ptrdiff_t>(c1), target) -
        plan.before.begin());
  };
  pool.run([&](int part, int) {
    if (part >= parts) return;
    run(start(part), part + 1 == parts ? c1 : start(part + 1));
  });
}

}  // namespace

std::shared_ptr<const FlatPlan> CpuBackend::make_flat_plan(std::vector<FlatSegment> segments,
                                                           std::int64_t numel) {
  return std::make_shared<CpuFlatPlan>(std::move(segments), numel);
}

void CpuBackend::flat_sgd_update(const FlatPlan& plan, FlatRange range, Tensor& param,
                                 const Tensor& grad, Tensor& momentum_buf,
                                 std::int64_t state_origin, const SgdParams& p) {
  const CpuFlatPlan& cp = cpu_plan(plan);
  SgdParams q = p;
  if (p.verdict.defined()) {
    if (!verdict_applies(p.verdict.data<double>(), q.step)) return;
    q.first_step = q.step == 1;
  }
  float* pw = param.data<float>();
  const float* pg = grad.data<float>();
  float* pbuf = p.momentum != 0.0f ? momentum_buf.data<float>() : nullptr;
  const SgdLoop with_decay(q, true), without_decay(q, false);
  for_chunks(ctx_.pool(), cp, range, kParallelGrain,
             [&](std::size_t c, std::int64_t b, std::int64_t e) {
               const SgdLoop& loop = cp.chunks[c].decay ? with_decay : without_decay;
               loop(pw + b, pg + b, pbuf ? pbuf + (b - state_origin) : nullptr, e - b);
             });
}

void CpuBackend::flat_adamw_update(const FlatPlan& plan, FlatRange range, Tensor& param,
                                   const Tensor& grad, Tensor& m, Tensor& v,
                                   std::int64_t state_origin, const AdamWParams& p) {
  const CpuFlatPlan& cp = cpu_plan(plan);
  AdamWParams q = p;
  if (p.verdict.defined() && !verdict_applies(p.verdict.data<double>(), q.step)) return;
  float* pw = param.data<float>();
  const float* pg = grad.data<float>();
  float* pm = m.data<float>();
  float* pv = v.data<float>();
  const AdamWLoop with_decay(q, true), without_decay(q, false);
  for_chunks(ctx_.pool(), cp, range, kParallelGrain / 4,
             [&](std::size_t c, std::int64_t b, std::int64_t e) {
               const AdamWLoop& loop = cp.chunks[c].decay ? with_decay : without_decay;
               const std::int64_t s = b - state_origin;
               loop(pw + b, pg + b, pm + s, pv + s, e - b);
             });
}

void CpuBackend::flat_sum_squares(const FlatPlan& plan, FlatRange range, const Tensor& x,
                                  Tensor& sums, FlatSums what) {
  const CpuFlatPlan& cp = cpu_plan(plan);
  const float* px = x.data<float>();
  auto [c0, c1] = cp.chunks_in(range);
  double* partial = scratch_doubles(c1 - c0);
  for_chunks(ctx_.pool(), cp, range, kParallelGrain,
             [&](std::size_t c, std::int64_t b, std::int64_t e) {
               partial[c - c0] = what == FlatSums::Squares
                                     ? sum_of_squares(px + b, e - b)
                                     : static_cast<double>(nonfinite_probe(px + b, e - b));
             });
  double* out = sums.data<double>();
  const std::int32_t slots = plan.slots();
  std::fill(out, out + slots + 1, 0.0);
  for (std::size_t c = c0; c < c1; ++c)
    out[cp.chunks[c].slot] += partial[c - c0];
  for (std::int32_t s = 0; s < slots; ++s)
    out[slots] += out[s];
}

// The verdict's three ops touch two doubles each (clip_by_verdict then one scale of the
// gradients): on the calling thread, which on the emulated GPU is the stream's worker.
void CpuBackend::verdict_add(const Tensor& total, Tensor& verdict, bool first) {
  double* v = verdict.data<double>();
  v[0] = (first ? 0.0 : v[0]) + total.data<double>()[0];
}

void CpuBackend::verdict_close(Tensor& verdict, std::int64_t taken) {
  double* v = verdict.data<double>();
  std::int64_t step = 0;
  v[1] = v[1] - static_cast<double>(taken) + (verdict_applies(v, step) ? 0.0 : 1.0);
}

void CpuBackend::clip_by_verdict(Tensor& x, const Tensor& verdict, double max_norm) {
  const double coef = clip_coefficient(max_norm, verdict.data<double>()[0]);
  if (coef < 1.0) scale(x, static_cast<float>(coef));  // never for a NaN or Inf norm
}

}  // namespace lockstep::ops::cpu

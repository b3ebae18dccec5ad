// The fused flat-buffer kernels on the GPU against the per-tensor CUDA kernels and against the
// CPU's fused ops (which tests/optim shows equal the per-parameter ops bit for bit). The GPU
// may contract a*b+c into one FMA where the CPU rounds twice, so agreement is to float rounding:
// 1e-6 of the largest value (a few ulps), as for the per-tensor optimizer kernels.
#include "support/cuda_test_support.hpp"

namespace lockstep::testing {
namespace {

class Flat : public CudaVsCpu {};

// Segments with padding between them and mixed decay flags; one spans many GPU chunks and the
// CPU's reduction blocks. Slots are not in buffer order, as in a real (reversed) layout.
std::vector<ops::FlatSegment> segments() {
  return {
      {0, 100, 3, true}, {128, 300001, 1, false}, {300160, 7, 0, true}, {300224, 4096, 2, true}};
}
constexpr std::int64_t kNumel = 304320;

ops::SgdParams sgd_case(int k, int step) {
  ops::SgdParams s;
  s.lr = 0.05f;
  s.momentum = k == 0 ? 0.0f : 0.9f;
  s.dampening = k == 2 ? 0.1f : 0.0f;
  s.weight_decay = k == 1 ? 0.0f : 1e-3f;
  s.nesterov = k == 3;
  s.first_step = step == 0;
  return s;
}

ops::AdamWParams adamw_case(int step) {
  ops::AdamWParams a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  a.step = step + 1;
  return a;
}

TEST_F(Flat, SgdMatchesThePerTensorKernelsAndTheCpu) {
  auto gplan = ops::make_flat_plan(gpu(), segments(), kNumel);
  auto cplan = ops::make_flat_plan(cpu(), segments(), kNumel);
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE(k);
    Tensor w = random_tensor({kNumel}, 10), buf = random_tensor({kNumel}, 11);
    Tensor wg = dev(w), bufg = dev(buf), wref = dev(w), bufref = dev(buf);
    for (int step = 0; step < 3; ++step) {
      Tensor g = random_tensor({kNumel}, 20 + step), gg = dev(g);
      ops::SgdParams p = sgd_case(k, step);
      ops::flat_sgd_update(cpu(), *cplan, {0, kNumel}, w, g, buf, 0, p);
      ops::flat_sgd_update(gpu(), *gplan, {0, kNumel}, wg, gg, bufg, 0, p);
      for (const ops::FlatSegment& s : segments()) {
        ops::SgdParams ps = p;
        if (!s.decay) ps.weight_decay = 0.0f;
        Tensor ws = wref.slice(s.offset, s.offset + s.numel),
               bs = bufref.slice(s.offset, s.offset + s.numel);
        ops::sgd_update(gpu(), ws, gg.slice(s.offset, s.offset + s.numel), bs, ps);
      }
    }
    for (const ops::FlatSegment& s : segments()) {
      SCOPED_TRACE(s.slot);
      EXPECT_CLOSE(host(wg).slice(s.offset, s.offset + s.numel),
                   host(wref).slice(s.offset, s.offset + s.numel), 1e-6);
      EXPECT_CLOSE(host(wg).slice(s.offset, s.offset + s.numel),
                   w.slice(s.offset, s.offset + s.numel), 1e-6);
      if (k != 0) {
        EXPECT_CLOSE(host(bufg).slice(s.offset, s.offset + s.numel),
                     buf.slice(s.offset, s.offset + s.numel), 1e-6);
      }
    }
  }
}

TEST_F(Flat, AdamWMatchesThePerTensorKernelsAndTheCpu) {
  auto gplan = ops::make_flat_plan(gpu(), segments(), kNumel);
  auto cplan = ops::make_flat_plan(cpu(), segments(), kNumel);
  Tensor w = random_tensor({kNumel}, 30), m = Tensor::zeros({kNumel}), v = Tensor::zeros({kNumel});
  Tensor wg = dev(w), mg = dev(m), vg = dev(v), wref = dev(w), mref = dev(m), vref = dev(v);
  for (int step = 0; step < 3; ++step) {
    Tensor g = random_tensor({kNumel}, 40 + step), gg = dev(g);
    ops::flat_adamw_update(cpu(), *cplan, {0, kNumel}, w, g, m, v, 0, adamw_case(step));
    ops::flat_adamw_update(gpu(), *gplan, {0, kNumel}, wg, gg, mg, vg, 0, adamw_case(step));
    for (const ops::FlatSegment& s : segments()) {
      ops::AdamWParams a = adamw_case(step);
      if (!s.decay) a.weight_decay = 0.0f;
      const std::int64_t b = s.offset, e = s.offset + s.numel;
      Tensor ws = wref.slice(b, e), ms = mref.slice(b, e), vs = vref.slice(b, e);
      ops::adamw_update(gpu(), ws, gg.slice(b, e), ms, vs, a);
    }
  }
  for (const ops::FlatSegment& s : segments()) {
    SCOPED_TRACE(s.slot);
    const std::int64_t b = s.offset, e = s.offset + s.numel;
    EXPECT_CLOSE(host(wg).slice(b, e), host(wref).slice(b, e), 1e-6);
    EXPECT_CLOSE(host(wg).slice(b, e), w.slice(b, e), 1e-6);
    EXPECT_CLOSE(host(mg).slice(b, e), m.slice(b, e), 1e-6);
    EXPECT_CLOSE(host(vg).slice(b, e), v.slice(b, e), 1e-6);
  }
}

TEST_F(Flat, ShardsWithShardSizedStateEqualTheWholeUpdateBitForBit) {
  // Each element is computed by the same kernel from the same inputs whichever launch covers it.
  auto plan = ops::make_flat_plan(gpu(), segments(), kNumel);
  Tensor g = dev(random_tensor({kNumel}, 50));
  Tensor w_all = dev(random_tensor({kNumel}, 51)), w_shards = dev(random_tensor({kNumel}, 51));
  Tensor m0 = random_tensor({kNumel}, 52, -0.1f, 0.1f),
         v0 = random_tensor({kNumel}, 53, 0.0f, 1.0f);
  Tensor m_all = dev(m0), v_all = dev(v0);
  ops::flat_adamw_update(gpu(), *plan, {0, kNumel}, w_all, g, m_all, v_all, 0, adamw_case(2));
  const std::int64_t cuts[] = {0, 77, 4160, 150001, 300040, kNumel};
  for (std::size_t s = 0; s + 1 < std::size(cuts); ++s) {
    const std::int64_t b = cuts[s], e = cuts[s + 1];
    Tensor m = dev(m0.slice(b, e).clone()), v = dev(v0.slice(b, e).clone());
    ops::flat_adamw_update(gpu(), *plan, {b, e}, w_shards, g, m, v, b, adamw_case(2));
    EXPECT_EQ(host(m).to_vector<float>(), host(m_all).slice(b, e).to_vector<float>()) << s;
    EXPECT_EQ(host(v).to_vector<float>(), host(v_all).slice(b, e).to_vector<float>()) << s;
  }
  EXPECT_EQ(host(w_shards).to_vector<float>(), host(w_all).to_vector<float>());
}

TEST_F(Flat, PaddingIsNeverReadOrWritten) {
  auto plan = ops::make_flat_plan(gpu(), segments(), kNumel);
  std::vector<float> wv = random_tensor({kNumel}, 60).to_vector<float>();
  std::vector<float> gv = random_tensor({kNumel}, 61).to_vector<float>();
  for (std::int64_t i = 100; i < 128; ++i) {  // padding after the first segment
    wv[static_cast<std::size_t>(i)] = std::nanf("");
    gv[static_cast<std::size_t>(i)] = std::nanf("");
  }
  Tensor w = dev(Tensor::from_vector(wv, {kNumel})), g = dev(Tensor::from_vector(gv, {kNumel}));
  Tensor m = dev(Tensor::zeros({kNumel})), v = dev(Tensor::zeros({kNumel}));
  ops::flat_adamw_update(gpu(), *plan, {0, kNumel}, w, g, m, v, 0, adamw_case(0));
  Tensor sums = Tensor::empty({5}, DType::F64, Device::cuda(0));
  ops::flat_sum_squares(gpu(), *plan, {0, kNumel}, g, sums);
  EXPECT_TRUE(std::isfinite(host(sums).to_vector<double>()[4])) << "padding reached the sum";
  auto wa = host(w).to_vector<float>(), ma = host(m).to_vector<float>();
  for (std::int64_t i = 100; i < 128; ++i) {
    EXPECT_TRUE(std::isnan(wa[static_cast<std::size_t>(i)])) << "padding written at " << i;
    EXPECT_EQ(ma[static_cast<std::size_t>(i)], 0.0f) << "state padding written at " << i;
  }
  // A NaN inside a segment does reach it.
  gv[300033] = std::nanf("");
  g = dev(Tensor::from_vector(gv, {kNumel}));
  ops::flat_sum_squares(gpu(), *plan, {0, kNumel}, g, sums);
  EXPECT_TRUE(std::isnan(host(sums).to_vector<double>()[4]));
  ops::flat_sum_squares(gpu(), *plan, {0, kNumel}, g, sums, ops::FlatSums::FinitenessOnly);
  auto probe = host(sums).to_vector<double>();
  EXPECT_TRUE(std::isnan(probe[4])) << "finiteness only";
  EXPECT_EQ(probe[0], 0.0) << "slot 0 holds no NaN";
}

TEST_F(Flat, SumOfSquaresPerSlotMatchesTheCpuAndIsDeterministic) {
  auto gplan = ops::make_flat_plan(gpu(), segments(), kNumel);
  auto cplan = ops::make_flat_plan(cpu(), segments(), kNumel);
  Tensor x = random_tensor({kNumel}, 70);
  Tensor xg = dev(x);
  for (ops::FlatRange r : {ops::FlatRange{0, kNumel}, ops::FlatRange{50, 200000}}) {
    SCOPED_TRACE(r.begin);
    Tensor cs = Tensor::empty({5}, DType::F64),
           gs = Tensor::empty({5}, DType::F64, Device::cuda(0));
    ops::flat_sum_squares(cpu(), *cplan, r, x, cs);
    ops::flat_sum_squares(gpu(), *gplan, r, xg, gs);
    auto want = cs.to_vector<double>(), got = host(gs).to_vector<double>();
    for (std::size_t s = 0; s < want.size(); ++s)
      EXPECT_NEAR(got[s], want[s], 1e-12 * (1.0 + want[s])) << "slot " << s;
    ops::flat_sum_squares(gpu(), *gplan, r, xg, gs);
    EXPECT_EQ(host(gs).to_vector<double>(), got) << "a second run gives the same bits";
  }
}

}  // namespace
}  // namespace lockstep::testing

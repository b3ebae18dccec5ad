// Small fixed-order reduction helpers for the CPU kernels. Sums run over kLanes independent
// accumulators (so the compiler can keep them in vector registers without reassociating), then
// the lanes are added in lane order: the result depends only on the data, never on threads.
#pragma once

#include <cstdint>

namespace lockstep::ops::cpu {

inline constexpr int kLanes = 8;

inline double lane_total(const double (&acc)[kLanes]) {
  double t = 0.0;
  for (int j = 0; j < kLanes; ++j)
    t += acc[j];
  return t;
}

// s1 = sum p[i], s2 = sum p[i]^2, in double.
inline void sum_and_squares(const float* p, std::int64_t n, double& s1, double& s2) {
  double a1[kLanes] = {}, a2[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      double v = p[i + j];
      a1[j] += v;
      a2[j] += v * v;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    double v = p[i];
    a1[j] += v;
    a2[j] += v * v;
  }
  s1 = lane_total(a1);
  s2 = lane_total(a2);
}

// sum p[i]^2 in double: sum_and_squares' s2, bit for bit, at half the work.
inline double sum_of_squares(const float* p, std::int64_t n) {
  double a2[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      double v = p[i + j];
      a2[j] += v * v;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    double v = p[i];
    a2[j] += v * v;
  }
  return lane_total(a2);
}

// 0 when every p[i] is finite, NaN otherwise: x * 0 is 0 for finite x and NaN for Inf or NaN,
// and NaN survives any sum, so the test is branch-free and vectorises.
inline float nonfinite_probe(const float* p, std::int64_t n) {
  float acc[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j)
      acc[j] += p[i + j] * 0.0f;
  }
  for (; i < n; ++i)
    acc[0] += p[i] * 0.0f;
  float t = 0.0f;
  for (int j = 0; j < kLanes; ++j)
    t += acc[j];
  return t;
}

// sdy = sum dy[i], sdyx = sum dy[i] * (x[i] - mean), in double.
inline void sum_dy_dyx(const float* x, const float* dy, std::int64_t n, double mean, double& sdy,
                       double& sdyx) {
  double a1[kLanes] = {}, a2[kLanes] = {};
  std::int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      double g = dy[i + j];
      a1[j] += g;
      a2[j] += g * (static_cast<double>(x[i + j]) - mean);
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    double g = dy[i];
    a1[j] += g;
    a2[j] += g * (static_cast<double>(x[i]) - mean);
  }
  sdy = lane_total(a1);
  sdyx = lane_total(a2);
}

}  // namespace lockstep::ops::cpu

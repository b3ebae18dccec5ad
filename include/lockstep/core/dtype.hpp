// Element types. Compute is f32; u8 holds raw images, i32 labels; bf16 is reserved for the
// CUDA mixed-precision path (storage only on the CPU).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace lockstep {

enum class DType : std::uint8_t { F32, I32, U8, BF16, F64 };

constexpr std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F32:
      return 4;
    case DType::I32:
      return 4;
    case DType::U8:
      return 1;
    case DType::BF16:
      return 2;
    case DType::F64:
      return 8;
  }
  return 0;
}

const char* dtype_name(DType t);
DType dtype_from_name(const std::string& name);  // throws lockstep::Error on unknown names

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::U8;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}

}  // namespace lockstep

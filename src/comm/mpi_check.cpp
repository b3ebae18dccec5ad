#include "comm/mpi_check.hpp"

#include <algorithm>
#include <mutex>
#include <type_traits>

#include "lockstep/core/bf16.hpp"
#include "lockstep/core/error.hpp"
#include "lockstep/core/simd_clones.hpp"

namespace lockstep::comm::detail {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return str("MPI error code ", code);
  int error_class = code;
  MPI_Error_class(code, &error_class);
  return str(std::string(text, length), " (MPI error class ", error_class, ")");
}

void mpi_fail(int code, const char* call, const char* file, int line) {
  int initialized = 0, finalized = 0, rank = -1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  throw Error(str("rank ", rank, ": ", call, " failed: ", mpi_error_string(code)),
              "every rank must call the same collectives in the same order with matching sizes",
              file, line);
}

MPI_Op to_mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return MPI_SUM;
    case ReduceOp::Max:
      return MPI_MAX;
    case ReduceOp::Min:
      return MPI_MIN;
  }
  LOCKSTEP_FAIL("unknown ReduceOp ", static_cast<int>(op));
}

namespace {

// The loops of the MPI_User_functions over bf16 bits: b[i] <- op(a[i], b[i]) in f32, rounded
// once. Integer bit operations and one f32 op per element, so the AVX2/AVX-512 clones (the
// project builds for baseline x86-64) give the same bits as the baseline one; the sum is the hot
// one (every gradient element at every combination), about 3x faster in the AVX2 clone.
template <class Combine>
void combine_bf16_loop(const std::uint16_t* a, std::uint16_t* b, int n) {
  for (int i = 0; i < n; ++i)
    b[i] = float_to_bf16(Combine{}(bf16_to_float(a[i]), bf16_to_float(b[i])));
}

LOCKSTEP_SIMD_CLONES void add_bf16_loop(const std::uint16_t* a, std::uint16_t* b, int n) {
  combine_bf16_loop<F32Add>(a, b, n);
}

// MPI_User_function over bf16 bits: inout[i] <- op(in[i], inout[i]).
template <class Combine>
void combine_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  if constexpr (std::is_same_v<Combine, F32Add>) {
    add_bf16_loop(a, b, *len);
  } else {
    combine_bf16_loop<Combine>(a, b, *len);
  }
}

}  // namespace

MPI_Op to_mpi_op(ReduceOp op, DType dtype) {
  if (dtype != DType::BF16) return to_mpi_op(op);
  // Created once per process, after MPI_Init (a communicator exists), and never freed: MPI
  // releases user ops at MPI_Finalize.
  static MPI_Op ops[3] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  static std::once_flag once;
  std::call_once(once, [] {
    LOCKSTEP_CHECK_MPI(MPI_Op_create(&combine_bf16<F32Add>, /*commute=*/1, &ops[0]));
    LOCKSTEP_CHECK_MPI(MPI_Op_create(&combine_bf16<F32Max>, 1, &ops[1]));
    LOCKSTEP_CHECK_MPI(MPI_Op_create(&combine_bf16<F32Min>, 1, &ops[2]));
  });
  switch (op) {
    case ReduceOp::Sum:
      return ops[0];
    case ReduceOp::Max:
      return ops[1];
    case ReduceOp::Min:
      return ops[2];
  }
  LOCKSTEP_FAIL("unknown ReduceOp ", static_cast<int>(op));
}

MPI_Datatype reduction_type(DType dtype, const char* what) {
  switch (dtype) {
    case DType::BF16:
      return MPI_UINT16_T;
    case DType::F32:
      return MPI_FLOAT;
    case DType::I32:
      return MPI_INT32_T;
    case DType::F64:
      return MPI_DOUBLE;
    default:
      break;
  }
  LOCKSTEP_FAIL_HINT("reduce f32, i32, f64 or bf16 tensors", what, ": no MPI reduction for dtype ",
                     dtype_name(dtype));
}

int to_mpi_thread_level(ThreadLevel level) {
  switch (level) {
    case ThreadLevel::Single:
      return MPI_THREAD_SINGLE;
    case ThreadLevel::Funneled:
      return MPI_THREAD_FUNNELED;
    case ThreadLevel::Serialized:
      return MPI_THREAD_SERIALIZED;
    case ThreadLevel::Multiple:
      return MPI_THREAD_MULTIPLE;
  }
  return MPI_THREAD_MULTIPLE;
}

ThreadLevel from_mpi_thread_level(int level) {
  if (level == MPI_THREAD_SINGLE) return ThreadLevel::Single;
  if (level == MPI_THREAD_FUNNELED) return ThreadLevel::Funneled;
  if (level == MPI_THREAD_SERIALIZED) return ThreadLevel::Serialized;
  return ThreadLevel::Multiple;
}

}  // namespace lockstep::comm::detail

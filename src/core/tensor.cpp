#include "lockstep/core/tensor.hpp"

#include <atomic>
#include <cstring>
#include <sstream>

#include "lockstep/core/allocator.hpp"

namespace lockstep {

std::int64_t shape_numel(const Shape& shape) {
  bool empty = false;
  for (std::int64_t d : shape) {
    LOCKSTEP_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
    empty = empty || d == 0;
  }
  if (empty) return 0;
  // Shapes come from files too (idx headers, HDF5 dataspaces): a product past 2^63 must be an
  // error, not a wrapped count that a small allocation then "satisfies".
  std::int64_t n = 1;
  for (std::int64_t d : shape) {
    LOCKSTEP_CHECK(!__builtin_mul_overflow(n, d, &n), "shape ", shape_str(shape),
                   " has more than 2^63 elements");
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i)
    out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

Storage::Storage(std::size_t bytes, Device device) : bytes_(bytes), device_(device) {
  data_ = allocator_for(device).allocate_on(device, bytes);
}

Storage::Storage(void* data, std::size_t bytes, Device device, Borrowed)
    : data_(data), bytes_(bytes), device_(device), owned_(false) {}

Storage::~Storage() {
  if (owned_) allocator_for(device_).deallocate(data_, bytes_);
}

Tensor Tensor::borrow(void* data, const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), device, Storage::Borrowed{});
  return t;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dtype;
  try {
    std::size_t bytes = 0;
    if (__builtin_mul_overflow(static_cast<std::size_t>(t.numel_), dtype_size(dtype), &bytes))
      LOCKSTEP_FAIL_HINT_TYPE(OutOfMemory, "",
                              "out of memory: more bytes than a 64-bit size holds");
    t.storage_ = std::make_shared<Storage>(bytes, device);
  } catch (const Error&) {
    rethrow_with_context(
        str("a ", dtype_name(dtype), " tensor ", shape_str(shape), " on ", device.str()));
  }
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  LOCKSTEP_CHECK(device.is_cpu(), "Tensor::zeros is host-only; use ops::fill on ", device.str());
  Tensor t = empty(shape, dtype, device);
  std::memset(t.raw_data(), 0, t.nbytes());
  return t;
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  LOCKSTEP_CHECK(static_cast<std::int64_t>(values.size()) == shape_numel(shape),
                 "from_vector: ", values.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape, dtype_of<T>(), device);
  copy_bytes(device, t.raw_data(), Device::cpu(), values.data(), t.nbytes());
  return t;
}

std::int64_t Tensor::dim(int i) const {
  int n = ndim();
  int k = i < 0 ? i + n : i;
  LOCKSTEP_CHECK(k >= 0 && k < n, "dimension ", i, " out of range for ", describe());
  return shape_[static_cast<std::size_t>(k)];
}

Tensor Tensor::view(const Shape& shape) const {
  LOCKSTEP_CHECK(shape_numel(shape) == numel_, "view: cannot view ", describe(), " as ",
                 shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice(std::int64_t begin, std::int64_t end) const {
  LOCKSTEP_CHECK(ndim() >= 1 && begin >= 0 && begin <= end && end <= shape_[0], "slice [", begin,
                 ", ", end, ") out of range for ", describe());
  std::int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  Shape s = shape_;
  s[0] = end - begin;
  return sub(begin * row, s);
}

Tensor Tensor::sub(std::int64_t offset, const Shape& shape) const {
  std::int64_t n = shape_numel(shape);
  LOCKSTEP_CHECK(offset >= 0 && offset + n <= numel_, "sub: ", n, " elements at offset ", offset,
                 " exceed ", describe());
  Tensor t = *this;
  t.shape_ = shape;
  t.numel_ = n;
  t.offset_ = offset_ + offset;
  return t;
}

Tensor Tensor::to(Device device) const {
  LOCKSTEP_CHECK(defined(), "to(): undefined tensor");
  Tensor t = empty(shape_, dtype_, device);
  copy_bytes(device, t.raw_data(), this->device(), raw_data(), nbytes());
  return t;
}

void* Tensor::raw_data() const {
  LOCKSTEP_CHECK(defined(), "data access on an undefined tensor");
  return static_cast<char*>(storage_->data()) +
         offset_ * static_cast<std::int64_t>(dtype_size(dtype_));
}

namespace {
std::atomic<std::uint64_t> g_host_reads{0};
}  // namespace

std::uint64_t Tensor::host_reads() {
  return g_host_reads.load(std::memory_order_relaxed);
}

template <class T>
std::vector<T> Tensor::to_vector() const {
  check_dtype(dtype_of<T>());
  g_host_reads.fetch_add(1, std::memory_order_relaxed);
  std::vector<T> out(static_cast<std::size_t>(numel_));
  copy_bytes(Device::cpu(), out.data(), device(), raw_data(), nbytes());
  return out;
}

template <class T>
void Tensor::copy_from(const std::vector<T>& values) {
  check_dtype(dtype_of<T>());
  LOCKSTEP_CHECK(static_cast<std::int64_t>(values.size()) == numel_, "copy_from: ", values.size(),
                 " values into ", describe());
  copy_bytes(device(), raw_data(), Device::cpu(), values.data(), nbytes());
}

float Tensor::item() const {
  LOCKSTEP_CHECK(numel_ == 1, "item() needs a one-element tensor, got ", describe());
  return to_vector<float>()[0];
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return str(dtype_name(dtype_), shape_str(shape_), " on ", device().str());
}

void Tensor::check_dtype(DType expected) const {
  LOCKSTEP_CHECK(dtype_ == expected, "expected a ", dtype_name(expected), " tensor, got ",
                 describe());
}

#define LOCKSTEP_INSTANTIATE(T)                                                        \
  template Tensor Tensor::from_vector<T>(const std::vector<T>&, const Shape&, Device); \
  template std::vector<T> Tensor::to_vector<T>() const;                                \
  template void Tensor::copy_from<T>(const std::vector<T>&);
LOCKSTEP_INSTANTIATE(float)
LOCKSTEP_INSTANTIATE(std::int32_t)
LOCKSTEP_INSTANTIATE(std::uint8_t)
LOCKSTEP_INSTANTIATE(double)
#undef LOCKSTEP_INSTANTIATE

}  // namespace lockstep

// Tensor: a shape, a dtype, a device and shared, contiguous storage (row-major, no strides).
// Copying a Tensor copies the handle, not the data. view()/slice()/sub() make tensors that share
// storage with an element offset: the Reducer makes every gradient a view into its bucket this
// way. Raw pointers (data<T>()) are for ops/ and tests; layer code passes Tensors to ops.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "lockstep/core/device.hpp"
#include "lockstep/core/dtype.hpp"
#include "lockstep/core/error.hpp"

namespace lockstep {

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& shape);
std::string shape_str(const Shape& shape);  // "[256, 784]"

class Storage {
 public:
  Storage(std::size_t bytes, Device device);
  // Memory owned elsewhere that outlives this Storage (Tensor::borrow).
  struct Borrowed {};
  Storage(void* data, std::size_t bytes, Device device, Borrowed);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device device_;
  bool owned_ = true;
};

class Tensor {
 public:
  Tensor() = default;  // undefined: defined() is false

  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  // zeros() only for host tensors; on a device use ops::fill.
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  // A tensor over memory this tensor does not own (no copy, no free): the caller keeps the
  // memory alive and unchanged in size while the tensor is used. A device backend uses it to
  // hand its kernels host views of device memory (ops/emu).
  static Tensor borrow(void* data, const Shape& shape, DType dtype, Device device);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int i) const;  // negative i counts from the end
  std::int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  std::int64_t offset() const { return offset_; }  // in elements, into storage
  const std::shared_ptr<Storage>& storage() const { return storage_; }
  bool shares_storage(const Tensor& other) const { return storage_ == other.storage_; }

  // Same data, new shape (element counts must match).
  Tensor view(const Shape& shape) const;
  // Rows [begin, end) along the first dimension, sharing storage.
  Tensor slice(std::int64_t begin, std::int64_t end) const;
  // `shape` elements starting `offset` elements into this tensor, sharing storage.
  Tensor sub(std::int64_t offset, const Shape& shape) const;
  // A deep copy on `device` (same device: an independent copy).
  Tensor to(Device device) const;
  Tensor clone() const { return to(device()); }

  template <class T>
  T* data() const {
    check_dtype(dtype_of<T>());
    return static_cast<T*>(raw_data());
  }
  void* raw_data() const;

  // Host helpers (copy through the host when the tensor lives on a device).
  template <class T>
  std::vector<T> to_vector() const;
  template <class T>
  void copy_from(const std::vector<T>& values);
  float item() const;  // one-element f32 tensor -> float
  // How many times this process has copied tensor values into host memory through to_vector or
  // item (on a GPU each one waits for the device): tests count them per training step.
  static std::uint64_t host_reads();

  std::string describe() const;  // "f32[256, 784] on cpu"

 private:
  void check_dtype(DType expected) const;

  std::shared_ptr<Storage> storage_;
  Shape shape_;
  std::int64_t numel_ = 0;
  std::int64_t offset_ = 0;
  DType dtype_ = DType::F32;
};

}  // namespace lockstep

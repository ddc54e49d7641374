// Weights: the model's tensors in device buffers, by canonical (GGUF) name.
//
// Quantized matrices are stored as their GGUF blocks and read in-kernel
// (ops/linear.h), so a Q4_1 file costs its own size on the device.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/device.h"
#include "ops/linear.h"

namespace mkv::model {

struct Weight {
  ops::BufferView view;
  ops::WeightType type = ops::WeightType::f32;
  std::vector<uint64_t> shape;  // logical, row-major: (rows, cols) or (n,)
  uint64_t rows() const { return shape.size() == 2 ? shape[0] : 1; }
  uint64_t cols() const { return shape.back(); }
};

class Weights {
 public:
  explicit Weights(gpu::DevicePtr device);

  // Copies nbytes at data (as a GGUF file stores them) into a new device buffer,
  // packed as the kernels read them (ops/weight_pack.h); returns its size. dtype:
  // a kernel weight type (ops/weight_type.h); shape (n,) or (rows, cols),
  // quantized along rows. Raises GpuError "[weights] ..." when nbytes does not
  // match dtype and shape.
  size_t add(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
           const void* data, size_t nbytes);

  const Weight* find(const std::string& name) const;  // nullptr when absent

  // Moves the named tensors (same type and row length, or all 1-D) into one
  // buffer, back to back along rows, and returns that stack: (Σ rows, cols)
  // or (Σ n,). Each tensor stays findable, now a view into the stack, so
  // nothing is stored twice. Quantized rows are independent blocks, so the
  // stack is exactly the matrices one above the other. Raises "[weights] ..."
  // on a missing tensor or a type/shape mismatch.
  Weight stack_rows(const std::vector<std::string>& names);
  size_t size() const { return by_name_.size(); }
  size_t nbytes() const { return nbytes_; }  // device bytes of all tensors
  std::vector<std::string> names() const;

 private:
  gpu::DevicePtr device_;
  std::unordered_map<std::string, Weight> by_name_;
  size_t nbytes_ = 0;
};

}  // namespace mkv::model

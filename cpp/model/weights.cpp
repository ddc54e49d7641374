#include "model/weights.h"

#include <cstring>

namespace mkv::model {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("weights", m); }

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

}  // namespace

Weights::Weights(gpu::DevicePtr device) : device_(std::move(device)) {
  if (!device_) fail("device is null");
}

void Weights::add(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
                  const void* data, size_t nbytes) {
  const ops::WeightType t = ops::parse_weight_type(dtype, "weights");
  if (shape.empty() || shape.size() > 2 || shape[0] == 0 || shape.back() == 0)
    fail(name + ": shape " + shape_str(shape) + " is not (n,) or (rows, cols) with positive sizes");
  if (by_name_.count(name)) fail(name + ": added twice");
  size_t want;
  if (shape.size() == 1) {
    if (ops::is_quantized(t)) fail(name + ": a 1-D tensor cannot be " + dtype + "; expected f32 or f16");
    want = shape[0] * (t == ops::WeightType::f32 ? 4 : 2);
  } else {
    if (shape[1] > UINT32_MAX) fail(name + ": more than 2^32 - 1 columns");
    want = ops::weight_bytes(t, shape[0], uint32_t(shape[1]), "weights");
  }
  if (nbytes != want)
    fail(name + ": " + std::to_string(nbytes) + " bytes for a " + dtype + " tensor of shape " +
         shape_str(shape) + "; expected " + std::to_string(want));
  gpu::BufferPtr buf = device_->new_buffer(nbytes);
  std::memcpy(buf->contents(), data, nbytes);
  by_name_[name] = Weight{{buf, 0}, t, shape};
  nbytes_ += nbytes;
}

const Weight* Weights::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

std::vector<std::string> Weights::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : by_name_) out.push_back(k);
  return out;
}

}  // namespace mkv::model

#include "model/weights.h"

#include <cstring>
#include <vector>

#include "ops/weight_pack.h"

namespace mkv::model {
namespace {

[[noreturn]] void fail(const std::string& m) { ops::fail("weights", m); }

std::string shape_str(const std::vector<uint64_t>& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

// Device bytes of a tensor, from its type and shape.
size_t tensor_bytes(const Weight& w) {
  if (w.shape.size() == 1) return w.shape[0] * (w.type == ops::WeightType::f32 ? 4 : 2);
  return ops::weight_bytes(w.type, w.shape[0], uint32_t(w.shape[1]), "weights");
}

}  // namespace

Weights::Weights(gpu::DevicePtr device) : device_(std::move(device)) {
  if (!device_) fail("device is null");
}

size_t Weights::add(const std::string& name, const std::string& dtype, const std::vector<uint64_t>& shape,
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
    want = ops::file_weight_bytes(t, shape[0], uint32_t(shape[1]), "weights");
  }
  if (nbytes != want)
    fail(name + ": " + std::to_string(nbytes) + " bytes for a " + dtype + " tensor of shape " +
         shape_str(shape) + "; expected " + std::to_string(want));
  Weight w{{nullptr, 0}, t, shape};
  const size_t device_bytes = tensor_bytes(w);
  gpu::BufferPtr buf = device_->new_buffer(device_bytes);
  if (shape.size() == 2 && ops::is_packed(t)) {  // the kernels' layout (ops/weight_pack.h)
    std::vector<unsigned char> packed(device_bytes);
    ops::pack_weights(t, shape[0], uint32_t(shape[1]), data, packed.data());
    buf->write(0, packed.data(), device_bytes);
  } else {
    buf->write(0, data, nbytes);
  }
  w.view.buffer = buf;
  by_name_[name] = w;
  nbytes_ += device_bytes;
  return device_bytes;
}

const Weight* Weights::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &it->second;
}

Weight Weights::stack_rows(const std::vector<std::string>& names) {
  if (names.empty()) fail("stack_rows needs at least one tensor");
  std::vector<Weight*> parts;
  size_t bytes = 0;
  uint64_t rows = 0;
  for (const std::string& n : names) {
    auto it = by_name_.find(n);
    if (it == by_name_.end()) fail("stack_rows: missing tensor " + n);
    Weight& w = it->second;
    const Weight& first = parts.empty() ? w : *parts.front();
    const bool rows_match = w.shape.size() == 1 || w.cols() == first.cols();  // 1-D: any lengths
    if (w.type != first.type || w.shape.size() != first.shape.size() || !rows_match)
      fail("stack_rows: " + n + " (" + ops::weight_type_name(w.type) + ", shape " + shape_str(w.shape) +
           ") does not match " + names.front() + " (" + ops::weight_type_name(first.type) + ", shape " +
           shape_str(first.shape) + ")");
    if (bytes % ops::weight_align(w.type) != 0)  // unreachable for valid shapes; the kernels rely on it
      fail("stack_rows: " + n + " would start at offset " + std::to_string(bytes) + ", not a multiple of " +
           std::to_string(ops::weight_align(w.type)));
    parts.push_back(&w);
    bytes += tensor_bytes(w);
    rows += w.shape[0];
  }
  const Weight& first = *parts.front();
  gpu::BufferPtr buf = device_->new_buffer(bytes);
  // One blit command buffer copies the parts on the device (no round trip through
  // the host on a discrete GPU).
  auto cb = device_->new_command_queue()->command_buffer();
  gpu::BlitEncoder& blit = cb->blit_encoder();
  size_t offset = 0;
  for (Weight* w : parts) {
    const size_t n = tensor_bytes(*w);
    blit.copy(w->view.buffer, w->view.offset, buf, offset, n);
    w->view = {buf, offset};  // the command buffer keeps the old buffer until it completes
    offset += n;
  }
  blit.end_encoding();
  cb->commit();
  cb->wait();
  std::vector<uint64_t> shape = first.shape.size() == 2 ? std::vector<uint64_t>{rows, first.cols()}
                                                        : std::vector<uint64_t>{rows};
  return Weight{{buf, 0}, first.type, shape};
}

std::vector<std::string> Weights::names() const {
  std::vector<std::string> out;
  for (const auto& [k, v] : by_name_) out.push_back(k);
  return out;
}

}  // namespace mkv::model

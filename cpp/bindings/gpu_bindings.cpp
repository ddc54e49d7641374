// Python view of the device layer: devices, buffers as numpy arrays, command
// buffers and encoders. Used by the executor tests and by anyone who wants to
// run a metalkv kernel directly.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstring>

#include "bindings.h"
#include "bindings/args.h"
#include "gpu/apple_gpu.h"
#include "gpu/device.h"
#include "gpu/device_select.h"
#include "ops/kernel_names.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace mkv::bindings {
namespace {

using gpu::BufferPtr;
using Shape3 = std::tuple<uint32_t, uint32_t, uint32_t>;

gpu::Size3 size3(const Shape3& t) { return {std::get<0>(t), std::get<1>(t), std::get<2>(t)}; }

void write_array(gpu::Buffer& b, nb::ndarray<nb::c_contig, nb::device::cpu> a, size_t offset) {
  b.write(offset, a.data(), a.nbytes());
}

}  // namespace

void bind_gpu(nb::module_& m, nb::module_& ops_m) {
  nb::exception<gpu::GpuError>(m, "GpuError", PyExc_RuntimeError);
  register_argument_error(m);

  m.def("build_info", &gpu::built_backends,
        "The GPU backends compiled into this build: {'metal': bool, 'cuda': bool}.");
  m.def("apple_gpu_cores", &gpu::apple_gpu_cores, "device_name"_a,
        "The GPU cores the Metal backend assumes for an MTLDevice name (cpp/gpu/apple_gpu.h).");
  m.def("device_kinds", &gpu::available_device_kinds,
        "Device kinds this machine can create, best first ('metal' on Apple Silicon, 'host').");

  nb::class_<gpu::Buffer>(m, "Buffer", "Shared-storage device memory.")
      .def_prop_ro("nbytes", &gpu::Buffer::length)
      .def(
          "numpy",
          [](nb::handle self) { return host_array(self, nb::cast<gpu::Buffer&>(self), 0, {}); },
          "The whole buffer as uint8 numpy (use .view(dtype)): a writable zero-copy view where the CPU sees "
          "the device's memory (host, metal), a copy where it does not (cuda; change it with write()).")
      .def_prop_ro("host_visible", &gpu::Buffer::host_visible,
                   "True where numpy() is a zero-copy view of the device's memory.")
      .def(
          "write",
          [](gpu::Buffer& b, nb::ndarray<nb::c_contig, nb::device::cpu> a, size_t offset) {
            write_array(b, a, offset);
          },
          "array"_a, "offset"_a = 0, "Copies a C-contiguous array into the buffer at offset bytes.");

  nb::class_<gpu::Pipeline>(m, "Pipeline")
      .def_prop_ro("name", &gpu::Pipeline::name)
      .def_prop_ro("max_total_threads_per_threadgroup",
                   &gpu::Pipeline::max_total_threads_per_threadgroup)
      .def_prop_ro("thread_execution_width", &gpu::Pipeline::thread_execution_width)
      .def("resident_threadgroups_per_unit", &gpu::Pipeline::resident_threadgroups_per_unit, "threads"_a,
           "threadgroup_memory"_a = 0,
           "Threadgroups of that many threads and threadgroup-memory bytes one compute unit runs at once.");

  nb::class_<gpu::ComputeEncoder>(m, "ComputeEncoder")
      .def("set_pipeline", &gpu::ComputeEncoder::set_pipeline, "pipeline"_a)
      .def(
          "set_buffer",
          [](gpu::ComputeEncoder& e, uint32_t index, const BufferPtr& b, size_t offset) {
            e.set_buffer(b, offset, index);
          },
          "index"_a, "buffer"_a, "offset"_a = 0)
      .def(
          "set_bytes",
          [](gpu::ComputeEncoder& e, uint32_t index, nb::bytes data) {
            e.set_bytes(data.c_str(), data.size(), index);
          },
          "index"_a, "data"_a, "Copies up to 4 KiB of argument bytes (e.g. a packed struct).")
      .def(
          "set_threadgroup_memory",
          [](gpu::ComputeEncoder& e, uint32_t index, size_t length) {
            e.set_threadgroup_memory_length(length, index);
          },
          "index"_a, "length"_a)
      .def(
          "dispatch",
          [](gpu::ComputeEncoder& e, const Shape3& groups, const Shape3& threads) {
            e.dispatch_threadgroups(size3(groups), size3(threads));
          },
          "threadgroups"_a, "threads_per_threadgroup"_a)
      .def("end", &gpu::ComputeEncoder::end_encoding);

  nb::class_<gpu::BlitEncoder>(m, "BlitEncoder")
      .def(
          "copy",
          [](gpu::BlitEncoder& e, const BufferPtr& src, size_t src_offset, const BufferPtr& dst,
             size_t dst_offset, size_t size) { e.copy(src, src_offset, dst, dst_offset, size); },
          "src"_a, "src_offset"_a, "dst"_a, "dst_offset"_a, "size"_a)
      .def("fill", &gpu::BlitEncoder::fill, "buffer"_a, "offset"_a, "size"_a, "value"_a)
      .def("end", &gpu::BlitEncoder::end_encoding);

  nb::class_<gpu::CommandBuffer>(m, "CommandBuffer")
      .def("compute", &gpu::CommandBuffer::compute_encoder, nb::rv_policy::reference_internal)
      .def("blit", &gpu::CommandBuffer::blit_encoder, nb::rv_policy::reference_internal)
      .def("commit", &gpu::CommandBuffer::commit, nb::call_guard<nb::gil_scoped_release>())
      .def("wait", &gpu::CommandBuffer::wait, nb::call_guard<nb::gil_scoped_release>(),
           "Blocks until done; raises GpuError if the work failed.")
      .def_prop_ro("counters", [](const gpu::CommandBuffer& cb) { return cb.counters().as_map(); });

  nb::class_<PyDevice>(m, "Device")
      .def(
          "__init__",
          [](PyDevice* self, const std::string& kind, const std::string& fiber_order,
             uint64_t seed, bool profile) {
            gpu::DeviceOptions options;
            options.fiber_order = fiber_order;
            options.seed = seed;
            options.profile = profile;
            gpu::DeviceChoice choice = gpu::choose_device(kind, options);
            new (self) PyDevice{choice.device, choice.device->new_command_queue(), choice.fallback};
          },
          "kind"_a = "auto", "fiber_order"_a = "", "seed"_a = 0, "profile"_a = false,
          "kind: 'auto', 'host', 'metal' or 'cuda'. fiber_order (host only): 'forward', 'reverse' or "
          "'random' with seed; '' uses $METALKV_FIBER_ORDER or 'forward'. profile (host only): "
          "time each dispatch by kernel (kernel_times()); $METALKV_PROFILE=1 also turns it on.")
      .def_prop_ro("kind", [](const PyDevice& d) { return d.device->kind(); })
      .def_prop_ro("fallback", [](const PyDevice& d) { return d.fallback; },
                   "Why 'auto' runs on the host executor although a GPU backend is built ('' when it did not "
                   "fall back); metalkv.device() warns with it.")
      .def_prop_ro("name", [](const PyDevice& d) { return d.device->name(); })
      .def_prop_ro(
          "properties",
          [](const PyDevice& d) {
            const gpu::DeviceProperties p = d.device->properties();
            nb::dict out;
            out["compute_units"] = p.compute_units;
            out["max_threads_per_unit"] = p.max_threads_per_unit;
            out["threadgroup_memory_per_unit"] = p.threadgroup_memory_per_unit;
            out["memory_bytes"] = p.memory_bytes;
            out["lanes_are_fibers"] = p.lanes_are_fibers;
            out["has_host_shapes"] = p.has_host_shapes;
            out["gemv_rows"] = p.gemv_rows;
            out["gemv_tokens"] = p.gemv_tokens;
            out["matrix_units"] = p.matrix_units;
            out["matrix_layout"] = p.matrix_layout;
            out["gemm_decode_rows"] = p.gemm_decode_rows;
            return out;
          },
          "What launch sizes, kernel shapes and default budgets are computed from: {'compute_units', "
          "'max_threads_per_unit', 'threadgroup_memory_per_unit', 'memory_bytes', 'lanes_are_fibers', "
          "'has_host_shapes', 'gemv_rows', 'gemv_tokens', 'matrix_units', 'matrix_layout', 'gemm_decode_rows'} (cpp/gpu/device.h DeviceProperties).")
      .def("kernel_names", [](const PyDevice& d) { return d.device->kernel_names(); })
      .def(
          "buffer",
          [](PyDevice& d, size_t nbytes) { return d.device->new_buffer(nbytes); }, "nbytes"_a,
          "A new zero-filled buffer.")
      .def(
          "buffer_from",
          [](PyDevice& d, nb::ndarray<nb::c_contig, nb::device::cpu> a) {
            auto b = d.device->new_buffer(a.nbytes() ? a.nbytes() : 1);
            write_array(*b, a, 0);
            return b;
          },
          "array"_a, "A new buffer holding a copy of a C-contiguous array.")
      .def(
          "pipeline", [](PyDevice& d, const std::string& name) { return d.device->pipeline(name); },
          "kernel_name"_a)
      .def(
          "command_buffer", [](PyDevice& d) { return d.queue->command_buffer(); },
          "A new command buffer on the device's queue.")
      .def_prop_ro("memory_use", [](const PyDevice& d) {
             const gpu::MemoryUse u = d.device->memory_use();
             nb::dict out;
             out["live"] = u.live;
             out["peak"] = u.peak;
             return out; },
           "Bytes of the device's buffers: live (not yet freed) and peak (the most live at once since the\n"
           "device was opened or reset_memory_peak()).")
      .def("reset_memory_peak", [](const PyDevice& d) { d.device->reset_memory_peak(); })
      .def("counters", [](const PyDevice& d) { return d.device->counters().as_map(); },
           "Totals since creation or reset_counters().")
      .def("reset_counters", [](PyDevice& d) { d.device->reset_counters(); },
           "Zeroes counters() and kernel_times().")
      .def(
          "kernel_times",
          [](const PyDevice& d) {
            std::map<std::string, std::pair<uint64_t, double>> out;
            for (const auto& [name, t] : d.device->kernel_times()) out[name] = {t.calls, t.seconds};
            return out;
          },
          "{kernel name: (calls, seconds)} since creation or reset_counters(); empty unless "
          "the device profiles (host executor with profile=True or $METALKV_PROFILE=1).")
      .def("__repr__", [](const PyDevice& d) { return "<metalkv.Device " + d.device->name() + ">"; });
  ops_m.def(
      "kernel_names", [](PyDevice& d) { return ops::op_kernel_names(*d.device); }, "device"_a,
      "Every kernel name the ops can build on this device (sorted): each must be in device.kernel_names(),\n"
      "and every kernel there but the test kernels must be one of these (tests/gpu/test_kernel_names.py).");
}

MKV_BINDING(gpu, bind_gpu);

}  // namespace mkv::bindings

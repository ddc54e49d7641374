// Metal backend: compiling the embedded kernel sources and building pipelines.
//
// Sources are compiled at runtime (newLibrary from source), one MTL::Library
// per embedded .metal file, on the first pipeline() or kernel_names() call, so
// creating a device stays cheap and no Xcode metal toolchain is needed.
#include <algorithm>
#include <cctype>

#include "../embedded_sources.h"
#include "metal_objects.h"

namespace mkv::gpu::metal {
namespace {

NS::SharedPtr<MTL::CompileOptions> compile_options() {
  NS::SharedPtr<MTL::CompileOptions> options = NS::TransferPtr(MTL::CompileOptions::alloc()->init());
  // Fast math (Metal's default) may assume no infinities or NaNs and reorder
  // arithmetic; our kernels use -INFINITY for masked scores and are checked
  // against IEEE results on the host executor.
  options->setFastMathEnabled(false);
  return options;
}

std::string join(const std::vector<std::string>& names) {
  if (names.empty()) return "(none)";
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// True if `name` occurs in `text` as a whole identifier (a kernel definition,
// or a [[host_name("...")]] for a template instantiation).
bool mentions_identifier(std::string_view text, std::string_view name) {
  auto is_ident = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
  for (size_t at = text.find(name); at != std::string_view::npos; at = text.find(name, at + 1)) {
    const size_t end = at + name.size();
    if ((at == 0 || !is_ident(text[at - 1])) && (end == text.size() || !is_ident(text[end]))) {
      return true;
    }
  }
  return false;
}

}  // namespace

void MetalDevice::load_libraries_locked() const {
  // Compiled once: the sources are constants of this binary, so a source that
  // failed would fail again.
  if (libraries_loaded_) return;
  libraries_loaded_ = true;
  AutoreleaseScope pool;  // the NS::String sources and NSErrors are autoreleased
  NS::SharedPtr<MTL::CompileOptions> options = compile_options();
  for (const EmbeddedSource& source : embedded_metal_sources()) {
    // NS::String wants a NUL-terminated string; a string_view does not promise one.
    const std::string text(source.source);
    NS::String* ns_text = NS::String::string(text.c_str(), NS::UTF8StringEncoding);
    // Metal may fill `error` with warnings even on success, so the library
    // pointer, not the error, decides whether compilation failed.
    NS::Error* error = nullptr;
    MTL::Library* library = ns_text ? device_->newLibrary(ns_text, options.get(), &error) : nullptr;
    if (library) {
      libraries_.push_back(NS::TransferPtr(library));
    } else {
      failed_sources_.push_back({std::string(source.path),
                                 ns_text ? describe(error) : "source is not valid UTF-8",
                                 source.source});
    }
  }
}

void MetalDevice::compile_kernels() const {
  std::lock_guard<std::mutex> lock(mu_);
  load_libraries_locked();
  std::string failures;
  for (const FailedSource& failed : failed_sources_) {
    if (failed.path.rfind("metal/test/", 0) == 0) continue;  // test-only kernels
    failures += "\n" + failed.path + ": " + failed.message;
  }
  if (!failures.empty())
    throw GpuError("[metal] Apple's Metal compiler rejected kernel sources on '" + name_ + "':" + failures);
}

std::vector<std::string> MetalDevice::kernel_names_locked() const {
  load_libraries_locked();
  AutoreleaseScope pool;  // functionNames() is autoreleased
  std::vector<std::string> names;
  for (const NS::SharedPtr<MTL::Library>& library : libraries_) {
    const NS::Array* functions = library->functionNames();
    const NS::UInteger count = functions ? functions->count() : 0;
    for (NS::UInteger i = 0; i < count; ++i) {
      names.push_back(to_std_string(functions->object<NS::String>(i)));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> MetalDevice::kernel_names() const {
  std::lock_guard<std::mutex> lock(mu_);
  return kernel_names_locked();
}

void MetalDevice::throw_not_found_locked(const std::string& kernel_name) const {
  // If the name appears in a source that failed to compile, that failure is
  // almost certainly why; show the compiler's message rather than a name list.
  for (const FailedSource& failed : failed_sources_) {
    if (!kernel_name.empty() && mentions_identifier(failed.source, kernel_name)) {
      throw GpuError("[metal] kernel '" + kernel_name + "' is in " + failed.path +
                     ", which failed to compile for '" + name_ + "':\n" + failed.message);
    }
  }
  std::string message = "[metal] unknown kernel '" + kernel_name +
                        "'; known kernels: " + join(kernel_names_locked());
  for (const FailedSource& failed : failed_sources_) {
    message += "\n(" + failed.path + " failed to compile: " + failed.message + ")";
  }
  throw GpuError(message);
}

PipelinePtr MetalDevice::pipeline(const std::string& kernel_name) {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = pipelines_.find(kernel_name); it != pipelines_.end()) return it->second;
  load_libraries_locked();

  AutoreleaseScope pool;
  // 1. Find the function in whichever library defines it.
  NS::SharedPtr<MTL::Function> function;
  NS::String* ns_name = NS::String::string(kernel_name.c_str(), NS::UTF8StringEncoding);
  for (const NS::SharedPtr<MTL::Library>& library : libraries_) {
    if (!ns_name) break;  // not valid UTF-8, so it cannot name a kernel
    if (MTL::Function* found = library->newFunction(ns_name)) {
      function = NS::TransferPtr(found);
      break;
    }
  }
  if (!function) throw_not_found_locked(kernel_name);

  // 2. Build the pipeline; this is where Metal checks resource limits.
  NS::Error* error = nullptr;
  MTL::ComputePipelineState* state = device_->newComputePipelineState(function.get(), &error);
  if (!state) {
    throw GpuError("[metal] could not build a pipeline for kernel '" + kernel_name +
                   "': " + describe(error));
  }
  PipelinePtr pipeline = std::make_shared<MetalPipeline>(kernel_name, NS::TransferPtr(state));
  pipelines_.emplace(kernel_name, pipeline);
  return pipeline;
}

}  // namespace mkv::gpu::metal

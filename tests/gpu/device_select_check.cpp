// The rules of cpp/gpu/device_select.cpp driven by fake backends: a GPU that
// compiles, one whose kernels the compiler rejects, one not built, one absent.
// Prints "ok" or the first rule broken. Built and run by test_device_select.py.
#include <cstdio>
#include <string>

#include "device_select.h"

using namespace mkv::gpu;

namespace {

struct FakeDevice : Device {
  explicit FakeDevice(std::string k) : k_(std::move(k)) {}
  std::string kind() const override { return k_; }
  std::string name() const override { return "fake " + k_; }
  DeviceProperties properties() const override { return {}; }
  BufferPtr new_buffer(size_t) override { return nullptr; }
  PipelinePtr pipeline(const std::string&) override { return nullptr; }
  std::vector<std::string> kernel_names() const override { return {}; }
  CommandQueuePtr new_command_queue() override { return nullptr; }
  Counters counters() const override { return {}; }
  void reset_counters() override {}
  std::string k_;
};

GpuBackend gpu(const std::string& kind, bool built, bool available, const char* compile_error) {
  GpuBackend b{kind, built, "'" + kind + "' is not built here", [=] { return available; }, nullptr};
  b.create = [=]() -> DevicePtr {
    if (compile_error) throw GpuError(std::string("[metal] kernel source attention.metal did not compile: ") +
                                      compile_error);
    return std::make_shared<FakeDevice>(kind);
  };
  return b;
}

DevicePtr host() { return std::make_shared<FakeDevice>("host"); }

int failures = 0;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAILED: %s\n", what.c_str());
    ++failures;
  }
}

std::string error_of(const std::string& kind, const std::vector<GpuBackend>& gpus) {
  try {
    choose_device(kind, gpus, host);
  } catch (const GpuError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

int main() {
  const auto good = gpu("metal", true, true, nullptr);
  const auto rejected = gpu("metal", true, true, "error: use of undeclared identifier 'foo' (line 12)");
  const auto absent = gpu("metal", true, false, nullptr);
  const auto not_built = gpu("metal", false, false, nullptr);

  DeviceChoice c = choose_device("auto", {good}, host);
  expect(c.device->kind() == "metal" && c.fallback.empty(), "auto picks a GPU whose kernels compile");

  c = choose_device("auto", {rejected}, host);
  expect(c.device->kind() == "host", "auto falls back to the host when the kernels do not compile");
  expect(c.fallback.find("undeclared identifier 'foo'") != std::string::npos &&
             c.fallback.find("host executor") != std::string::npos,
         "the fallback note quotes the compiler and says where it runs: " + c.fallback);
  expect(error_of("metal", {rejected}).find("undeclared identifier 'foo'") != std::string::npos,
         "device='metal' raises with the compiler's message");

  c = choose_device("auto", {rejected, gpu("cuda", true, true, nullptr)}, host);
  expect(c.device->kind() == "cuda" && c.fallback.empty(), "auto tries the next GPU backend");

  c = choose_device("auto", {absent}, host);
  expect(c.device->kind() == "host" && c.fallback.empty(), "no GPU present: the host, quietly");
  c = choose_device("auto", {not_built}, host);
  expect(c.device->kind() == "host" && c.fallback.empty(), "no GPU backend built: the host, quietly");

  expect(error_of("metal", {absent}).find("no metal GPU is available") != std::string::npos,
         "device='metal' without a GPU raises");
  expect(error_of("metal", {not_built}).find("'metal' is not built here") != std::string::npos,
         "device='metal' in a build without it raises with the backend's reason");
  expect(error_of("gpu", {good}).find("unknown device kind 'gpu'; expected 'auto', 'host', 'metal'") !=
             std::string::npos,
         "an unknown kind lists the known ones: " + error_of("gpu", {good}));
  expect(choose_device("host", {good}, host).device->kind() == "host", "host is host");
  if (failures == 0) std::printf("ok\n");
  return failures ? 1 : 0;
}

# CUDA device. The top-level CMakeLists.txt includes this after enable_language(CUDA)
# and adds the results to the core library. It sets:
#   METALKV_CUDA_BACKEND_SOURCES  the runtime's .cpp files (compiled by the C++ compiler)
#   METALKV_CUDA_BACKEND_LIBS     the kernels (an object library of generated .cu) and cudart
#
# Every metal/*.metal becomes a .cu through cuda_pass.py (the same source as the
# host executor's and Metal's) and is compiled by nvcc for METALKV_CUDA_ARCHITECTURES.

find_package(CUDAToolkit REQUIRED)
set(METALKV_CUDA_ARCHITECTURES "80;90" CACHE STRING
    "GPU architectures of the CUDA kernels (CMAKE_CUDA_ARCHITECTURES form: 80 = A100, 90 = H100/H200)")

set(_mkv_cuda_pass ${PROJECT_SOURCE_DIR}/cpp/gpu/cuda/cuda_pass.py)
set(_mkv_cuda_gen ${CMAKE_CURRENT_BINARY_DIR}/cuda_kernels)
# The CUDA prelude and the headers it shares with the host prelude: every kernel
# is rebuilt when one changes, also where the generator reads no nvcc depfiles.
file(GLOB _mkv_cuda_prelude CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/cpp/gpu/cuda/prelude/*
     ${PROJECT_SOURCE_DIR}/cpp/gpu/prelude_common/*)
set(_mkv_cuda_sources)
foreach(src ${METALKV_METAL_SOURCES})
  if(src STREQUAL "metal/test/broken.metal")
    continue()  # provokes the host executor's runtime validation errors; nothing to run on a GPU
  endif()
  string(REPLACE "/" "_" stem ${src})
  set(out ${_mkv_cuda_gen}/${stem}.cu)
  add_custom_command(
    OUTPUT ${out}
    COMMAND Python::Interpreter ${_mkv_cuda_pass} --cxx ${CMAKE_CXX_COMPILER} --root ${PROJECT_SOURCE_DIR}
            -I ${PROJECT_SOURCE_DIR}/metal
            ${PROJECT_SOURCE_DIR}/${src} ${out}
    DEPENDS ${PROJECT_SOURCE_DIR}/${src} ${_mkv_cuda_pass} ${PROJECT_SOURCE_DIR}/cpp/gpu/kernel_source.py
            ${METALKV_METAL_HEADERS}
    COMMENT "cuda_pass: ${src}")
  list(APPEND _mkv_cuda_sources ${out})
endforeach()

set_source_files_properties(${_mkv_cuda_sources} PROPERTIES OBJECT_DEPENDS "${_mkv_cuda_prelude}")
add_library(metalkv_cuda_kernels OBJECT ${_mkv_cuda_sources})
set_target_properties(metalkv_cuda_kernels PROPERTIES CUDA_ARCHITECTURES "${METALKV_CUDA_ARCHITECTURES}"
                      POSITION_INDEPENDENT_CODE ON CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON)
target_include_directories(metalkv_cuda_kernels PRIVATE ${PROJECT_SOURCE_DIR}/cpp/gpu/cuda/prelude)
# -lineinfo: compute-sanitizer and ncu name .metal lines; no fast math (the
# Metal backend turns it off too: masks use -INFINITY).
target_compile_options(metalkv_cuda_kernels PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --expt-relaxed-constexpr>)

set(METALKV_CUDA_BACKEND_SOURCES
    ${PROJECT_SOURCE_DIR}/cpp/gpu/cuda/cuda_device.cpp
    ${PROJECT_SOURCE_DIR}/cpp/gpu/cuda/cuda_command.cpp)
# Static cudart: the module loads on machines without a CUDA runtime library; the
# driver is looked up only when a cuda device is asked for.
set(METALKV_CUDA_BACKEND_LIBS metalkv_cuda_kernels CUDA::cudart_static)
message(STATUS "metalkv: CUDA device for architectures ${METALKV_CUDA_ARCHITECTURES} (nvcc ${CMAKE_CUDA_COMPILER_VERSION})")

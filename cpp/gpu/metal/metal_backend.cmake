# Metal backend (Apple only). The top-level CMakeLists.txt includes this inside
# if(APPLE), adds the results below to the core library and defines
# METALKV_HAVE_METAL=1. It sets:
#   METALKV_METAL_BACKEND_SOURCES  the backend's .cpp files
#   METALKV_METAL_BACKEND_LIBS     metal-cpp's include target and the frameworks
#   METALKV_METAL_CPP_INCLUDE_DIR  the folder holding Metal/Metal.hpp
#
# metal-cpp is header-only and not shipped with Xcode, so it is fetched at
# configure time unless METALKV_METAL_CPP_DIR points at a local copy.
# Offline example: cmake -DMETALKV_METAL_CPP_DIR=$HOME/src/metal-cpp ...

set(METALKV_METAL_CPP_URL
    "https://developer.apple.com/metal/cpp/files/metal-cpp_macOS14.2_iOS17.2.zip"
    CACHE STRING "metal-cpp archive to download (Apple's zip, or a GitHub mirror's archive)")
# The hash pins the default URL; set it to "" when pointing the URL elsewhere.
set(METALKV_METAL_CPP_URL_HASH
    "SHA256=d800ddbc3fccabce3a513f975eeafd4057e07a29e905ad5aaef8c1f4e12d9ada"
    CACHE STRING "Expected hash of METALKV_METAL_CPP_URL (empty: do not check)")
set(METALKV_METAL_CPP_DIR "" CACHE PATH
    "Local metal-cpp folder containing Metal/Metal.hpp; skips the download")

if(METALKV_METAL_CPP_DIR)
  set(_mkv_metal_cpp_root "${METALKV_METAL_CPP_DIR}")
else()
  include(FetchContent)
  if(POLICY CMP0135)
    cmake_policy(SET CMP0135 NEW)  # extracted files get the extraction time
  endif()
  set(_mkv_metal_cpp_hash)
  if(METALKV_METAL_CPP_URL_HASH)
    set(_mkv_metal_cpp_hash URL_HASH "${METALKV_METAL_CPP_URL_HASH}")
  endif()
  FetchContent_Declare(metalkv_metal_cpp URL "${METALKV_METAL_CPP_URL}" ${_mkv_metal_cpp_hash})
  # The archive has no CMakeLists.txt, so this only downloads and extracts.
  FetchContent_MakeAvailable(metalkv_metal_cpp)
  set(_mkv_metal_cpp_root "${metalkv_metal_cpp_SOURCE_DIR}")
endif()

# Apple's zip may carry a __MACOSX folder beside metal-cpp/, which stops CMake
# from stripping the top folder; accept either layout.
set(METALKV_METAL_CPP_INCLUDE_DIR "")
foreach(_mkv_dir "${_mkv_metal_cpp_root}" "${_mkv_metal_cpp_root}/metal-cpp")
  if(NOT METALKV_METAL_CPP_INCLUDE_DIR AND EXISTS "${_mkv_dir}/Metal/Metal.hpp")
    set(METALKV_METAL_CPP_INCLUDE_DIR "${_mkv_dir}")
  endif()
endforeach()
if(NOT METALKV_METAL_CPP_INCLUDE_DIR)
  message(FATAL_ERROR
    "[metal] metal-cpp headers not found under '${_mkv_metal_cpp_root}' (expected "
    "Metal/Metal.hpp). Download metal-cpp from https://developer.apple.com/metal/cpp/ "
    "and pass -DMETALKV_METAL_CPP_DIR=/path/to/metal-cpp.")
endif()

if(NOT TARGET metalkv_metal_cpp)
  add_library(metalkv_metal_cpp INTERFACE)
  # SYSTEM: keep metal-cpp's own warnings out of our -Wall builds.
  target_include_directories(metalkv_metal_cpp SYSTEM INTERFACE "${METALKV_METAL_CPP_INCLUDE_DIR}")
  target_compile_features(metalkv_metal_cpp INTERFACE cxx_std_17)  # metal-cpp needs C++17
endif()

set(METALKV_METAL_BACKEND_SOURCES
    "${CMAKE_CURRENT_LIST_DIR}/metal_device.cpp"   # the one NS/MTL_PRIVATE_IMPLEMENTATION unit
    "${CMAKE_CURRENT_LIST_DIR}/metal_library.cpp"
    "${CMAKE_CURRENT_LIST_DIR}/metal_command.cpp")

# QuartzCore is not used yet; it is linked so that metal-cpp's CA:: headers
# (CAMetalLayer) work should the backend ever present to a window.
set(METALKV_METAL_BACKEND_LIBS
    metalkv_metal_cpp
    "-framework Metal"
    "-framework Foundation"
    "-framework QuartzCore")

message(STATUS "metalkv: Metal backend with metal-cpp from ${METALKV_METAL_CPP_INCLUDE_DIR}")

# Metal backend (Apple only). The top-level CMakeLists.txt includes this inside
# if(APPLE); tests/tools/test_metal_cpp_discovery.py includes it on any OS.
#
# metal-cpp is header-only and not shipped with Xcode. It is looked for in this order:
#   1. METALKV_METAL_CPP_DIR, a folder given by the user;
#   2. an installed mlx-metal wheel (it ships metal-cpp), asked of the configuring Python;
#   3. the pinned download METALKV_METAL_CPP_URL (PyPI's mlx-metal wheel, hash-checked:
#      the same file that tools/check_metal_backend.py checks the backend against).
# If none works, METALKV_METAL=AUTO builds the host device only and warns how to get the
# GPU; ON stops with that message; OFF skips the search. docs/BUILD.md has the pip forms.
#
# It sets:
#   METALKV_METAL_BACKEND_SOURCES  the backend's .cpp files; empty: no Metal backend
#   METALKV_METAL_BACKEND_LIBS     metal-cpp's include target and the frameworks
#   METALKV_METAL_CPP_INCLUDE_DIR  the folder holding Metal/Metal.hpp
#   METALKV_METAL_CPP_ORIGIN       which of the three it came from, in words

set(METALKV_METAL "AUTO" CACHE STRING
    "Metal backend: AUTO (if metal-cpp is found, else host only), ON (required), OFF")
set_property(CACHE METALKV_METAL PROPERTY STRINGS AUTO ON OFF)
set(METALKV_METAL_CPP_DIR "" CACHE PATH
    "Local metal-cpp folder containing Metal/Metal.hpp; tried first")
# mlx-metal 0.32.4 ships metal-cpp for macOS 26 under mlx/include/metal_cpp.
set(METALKV_METAL_CPP_URL
    "https://files.pythonhosted.org/packages/77/24/7e5b7ed5d28abacab4577c7a8dd1fca6e9058504f5f95ae4333c09420e2e/mlx_metal-0.32.4-py3-none-macosx_14_0_arm64.whl"
    CACHE STRING "metal-cpp archive to download: a .whl of mlx-metal, or a zip of metal-cpp")
# The hash pins the default URL; set it to "" when pointing the URL elsewhere.
set(METALKV_METAL_CPP_URL_HASH
    "SHA256=8019b2db622599267d66cc168b2f0dbf5af929790a6c3b3913e00eabc42a7947"
    CACHE STRING "Expected hash of METALKV_METAL_CPP_URL as ALGO=hex (empty: do not check)")

# The metal-cpp folder inside `dir`: itself, Apple's zip layout (metal-cpp/, perhaps beside
# __MACOSX/), the mlx-metal wheel's layout, or a single top folder (a GitHub archive).
function(_mkv_metal_cpp_in dir out)
  file(GLOB _tops LIST_DIRECTORIES true "${dir}/*")
  foreach(_d "${dir}" "${dir}/metal-cpp" "${dir}/mlx/include/metal_cpp" ${_tops})
    if(EXISTS "${_d}/Metal/Metal.hpp" AND EXISTS "${_d}/Foundation/Foundation.hpp")
      get_filename_component(_d "${_d}" ABSOLUTE)
      set(${out} "${_d}" PARENT_SCOPE)
      return()
    endif()
  endforeach()
  set(${out} "" PARENT_SCOPE)
endfunction()

# 2. An installed mlx-metal, without importing mlx. Asked twice: as the build runs Python
# (which, in pip's isolated build, sees only the build requirements), then with -I, which
# sees the interpreter's own site-packages: the environment that metalkv is installed into.
function(_mkv_metal_cpp_from_python out origin reason)
  set(${out} "" PARENT_SCOPE)
  if(NOT Python_EXECUTABLE)
    set(${reason} "mlx-metal: no Python_EXECUTABLE to ask" PARENT_SCOPE)
    return()
  endif()
  set(_query [=[
import importlib.metadata as md, os, sys
try:
    dist = md.distribution("mlx-metal")
except md.PackageNotFoundError:
    sys.exit("not installed in " + sys.prefix)
header = "mlx/include/metal_cpp/Metal/Metal.hpp"  # as listed in the wheel's RECORD
files = [f for f in (dist.files or []) if str(f).replace(os.sep, "/").endswith(header[4:])]
path = os.path.abspath(dist.locate_file(files[0] if files else header))
if not os.path.isfile(path):
    sys.exit(dist.version + " in " + sys.prefix + " has no metal_cpp/Metal/Metal.hpp")
print(dist.version + "\n" + os.path.dirname(os.path.dirname(path)))
]=])
  set(_why)
  foreach(_isolation "" "-I")
    execute_process(COMMAND "${Python_EXECUTABLE}" ${_isolation} -c "${_query}"
                    RESULT_VARIABLE _rc OUTPUT_VARIABLE _found ERROR_VARIABLE _err
                    OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_STRIP_TRAILING_WHITESPACE)
    if(_rc EQUAL 0 AND _found MATCHES "^([^\n]*)\n(.*)$")
      _mkv_metal_cpp_in("${CMAKE_MATCH_2}" _dir)
      if(_dir)
        set(${out} "${_dir}" PARENT_SCOPE)
        set(${origin} "mlx-metal ${CMAKE_MATCH_1} installed for ${Python_EXECUTABLE}" PARENT_SCOPE)
        return()
      endif()
      set(_err "${CMAKE_MATCH_1} at ${CMAKE_MATCH_2}: no Metal/ and Foundation/ headers there")
    endif()
    string(REGEX REPLACE ".*\n" "" _err "${_err}")  # the last line: sys.exit's message
    list(APPEND _why "${_err}")
  endforeach()
  list(REMOVE_DUPLICATES _why)
  list(JOIN _why " / " _why)
  set(${reason} "mlx-metal: ${_why} (${Python_EXECUTABLE})" PARENT_SCOPE)
endfunction()

# 3. The pinned download, into the build folder; kept (with a stamp) for the next configure.
# file(DOWNLOAD) with STATUS and our own hash check, so that no failure stops the configure.
function(_mkv_metal_cpp_download out reason)
  set(${out} "" PARENT_SCOPE)
  if(NOT METALKV_METAL_CPP_URL)
    set(${reason} "download: METALKV_METAL_CPP_URL is empty" PARENT_SCOPE)
    return()
  endif()
  string(SHA256 _key "${METALKV_METAL_CPP_URL} ${METALKV_METAL_CPP_URL_HASH}")
  string(SUBSTRING "${_key}" 0 12 _key)
  set(_dest "${CMAKE_BINARY_DIR}/_deps/metalkv_metal_cpp-${_key}")
  set(_stamp "${_dest}/downloaded.stamp")
  if(EXISTS "${_stamp}")
    _mkv_metal_cpp_in("${_dest}/src" _dir)
    if(_dir)
      set(${out} "${_dir}" PARENT_SCOPE)
      return()
    endif()
  endif()
  file(REMOVE_RECURSE "${_dest}")
  get_filename_component(_name "${METALKV_METAL_CPP_URL}" NAME)
  string(REGEX REPLACE "[?#].*" "" _name "${_name}")
  set(_archive "${_dest}/${_name}")
  message(STATUS "metalkv: downloading metal-cpp from ${METALKV_METAL_CPP_URL}")
  file(DOWNLOAD "${METALKV_METAL_CPP_URL}" "${_archive}" STATUS _status
       TIMEOUT 600 INACTIVITY_TIMEOUT 60)
  list(GET _status 0 _code)
  if(NOT _code EQUAL 0)
    list(GET _status 1 _message)
    set(${reason} "download of ${METALKV_METAL_CPP_URL} failed: ${_message}" PARENT_SCOPE)
    return()
  endif()
  if(METALKV_METAL_CPP_URL_HASH)
    if(NOT METALKV_METAL_CPP_URL_HASH MATCHES "^(MD5|SHA1|SHA224|SHA256|SHA384|SHA512)=([0-9A-Fa-f]+)$")
      set(${reason} "download: METALKV_METAL_CPP_URL_HASH='${METALKV_METAL_CPP_URL_HASH}' is not\
 ALGO=hex (e.g. SHA256=...)" PARENT_SCOPE)
      return()
    endif()
    set(_algo "${CMAKE_MATCH_1}")
    string(TOLOWER "${CMAKE_MATCH_2}" _expected)
    file(${_algo} "${_archive}" _actual)
    if(NOT _actual STREQUAL _expected)
      file(REMOVE_RECURSE "${_dest}")
      set(${reason} "download of ${METALKV_METAL_CPP_URL}: ${_algo} ${_actual}, expected\
 ${_expected} (METALKV_METAL_CPP_URL_HASH)" PARENT_SCOPE)
      return()
    endif()
  endif()
  # Only the headers of a wheel (the rest is ~150 MB of MLX); all of any other archive.
  set(_members)
  if(_name MATCHES "\\.whl$")
    set(_members mlx/include/metal_cpp)
  endif()
  file(MAKE_DIRECTORY "${_dest}/src")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E tar xf "${_archive}" ${_members}
                  WORKING_DIRECTORY "${_dest}/src" RESULT_VARIABLE _rc
                  OUTPUT_QUIET ERROR_VARIABLE _err)
  file(REMOVE "${_archive}")
  _mkv_metal_cpp_in("${_dest}/src" _dir)
  if(NOT _dir)
    string(STRIP "${_err}" _err)
    set(${reason} "download of ${METALKV_METAL_CPP_URL}: no Metal/Metal.hpp and\
 Foundation/Foundation.hpp in the archive ${_err}" PARENT_SCOPE)
    return()
  endif()
  file(WRITE "${_stamp}" "${METALKV_METAL_CPP_URL}\n${METALKV_METAL_CPP_URL_HASH}\n")
  set(${out} "${_dir}" PARENT_SCOPE)
endfunction()

# ---- the search, in order ----
string(TOUPPER "${METALKV_METAL}" _mkv_mode)
if(NOT _mkv_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "[metal] METALKV_METAL='${METALKV_METAL}'; expected AUTO, ON or OFF")
endif()
set(METALKV_METAL_BACKEND_SOURCES)
set(METALKV_METAL_BACKEND_LIBS)
set(METALKV_METAL_CPP_INCLUDE_DIR "")
set(METALKV_METAL_CPP_ORIGIN "")
set(_mkv_tried)  # why each way failed, for the warning
set(_mkv_dir_unusable "")  # a folder the user gave that was not metal-cpp

if(_mkv_mode STREQUAL "OFF")
  message(STATUS "metalkv: METALKV_METAL=OFF: host device only")
  return()
endif()

if(METALKV_METAL_CPP_DIR)
  _mkv_metal_cpp_in("${METALKV_METAL_CPP_DIR}" METALKV_METAL_CPP_INCLUDE_DIR)
  if(METALKV_METAL_CPP_INCLUDE_DIR)
    set(METALKV_METAL_CPP_ORIGIN "METALKV_METAL_CPP_DIR")
  else()
    set(_mkv_dir_unusable "METALKV_METAL_CPP_DIR=${METALKV_METAL_CPP_DIR}: no Metal/Metal.hpp\
 and Foundation/Foundation.hpp in it (nor in metal-cpp/ or mlx/include/metal_cpp/)")
    list(APPEND _mkv_tried "${_mkv_dir_unusable}")
  endif()
else()
  list(APPEND _mkv_tried "METALKV_METAL_CPP_DIR: not set")
endif()
if(NOT METALKV_METAL_CPP_INCLUDE_DIR)
  _mkv_metal_cpp_from_python(METALKV_METAL_CPP_INCLUDE_DIR METALKV_METAL_CPP_ORIGIN _mkv_why)
  if(NOT METALKV_METAL_CPP_INCLUDE_DIR)
    list(APPEND _mkv_tried "${_mkv_why}")
  endif()
endif()
if(NOT METALKV_METAL_CPP_INCLUDE_DIR)
  _mkv_metal_cpp_download(METALKV_METAL_CPP_INCLUDE_DIR _mkv_why)
  if(METALKV_METAL_CPP_INCLUDE_DIR)
    set(METALKV_METAL_CPP_ORIGIN "the download of ${METALKV_METAL_CPP_URL}")
  else()
    list(APPEND _mkv_tried "${_mkv_why}")
  endif()
endif()

if(NOT METALKV_METAL_CPP_INCLUDE_DIR)
  list(JOIN _mkv_tried "\n  - " _mkv_tried)
  string(CONCAT _mkv_howto
    "metal-cpp was not found:\n  - ${_mkv_tried}\n"
    "To build with the Metal GPU, do one of:\n"
    "  1. pip install . -Ccmake.define.METALKV_METAL_CPP_DIR=/path/to/metal-cpp\n"
    "     (the folder holding Metal/Metal.hpp: https://developer.apple.com/metal/cpp/)\n"
    "  2. pip install mlx-metal   (into the environment metalkv is installed into), then\n"
    "     pip install . again\n"
    "  3. let the download work: go online, or point it at a reachable copy with\n"
    "     -Ccmake.define.METALKV_METAL_CPP_URL=...\n"
    "     -Ccmake.define.METALKV_METAL_CPP_URL_HASH=SHA256=... (or \"\" not to check it)\n"
    "(plain cmake: -DMETALKV_METAL_CPP_DIR=... and so on)")
  if(_mkv_mode STREQUAL "ON")
    message(FATAL_ERROR "[metal] METALKV_METAL=ON, but ${_mkv_howto}")
  endif()
  message(WARNING "[metal] Building the host device only (no Metal GPU): ${_mkv_howto}\n"
                  "Pass -Ccmake.define.METALKV_METAL=ON to make this an error, OFF to silence it.")
  return()
endif()
if(_mkv_dir_unusable)
  # A folder the user gave was not used: say so, even though another way worked.
  message(WARNING "[metal] ${_mkv_dir_unusable}; using ${METALKV_METAL_CPP_ORIGIN} instead")
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

message(STATUS "metalkv: Metal backend with metal-cpp from ${METALKV_METAL_CPP_ORIGIN}: "
               "${METALKV_METAL_CPP_INCLUDE_DIR}")

# Host prelude: the headers that let metal/*.metal compile as C++17 on the CPU.
#
# Usage, from any CMakeLists.txt:
#   include(cpp/gpu/host/prelude/prelude.cmake)
#   target_include_directories(my_kernels PRIVATE ${METALKV_PRELUDE_INCLUDE_DIRS})
#   add_dependencies(my_kernels metalkv_prelude_gen)
#
# Defines:
#   metalkv_prelude_gen           custom target that generates the swizzle members
#                                 (gen_swizzles.py -> prelude_gen/mkv_prelude_swizzles.inc)
#   METALKV_PRELUDE_INCLUDE_DIRS  this directory (metal_stdlib, mkv_prelude_*.h)
#                                 and the generated-header directory
#                                 (mkv_prelude_*.h include cpp/gpu/prelude_common/, shared with
#                                 the CUDA prelude, by relative path: no directory to add)
#   METALKV_PRELUDE_GENERATED     full path of the generated header
#
# The generated header lands in ${CMAKE_CURRENT_BINARY_DIR}/prelude_gen of the
# directory that first includes this file; including it again (from another
# directory too) reuses that target and sets the same variables.

if(NOT TARGET metalkv_prelude_gen)
  set(_mkv_prelude_src "${CMAKE_CURRENT_LIST_DIR}")
  set(_mkv_prelude_gen_dir "${CMAKE_CURRENT_BINARY_DIR}/prelude_gen")
  set(_mkv_prelude_out "${_mkv_prelude_gen_dir}/mkv_prelude_swizzles.inc")

  # Reuse whichever Python the project already found (FindPython or FindPython3).
  if(TARGET Python::Interpreter)
    set(_mkv_python Python::Interpreter)
  elseif(TARGET Python3::Interpreter)
    set(_mkv_python Python3::Interpreter)
  else()
    find_package(Python3 REQUIRED COMPONENTS Interpreter)
    set(_mkv_python Python3::Interpreter)
  endif()

  add_custom_command(
    OUTPUT "${_mkv_prelude_out}"
    COMMAND "${CMAKE_COMMAND}" -E make_directory "${_mkv_prelude_gen_dir}"
    COMMAND ${_mkv_python} "${_mkv_prelude_src}/gen_swizzles.py" "${_mkv_prelude_out}"
    DEPENDS "${_mkv_prelude_src}/gen_swizzles.py"
    COMMENT "Generating host prelude swizzles"
    VERBATIM)
  add_custom_target(metalkv_prelude_gen DEPENDS "${_mkv_prelude_out}")

  # Global properties, so an include from another directory sees the same values.
  set_property(GLOBAL PROPERTY METALKV_PRELUDE_INCLUDE_DIRS "${_mkv_prelude_src};${_mkv_prelude_gen_dir}")
  set_property(GLOBAL PROPERTY METALKV_PRELUDE_GENERATED "${_mkv_prelude_out}")
endif()

get_property(METALKV_PRELUDE_INCLUDE_DIRS GLOBAL PROPERTY METALKV_PRELUDE_INCLUDE_DIRS)
get_property(METALKV_PRELUDE_GENERATED GLOBAL PROPERTY METALKV_PRELUDE_GENERATED)

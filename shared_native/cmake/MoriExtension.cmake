# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
#
# mori_add_extension: the pybind11 extension of one mori package, built the same way in
# every package. Installed beside mori_coreConfig.cmake, so a package's CMakeLists.txt is
#
#   find_package(mori_core 0.1 CONFIG REQUIRED)
#   mori_setup_cuda()
#   mori_add_extension(_C PACKAGE ep SOURCES ... CUDA_SOURCES ...)
#
# What it does: pybind11_add_module(<target> MODULE), C++17, the package's csrc/ on the
# include path, linked to mori::core; MORI_<PKG>_WITH_CUDA=1 or 0; with CUDA the
# CUDA_SOURCES are added and cudart linked statically with its symbols kept private (so
# the extension never interposes on the libcudart torch loads); installed as
# mori/<package>/<target> with an RPATH to mori-core's lib/ in the same site-packages.
include_guard(GLOBAL)

function(mori_add_extension target)
  cmake_parse_arguments(PARSE_ARGV 1 ARG "" "PACKAGE" "SOURCES;CUDA_SOURCES")
  if(NOT ARG_PACKAGE)
    message(FATAL_ERROR "mori_add_extension(${target}): PACKAGE is required")
  endif()
  if(NOT TARGET pybind11::module)
    find_package(Python REQUIRED COMPONENTS Interpreter Development.Module)
    find_package(pybind11 CONFIG REQUIRED)
  endif()
  string(TOUPPER "${ARG_PACKAGE}" upper)
  set(sources ${ARG_SOURCES})
  if(MORI_WITH_CUDA)
    list(APPEND sources ${ARG_CUDA_SOURCES})
  endif()
  pybind11_add_module(${target} MODULE ${sources})
  target_compile_features(${target} PRIVATE cxx_std_17)
  target_include_directories(${target} PRIVATE "${CMAKE_CURRENT_SOURCE_DIR}/csrc")
  target_link_libraries(${target} PRIVATE mori::core)
  if(MORI_WITH_CUDA)
    target_compile_definitions(${target} PRIVATE MORI_${upper}_WITH_CUDA=1)
    target_link_libraries(${target} PRIVATE CUDA::cudart_static)
    target_link_options(${target} PRIVATE "LINKER:--exclude-libs,ALL")
    set_target_properties(${target} PROPERTIES CUDA_SEPARABLE_COMPILATION OFF)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  else()
    target_compile_definitions(${target} PRIVATE MORI_${upper}_WITH_CUDA=0)
  endif()
  # mori/<package>/<target>.so finds mori/core/lib/libmori_core.so of the same site-packages.
  set_target_properties(${target} PROPERTIES
    INSTALL_RPATH "$ORIGIN/../core/lib" BUILD_WITH_INSTALL_RPATH ON)
  install(TARGETS ${target} LIBRARY DESTINATION "mori/${ARG_PACKAGE}")
endfunction()

# SPDX-License-Identifier: MIT
# Copyright (c) 2026 The mori authors
#
# mori_setup_cuda(): resolves MORI_CUDA (auto|on|off) to MORI_WITH_CUDA (ON/OFF),
# enables the CUDA language and sets CMAKE_CUDA_ARCHITECTURES from MORI_CUDA_ARCHS
# (default 90). Shared by libmori_core and the packages' extensions, so one switch
# means the same thing everywhere. Environment variables of the same names are
# honoured, so `MORI_CUDA=off pip install ...` works without -D flags.

include_guard(GLOBAL)
include(CheckLanguage)

# mori_build_switch(<name> <default> [<value>...]): the build switch <name> from the CMake
# variable, else the environment variable of the same name, else <default>; with values
# listed, it must be one of them (any case) and <name>_MODE is it in lower case. Every
# package's switches (MORI_CUDA, MORI_CUDA_ARCHS, mori-io's MORI_IO_RDMA) are read so.
function(mori_build_switch name default)
  if(DEFINED ${name})
    set(value "${${name}}")
  elseif(DEFINED ENV{${name}})
    set(value "$ENV{${name}}")
  else()
    set(value "${default}")
  endif()
  if(ARGN)
    string(TOLOWER "${value}" mode)
    if(NOT mode IN_LIST ARGN)
      string(REPLACE ";" ", " allowed "${ARGN}")
      message(FATAL_ERROR "${name}='${value}' is not one of ${allowed}")
    endif()
    set(${name}_MODE "${mode}" PARENT_SCOPE)
  endif()
  set(${name} "${value}" PARENT_SCOPE)
endfunction()

macro(mori_setup_cuda)
  mori_build_switch(MORI_CUDA auto auto on off)
  mori_build_switch(MORI_CUDA_ARCHS 90)
  set(_mori_cuda_mode "${MORI_CUDA_MODE}")

  set(MORI_WITH_CUDA OFF)
  if(NOT _mori_cuda_mode STREQUAL "off")
    if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX}
       AND EXISTS "/usr/local/cuda/bin/nvcc")
      set(CMAKE_CUDA_COMPILER "/usr/local/cuda/bin/nvcc")
    endif()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(MORI_WITH_CUDA ON)
    elseif(_mori_cuda_mode STREQUAL "on")
      message(FATAL_ERROR "MORI_CUDA=on but no CUDA compiler (nvcc) was found; "
                          "set CUDACXX or put nvcc on PATH")
    endif()
  endif()

  if(MORI_WITH_CUDA)
    string(REPLACE "," ";" CMAKE_CUDA_ARCHITECTURES "${MORI_CUDA_ARCHS}")
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    set(CMAKE_CUDA_STANDARD 17)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    message(STATUS "mori: CUDA on (${CMAKE_CUDA_COMPILER}, archs ${CMAKE_CUDA_ARCHITECTURES})")
  else()
    message(STATUS "mori: CUDA off (MORI_CUDA=${MORI_CUDA})")
  endif()
endmacro()

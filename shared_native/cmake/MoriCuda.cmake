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

macro(mori_setup_cuda)
  if(NOT DEFINED MORI_CUDA)
    if(DEFINED ENV{MORI_CUDA})
      set(MORI_CUDA "$ENV{MORI_CUDA}")
    else()
      set(MORI_CUDA "auto")
    endif()
  endif()
  if(NOT DEFINED MORI_CUDA_ARCHS)
    if(DEFINED ENV{MORI_CUDA_ARCHS})
      set(MORI_CUDA_ARCHS "$ENV{MORI_CUDA_ARCHS}")
    else()
      set(MORI_CUDA_ARCHS "90")
    endif()
  endif()
  string(TOLOWER "${MORI_CUDA}" _mori_cuda_mode)
  if(NOT _mori_cuda_mode MATCHES "^(auto|on|off)$")
    message(FATAL_ERROR "MORI_CUDA='${MORI_CUDA}' is not one of auto, on, off")
  endif()

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

# Where paraseq's Kokkos comes from: PARASEQ_KOKKOS
#   AUTO     (default) an installed Kokkos >= 4.5 if find_package finds one, the bundled one otherwise
#   SYSTEM   an installed Kokkos, which must be found (Kokkos_ROOT or CMAKE_PREFIX_PATH)
#   BUNDLED  Kokkos built with paraseq from the pinned release below (FetchContent), and installed
#            with it; FETCHCONTENT_SOURCE_DIR_KOKKOS=<Kokkos source tree> builds from a local copy
#            instead of downloading (the offline path)
# The bundled Kokkos is configured from paraseq's settings: PARASEQ_BACKENDS, CMAKE_CUDA_ARCHITECTURES,
# the C++ standard and the compilers. Included at directory scope: it may enable the CUDA language.
#
# Sets Kokkos_VERSION, Kokkos_DEVICES, Kokkos_ENABLE_<BACKEND>, Kokkos_COMPILE_LANGUAGE as an installed
# Kokkos' package config does, and PARASEQ_KOKKOS_BUNDLED.

# The bundled release: the newest that Spack's kokkos package lists (docs/compatibility.md), with
# CUDA 13 support. Its checksum is Spack's; update both together.
set(PARASEQ_BUNDLED_KOKKOS_VERSION 5.1.1)
set(PARASEQ_BUNDLED_KOKKOS_SHA256 8bdbee0f0ac383436743ad8a9e3e928705b34b31a25a92dc5179c52a3aa98519)

paraseq_choice_option(PARASEQ_KOKKOS AUTO
  "Where Kokkos comes from: AUTO (installed if found, else bundled), SYSTEM or BUNDLED" AUTO SYSTEM BUNDLED)

set(PARASEQ_KOKKOS_BUNDLED OFF)
if(PARASEQ_KOKKOS STREQUAL "SYSTEM")
  find_package(Kokkos 4.5 REQUIRED CONFIG)
elseif(PARASEQ_KOKKOS STREQUAL "AUTO")
  find_package(Kokkos 4.5 QUIET CONFIG)
  if(NOT Kokkos_FOUND)
    message(STATUS "paraseq: no installed Kokkos >= 4.5 found (Kokkos_ROOT, CMAKE_PREFIX_PATH); building the bundled one")
    set(PARASEQ_KOKKOS_BUNDLED ON)
  endif()
else()
  set(PARASEQ_KOKKOS_BUNDLED ON)
endif()
if(NOT PARASEQ_KOKKOS_BUNDLED)
  foreach(setting IN ITEMS PARASEQ_BACKENDS FETCHCONTENT_SOURCE_DIR_KOKKOS)
    if(DEFINED ${setting})
      message(WARNING "${setting} is set, but it configures only the bundled Kokkos, and paraseq uses the installed Kokkos ${Kokkos_VERSION} of ${Kokkos_DIR} (PARASEQ_KOKKOS=${PARASEQ_KOKKOS}; BUNDLED builds the bundled one)")
    endif()
  endforeach()
endif()

if(PARASEQ_KOKKOS_BUNDLED)
  # Backends. The default: OpenMP and Serial on the host, and CUDA when a CUDA compiler is found.
  set(PARASEQ_BACKEND_CHOICES Serial OpenMP Threads CUDA)
  include(CheckLanguage)
  if(NOT DEFINED CACHE{PARASEQ_BACKENDS})
    set(default_backends Serial OpenMP)
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      list(APPEND default_backends CUDA)
    else()
      message(STATUS "paraseq: no CUDA compiler found (nvcc on PATH, or CUDACXX): the bundled Kokkos is host-only")
    endif()
    set(PARASEQ_BACKENDS "${default_backends}" CACHE STRING
        "Kokkos backends of the bundled Kokkos (a list of: Serial, OpenMP, Threads, CUDA)")
  endif()
  foreach(backend IN LISTS PARASEQ_BACKENDS)
    if(NOT backend IN_LIST PARASEQ_BACKEND_CHOICES)
      list(JOIN PARASEQ_BACKEND_CHOICES ", " choices)
      message(FATAL_ERROR "PARASEQ_BACKENDS names '${backend}' (in '${PARASEQ_BACKENDS}'); expected a list of: ${choices}")
    endif()
  endforeach()
  if(PARASEQ_BACKENDS STREQUAL "")
    message(FATAL_ERROR "PARASEQ_BACKENDS is empty; expected a list of: Serial, OpenMP, Threads, CUDA")
  endif()
  # The list decides: a backend left out of it is switched off even if an earlier run enabled it.
  foreach(backend IN LISTS PARASEQ_BACKEND_CHOICES)
    string(TOUPPER ${backend} upper)
    if(backend IN_LIST PARASEQ_BACKENDS)
      set(Kokkos_ENABLE_${upper} ON CACHE BOOL "set from PARASEQ_BACKENDS" FORCE)
    else()
      set(Kokkos_ENABLE_${upper} OFF CACHE BOOL "set from PARASEQ_BACKENDS" FORCE)
    endif()
  endforeach()

  if(Kokkos_ENABLE_CUDA)
    # Without an architecture, CMake and Kokkos both ask the GPU of this machine.
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES AND NOT DEFINED ENV{CUDAARCHS})
      if(CMAKE_VERSION VERSION_LESS 3.24)
        message(FATAL_ERROR "PARASEQ_BACKENDS has CUDA but no CMAKE_CUDA_ARCHITECTURES is set (e.g. 90 for an H100/H200); CMake ${CMAKE_VERSION} cannot detect the GPU (3.24 can)")
      endif()
      set(CMAKE_CUDA_ARCHITECTURES native CACHE STRING "CUDA architecture (native: the GPU of this machine)")
    endif()
    enable_language(CUDA)
    # paraseq's CUDA sources and Kokkos' are compiled as the CMake CUDA language (nvcc with
    # CMAKE_CUDA_HOST_COMPILER), no nvcc_wrapper.
    set(Kokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE ON CACHE BOOL "set by paraseq: Kokkos is compiled as CUDA" FORCE)
    if(NOT DEFINED CMAKE_CUDA_STANDARD AND NOT CMAKE_CUDA_FLAGS MATCHES "-std=")
      set(CMAKE_CUDA_STANDARD 20)
      set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    endif()
    # The View implementation paraseq's CUDA tests passed with under nvcc 13 (docs/compatibility.md:
    # the mdspan-based View miscompiled there); -DKokkos_ENABLE_IMPL_VIEW_LEGACY=OFF overrides.
    set(Kokkos_ENABLE_IMPL_VIEW_LEGACY ON CACHE BOOL "Whether to use the legacy implementation of View (paraseq's default on CUDA)")

    # Kokkos compiles for one GPU architecture, named Kokkos_ARCH_<NAME>.
    set(paraseq_cuda_arch_names
        50 MAXWELL50 52 MAXWELL52 53 MAXWELL53 60 PASCAL60 61 PASCAL61 70 VOLTA70 72 VOLTA72 75 TURING75
        80 AMPERE80 86 AMPERE86 87 AMPERE87 89 ADA89 90 HOPPER90 100 BLACKWELL100 103 BLACKWELL103
        120 BLACKWELL120 121 BLACKWELL121)
    set(architectures "${CMAKE_CUDA_ARCHITECTURES}")
    if(NOT architectures)
      set(architectures "$ENV{CUDAARCHS}")
    endif()
    list(LENGTH architectures architecture_count)
    if(architecture_count GREATER 1)
      message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES is '${architectures}'; the bundled Kokkos compiles for one architecture: give one (e.g. 90)")
    endif()
    set(wanted_arch "")
    if(NOT architectures STREQUAL "native")
      # 90, 90-real, 90a-virtual, ...: the compute capability is the leading number.
      string(REGEX MATCH "^[0-9]+" capability "${architectures}")
      list(FIND paraseq_cuda_arch_names "${capability}" index)
      if(capability STREQUAL "" OR index EQUAL -1)
        message(FATAL_ERROR "CMAKE_CUDA_ARCHITECTURES is '${architectures}'; the bundled Kokkos needs one compute capability it knows (50 to 121, e.g. 90) or 'native'")
      endif()
      math(EXPR index "${index} + 1")
      list(GET paraseq_cuda_arch_names ${index} wanted_arch)
    endif()
    # Exactly the wanted one is on (a reconfigure with another architecture turns the old one off);
    # none for 'native', where Kokkos detects the GPU itself.
    foreach(name IN LISTS paraseq_cuda_arch_names)
      if(name MATCHES "^[A-Z]")
        if(name STREQUAL wanted_arch)
          set(Kokkos_ARCH_${name} ON CACHE BOOL "set from CMAKE_CUDA_ARCHITECTURES" FORCE)
        elseif(DEFINED CACHE{Kokkos_ARCH_${name}})
          set(Kokkos_ARCH_${name} OFF CACHE BOOL "set from CMAKE_CUDA_ARCHITECTURES" FORCE)
        endif()
      endif()
    endforeach()
  endif()

  include(FetchContent)
  set(url https://github.com/kokkos/kokkos/releases/download/${PARASEQ_BUNDLED_KOKKOS_VERSION}/kokkos-${PARASEQ_BUNDLED_KOKKOS_VERSION}.tar.gz)
  set(timestamp_option)
  if(CMAKE_VERSION VERSION_GREATER_EQUAL 3.24)
    set(timestamp_option DOWNLOAD_EXTRACT_TIMESTAMP TRUE)
  endif()
  FetchContent_Declare(Kokkos URL ${url} URL_HASH SHA256=${PARASEQ_BUNDLED_KOKKOS_SHA256} ${timestamp_option})
  if(FETCHCONTENT_SOURCE_DIR_KOKKOS)
    message(STATUS "paraseq: building the bundled Kokkos from ${FETCHCONTENT_SOURCE_DIR_KOKKOS}")
  else()
    message(STATUS "paraseq: building the bundled Kokkos ${PARASEQ_BUNDLED_KOKKOS_VERSION} from ${url}")
  endif()
  # Kokkos is linked into the operators' shared library: position-independent. A pip build makes it
  # static, so that the wheel needs no Kokkos library beside libparaseq_torch.so.
  set(paraseq_saved_pic ${CMAKE_POSITION_INDEPENDENT_CODE})
  set(CMAKE_POSITION_INDEPENDENT_CODE ON)
  if(SKBUILD)
    set(BUILD_SHARED_LIBS OFF)
  endif()
  FetchContent_MakeAvailable(Kokkos)
  set(CMAKE_POSITION_INDEPENDENT_CODE ${paraseq_saved_pic})

  # What an installed Kokkos' package config would have told.
  FetchContent_GetProperties(Kokkos SOURCE_DIR kokkos_source_dir)
  get_directory_property(Kokkos_VERSION DIRECTORY ${kokkos_source_dir} DEFINITION Kokkos_VERSION)
  get_directory_property(Kokkos_DEVICES DIRECTORY ${kokkos_source_dir} DEFINITION KOKKOS_ENABLED_DEVICES)
  if(Kokkos_VERSION VERSION_LESS 4.5)
    message(FATAL_ERROR "the bundled Kokkos (${kokkos_source_dir}) is ${Kokkos_VERSION}; paraseq needs Kokkos >= 4.5")
  endif()
  if(Kokkos_ENABLE_CUDA)
    set(Kokkos_COMPILE_LANGUAGE CUDA)
  else()
    set(Kokkos_COMPILE_LANGUAGE CXX)
  endif()
endif()

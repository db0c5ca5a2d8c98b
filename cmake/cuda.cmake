# The CUDA backend (src/backend/cuda): CUDA runtime, cuBLAS, cuDNN, NCCL.
#
#   GPIPE_CUDA=AUTO  build it when the toolkit (nvcc, cudart, cuBLAS), cuDNN
#                    and NCCL are all found; otherwise say what is missing
#                    and build without it
#   GPIPE_CUDA=ON    the same, but anything missing is a configure error
#   GPIPE_CUDA=OFF   never look
#
# cuDNN and NCCL are found with find_path / find_library, hinted by the
# toolkit's directories and the CUDNN_ROOT / NCCL_ROOT variables or
# environment variables; CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, NCCL_INCLUDE_DIR
# and NCCL_LIBRARY can be set directly.  CMAKE_CUDA_ARCHITECTURES defaults
# to "80;90" (A100, H100).
#
# When built, the backend is a plugin, libgpipe-cuda.so (the MODULE
# gpipe_cuda, beside the tools in the build, in <libdir>/gpipe installed),
# which alone links the CUDA libraries: src/backend/device.c loads it when
# a cuda: device is opened, so a CPU run does not map the CUDA libraries
# (about 1 GB of address space: it starts under a small `ulimit -v`).  The
# plugin calls back into the program's gpipe, so programs that link gpipe
# export its symbols (an INTERFACE link option, --export-dynamic; the .pc
# and gpipeConfig.cmake say it too).  GPIPE_CUDA=1 is defined for
# src/backend/device.c and for the sources that include
# src/pipeline/nvtx.h (NVTX ranges, header-only); nowhere else.
# GPIPE_CUDA_BUILT tells tests/CMakeLists.txt.
set(GPIPE_CUDA_BUILT OFF)
if(GPIPE_CUDA STREQUAL "OFF")
  message(STATUS "gpipe: CUDA backend off (GPIPE_CUDA=OFF)")
  return()
endif()
if(NOT GPIPE_CUDA STREQUAL "AUTO" AND NOT GPIPE_CUDA STREQUAL "ON")
  message(FATAL_ERROR "GPIPE_CUDA must be AUTO, ON or OFF, not '${GPIPE_CUDA}'")
endif()

set(_gp_cuda_missing "")
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  list(APPEND _gp_cuda_missing "nvcc (CUDA compiler; set CUDACXX or put nvcc on PATH)")
endif()
find_package(CUDAToolkit QUIET)
if(NOT CUDAToolkit_FOUND)
  list(APPEND _gp_cuda_missing "the CUDA toolkit (find_package(CUDAToolkit))")
elseif(NOT TARGET CUDA::cublas)
  list(APPEND _gp_cuda_missing "cuBLAS (libcublas)")
elseif(NOT TARGET CUDA::cublasLt)
  list(APPEND _gp_cuda_missing "cuBLASLt (libcublasLt)")
endif()

set(_gp_hint_inc ${CUDAToolkit_INCLUDE_DIRS})
set(_gp_hint_lib ${CUDAToolkit_LIBRARY_DIR})
find_path(CUDNN_INCLUDE_DIR cudnn.h
          HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${_gp_hint_inc}
          PATH_SUFFIXES include)
find_library(CUDNN_LIBRARY cudnn
             HINTS ${CUDNN_ROOT} $ENV{CUDNN_ROOT} ${_gp_hint_lib}
             PATH_SUFFIXES lib64 lib)
find_path(NCCL_INCLUDE_DIR nccl.h
          HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${_gp_hint_inc}
          PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl
             HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${_gp_hint_lib}
             PATH_SUFFIXES lib64 lib)
if(NOT CUDNN_INCLUDE_DIR OR NOT CUDNN_LIBRARY)
  list(APPEND _gp_cuda_missing "cuDNN (cudnn.h: ${CUDNN_INCLUDE_DIR}, libcudnn: ${CUDNN_LIBRARY}; set CUDNN_ROOT)")
else()
  # The legacy descriptor API used by cuda_dnn.c is in cuDNN 8 and 9.
  set(_gp_cudnn_ver_h "${CUDNN_INCLUDE_DIR}/cudnn_version.h")
  if(EXISTS "${_gp_cudnn_ver_h}")
    file(STRINGS "${_gp_cudnn_ver_h}" _gp_cudnn_major REGEX "^#define CUDNN_MAJOR [0-9]+")
    string(REGEX REPLACE "^#define CUDNN_MAJOR ([0-9]+).*" "\\1" CUDNN_VERSION_MAJOR "${_gp_cudnn_major}")
  endif()
  if(CUDNN_VERSION_MAJOR AND CUDNN_VERSION_MAJOR LESS 8)
    list(APPEND _gp_cuda_missing "cuDNN 8 or newer (found ${CUDNN_VERSION_MAJOR})")
  endif()
endif()
if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
  list(APPEND _gp_cuda_missing "NCCL (nccl.h: ${NCCL_INCLUDE_DIR}, libnccl: ${NCCL_LIBRARY}; set NCCL_ROOT)")
endif()

if(_gp_cuda_missing)
  list(JOIN _gp_cuda_missing "; " _gp_msg)
  if(GPIPE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "GPIPE_CUDA=ON but the CUDA backend cannot be built; missing: ${_gp_msg}")
  endif()
  message(STATUS "gpipe: CUDA backend not built (GPIPE_CUDA=AUTO); missing: ${_gp_msg}")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "GPU architectures of the CUDA backend" FORCE)
endif()
# One CUDA runtime in the process: the shared libcudart that cuBLAS, cuDNN
# and NCCL use too (nvcc's default would link cudart_static into every
# executable, beside the shared one).
set(CMAKE_CUDA_RUNTIME_LIBRARY Shared)
enable_language(CUDA)
set(GPIPE_CUDA_BUILT ON)
message(STATUS "gpipe: CUDA backend ON (CUDA ${CUDAToolkit_VERSION}, cuDNN ${CUDNN_VERSION_MAJOR}, "
               "NCCL ${NCCL_LIBRARY}, architectures ${CMAKE_CUDA_ARCHITECTURES})")

file(GLOB GPIPE_CUDA_SOURCES CONFIGURE_DEPENDS
     ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.c ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu)
add_library(gpipe_cuda MODULE ${GPIPE_CUDA_SOURCES})
set_target_properties(gpipe_cuda PROPERTIES OUTPUT_NAME gpipe-cuda PREFIX lib
                      LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR})
target_include_directories(gpipe_cuda PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src)
# Library headers are system headers: their warnings are not ours.
target_include_directories(gpipe_cuda SYSTEM PRIVATE ${CUDNN_INCLUDE_DIR} ${NCCL_INCLUDE_DIR}
                           ${CUDAToolkit_INCLUDE_DIRS})
target_link_libraries(gpipe_cuda PRIVATE Threads::Threads)
target_compile_definitions(gpipe_cuda PRIVATE _POSIX_C_SOURCE=200809L)
set_target_properties(gpipe_cuda PROPERTIES CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
                      POSITION_INDEPENDENT_CODE ON)
set(_gp_nvcc_host -Wall,-Wextra,-Wno-unused-parameter)
set(_gp_nvcc_dev "")
if(GPIPE_WERROR)
  set(_gp_nvcc_host "${_gp_nvcc_host},-Werror")
  set(_gp_nvcc_dev -Werror=all-warnings)
endif()
# --threads 0: nvcc compiles the architectures at once, one thread each
# (CUDA 11.2 on; the kernels are one file, which make -j cannot split:
# 29 -> 20 s for sm_80 + sm_90 on 2 cores)
set(_gp_nvcc_par "")
if(CUDAToolkit_VERSION VERSION_GREATER_EQUAL 11.2)
  set(_gp_nvcc_par --threads=0)
endif()
target_compile_options(gpipe_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:C>:${GPIPE_WARN}>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_gp_nvcc_host} ${_gp_nvcc_dev} ${_gp_nvcc_par}>)

set_target_properties(gpipe_cuda PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
target_link_libraries(gpipe_cuda PRIVATE CUDA::cudart CUDA::cublas CUDA::cublasLt ${CUDNN_LIBRARY}
                      ${NCCL_LIBRARY} ${CMAKE_DL_LIBS})
# (every program that links gpipe can load the plugin: it exports gpipe's
# functions, and the library brings dlopen)
add_dependencies(gpipe gpipe_cuda)
target_link_libraries(gpipe PUBLIC ${CMAKE_DL_LIBS})
target_link_options(gpipe INTERFACE "LINKER:--export-dynamic")
include(GNUInstallDirs)
set_property(SOURCE ${PROJECT_SOURCE_DIR}/src/backend/device.c APPEND PROPERTY
             COMPILE_DEFINITIONS GPIPE_CUDA=1 GPIPE_CUDA_PLUGIN_NAME="libgpipe-cuda.so"
             GPIPE_CUDA_PLUGIN_LIBDIR="${CMAKE_INSTALL_LIBDIR}"
             GPIPE_CUDA_PLUGIN_INSTALLED="${CMAKE_INSTALL_FULL_LIBDIR}/gpipe/libgpipe-cuda.so")
# The NVTX ranges of src/pipeline/nvtx.h are on where GPIPE_CUDA is
# defined: define it for the library sources that include that header
# (NVTX 3 is header-only: the toolkit's include directory).
target_include_directories(gpipe SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
foreach(_gp_src ${GPIPE_SOURCES})
  file(STRINGS "${_gp_src}" _gp_nvtx REGEX "#include \"pipeline/nvtx.h\"")
  if(_gp_nvtx)
    set_property(SOURCE ${_gp_src} APPEND PROPERTY COMPILE_DEFINITIONS GPIPE_CUDA=1)
  endif()
endforeach()

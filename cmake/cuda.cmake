# The CUDA backend is its own issue; the switch is reserved here so configs and
# CI can name it. AUTO builds it only when the toolkit is found.
if(GPIPE_CUDA STREQUAL "ON")
  message(STATUS "gpipe: GPIPE_CUDA=ON requested; the CUDA backend is not built yet")
endif()

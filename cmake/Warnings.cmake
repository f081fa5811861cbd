# apexrl_enable_warnings(target): the warning set every apexrl target builds with.
#
# APEXRL_THREAD_SAFETY=ON adds clang's thread-safety analysis, its findings as errors: every member marked
# GUARDED_BY must only be touched with its lock held, every REQUIRES/EXCLUDES must hold at each call. Only
# clang implements the analysis (the annotations compile to nothing under g++), so other compilers are refused
# rather than silently checking nothing.
if(APEXRL_THREAD_SAFETY AND NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "APEXRL_THREAD_SAFETY=ON needs clang (CMAKE_CXX_COMPILER_ID is '${CMAKE_CXX_COMPILER_ID}'): "
                      "configure with -DCMAKE_CXX_COMPILER=clang++")
endif()
set(APEXRL_THREAD_SAFETY_FLAGS -Wthread-safety)

function(apexrl_enable_warnings target)
  if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
    target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor)
    if(APEXRL_WERROR)
      target_compile_options(${target} PRIVATE -Werror)
    endif()
  endif()
  if(APEXRL_THREAD_SAFETY)
    target_compile_options(${target} PRIVATE ${APEXRL_THREAD_SAFETY_FLAGS} -Werror=thread-safety)
  endif()
endfunction()

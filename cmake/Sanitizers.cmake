# apexrl_enable_sanitizer(target): instrument a target with APEXRL_SANITIZER: thread, address, undefined, or
# address and undefined together ("address,undefined": one build runs both, as CI's decoder fuzzing does).
# The concurrency stress test is built with APEXRL_SANITIZER=thread in CI.
set(_apexrl_known_sanitizers thread address undefined)
string(REPLACE "," ";" _apexrl_sanitizers "${APEXRL_SANITIZER}")
foreach(_apexrl_san IN LISTS _apexrl_sanitizers)
  if(NOT _apexrl_san IN_LIST _apexrl_known_sanitizers)
    message(FATAL_ERROR "APEXRL_SANITIZER='${APEXRL_SANITIZER}': use thread, address, undefined, "
                        "address,undefined or leave it empty")
  endif()
endforeach()
list(LENGTH _apexrl_sanitizers _apexrl_sanitizer_count)
if("thread" IN_LIST _apexrl_sanitizers AND _apexrl_sanitizer_count GREATER 1)
  message(FATAL_ERROR "APEXRL_SANITIZER='${APEXRL_SANITIZER}': ThreadSanitizer cannot be combined with another")
endif()

function(apexrl_enable_sanitizer target)
  if(APEXRL_SANITIZER)
    target_compile_options(${target} PUBLIC -fsanitize=${APEXRL_SANITIZER} -fno-omit-frame-pointer -g)
    target_link_options(${target} PUBLIC -fsanitize=${APEXRL_SANITIZER})
  endif()
endfunction()

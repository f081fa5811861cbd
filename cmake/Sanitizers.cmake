# apexrl_enable_sanitizer(target): instrument a target with APEXRL_SANITIZER (thread|address|undefined).
# The concurrency stress test is built with APEXRL_SANITIZER=thread in CI.
set(_apexrl_known_sanitizers "" thread address undefined)
if(NOT APEXRL_SANITIZER IN_LIST _apexrl_known_sanitizers)
  message(FATAL_ERROR "APEXRL_SANITIZER='${APEXRL_SANITIZER}': use thread, address, undefined or leave it empty")
endif()

function(apexrl_enable_sanitizer target)
  if(APEXRL_SANITIZER)
    target_compile_options(${target} PUBLIC -fsanitize=${APEXRL_SANITIZER} -fno-omit-frame-pointer -g)
    target_link_options(${target} PUBLIC -fsanitize=${APEXRL_SANITIZER})
  endif()
endfunction()

# Runs a command and passes only if it exits 0 AND its output matches a pattern.
#
#   cmake -DEXPECT=<regex> [-DSKIP_CODE=<n>] -P expect_output.cmake -- COMMAND [ARG...]
#
# ctest's PASS_REGULAR_EXPRESSION replaces the exit-status check instead of adding to it, so a
# program that printed its success line and then failed in a sanitizer (LeakSanitizer reports at
# exit: status 1 under ASan, 23 standalone) or crashed in a destructor would pass. This wrapper
# checks both:
#   - status SKIP_CODE (when given) is a skip: the wrapper prints "kvsdk-expect-output: SKIPPED"
#     and kvsdk_add_output_test() makes that line ctest's SKIP_REGULAR_EXPRESSION (cmake -P
#     cannot choose its own exit status before CMake 3.29), so ctest reports "Skipped";
#   - any other non-zero status, or a signal, fails;
#   - exit 0 without a match of EXPECT fails.
# Patterns are CMake regexes matched against stdout and stderr merged, exactly as ctest matched
# PASS_REGULAR_EXPRESSION ('.' also matches a newline). Arguments cannot contain ';' (a CMake
# list separator). Registered through kvsdk_add_output_test() (tests/support/output_test.cmake).
if(NOT DEFINED EXPECT OR EXPECT STREQUAL "")
  message(FATAL_ERROR "expect_output.cmake: -DEXPECT=<regex> is required")
endif()

set(command)
set(after_separator FALSE)
math(EXPR last "${CMAKE_ARGC} - 1")
foreach(i RANGE 1 ${last})
  set(arg "${CMAKE_ARGV${i}}")
  if(after_separator)
    if(arg MATCHES ";")
      message(FATAL_ERROR "expect_output.cmake: argument contains ';': ${arg}")
    endif()
    list(APPEND command "${arg}")
  elseif(arg STREQUAL "--")
    set(after_separator TRUE)
  endif()
endforeach()
if(NOT command)
  message(FATAL_ERROR "expect_output.cmake: no command after --")
endif()

# The same variable for both pipes merges them in the order produced; ECHO_* streams them on, so
# ctest's --output-on-failure shows the program's own output.
execute_process(COMMAND ${command} RESULT_VARIABLE status OUTPUT_VARIABLE output
                ERROR_VARIABLE output ECHO_OUTPUT_VARIABLE ECHO_ERROR_VARIABLE)
list(JOIN command " " shown)
if(DEFINED SKIP_CODE AND NOT SKIP_CODE STREQUAL "" AND status STREQUAL "${SKIP_CODE}")
  message("kvsdk-expect-output: SKIPPED (exit ${status}): ${shown}")
  return()
endif()
if(NOT status STREQUAL "0")
  # A number is an exit status; a signal comes back as text ("Segmentation fault", ...).
  message(FATAL_ERROR "FAIL: exited with status '${status}' (non-zero): ${shown}")
endif()
if(NOT output MATCHES "${EXPECT}")
  message(FATAL_ERROR "FAIL: exited 0 but the output does not match '${EXPECT}': ${shown}")
endif()

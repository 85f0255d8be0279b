# kvsdk_add_output_test(NAME name EXPECT regex [SKIP_RETURN_CODE n] COMMAND exe_or_target args...)
#
# A ctest entry that passes only when COMMAND exits 0 AND its output (stdout and stderr merged)
# matches EXPECT (a CMake regex, as PASS_REGULAR_EXPRESSION took). Use it instead of
# PASS_REGULAR_EXPRESSION, which makes ctest ignore the exit status: under the asan preset a
# LeakSanitizer report (exit 1 after the success line) would otherwise pass. With
# SKIP_RETURN_CODE, that exit status is reported by ctest as "Skipped" rather than passed or
# failed. The command runs through tests/support/expect_output.cmake; a target name as the first
# word becomes its file, through the cross-compiling emulator as add_test() would run it.
set(KVSDK_EXPECT_OUTPUT_SCRIPT ${CMAKE_CURRENT_LIST_DIR}/expect_output.cmake)

function(kvsdk_add_output_test)
  cmake_parse_arguments(PARSE_ARGV 0 arg "" "NAME;EXPECT;SKIP_RETURN_CODE" "COMMAND")
  if(NOT arg_NAME OR "${arg_EXPECT}" STREQUAL "" OR NOT arg_COMMAND OR arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "kvsdk_add_output_test(NAME n EXPECT re [SKIP_RETURN_CODE n] COMMAND ...)")
  endif()
  list(POP_FRONT arg_COMMAND program)
  set(launcher)
  if(TARGET ${program})
    if(CMAKE_CROSSCOMPILING)
      get_target_property(launcher ${program} CROSSCOMPILING_EMULATOR)
      if(NOT launcher)
        set(launcher)
      endif()
    endif()
    set(program $<TARGET_FILE:${program}>)
  endif()
  set(skip_arg)
  if(NOT "${arg_SKIP_RETURN_CODE}" STREQUAL "")
    set(skip_arg -DSKIP_CODE=${arg_SKIP_RETURN_CODE})
  endif()
  add_test(NAME ${arg_NAME}
           COMMAND ${CMAKE_COMMAND} "-DEXPECT=${arg_EXPECT}" ${skip_arg}
                   -P ${KVSDK_EXPECT_OUTPUT_SCRIPT} -- ${launcher} ${program} ${arg_COMMAND})
  if(skip_arg)
    set_tests_properties(${arg_NAME} PROPERTIES
                         SKIP_REGULAR_EXPRESSION "kvsdk-expect-output: SKIPPED")
  endif()
endfunction()

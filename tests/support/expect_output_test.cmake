# cmake -DSCRIPT=expect_output.cmake -P expect_output_test.cmake
# Self-test of the output-checking wrapper that replaced PASS_REGULAR_EXPRESSION (ctest:
# support.expect_output): the expected line followed by a non-zero exit, LeakSanitizer's status or
# a signal must fail; the line missing fails; exit 0 with the line (on either stream, across lines)
# passes; the skip status is reported as a skip only when asked for.
find_program(SH sh REQUIRED)
set(failures 0)

# check(NAME WANT_PASS|WANT_FAIL|WANT_SKIP EXPECT_REGEX SHELL_LINE [extra -D args...])
function(check name want expect line)
  execute_process(COMMAND ${CMAKE_COMMAND} "-DEXPECT=${expect}" ${ARGN} -P ${SCRIPT} -- ${SH} -c
                          "${line}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(ok FALSE)
  set(skipped FALSE)
  if(out MATCHES "kvsdk-expect-output: SKIPPED")
    set(skipped TRUE)
  endif()
  if(want STREQUAL "WANT_PASS" AND rc STREQUAL "0" AND NOT skipped)
    set(ok TRUE)
  elseif(want STREQUAL "WANT_FAIL" AND NOT rc STREQUAL "0" AND out MATCHES "FAIL: ")
    set(ok TRUE)
  elseif(want STREQUAL "WANT_SKIP" AND rc STREQUAL "0" AND skipped)
    set(ok TRUE)
  endif()
  if(ok)
    message("ok: ${name}")
  else()
    message("NOT OK: ${name}: wanted ${want}, wrapper exited '${rc}' with:\n${out}")
    math(EXPR n "${failures} + 1")
    set(failures ${n} PARENT_SCOPE)
  endif()
endfunction()

check("pattern printed, exit 0" WANT_PASS "replayed [1-9][0-9]* inputs"
      "echo replayed 3 inputs")
check("pattern printed, exit 1" WANT_FAIL "replayed [1-9][0-9]* inputs"
      "echo replayed 3 inputs && exit 1")
check("pattern printed, standalone LeakSanitizer exit 23" WANT_FAIL "sample finished: OK"
      "echo sample finished: OK && echo 'ERROR: LeakSanitizer' >&2 && exit 23")
check("pattern printed, then killed by a signal" WANT_FAIL "cli tests passed"
      "echo cli tests passed && kill -SEGV $$")
check("pattern absent, exit 0" WANT_FAIL "chat resume test: OK" "echo something else")
check("pattern on stderr, exit 0" WANT_PASS "chat resume test: OK"
      "echo chat resume test: OK >&2")
check("pattern across lines" WANT_PASS "full +100% +[0-9]+.*full +50% +- +failed"
      "printf 'full  100%%  12\\nnoise\\nfull  50%%  -  failed\\n'")
check("skip status with SKIP_CODE" WANT_SKIP "never printed" "echo no model && exit 77"
      -DSKIP_CODE=77)
check("skip status without SKIP_CODE" WANT_FAIL "never printed" "echo no model && exit 77")
check("other status with SKIP_CODE" WANT_FAIL "x" "echo x && exit 1" -DSKIP_CODE=77)

if(NOT failures EQUAL 0)
  message(FATAL_ERROR "${failures} expect_output check(s) failed")
endif()
message("expect_output self-test: OK")

# cmake -DHOST_TOOL=native_tool -DTARGET_TOOL=cross_tool -DTARGET_EMULATOR=qemu|args -DWORK=dir
#       -P cross_arch.cmake
# Every preset's snapshot written natively continues identically in the emulated build, and the
# reverse.
# Reports SKIP (ctest's SKIP_REGULAR_EXPRESSION) when the native tool is missing, unless
# KVSDK_PORTABILITY_REQUIRE_PEER=1 is set, which makes that a failure.
if(NOT EXISTS "${HOST_TOOL}")
  if("$ENV{KVSDK_PORTABILITY_REQUIRE_PEER}" STREQUAL "1")
    message(FATAL_ERROR "host snapshot tool ${HOST_TOOL} not built (build the dev preset)")
  endif()
  message("SKIP: ${HOST_TOOL} not built; build the dev preset to run this test")
  return()
endif()
set(script ${CMAKE_CURRENT_LIST_DIR}/write_then_check.cmake)
foreach(direction host_to_target target_to_host)
  if(direction STREQUAL host_to_target)
    set(args -DWRITER=${HOST_TOOL} -DREADER=${TARGET_TOOL} -DREADER_EMULATOR=${TARGET_EMULATOR})
  else()
    set(args -DWRITER=${TARGET_TOOL} -DWRITER_EMULATOR=${TARGET_EMULATOR} -DREADER=${HOST_TOOL})
  endif()
  message("--- ${direction}")
  execute_process(COMMAND ${CMAKE_COMMAND} ${args} -DWORK=${WORK}/${direction} -P ${script}
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${direction}: failed")
  endif()
endforeach()
# The snapshot id in the 32-byte file header is a hash of the cache state: both architectures
# must derive the same one, for every preset's snapshot (and smallkv's proxy's). The files as a
# whole need not match: their compressed frames came out different on the two architectures
# (zstd does not promise identical output across platforms); what they decompress to is what the
# checks above compare.
file(GLOB snapshots RELATIVE ${WORK}/host_to_target ${WORK}/host_to_target/*.kvsdk)
if(NOT snapshots)
  message(FATAL_ERROR "no snapshots in ${WORK}/host_to_target")
endif()
foreach(name ${snapshots})
  file(READ ${WORK}/host_to_target/${name} host_header LIMIT 32 HEX)
  if(NOT EXISTS ${WORK}/target_to_host/${name})
    message(FATAL_ERROR "${name}: written natively but not by the emulated build")
  endif()
  file(READ ${WORK}/target_to_host/${name} target_header LIMIT 32 HEX)
  if(NOT host_header STREQUAL target_header)
    message(FATAL_ERROR "${name}: file headers (snapshot ids) differ:\n  ${host_header}\n  ${target_header}")
  endif()
endforeach()
list(LENGTH snapshots count)
message("both architectures derived the same snapshot ids for all ${count} snapshots")

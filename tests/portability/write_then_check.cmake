# cmake -DWRITER=tool [-DWRITER_EMULATOR=a|b] -DREADER=tool [-DREADER_EMULATOR=a|b] -DWORK=dir
#       -P write_then_check.cmake
# The writer saves the portability scenario of every preset into WORK, the reader loads and
# checks each (the tool's output names every preset and how many outputs matched bit for bit).
foreach(side WRITER READER)
  string(REPLACE "|" ";" ${side}_EMULATOR "${${side}_EMULATOR}")
endforeach()
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
execute_process(COMMAND ${WRITER_EMULATOR} ${WRITER} write ${WORK} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "write failed (${rc}): ${WRITER_EMULATOR} ${WRITER}")
endif()
execute_process(COMMAND ${READER_EMULATOR} ${READER} check ${WORK} RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check failed (${rc}): ${READER_EMULATOR} ${READER}")
endif()

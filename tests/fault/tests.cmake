# Fault-injection tests, label "fault": every tests/fault/test_*.c is one executable and one
# CTest test. They damage files on purpose (truncation, flipped bytes, foreign versions),
# kill writers mid-write and race them, and check that kiln refuses what is damaged, names
# the file and what is wrong, and never loses a good file.
file(GLOB KILN_FAULT_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/fault/test_*.c)
foreach(src ${KILN_FAULT_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests/unit)
  target_link_libraries(${name} PRIVATE kiln)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME fault.${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(fault.${name} PROPERTIES LABELS fault TIMEOUT 60 SKIP_RETURN_CODE 77
    ENVIRONMENT "KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILN_BIN=${CMAKE_BINARY_DIR}/kiln;OMP_NUM_THREADS=2")
endforeach()

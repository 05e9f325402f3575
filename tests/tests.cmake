# Unit tests: every tests/unit/test_*.c is one executable and one CTest test, labelled "unit".
file(GLOB KILN_UNIT_TESTS CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/unit/test_*.c)
foreach(src ${KILN_UNIT_TESTS})
  get_filename_component(name ${src} NAME_WE)
  add_executable(${name} ${src})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests/unit)
  target_link_libraries(${name} PRIVATE kiln)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  add_test(NAME unit.${name} COMMAND ${name} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(unit.${name} PROPERTIES LABELS unit SKIP_RETURN_CODE 77 ENVIRONMENT "KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILN_BIN=${CMAKE_BINARY_DIR}/kiln;KILN_GPT2_DIR=${CMAKE_SOURCE_DIR}/deps/gpt2;OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")
endforeach()

# Other suites (reference, fault, fuzz) add themselves from their own cmake files.
file(GLOB KILN_TEST_CMAKES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/*/tests.cmake)
foreach(f ${KILN_TEST_CMAKES})
  include(${f})
endforeach()

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

# kiln_add_case_tests(SCRIPT PREFIX LABEL TIMEOUT ENV): each function case_<name> of the shell
# script SCRIPT is one CTest test PREFIX.<name>, run as `sh SCRIPT <name>` on the cli tests'
# fixture, labelled LABEL, exit 77 a skip, with the environment ENV (a list).
function(kiln_add_case_tests script prefix label timeout env)
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${script})
  file(STRINGS ${script} cases REGEX "^case_[a-z0-9_]+\\(\\)")
  foreach(line ${cases})
    string(REGEX REPLACE "^case_([a-z0-9_]+)\\(\\).*" "\\1" case ${line})
    add_test(NAME ${prefix}.${case} COMMAND sh ${script} ${case})
    set_tests_properties(${prefix}.${case} PROPERTIES LABELS ${label}
      FIXTURES_REQUIRED cli_fixture TIMEOUT ${timeout} SKIP_RETURN_CODE 77 ENVIRONMENT "${env}")
  endforeach()
endfunction()

# Other suites (reference, fault, fuzz) add themselves from their own cmake files.
file(GLOB KILN_TEST_CMAKES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/tests/*/tests.cmake)
foreach(f ${KILN_TEST_CMAKES})
  include(${f})
endforeach()

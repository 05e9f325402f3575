# End-to-end tests of the kiln command, label "cli". Each function case_<name> in
# tests/cli/test_<group>.sh is one CTest test, cli.<group>.<name>, run by /bin/sh against the
# kiln binary of this build. cli.fixture first builds the data they share (text, shards, a
# trained tokenizer, a tiny trained model) under <build>/cli-work/fixture; each case works
# in its own folder there, removed when the case passes and kept for a look when it fails.
# Exit status 77 means skipped (a sanitizer build cannot run the ulimit -v cases).
set(KILN_CLI_DIR ${CMAKE_SOURCE_DIR}/tests/cli)
set(KILN_CLI_ENV
  "KILN_BIN=${CMAKE_BINARY_DIR}/kiln"
  "KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
  "KILN_CLI_WORK=${CMAKE_BINARY_DIR}/cli-work"
  "OMP_NUM_THREADS=1")

add_test(NAME cli.fixture COMMAND sh ${KILN_CLI_DIR}/fixture.sh)
set_tests_properties(cli.fixture PROPERTIES
  LABELS cli FIXTURES_SETUP cli_fixture TIMEOUT 120 ENVIRONMENT "${KILN_CLI_ENV}")

file(GLOB KILN_CLI_SCRIPTS CONFIGURE_DEPENDS ${KILN_CLI_DIR}/test_*.sh)
foreach(script ${KILN_CLI_SCRIPTS})
  # New cases in a script re-run CMake, so that CTest knows them.
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${script})
  get_filename_component(group ${script} NAME_WE)
  string(REGEX REPLACE "^test_" "" group ${group})
  file(STRINGS ${script} cases REGEX "^case_[a-z0-9_]+\\(\\)")
  foreach(line ${cases})
    string(REGEX REPLACE "^case_([a-z0-9_]+)\\(\\).*" "\\1" case ${line})
    add_test(NAME cli.${group}.${case} COMMAND sh ${script} ${case})
    set_tests_properties(cli.${group}.${case} PROPERTIES
      LABELS cli FIXTURES_REQUIRED cli_fixture TIMEOUT 90 SKIP_RETURN_CODE 77
      ENVIRONMENT "${KILN_CLI_ENV}")
  endforeach()
endforeach()

# GGUF export against llama.cpp (tests/compress/test_gguf.sh), label "compress": each
# case_<name> is one CTest test on the cli tests' fixture; kiln_logits prints kiln's logits.
add_executable(kiln_logits ${CMAKE_SOURCE_DIR}/tests/compress/kiln_logits.c)
target_link_libraries(kiln_logits PRIVATE kiln)
set_target_properties(kiln_logits PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
set(KILN_GGUF_TEST ${CMAKE_SOURCE_DIR}/tests/compress/test_gguf.sh)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${KILN_GGUF_TEST})
file(STRINGS ${KILN_GGUF_TEST} kiln_gguf_cases REGEX "^case_[a-z0-9_]+\\(\\)")
foreach(line ${kiln_gguf_cases})
  string(REGEX REPLACE "^case_([a-z0-9_]+)\\(\\).*" "\\1" case ${line})
  add_test(NAME compress.gguf.${case} COMMAND sh ${KILN_GGUF_TEST} ${case})
  set_tests_properties(compress.gguf.${case} PROPERTIES
    LABELS compress FIXTURES_REQUIRED cli_fixture TIMEOUT 300 SKIP_RETURN_CODE 77
    ENVIRONMENT "KILN_BIN=${CMAKE_BINARY_DIR}/kiln;KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILN_CLI_WORK=${CMAKE_BINARY_DIR}/cli-work;KILN_LOGITS=$<TARGET_FILE:kiln_logits>;OMP_NUM_THREADS=1")
endforeach()

# Post-training quantization (tests/compress/test_quant.sh), label "compress" too.
set(KILN_QUANT_TEST ${CMAKE_SOURCE_DIR}/tests/compress/test_quant.sh)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${KILN_QUANT_TEST})
file(STRINGS ${KILN_QUANT_TEST} kiln_quant_cases REGEX "^case_[a-z0-9_]+\\(\\)")
foreach(line ${kiln_quant_cases})
  string(REGEX REPLACE "^case_([a-z0-9_]+)\\(\\).*" "\\1" case ${line})
  add_test(NAME compress.quant.${case} COMMAND sh ${KILN_QUANT_TEST} ${case})
  set_tests_properties(compress.quant.${case} PROPERTIES
    LABELS compress FIXTURES_REQUIRED cli_fixture TIMEOUT 120 SKIP_RETURN_CODE 77
    ENVIRONMENT "KILN_BIN=${CMAKE_BINARY_DIR}/kiln;KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR};KILN_CLI_WORK=${CMAKE_BINARY_DIR}/cli-work;KILN_LOGITS=$<TARGET_FILE:kiln_logits>;OMP_NUM_THREADS=1")
endforeach()

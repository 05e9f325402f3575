# GGUF export against llama.cpp (tests/compress/test_gguf.sh), label "compress": each
# case_<name> is one CTest test on the cli tests' fixture; kiln_logits prints kiln's logits.
add_executable(kiln_logits ${CMAKE_SOURCE_DIR}/tests/compress/kiln_logits.c)
target_link_libraries(kiln_logits PRIVATE kiln)
set_target_properties(kiln_logits PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
set(KILN_COMPRESS_ENV "KILN_BIN=${CMAKE_BINARY_DIR}/kiln" "KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
  "KILN_CLI_WORK=${CMAKE_BINARY_DIR}/cli-work" "KILN_LOGITS=$<TARGET_FILE:kiln_logits>"
  "OMP_NUM_THREADS=1")
kiln_add_case_tests(${CMAKE_SOURCE_DIR}/tests/compress/test_gguf.sh compress.gguf compress 300
  "${KILN_COMPRESS_ENV}")
# Post-training quantization (tests/compress/test_quant.sh), label "compress" too.
kiln_add_case_tests(${CMAKE_SOURCE_DIR}/tests/compress/test_quant.sh compress.quant compress 120
  "${KILN_COMPRESS_ENV}")

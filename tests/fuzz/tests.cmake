# libFuzzer targets: built with -DKILN_FUZZ=ON and clang (CC=clang). Each target compiles the
# library sources it needs itself, instrumented for coverage and checked by AddressSanitizer
# and UndefinedBehaviorSanitizer, rather than linking the uninstrumented kiln library.
# Each has a CTest test "fuzz.<name>" that fuzzes for 30 s from a seed corpus generated at
# test time, with a fixed seed.
if(KILN_FUZZ)
  if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
    message(WARNING "KILN_FUZZ needs clang (configure with CC=clang); fuzz targets skipped")
  else()
    set(KILN_FUZZ_ST_SOURCES
      ${CMAKE_SOURCE_DIR}/src/ckpt/safetensors_dtype.c
      ${CMAKE_SOURCE_DIR}/src/ckpt/safetensors_read.c
      ${CMAKE_SOURCE_DIR}/src/ckpt/safetensors_write.c
      ${CMAKE_SOURCE_DIR}/src/core/dtype.c
      ${CMAKE_SOURCE_DIR}/src/core/error.c
      ${CMAKE_SOURCE_DIR}/src/core/fs.c)
    # -Wno-pass-failed: at -O1 under the sanitizers clang cannot vectorise the `omp simd` loops
    # of core/dtype.c, and says so; the loops are right, only slower, which fuzzing allows.
    set(KILN_FUZZ_FLAGS -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer -g -O1 -Wno-pass-failed)

    add_executable(fuzz_safetensors ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_safetensors.c
      ${KILN_FUZZ_ST_SOURCES})
    target_compile_options(fuzz_safetensors PRIVATE ${KILN_FUZZ_FLAGS})
    target_link_options(fuzz_safetensors PRIVATE -fsanitize=fuzzer,address,undefined)

    # The seed generator is plain code (no fuzzer runtime: it has its own main).
    add_executable(fuzz_seed_safetensors ${CMAKE_SOURCE_DIR}/tests/fuzz/gen_safetensors_seeds.c
      ${KILN_FUZZ_ST_SOURCES})

    foreach(t fuzz_safetensors fuzz_seed_safetensors)
      target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src
        ${CJSON_INCLUDE_DIR})
      target_link_libraries(${t} PRIVATE ${CJSON_LIB} OpenMP::OpenMP_C m)
      set_target_properties(${t} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
    endforeach()

    set(work ${CMAKE_BINARY_DIR}/fuzz/safetensors)
    file(MAKE_DIRECTORY ${work})
    add_test(NAME fuzz.safetensors
      COMMAND sh -c "rm -rf corpus seeds && mkdir corpus seeds && \"$0\" seeds && \"$1\" -seed=1 -max_total_time=30 -max_len=16384 -timeout=10 -rss_limit_mb=2048 -dict=\"$2\" -print_final_stats=1 corpus seeds"
        $<TARGET_FILE:fuzz_seed_safetensors> $<TARGET_FILE:fuzz_safetensors>
        ${CMAKE_SOURCE_DIR}/tests/fuzz/safetensors.dict
      WORKING_DIRECTORY ${work})
    set_tests_properties(fuzz.safetensors PROPERTIES LABELS fuzz TIMEOUT 120)
    # The tokenizer: any bytes must encode, decode back to themselves, and never crash.
    file(GLOB KILN_FUZZ_TOK_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/tok/*.c)
    list(APPEND KILN_FUZZ_TOK_SOURCES ${CMAKE_SOURCE_DIR}/src/core/error.c
      ${CMAKE_SOURCE_DIR}/src/core/alloc.c ${CMAKE_SOURCE_DIR}/src/core/fs.c)
    add_executable(fuzz_tokenizer ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_tokenizer.c ${KILN_FUZZ_TOK_SOURCES})
    target_compile_options(fuzz_tokenizer PRIVATE ${KILN_FUZZ_FLAGS})
    target_link_options(fuzz_tokenizer PRIVATE -fsanitize=fuzzer,address,undefined)
    target_include_directories(fuzz_tokenizer PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src
      ${CJSON_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR})
    target_link_libraries(fuzz_tokenizer PRIVATE ${CJSON_LIB} ${XXHASH_LIB} PkgConfig::PCRE2 OpenMP::OpenMP_C m)
    set_target_properties(fuzz_tokenizer PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
    file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz/tokenizer)
    add_test(NAME fuzz.tokenizer
      COMMAND sh -c "rm -rf corpus && mkdir corpus && \"$0\" -seed=1 -max_total_time=30 -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 corpus"
        $<TARGET_FILE:fuzz_tokenizer>
      WORKING_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz/tokenizer)
    set_tests_properties(fuzz.tokenizer PROPERTIES LABELS fuzz TIMEOUT 120
      ENVIRONMENT "KILN_GPT2_DIR=${CMAKE_SOURCE_DIR}/deps/gpt2")
  endif()
endif()

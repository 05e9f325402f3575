# libFuzzer targets: built with -DKILN_FUZZ=ON and clang (CC=clang). Each target compiles the
# library sources it needs itself, instrumented for coverage and checked by AddressSanitizer
# and UndefinedBehaviorSanitizer, rather than linking the uninstrumented kiln library.
# Each has a CTest test "fuzz.<name>" that fuzzes for 20 to 30 s from a seed corpus generated
# at test time, with a fixed seed.
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
      ${CJSON_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR} ${UTF8PROC_INCLUDE_DIR})
    target_link_libraries(fuzz_tokenizer PRIVATE ${CJSON_LIB} ${XXHASH_LIB} ${UTF8PROC_LIB} PkgConfig::PCRE2 OpenMP::OpenMP_C m)
    set_target_properties(fuzz_tokenizer PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
    file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz/tokenizer)
    add_test(NAME fuzz.tokenizer
      COMMAND sh -c "rm -rf corpus && mkdir corpus && \"$0\" -seed=1 -max_total_time=30 -max_len=4096 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 corpus"
        $<TARGET_FILE:fuzz_tokenizer>
      WORKING_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz/tokenizer)
    set_tests_properties(fuzz.tokenizer PROPERTIES LABELS fuzz TIMEOUT 120
      ENVIRONMENT "KILN_GPT2_DIR=${CMAKE_SOURCE_DIR}/deps/gpt2")

    # Hugging Face tokenizer.json: any file parses cleanly or gives a tokenizer whose ids are in
    # range and whose prepared form reads back the same; any text encodes.
    add_executable(fuzz_tokenizer_hf ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_tokenizer_hf.c ${KILN_FUZZ_TOK_SOURCES})
    target_compile_options(fuzz_tokenizer_hf PRIVATE ${KILN_FUZZ_FLAGS})
    target_link_options(fuzz_tokenizer_hf PRIVATE -fsanitize=fuzzer,address,undefined)
    add_executable(fuzz_seed_tokenizer_hf ${CMAKE_SOURCE_DIR}/tests/fuzz/gen_tokenizer_hf_seeds.c)
    foreach(t fuzz_tokenizer_hf fuzz_seed_tokenizer_hf)
      target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CMAKE_SOURCE_DIR}/src
        ${CMAKE_SOURCE_DIR}/tests/fuzz ${CJSON_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR} ${UTF8PROC_INCLUDE_DIR})
      target_link_libraries(${t} PRIVATE ${CJSON_LIB} ${XXHASH_LIB} ${UTF8PROC_LIB} PkgConfig::PCRE2 OpenMP::OpenMP_C m)
      set_target_properties(${t} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
    endforeach()
    file(MAKE_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz/tokenizer_hf)
    add_test(NAME fuzz.tokenizer_hf
      COMMAND sh -c "rm -rf corpus seeds && mkdir corpus seeds && \"$0\" seeds && \"$1\" -seed=1 -max_total_time=30 -max_len=16384 -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 corpus seeds"
        $<TARGET_FILE:fuzz_seed_tokenizer_hf> $<TARGET_FILE:fuzz_tokenizer_hf>
      WORKING_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz/tokenizer_hf)
    set_tests_properties(fuzz.tokenizer_hf PROPERTIES LABELS fuzz TIMEOUT 120)

    # The readers of the files users hand kiln that need a model to load into or a trainer to
    # resume: one instrumented copy of the whole library, shared by their targets (coverage
    # only: the fuzzer's own runtime comes with each target's link).
    file(GLOB_RECURSE KILN_FUZZ_LIB_SOURCES CONFIGURE_DEPENDS ${CMAKE_SOURCE_DIR}/src/*.c)
    add_library(kiln_fuzzlib STATIC ${KILN_FUZZ_LIB_SOURCES})
    target_compile_options(kiln_fuzzlib PRIVATE -fsanitize=fuzzer-no-link,address,undefined
      -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g -O1 -Wno-pass-failed)
    target_include_directories(kiln_fuzzlib PUBLIC ${CMAKE_SOURCE_DIR}/include
      PRIVATE ${CMAKE_SOURCE_DIR}/src ${OPENBLAS_INCLUDE_DIR} ${CJSON_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR} ${ISAL_INCLUDE_DIR})
    target_link_libraries(kiln_fuzzlib PUBLIC ${OPENBLAS_LIB} ${CJSON_LIB} ${XXHASH_LIB} ${ISAL_LIB}
      PkgConfig::PCRE2 OpenMP::OpenMP_C m)

    # kiln_fuzz_target(NAME SEEDGEN SEEDARG SECONDS MAXLEN DICT): fuzz_NAME.c against the
    # instrumented library, and the test fuzz.NAME: SEEDGEN SEEDARG writes the seeds, then
    # SECONDS of fuzzing from them with a fixed seed (DICT: a file of tokens beside this one, or
    # ""). The malloc limit (the rss limit, 2 GiB) makes an allocation far past what an input of
    # MAXLEN bytes can justify a failure.
    function(kiln_fuzz_target name seedgen seedarg seconds maxlen dict)
      add_executable(fuzz_${name} ${CMAKE_SOURCE_DIR}/tests/fuzz/fuzz_${name}.c)
      target_compile_options(fuzz_${name} PRIVATE ${KILN_FUZZ_FLAGS})
      target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined)
      target_include_directories(fuzz_${name} PRIVATE ${CMAKE_SOURCE_DIR}/src
        ${CJSON_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR})
      target_link_libraries(fuzz_${name} PRIVATE kiln_fuzzlib)
      set_target_properties(fuzz_${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
      set(work ${CMAKE_BINARY_DIR}/fuzz/${name})
      file(MAKE_DIRECTORY ${work})
      set(dictarg "")
      if(dict)
        set(dictarg "-dict=${CMAKE_SOURCE_DIR}/tests/fuzz/${dict}")
      endif()
      add_test(NAME fuzz.${name}
        COMMAND sh -c "rm -rf corpus seeds && mkdir corpus seeds && \"$0\" ${seedarg} seeds && \"$1\" -seed=1 -max_total_time=${seconds} -max_len=${maxlen} -timeout=10 -rss_limit_mb=2048 ${dictarg} -print_final_stats=1 corpus seeds"
          $<TARGET_FILE:${seedgen}> $<TARGET_FILE:fuzz_${name}>
        WORKING_DIRECTORY ${work})
      set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 180
        ENVIRONMENT "OMP_NUM_THREADS=1;OMP_WAIT_POLICY=passive")
    endfunction()

    add_executable(fuzz_seed_models ${CMAKE_SOURCE_DIR}/tests/fuzz/gen_model_seeds.c)
    target_link_libraries(fuzz_seed_models PRIVATE kiln)
    set_target_properties(fuzz_seed_models PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
    kiln_fuzz_target(quant fuzz_seed_models quant 25 65536 model.dict)
    kiln_fuzz_target(weights fuzz_seed_models weights 25 131072 model.dict)
    kiln_fuzz_target(config_json fuzz_seed_models config 20 4096 "")
    # The checkpoint's seeds come from the instrumented library, as the fuzzer's own run does:
    # the same bits, so that the seeds' checksums hold as written.
    add_executable(fuzz_seed_ckpt ${CMAKE_SOURCE_DIR}/tests/fuzz/gen_ckpt_seeds.c)
    target_link_libraries(fuzz_seed_ckpt PRIVATE kiln_fuzzlib)
    target_link_options(fuzz_seed_ckpt PRIVATE -fsanitize=address,undefined)
    target_include_directories(fuzz_seed_ckpt PRIVATE ${CMAKE_SOURCE_DIR}/src ${CJSON_INCLUDE_DIR})
    set_target_properties(fuzz_seed_ckpt PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
    kiln_fuzz_target(ckpt fuzz_seed_ckpt "" 30 98304 ckpt.dict)
    # kiln report's reader of metrics files and its plots, built from the tool's sources.
    add_executable(fuzz_seed_report ${CMAKE_SOURCE_DIR}/tests/fuzz/gen_report_seeds.c)
    set_target_properties(fuzz_seed_report PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/fuzz)
    kiln_fuzz_target(report fuzz_seed_report "" 25 8192 "")
    target_sources(fuzz_report PRIVATE ${CMAKE_SOURCE_DIR}/tools/kiln/report_runs.c
      ${CMAKE_SOURCE_DIR}/tools/kiln/report_plot.c ${CMAKE_SOURCE_DIR}/tools/kiln/report_svg.c)
    target_include_directories(fuzz_report PRIVATE ${CMAKE_SOURCE_DIR}/tools/kiln)
  endif()
endif()

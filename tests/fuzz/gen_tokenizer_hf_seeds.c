/* Seeds for fuzz_tokenizer_hf: each seed tokenizer.json (first byte 0: a file) and a few
 * texts (first byte 1), into the folder named by argv[1]. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hf_seeds.h"

static void put(const char *dir, const char *name, char kind, const char *s) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        perror(path);
        exit(1);
    }
    fputc(kind, f);
    fwrite(s, 1, strlen(s), f);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_tokenizer_hf_seeds DIR\n");
        return 2;
    }
    char *a = hf_seed_byte_level(), *b = hf_seed_sentencepiece();
    put(argv[1], "byte_level", 0, a);
    put(argv[1], "sentencepiece", 0, b);
    put(argv[1], "text1", 1,
        "Hello world, it's 12345 <t>\r\n\t x \xe4\xb8\xad\xe6\x96\x87 e\xcc\x81");
    put(argv[1], "text2", 1,
        "  \n\n the the a\xe2\x96\x81"
        "a \xff\xfe\xc3");
    free(a);
    free(b);
    return 0;
}

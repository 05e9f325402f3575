/* state.json's own checksum: the other files' checksums are in it, and it needs one of its
 * own, or a flipped digit in a loader position or a hash would be loaded (or refuse a good
 * run) without a word. The text carries "state_xxh3": the XXH3-64 of the whole text with
 * those 16 hex digits written as zeros. */
#include <stdio.h>
#include <string.h>
#include <xxhash.h>

#include "core/error.h"
#include "train/trainer_ckpt.h"

#define SEAL_KEY "\"state_xxh3\":"
#define SEAL_ZERO "0000000000000000"

/* The 16 digits of the key's string value (NULL: no key, or not a string of 16). */
static char *seal_digits(char *text, size_t len) {
    size_t klen = strlen(SEAL_KEY);
    for (size_t i = 0; i + klen <= len; i++) {
        if (text[i] != '"' || memcmp(text + i, SEAL_KEY, klen))
            continue;
        size_t d = i + klen;
        while (d < len && (text[d] == ' ' || text[d] == '\t'))
            d++;
        if (d + 18 <= len && text[d] == '"' && text[d + 17] == '"')
            return text + d + 1;
    }
    return NULL;
}

kiln_status kiln__ckpt_seal(char *text, size_t len) {
    char *d = seal_digits(text, len);
    if (!d || memcmp(d, SEAL_ZERO, 16))
        return kiln_error_setf(KILN_ERR_ARG, "state.json has no zeroed state_xxh3 to seal");
    char hex[17];
    snprintf(hex, sizeof hex, "%016llx", (unsigned long long)XXH3_64bits(text, len));
    memcpy(d, hex, 16);
    return KILN_OK;
}

kiln_status kiln__ckpt_check_seal(const char *path, char *text, size_t len) {
    char *d = seal_digits(text, len);
    if (!d)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s has no checksum of its own (state_xxh3)",
                               path);
    char got[17];
    memcpy(got, d, 16);
    got[16] = '\0';
    memcpy(d, SEAL_ZERO, 16);
    char want[17];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)XXH3_64bits(text, len));
    memcpy(d, got, 16);
    if (strcmp(got, want))
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s does not match its own checksum (state_xxh3 %s, the text "
                               "hashes to %s)",
                               path, got, want);
    return KILN_OK;
}

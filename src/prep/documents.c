/* The documents of kiln prepare's inputs, for other readers (kiln tokenizer train): the same
 * expansion, checks and reading as kiln_prepare's two passes (prepare_inputs.c). */
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "kiln/prepare.h"
#include "prep/prepare_internal.h"

struct kiln_documents {
    prep_inputs in;
    prep_reader rd;
    int file; /* the file being read: in.files[file] */
    int open; /* rd is open */
};

kiln_status kiln_documents_open(kiln_documents **out, const kiln_prepare_config *cfg) {
    if (!out || !cfg)
        return kiln_error_setf(KILN_ERR_ARG, "kiln_documents_open: no output or no config");
    *out = NULL;
    if (cfg->num_inputs < 0 || (cfg->num_inputs > 0 && !cfg->inputs))
        return kiln_error_setf(KILN_ERR_ARG, "kiln_documents_open: bad list of inputs");
    kiln_documents *d = calloc(1, sizeof *d);
    if (!d)
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory to read the inputs");
    kiln_status st = kiln__prep_inputs_collect(&d->in, cfg);
    if (st != KILN_OK) {
        free(d);
        return st;
    }
    *out = d;
    return KILN_OK;
}

int64_t kiln_documents_count(const kiln_documents *d) {
    return d ? d->in.docs : 0;
}

int64_t kiln_documents_bytes(const kiln_documents *d) {
    return d ? d->in.bytes_total : 0;
}

kiln_status kiln_documents_next(kiln_documents *d, const char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    while (d->file < d->in.n) {
        const prep_file *f = &d->in.files[d->file];
        if (f->skip) {
            d->file++;
            continue;
        }
        if (!d->open) {
            KILN_CHECK(kiln__prep_reader_open(&d->rd, f));
            d->open = 1;
        }
        KILN_CHECK(kiln__prep_reader_next(&d->rd, text, len));
        if (*text)
            return KILN_OK;
        kiln__prep_reader_close(&d->rd);
        d->open = 0;
        d->file++;
    }
    return KILN_OK;
}

void kiln_documents_close(kiln_documents *d) {
    if (!d)
        return;
    if (d->open)
        kiln__prep_reader_close(&d->rd);
    kiln__prep_inputs_free(&d->in);
    free(d);
}

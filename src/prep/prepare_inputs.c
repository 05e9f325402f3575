/* kiln prepare's inputs: expanding files and folders, the first pass that checks and counts
 * every document, the reader of the second pass, and where text may be cut. */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <cjson/cJSON.h>

#include "core/error.h"
#include "kiln/core.h"
#include "prep/prepare_internal.h"

enum { BINARY_PROBE = 64 * 1024 }; /* bytes looked at for a NUL */

void kiln__prep_note(const kiln_prepare_config *cfg, const char *fmt, ...) {
    if (!cfg->note)
        return;
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    cfg->note(cfg->ctx, line);
}

/* ---- where text may be cut ---- */

static int printable_ascii(unsigned char c) {
    return c >= 0x21 && c <= 0x7E;
}

/* GPT-2's pieces never join a non-space character to a following space, and a piece that
 * starts at a space matches the same way whatever came before (the pattern has no
 * look-behind). A newline between two printable characters is a piece of its own, whether
 * the text goes on or ends after it. So both cuts give the same pieces, hence ids. */
int kiln__prep_is_safe_cut(const char *text, size_t len, size_t i) {
    const unsigned char *t = (const unsigned char *)text;
    if (i == 0 || i >= len)
        return 0;
    if (t[i] == ' ' && printable_ascii(t[i - 1]))
        return 1;
    return i >= 2 && t[i - 1] == '\n' && printable_ascii(t[i - 2]) && printable_ascii(t[i]);
}

size_t kiln__prep_next_cut(const char *text, size_t len, size_t from) {
    for (size_t i = from; i < len; i++)
        if (kiln__prep_is_safe_cut(text, len, i))
            return i;
    return len;
}

/* ---- the list of files ---- */

static kiln_status add_file(prep_inputs *in, const char *path, prep_kind kind, int64_t size) {
    if (in->n == in->cap) {
        int cap = in->cap ? 2 * in->cap : 64;
        prep_file *f = realloc(in->files, (size_t)cap * sizeof *f);
        if (!f)
            return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the list of inputs");
        in->files = f;
        in->cap = cap;
    }
    prep_file *f = &in->files[in->n];
    memset(f, 0, sizeof *f);
    if (!(f->path = strdup(path)))
        return kiln_error_setf(KILN_ERR_NOMEM, "no memory for the list of inputs");
    f->kind = kind;
    f->size = size;
    in->n++;
    return KILN_OK;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The sorted names in folder d that pass keep() (NULL: every name not starting with '.'). */
static kiln_status list_folder(const char *d, int (*keep)(const char *), char ***names, int *n) {
    *names = NULL;
    *n = 0;
    DIR *dir = opendir(d);
    if (!dir)
        return kiln_error_setf(KILN_ERR_IO, "%s: cannot list the folder: %s", d, strerror(errno));
    int cap = 0;
    struct dirent *e;
    kiln_status st = KILN_OK;
    while ((e = readdir(dir)) != NULL) {
        if (keep ? !keep(e->d_name) : e->d_name[0] == '.')
            continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 64;
            char **p = realloc(*names, (size_t)cap * sizeof *p);
            if (!p) {
                st = kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory to list the folder", d);
                break;
            }
            *names = p;
        }
        if (!((*names)[*n] = strdup(e->d_name))) {
            st = kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory to list the folder", d);
            break;
        }
        (*n)++;
    }
    closedir(dir);
    if (*n > 1)
        qsort(*names, (size_t)*n, sizeof **names, cmp_name);
    return st;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

/* What a file that is neither a regular file nor a folder is, for messages. */
static const char *kind_of(mode_t m) {
    return S_ISFIFO(m)                ? "a FIFO (named pipe)"
           : S_ISCHR(m) || S_ISBLK(m) ? "a device"
           : S_ISSOCK(m)              ? "a socket"
                                      : "not a regular file";
}

/* A file or folder named as an input (depth 0) or found in an input folder. What cannot be
 * read as a file of text without waiting or without end (a FIFO, a device, a socket) is
 * refused when named and skipped with a note when found; so is the output folder. */
static kiln_status add_path(prep_inputs *in, const kiln_prepare_config *cfg, const char *path,
                            int depth) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return kiln_error_setf(errno == ENOENT ? KILN_ERR_NOT_FOUND : KILN_ERR_IO, "%s: %s", path,
                               strerror(errno));
    if (S_ISREG(sb.st_mode))
        return add_file(in, path, ends_with(path, ".jsonl") ? PREP_JSONL : PREP_TEXT,
                        (int64_t)sb.st_size);
    if (!S_ISDIR(sb.st_mode)) {
        if (depth == 0)
            return kiln_error_setf(KILN_ERR_ARG,
                                   "%s is %s: inputs are text files, folders and .jsonl files",
                                   path, kind_of(sb.st_mode));
        kiln__prep_note(cfg, "note: skipping %s: it is %s, not a file of text", path,
                        kind_of(sb.st_mode));
        return KILN_OK;
    }
    if (in->has_out_dir && sb.st_dev == in->out_dev && sb.st_ino == in->out_ino) {
        if (depth == 0)
            return kiln_error_setf(KILN_ERR_ARG,
                                   "%s is the output folder (--out %s); it cannot also be an input",
                                   path, cfg->out_dir);
        kiln__prep_note(cfg, "note: skipping %s: it is the output folder", path);
        return KILN_OK;
    }
    if (depth > 64)
        return kiln_error_setf(KILN_ERR_ARG, "%s: folders nested too deep (a link loop?)", path);
    char **names;
    int n;
    KILN_CHECK(list_folder(path, NULL, &names, &n));
    kiln_status st = KILN_OK;
    for (int i = 0; i < n && st == KILN_OK; i++) {
        size_t len = strlen(path) + strlen(names[i]) + 2;
        char *child = malloc(len);
        if (!child) {
            st = kiln_error_setf(KILN_ERR_NOMEM, "no memory for the list of inputs");
            break;
        }
        snprintf(child, len, "%s/%s", path, names[i]);
        st = add_path(in, cfg, child, depth + 1);
        free(child);
    }
    free_names(names, n);
    return st;
}

static int is_brown_name(const char *s) {
    return strlen(s) == 4 && s[0] == 'c' && s[1] >= 'a' && s[1] <= 'r' && s[2] >= '0' &&
           s[2] <= '9' && s[3] >= '0' && s[3] <= '9';
}

static kiln_status add_brown(prep_inputs *in, const char *d) {
    char **names;
    int n;
    KILN_CHECK(list_folder(d, is_brown_name, &names, &n));
    kiln_status st =
        n ? KILN_OK
          : kiln_error_setf(KILN_ERR_NOT_FOUND, "%s: no Brown corpus files (ca01..cr09)", d);
    for (int i = 0; i < n && st == KILN_OK; i++) {
        char p[4200];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", d, names[i]);
        st = stat(p, &sb) == 0 ? add_file(in, p, PREP_BROWN, (int64_t)sb.st_size)
                               : kiln_error_setf(KILN_ERR_IO, "%s: %s", p, strerror(errno));
    }
    free_names(names, n);
    return st;
}

/* ---- the first pass ---- */

/* A file that was listed and is gone when read: an input that changed under prepare. */
static kiln_status vanished(kiln_status st, const char *path) {
    if (st != KILN_ERR_NOT_FOUND)
        return st;
    return kiln_error_wrapf(KILN_ERR_IO, "%s was listed as an input but is gone now", path);
}

/* kiln_file_open_regular for a file that add_path listed. */
static kiln_status open_listed(const char *path, int *fd, uint64_t *size) {
    return vanished(kiln_file_open_regular(path, fd, size), path);
}

/* Offset of the first NUL in the first BINARY_PROBE bytes, or -1. */
static kiln_status probe_binary(const char *path, int64_t *nul_at) {
    *nul_at = -1;
    int fd;
    KILN_CHECK(open_listed(path, &fd, NULL));
    static _Thread_local char buf[BINARY_PROBE];
    size_t n = 0;
    while (n < sizeof buf) {
        ssize_t k = read(fd, buf + n, sizeof buf - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            kiln_status st =
                kiln_error_setf(KILN_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
            close(fd);
            return st;
        }
        if (k == 0)
            break;
        n += (size_t)k;
    }
    close(fd);
    const char *z = memchr(buf, 0, n);
    if (z)
        *nul_at = z - buf;
    return KILN_OK;
}

/* A regular file (kiln_file_open_regular's rules: never a FIFO or device) as a stream. */
static kiln_status open_stream(const char *path, FILE **f) {
    int fd;
    KILN_CHECK(open_listed(path, &fd, NULL));
    *f = fdopen(fd, "rb");
    if (!*f) {
        kiln_status st = kiln_error_setf(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        close(fd);
        return st;
    }
    return KILN_OK;
}

/* Column (from 1) of the first "\u0000" escape in a line that parsed as JSON, or 0. A NUL
 * character would end the C string cJSON gives back: the text would be cut there. */
static size_t nul_escape_column(const char *line, size_t len) {
    for (size_t i = 0; i + 1 < len; i++) {
        if (line[i] != '\\')
            continue;
        if (line[i + 1] == 'u' && i + 6 <= len && !memcmp(line + i + 2, "0000", 4))
            return i + 1;
        i++; /* the escaped character */
    }
    return 0;
}

/* Parse JSON Lines line (len bytes, NUL-terminated): *text is its "text" string, or an
 * error naming where:line_no and what is wrong. */
static kiln_status parse_line(const char *line, size_t len, const char *where, int64_t line_no,
                              cJSON **json, const char **text) {
    *json = NULL;
    *text = NULL;
    const char *z = memchr(line, 0, len);
    if (z)
        return kiln_error_setf(KILN_ERR_FORMAT, "%s:%lld: a NUL byte at column %lld", where,
                               (long long)line_no, (long long)(z - line + 1));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(line, len + 1, &end, 1);
    if (!j) {
        long long col = end && end >= line && end <= line + len ? (long long)(end - line + 1) : 0;
        return kiln_error_setf(KILN_ERR_FORMAT, "%s:%lld: not valid JSON (at column %lld)", where,
                               (long long)line_no, col);
    }
    size_t nul_col = nul_escape_column(line, len);
    if (nul_col) {
        cJSON_Delete(j);
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s:%lld: a \\u0000 (NUL character) at column %zu: kiln reads text "
                               "and will not cut a string at it; remove it from the line",
                               where, (long long)line_no, nul_col);
    }
    const cJSON *t = cJSON_IsObject(j) ? cJSON_GetObjectItemCaseSensitive(j, "text") : NULL;
    if (!cJSON_IsObject(j) || !t || !cJSON_IsString(t)) {
        cJSON_Delete(j);
        return kiln_error_setf(KILN_ERR_FORMAT, "%s:%lld: %s", where, (long long)line_no,
                               !cJSON_IsObject(j) ? "not a JSON object"
                               : !t               ? "the object has no \"text\" field"
                                                  : "\"text\" is not a string");
    }
    *json = j;
    *text = t->valuestring;
    return KILN_OK;
}

static int blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return 0;
    return 1;
}

/* Read one line (without its newline) into r->line; 0 at the end of the file. */
static int read_line(prep_reader *r, size_t *len) {
    ssize_t n = getline(&r->line, &r->line_cap, r->f);
    if (n < 0)
        return 0;
    r->line_no++;
    r->bytes_read += n;
    if (n > 0 && r->line[n - 1] == '\n')
        r->line[--n] = '\0';
    *len = (size_t)n;
    return 1;
}

static kiln_status scan_jsonl(prep_inputs *in, prep_file *file) {
    prep_reader r = {.file = file};
    KILN_CHECK(open_stream(file->path, &r.f));
    kiln_status st = KILN_OK;
    size_t len;
    while (st == KILN_OK && read_line(&r, &len)) {
        if (blank(r.line, len))
            continue;
        cJSON *j;
        const char *text;
        st = parse_line(r.line, len, file->path, r.line_no, &j, &text);
        if (st == KILN_OK && text[0] == '\0')
            in->empty++;
        else if (st == KILN_OK) {
            file->docs++;
            file->text += (int64_t)strlen(text);
        }
        cJSON_Delete(j);
    }
    if (st == KILN_OK && ferror(r.f))
        st = kiln_error_setf(KILN_ERR_IO, "%s: read error after line %lld: %s", file->path,
                             (long long)r.line_no, strerror(errno));
    fclose(r.f);
    free(r.line);
    return st;
}

/* The text bytes of a Brown corpus file, its tags stripped (for the shard count's bound). */
static kiln_status brown_text_bytes(prep_file *f) {
    char *raw = NULL, *txt = NULL;
    size_t n = 0, len = 0;
    KILN_CHECK(vanished(kiln_file_read(f->path, 0, &raw, &n), f->path));
    kiln_status st = kiln_prepare_brown_text(raw, n, &txt, &len);
    free(raw);
    free(txt);
    if (st != KILN_OK)
        return kiln_error_wrapf(st, "%s", f->path);
    f->text = (int64_t)len;
    return KILN_OK;
}

static kiln_status scan_file(prep_inputs *in, prep_file *f, const kiln_prepare_config *cfg) {
    if (f->size == 0) {
        kiln__prep_note(cfg, "note: skipping empty file %s", f->path);
        in->empty++;
        f->skip = 1;
        return KILN_OK;
    }
    if (f->kind == PREP_JSONL)
        return scan_jsonl(in, f);
    f->docs = 1;
    if (f->kind == PREP_BROWN)
        return brown_text_bytes(f);
    f->text = f->size;
    int64_t nul_at;
    KILN_CHECK(probe_binary(f->path, &nul_at));
    if (nul_at < 0)
        return KILN_OK;
    in->binary++;
    switch (cfg->binary) {
    case KILN_PREPARE_BINARY_SKIP:
        kiln__prep_note(cfg, "note: skipping binary file %s (a NUL byte at offset %lld)", f->path,
                        (long long)nul_at);
        f->skip = 1;
        f->docs = 0;
        f->text = 0;
        return KILN_OK;
    case KILN_PREPARE_BINARY_ENCODE:
        kiln__prep_note(cfg,
                        "warning: %s looks binary (a NUL byte at offset %lld); encoding its bytes",
                        f->path, (long long)nul_at);
        return KILN_OK;
    default:
        return kiln_error_setf(KILN_ERR_FORMAT,
                               "%s looks binary (a NUL byte at offset %lld): kiln prepare reads "
                               "text; remove it from the inputs, or pass --binary skip or "
                               "--binary encode",
                               f->path, (long long)nul_at);
    }
}

static uint64_t doc_hash(uint64_t seed, int64_t i) {
    uint64_t le = (uint64_t)i;
    return XXH3_64bits_withSeed(&le, sizeof le, seed);
}

int kiln__prep_doc_is_val(const prep_inputs *in, uint64_t seed, int64_t i) {
    if (i == in->forced_val)
        return 1;
    if (i == in->forced_train)
        return 0;
    return doc_hash(seed, i) < in->val_threshold;
}

/* Decide the split over in->docs documents (see kiln/prepare.h). */
static void plan_split(prep_inputs *in, const kiln_prepare_config *cfg) {
    double x = cfg->val_fraction * 18446744073709551616.0;
    in->val_threshold = x <= 0 ? 0 : x >= 18446744073709551615.0 ? UINT64_MAX : (uint64_t)x;
    in->forced_val = in->forced_train = -1;
    if (in->val_threshold == 0 || in->docs < 2)
        return;
    int64_t nval = 0, lo = 0, hi = 0;
    uint64_t lo_h = UINT64_MAX, hi_h = 0;
    for (int64_t i = 0; i < in->docs; i++) {
        uint64_t h = doc_hash(cfg->seed, i);
        nval += h < in->val_threshold;
        if (h <= lo_h)
            lo_h = h, lo = i;
        if (h >= hi_h)
            hi_h = h, hi = i;
    }
    if (nval == 0)
        in->forced_val = lo;
    else if (nval == in->docs)
        in->forced_train = hi;
}

kiln_status kiln__prep_inputs_collect(prep_inputs *in, const kiln_prepare_config *cfg) {
    memset(in, 0, sizeof *in);
    struct stat out_sb;
    if (cfg->out_dir && stat(cfg->out_dir, &out_sb) == 0 && S_ISDIR(out_sb.st_mode)) {
        in->has_out_dir = 1;
        in->out_dev = out_sb.st_dev;
        in->out_ino = out_sb.st_ino;
    }
    kiln_status st = KILN_OK;
    if (cfg->num_inputs == 0) {
        if (!cfg->corpus_dir)
            return kiln_error_setf(KILN_ERR_ARG, "no inputs and no Brown corpus folder given");
        st = add_brown(in, cfg->corpus_dir);
    }
    for (int i = 0; i < cfg->num_inputs && st == KILN_OK; i++)
        st = add_path(in, cfg, cfg->inputs[i], 0);
    for (int i = 0; i < in->n && st == KILN_OK; i++) {
        st = scan_file(in, &in->files[i], cfg);
        if (st == KILN_OK && !in->files[i].skip) {
            in->docs += in->files[i].docs;
            in->bytes_total += in->files[i].size;
        }
    }
    if (st == KILN_OK && in->n == 0)
        st = kiln_error_setf(KILN_ERR_NOT_FOUND, "the inputs hold no files");
    if (st == KILN_OK && in->docs == 0)
        st = kiln_error_setf(KILN_ERR_FORMAT,
                             "the inputs hold no text: %d file%s, every one empty or skipped",
                             in->n, in->n == 1 ? "" : "s");
    if (st != KILN_OK) {
        kiln__prep_inputs_free(in);
        return st;
    }
    plan_split(in, cfg);
    return KILN_OK;
}

void kiln__prep_inputs_free(prep_inputs *in) {
    for (int i = 0; i < in->n; i++)
        free(in->files[i].path);
    free(in->files);
    memset(in, 0, sizeof *in);
}

/* ---- the second pass ---- */

kiln_status kiln__prep_reader_open(prep_reader *r, const prep_file *file) {
    memset(r, 0, sizeof *r);
    r->file = file;
    r->fd = -1;
    if (file->kind != PREP_JSONL)
        return KILN_OK;
    return open_stream(file->path, &r->f);
}

/* The file changed size since the first pass listed it (was: its size then). */
static kiln_status changed(const char *path, int64_t was, long long now, const char *when) {
    return kiln_error_setf(KILN_ERR_IO,
                           "%s was %lld bytes when kiln prepare listed it and is %lld bytes %s: "
                           "it changed while kiln prepare ran (truncated or rewritten); nothing "
                           "was written",
                           path, (long long)was, now, when);
}

/* A text file's bytes, read whole into r->text: a short read, or a size other than the
 * first pass's, is an error naming the file and both sizes. The descriptor stays open for
 * the check at the end (end_text). */
static kiln_status read_text(prep_reader *r) {
    const char *path = r->file->path;
    uint64_t size;
    KILN_CHECK(open_listed(path, &r->fd, &size));
    if (size != (uint64_t)r->file->size)
        return changed(path, r->file->size, (long long)size, "now");
    if (size >= (uint64_t)SIZE_MAX)
        return kiln_error_setf(KILN_ERR_NOMEM, "%s: %llu bytes cannot be read into memory", path,
                               (unsigned long long)size);
    if (!(r->text = malloc((size_t)size + 1)))
        return kiln_error_setf(KILN_ERR_NOMEM, "%s: no memory for its %llu bytes", path,
                               (unsigned long long)size);
    size_t done = 0;
    while (done < (size_t)size) {
        ssize_t k = pread(r->fd, r->text + done, (size_t)size - done, (off_t)done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return kiln_error_setf(KILN_ERR_IO, "%s: cannot read at byte %zu: %s", path, done,
                                   strerror(errno));
        if (k == 0) {
            struct stat sb;
            return changed(path, r->file->size, fstat(r->fd, &sb) == 0 ? (long long)sb.st_size : -1,
                           "now (reading stopped short at that point)");
        }
        done += (size_t)k;
    }
    r->text_len = done;
    r->bytes_read = (int64_t)done;
    return KILN_OK;
}

/* After a text file's document was used: the file has the size it was read at, else the
 * ids just made may not be of the file as it is (and a mapping would have died here). */
static kiln_status end_text(prep_reader *r) {
    struct stat sb;
    if (r->fd < 0)
        return KILN_OK;
    kiln_status st = KILN_OK;
    if (fstat(r->fd, &sb) == 0 && (uint64_t)sb.st_size != (uint64_t)r->file->size)
        st = changed(r->file->path, r->file->size, (long long)sb.st_size, "now");
    close(r->fd);
    r->fd = -1;
    return st;
}

static void drop_document(prep_reader *r) {
    cJSON_Delete(r->json);
    r->json = NULL;
    free(r->owned);
    r->owned = NULL;
    free(r->text);
    r->text = NULL;
    r->text_len = 0;
}

kiln_status kiln__prep_reader_next(prep_reader *r, const char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    drop_document(r);
    if (r->done)
        return end_text(r);
    if (r->file->kind == PREP_TEXT) {
        r->done = 1;
        KILN_CHECK(read_text(r));
        *text = r->text;
        *len = r->text_len;
        return KILN_OK;
    }
    if (r->file->kind == PREP_BROWN) {
        r->done = 1;
        char *raw = NULL;
        size_t n = 0;
        KILN_CHECK(vanished(kiln_file_read(r->file->path, 0, &raw, &n), r->file->path));
        r->bytes_read = (int64_t)n;
        kiln_status st = kiln_prepare_brown_text(raw, n, &r->owned, &r->owned_len);
        free(raw);
        if (st != KILN_OK)
            return kiln_error_wrapf(st, "%s", r->file->path);
        *text = r->owned;
        *len = r->owned_len;
        return KILN_OK;
    }
    size_t n;
    while (read_line(r, &n)) {
        if (blank(r->line, n))
            continue;
        cJSON *j;
        const char *t;
        KILN_CHECK(parse_line(r->line, n, r->file->path, r->line_no, &j, &t));
        if (t[0] == '\0') {
            cJSON_Delete(j);
            continue;
        }
        r->json = j;
        *text = t;
        *len = strlen(t);
        return KILN_OK;
    }
    r->done = 1;
    if (ferror(r->f))
        return kiln_error_setf(KILN_ERR_IO, "%s: read error after line %lld: %s", r->file->path,
                               (long long)r->line_no, strerror(errno));
    struct stat sb; /* the lines read were all the file's */
    if (fstat(fileno(r->f), &sb) == 0 && (uint64_t)sb.st_size != (uint64_t)r->file->size)
        return changed(r->file->path, r->file->size, (long long)sb.st_size, "now");
    return KILN_OK;
}

void kiln__prep_reader_close(prep_reader *r) {
    if (r->f)
        fclose(r->f);
    if (r->fd >= 0)
        close(r->fd);
    free(r->line);
    drop_document(r);
    memset(r, 0, sizeof *r);
    r->fd = -1;
}

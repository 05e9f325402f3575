/* TensorBoard event files (src/train/tfevents.c): CRC32C against its published check value,
 * and a written file read back record by record (framing, both masked CRCs, the Event's
 * step, file_version and each scalar's tag and value), parsed here independently of the
 * writer. tests/cli/test_tensorboard.sh decodes a training's file with Python's crc32c and
 * protobuf. */
#include <dirent.h>
#include <stdint.h>
#include <unistd.h>

#include "test.h"
#include "train/tfevents.h"

static uint64_t rd64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

static uint32_t rd32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t varint(const unsigned char **p, const unsigned char *end) {
    uint64_t v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        unsigned char c = *(*p)++;
        v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80))
            break;
    }
    return v;
}

/* What one Event holds, from its bytes. */
typedef struct event {
    int64_t step;
    char version[32];
    int nvalues;
    char tags[16][32];
    float values[16];
} event;

static void parse_summary_value(const unsigned char *p, const unsigned char *end, event *e) {
    int i = e->nvalues++;
    while (p < end) {
        uint64_t k = varint(&p, end);
        if (k == (1 << 3 | 2)) {
            uint64_t n = varint(&p, end);
            snprintf(e->tags[i], sizeof e->tags[i], "%.*s", (int)n, (const char *)p);
            p += n;
        } else if (k == (2 << 3 | 5)) {
            uint32_t bits = rd32(p);
            memcpy(&e->values[i], &bits, 4);
            p += 4;
        } else {
            return;
        }
    }
}

static void parse_event(const unsigned char *p, const unsigned char *end, event *e) {
    memset(e, 0, sizeof *e);
    while (p < end) {
        uint64_t k = varint(&p, end);
        if (k == (1 << 3 | 1)) {
            p += 8;
        } else if (k == (2 << 3 | 0)) {
            e->step = (int64_t)varint(&p, end);
        } else if (k == (3 << 3 | 2)) {
            uint64_t n = varint(&p, end);
            snprintf(e->version, sizeof e->version, "%.*s", (int)n, (const char *)p);
            p += n;
        } else if (k == (5 << 3 | 2)) {
            uint64_t n = varint(&p, end);
            const unsigned char *s = p, *se = p + n;
            while (s < se && e->nvalues < 16) {
                uint64_t vk = varint(&s, se);
                uint64_t vn = varint(&s, se);
                if (vk == (1 << 3 | 2))
                    parse_summary_value(s, s + vn, e);
                s += vn;
            }
            p = se;
        } else {
            return;
        }
    }
}

static void test_crc(void) {
    CHECK_INT_EQ(kiln__crc32c("123456789", 9), 0xE3069283u);
    CHECK_INT_EQ(kiln__crc32c("", 0), 0u);
    uint32_t c = kiln__crc32c("123456789", 9);
    CHECK_INT_EQ(kiln__crc32c_masked("123456789", 9), ((c >> 15) | (c << 17)) + 0xa282ead8u);
}

static void test_file(void) {
    char dir[] = "/tmp/kiln-tfevents-XXXXXX";
    CHECK_TRUE(mkdtemp(dir) != NULL);
    char sub[128];
    snprintf(sub, sizeof sub, "%s/tb/run", dir);
    kiln__tfevents *w = NULL;
    CHECK_OK(kiln__tfevents_open(&w, sub));
    const char *tags[3] = {"train/loss", "train/lr", "val/loss"};
    double v1[3] = {5.25, 1e-3, NAN}, v2[3] = {4.5, 2e-3, 4.75};
    kiln__tfevents_scalars(w, 1, tags, v1, 3, NULL);
    kiln__tfevents_scalars(w, 2, tags, v2, 3, NULL);
    char path[4096];
    snprintf(path, sizeof path, "%s", kiln__tfevents_path(w));
    CHECK_TRUE(strstr(path, "/tb/run/events.out.tfevents.") != NULL);
    kiln__tfevents_close(w);
    FILE *f = fopen(path, "rb");
    CHECK_TRUE(f != NULL);
    if (!f)
        return;
    unsigned char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    event ev[4];
    int count = 0;
    for (size_t at = 0; at + 12 <= n && count < 4;) {
        uint64_t len = rd64(buf + at);
        CHECK_INT_EQ(rd32(buf + at + 8), kiln__crc32c_masked(buf + at, 8));
        CHECK_TRUE(at + 16 + len <= n);
        if (at + 16 + len > n)
            break;
        CHECK_INT_EQ(rd32(buf + at + 12 + len), kiln__crc32c_masked(buf + at + 12, len));
        parse_event(buf + at + 12, buf + at + 12 + len, &ev[count++]);
        at += 16 + len;
        if (at == n)
            break;
    }
    CHECK_INT_EQ(count, 3);
    CHECK_STR_EQ(ev[0].version, "brain.Event:2");
    CHECK_INT_EQ(ev[1].step, 1);
    CHECK_INT_EQ(ev[1].nvalues, 2); /* the NaN is left out */
    CHECK_STR_EQ(ev[1].tags[0], "train/loss");
    CHECK_TRUE(ev[1].values[0] == 5.25f);
    CHECK_STR_EQ(ev[1].tags[1], "train/lr");
    CHECK_TRUE(ev[1].values[1] == 1e-3f);
    CHECK_INT_EQ(ev[2].step, 2);
    CHECK_INT_EQ(ev[2].nvalues, 3);
    CHECK_STR_EQ(ev[2].tags[2], "val/loss");
    CHECK_TRUE(ev[2].values[2] == 4.75f);
    unlink(path);
    /* a folder that cannot be made: a clear error */
    char file[160];
    snprintf(file, sizeof file, "%s/afile", dir);
    FILE *af = fopen(file, "w");
    if (af)
        fclose(af);
    char under[200];
    snprintf(under, sizeof under, "%s/x", file);
    CHECK_STATUS(kiln__tfevents_open(&w, under), KILN_ERR_IO);
    CHECK_TRUE(strstr(kiln_error_message(), "is not a folder") != NULL);
    CHECK_TRUE(w == NULL);
    unlink(file);
    snprintf(sub, sizeof sub, "%s/tb/run", dir);
    rmdir(sub);
    snprintf(sub, sizeof sub, "%s/tb", dir);
    rmdir(sub);
    rmdir(dir);
}

int main(void) {
    RUN_TEST(test_crc);
    RUN_TEST(test_file);
    TEST_MAIN_END();
}

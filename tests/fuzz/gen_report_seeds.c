/* Seeds for fuzz_report: metrics files as kiln train writes them (steps with validation and
 * fp16 fields, events of each kind, a restart that goes back, a cut last line). */
#include <stdio.h>

static const char *const seeds[] = {
    "{\"step\": 1, \"loss\": 5.5, \"lr\": 3e-05, \"grad_norm\": 2.7, \"ms\": 0.5, "
    "\"tokens_per_s\": "
    "112608.4, \"mfu\": 0.089, \"peak_rss_mb\": 102.7, \"elapsed_s\": 0.001}\n"
    "{\"step\": 2, \"loss\": 5.4, \"lr\": 6e-05, \"grad_norm\": 2.6, \"ms\": 0.4, \"val_loss\": "
    "5.3, "
    "\"elapsed_s\": 0.002}\n",
    "{\"step\": 1, \"loss\": 5.0, \"ms\": 100.0, \"skipped\": 1, \"loss_scale\": 65536, "
    "\"elapsed_s\": 0.1}\n{\"event\": \"skip\", \"step\": 2, \"guard\": \"loss\", \"z\": 9.1}\n"
    "{\"step\": 2, \"loss\": 4.9, \"ms\": 100.0, \"loss_scale\": 32768, \"comm_ms\": 3.5, "
    "\"comm_hidden\": 0.8, \"world\": 2}\n{\"event\": \"straggler\", \"step\": 2, \"rank\": 1}\n"
    "{\"event\": \"straggler_end\", \"step\": 3, \"rank\": 1}\n{\"event\": \"rank_batches\", "
    "\"step\": 3, \"batches\": [2, 1]}\n",
    "{\"step\": 5, \"loss\": 3.0, \"grad_norm\": 1e-9}\n{\"step\": 3, \"loss\": 3.1, "
    "\"grad_norm\": "
    "1e6}\n{\"event\": \"rollback\", \"step\": 4}\n{\"step\": 2, \"loss\": 3.2}\n{\"step\": 9, "
    "\"lo",
    "{\"step\": 1, \"loss\": 1e308, \"lr\": -1, \"future\": {\"a\": [1, 2]}}\n"
    "{\"event\": \"new_kind\", \"note\": \"x\"}\nnot json\n\n{\"step\": 1.5}\n",
};

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s SEED_FOLDER\n", argv[0]);
        return 2;
    }
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/seed_%zu.jsonl", argv[1], i);
        FILE *f = fopen(path, "wb");
        if (!f || fputs(seeds[i], f) < 0 || fclose(f)) {
            perror(path);
            return 1;
        }
    }
    return 0;
}

/* How the kiln command ends a job the library reports lost: the library reports (a status, a
 * callback) and never exits; these handlers end the process with kiln's exit statuses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kiln/comm.h"
#include "tool_common.h"

/* kiln_comm_abort: the other ranks ended (MPI_Abort ends this one too), then this process. */
static void abort_job(kiln_comm *c, int code, const char *msg, void *user) {
    (void)msg;
    (void)user;
    kiln_comm_abort_job(c, code);
    exit(code);
}

void tool_exit_handlers_install(void) {
    kiln_comm_set_abort_handler(abort_job, NULL);
}

/* On the watchdog's thread, while the training thread is stuck inside a step: write(2), no
 * stdio lock, and _exit, no atexit handlers; under mpirun the launcher ends the other ranks. */
void tool_watchdog_hung(const kiln_watchdog_hang *h, void *user) {
    (void)user;
    char line[640];
    int n = snprintf(line, sizeof line, "%s; exiting with status %d\n", h->message,
                     TOOL_EXIT_HUNG);
    if (n > 0) {
        ssize_t w = write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)w;
    }
    _exit(TOOL_EXIT_HUNG);
}

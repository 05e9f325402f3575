/* Collectives through memory the ranks of one machine share (kiln/comm.h,
 * kiln_comm_alloc_shared): MPI shared-memory windows over the node's ranks, and the in-place
 * allreduce, reduce-scatter and allgather of buffers inside them, which read the other
 * ranks' buffers directly instead of sending their bytes as MPI messages.
 *
 * One collective, n ranks, S bytes, rank r owning piece r (S/n, edges on 16 elements):
 *   entry    one 5-integer MPI_Allreduce: a barrier (every rank's buffer is final), and the
 *            check that every rank passed the same offset into the same kind of memory with
 *            the same count and layout; where not, every rank falls back to MPI's own
 *   reduce   (allreduce, reduce-scatter) rank r adds piece r of every rank's buffer, in rank
 *            order, into its own piece r: S of reads, S/n of writes
 *   copy     (allreduce, allgather) after a barrier, rank r copies each other piece q from
 *            rank q's buffer
 *   exit     a barrier: no rank writes its buffer again while another may still read it
 * Against a ring over MPI's shared-memory transport (a copy into a staging buffer for each
 * piece received, then the add), each byte is read and written fewer times, and no rank
 * waits on a message in flight. Memory ordering: MPI_Win_sync around each barrier, inside
 * a passive-target epoch (MPI_Win_lock_all) that lasts as long as the window.
 *
 * Ranks on N machines of L ranks each (rank n L + l: local rank l of machine n): windows
 * over each machine's ranks, the entry's agreement over all, and between the machines MPI
 * over the rail of local index l (the ranks n' L + l, for every n'):
 *   allreduce       rank l reduces piece l (S/L) over its machine, allreduces it over its
 *                   rail, then copies the other pieces from its machine's ranks
 *   reduce-scatter  rank l sums, over its machine, the pieces of its rail's ranks into a
 *                   scratch buffer, and MPI's reduce-scatter over the rail gives its own
 *   allgather       machine n's pieces are a block cut in L parts: rank l gathers part l of
 *                   its own block from the owners, MPI's allgather over the rail brings
 *                   part l of every other block, and the other parts come from its machine
 * so what leaves each machine is no more than what one rank of a flat ring sends, and it
 * leaves through L rails at once, in 2(N-1) steps of the rails' rings instead of 2(NL-1).
 *
 * A common window (kiln_comm_alloc_common) is one buffer for the machine, rank 0's part,
 * that every rank maps: each rank writes the pieces it owns, and the in-place allgather of
 * it is the entry and exit alone (nothing to copy: every piece is everyone's already).
 * Reductions of it are refused: every rank would add the same memory. */
#ifdef KILN_HAVE_MPI

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "dist/comm_shm.h"

/* Buffers below this are never worth the barriers (and every rank agrees on it from the
 * count alone, which the collectives' contract makes the same everywhere). */
#define SHM_MIN_BYTES ((size_t)64 << 10)
#define SHM_ALIGN 16   /* elements: piece edges */
#define SHM_CHUNK 2048 /* elements reduced at a time in a buffer that stays in L1 */
#define REDUCE_COMMON                                                                          \
    "a reduction of the buffer every rank shares as one (each would add the same memory)"

typedef struct shm_win {
    MPI_Win win;
    char *base; /* this rank's part (common: the one buffer, rank 0's part) */
    size_t bytes;
    char **peer;  /* every rank's part, in this process's mapping */
    int released; /* given back: freed at the next collective point (below) */
    int common;   /* one buffer for every rank (rank 0's part); peer[] unused */
    struct shm_win *next;
} shm_win;

static uint64_t shm_runs; /* collectives run through shared memory (tests read it) */

uint64_t kiln__comm_shm_runs(void) {
    return shm_runs;
}

struct kiln__shm {
    MPI_Comm comm; /* the communicator's (not owned): the entry's agreement over machines */
    MPI_Comm node; /* this machine's ranks, in the communicator's order */
    MPI_Comm rail; /* machines > 1: the ranks of this one's local index on every machine, in
                      machine order; else MPI_COMM_NULL */
    int rank, size;     /* on this machine: local index l and ranks per machine L */
    int nodes, node_id; /* machines N and this one's index n: global rank n * L + l */
    int grank, gsize;   /* in the communicator: n * L + l and N * L */
    shm_win *wins;
    void *scratch; /* machines > 1: a reduce-scatter's sums of this machine's ranks */
    size_t scratch_bytes;
    uint64_t net_bytes; /* the last collective run here: what this rank sent over the rail */
};

uint64_t kiln__shm_net_bytes(const kiln__shm *s) {
    return s ? s->net_bytes : 0;
}

static kiln_status shm_fail(int err, const char *call) {
    char what[96];
    snprintf(what, sizeof what, "shared memory: %s", call);
    return kiln__comm_mpi_fail(err, what, NULL);
}

/* KILN_COMM_NODE_RANKS=L groups the ranks in machines of L consecutive ranks, whatever
 * machines they run on (tests, and "hosts" that are namespaces of one machine): 0 when not
 * set, -1 when not a count. */
static int node_ranks_env(void) {
    const char *env = getenv("KILN_COMM_NODE_RANKS");
    if (!env || !*env)
        return 0;
    char *end;
    long v = strtol(env, &end, 10);
    return *end || v < 1 || v > 1 << 20 ? -1 : (int)v;
}

kiln_status kiln__shm_create(MPI_Comm comm, kiln__shm **out) {
    *out = NULL;
    const char *env = getenv("KILN_COMM_SHM");
    int size = 1, rank = 0, nsize = 0, nrank = 0, e;
    MPI_Comm_size(comm, &size);
    MPI_Comm_rank(comm, &rank);
    int grouped = node_ranks_env();
    if (grouped < 0)
        return kiln_error_setf(KILN_ERR_CONFIG, "KILN_COMM_NODE_RANKS=%s: not a count of ranks "
                                                "per machine (1 or more)",
                               getenv("KILN_COMM_NODE_RANKS"));
    /* every rank reads the same environment from mpirun, and the split below is collective
     * on all of them; a rank that opted out alone would still take part in it */
    int off = size < 2 || (env && !strcmp(env, "0"));
    MPI_Comm node;
    e = grouped ? MPI_Comm_split(comm, rank / grouped, rank, &node)
                : MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    if (e != MPI_SUCCESS)
        return shm_fail(e, grouped ? "MPI_Comm_split" : "MPI_Comm_split_type");
    MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
    MPI_Comm_size(node, &nsize);
    MPI_Comm_rank(node, &nrank); /* key 0 (or the rank): the communicator's order */
    /* Machines of L ranks each, L >= 2, rank n * L + l being local rank l of machine n (what
     * mpirun's default mapping gives): else nothing is shared. The opt-out agreed, so that
     * no rank is left alone in a window call. */
    int v[4] = {off || nsize < 2 || nrank != rank % nsize, nsize, -nsize, 0}, m[4];
    e = MPI_Allreduce(v, m, 3, MPI_INT, MPI_MAX, comm);
    int first = rank - nrank, lo = first, hi = first; /* the machine's ranks: consecutive */
    if (e == MPI_SUCCESS && !m[0] && m[1] == -m[2]) {
        e = MPI_Allreduce(&first, &lo, 1, MPI_INT, MPI_MIN, node);
        if (e == MPI_SUCCESS)
            e = MPI_Allreduce(&first, &hi, 1, MPI_INT, MPI_MAX, node);
        v[3] = lo != hi;
        if (e == MPI_SUCCESS)
            e = MPI_Allreduce(&v[3], &m[3], 1, MPI_INT, MPI_MAX, comm);
    }
    if (e != MPI_SUCCESS || m[0] || m[1] != -m[2] || m[3]) {
        MPI_Comm_free(&node);
        return e != MPI_SUCCESS ? shm_fail(e, "MPI_Allreduce") : KILN_OK;
    }
    MPI_Comm rail = MPI_COMM_NULL;
    if (nsize < size) {
        e = MPI_Comm_split(comm, nrank, rank, &rail);
        if (e != MPI_SUCCESS) {
            MPI_Comm_free(&node);
            return shm_fail(e, "MPI_Comm_split");
        }
        MPI_Comm_set_errhandler(rail, MPI_ERRORS_RETURN);
    }
    kiln__shm *s = calloc(1, sizeof *s);
    if (!s) {
        if (rail != MPI_COMM_NULL)
            MPI_Comm_free(&rail);
        MPI_Comm_free(&node);
        return kiln_error_setf(KILN_ERR_NOMEM, "shared memory: out of memory");
    }
    s->comm = comm;
    s->node = node;
    s->rail = rail;
    s->rank = nrank;
    s->size = nsize;
    s->nodes = size / nsize;
    s->node_id = rank / nsize;
    s->grank = rank;
    s->gsize = size;
    *out = s;
    return KILN_OK;
}

int kiln__shm_local_size(const kiln__shm *s) {
    return s ? s->size : 1;
}

static void win_free(shm_win *w) {
    MPI_Win_unlock_all(w->win);
    MPI_Win_free(&w->win);
    free(w->peer);
    free(w);
}

void kiln__shm_free(kiln__shm *s) {
    if (!s)
        return;
    while (s->wins) {
        shm_win *w = s->wins;
        s->wins = w->next;
        win_free(w);
    }
    if (s->rail != MPI_COMM_NULL)
        MPI_Comm_free(&s->rail);
    MPI_Comm_free(&s->node);
    free(s->scratch);
    free(s);
}

/* MPI_Win_free is collective: a rank that gave a window back on a failure path alone
 * (its model half built) must not wait there for ranks that went on. So a window given
 * back is only marked, and freed at the next point every rank reaches in step: the next
 * allocation, or the communicator's end. */
static void free_released(kiln__shm *s) {
    for (shm_win **at = &s->wins; *at;) {
        shm_win *w = *at;
        if (!w->released) {
            at = &w->next;
            continue;
        }
        *at = w->next;
        win_free(w);
    }
}

kiln_status kiln__shm_alloc(kiln__shm *s, size_t bytes, int common, void **out) {
    *out = NULL;
    free_released(s);
    shm_win *w = calloc(1, sizeof *w);
    char **peer = calloc((size_t)s->size, sizeof *peer);
    if (!w || !peer) {
        free(w);
        free(peer);
        return kiln_error_setf(KILN_ERR_NOMEM, "shared memory: out of memory");
    }
    /* each rank's part where its own process faults it in (its NUMA node), not one block;
     * a common window has rank 0's part alone */
    MPI_Info info;
    MPI_Info_create(&info);
    MPI_Info_set(info, "alloc_shared_noncontig", "true");
    void *base = NULL;
    size_t want = bytes ? bytes : 1;
    MPI_Aint mine = common && s->rank != 0 ? 0 : (MPI_Aint)want;
    int e = MPI_Win_allocate_shared(mine, 1, info, s->node, &base, &w->win);
    MPI_Info_free(&info);
    if (e != MPI_SUCCESS) {
        free(w);
        free(peer);
        return shm_fail(e, "MPI_Win_allocate_shared");
    }
    for (int q = 0; q < s->size && e == MPI_SUCCESS; q++) {
        MPI_Aint qsize = 0;
        int disp = 0;
        void *qbase = NULL;
        e = MPI_Win_shared_query(w->win, q, &qsize, &disp, &qbase);
        peer[q] = qbase;
        /* every rank asks for the same size (MPI may round it up) */
        if (e == MPI_SUCCESS && (!common || q == 0) && (size_t)qsize < want)
            e = MPI_ERR_SIZE;
    }
    if (e == MPI_SUCCESS)
        e = MPI_Win_lock_all(MPI_MODE_NOCHECK, w->win);
    if (e != MPI_SUCCESS) {
        MPI_Win_free(&w->win);
        free(w);
        free(peer);
        return shm_fail(e, "MPI_Win_shared_query");
    }
    w->base = common ? peer[0] : base;
    w->bytes = want;
    w->peer = peer;
    w->common = common;
    if (!common || s->rank == 0)
        memset(w->base, 0, want); /* the window's memory is not promised zero */
    w->next = s->wins;
    s->wins = w;
    if (common) { /* zeroed before any rank writes its pieces */
        MPI_Win_sync(w->win);
        e = MPI_Barrier(s->node);
        MPI_Win_sync(w->win);
        if (e != MPI_SUCCESS) {
            w->released = 1;
            return shm_fail(e, "MPI_Barrier");
        }
    }
    *out = w->base;
    return KILN_OK;
}

void kiln__shm_release(kiln__shm *s, void *p) {
    for (shm_win *w = s->wins; w; w = w->next)
        if (w->base == p)
            w->released = 1;
}

kiln_status kiln__shm_free_now(kiln__shm *s, void *p) {
    kiln__shm_release(s, p);
    free_released(s);
    return KILN_OK;
}

/* The window holding [p, p + bytes) of this rank's memory, and p's offset in it. */
static shm_win *find(const kiln__shm *s, const void *p, size_t bytes, int64_t *off) {
    const char *c = p;
    for (shm_win *w = s->wins; w; w = w->next)
        if (!w->released && c >= w->base && c + bytes <= w->base + w->bytes) {
            *off = c - w->base;
            return w;
        }
    return NULL;
}

/* The entry: every rank's buffer is final, and all agree to go through shared memory (1),
 * or all fall back to MPI (0); -1 with a message when MPI failed, or when a common window's
 * buffer is on some ranks and not on others (reduce: on any), which MPI cannot mend. */
static int agree(const kiln__shm *s, const shm_win *w, int64_t off, int64_t count, int ok,
                 int reduce, kiln_status *st) {
    int64_t kind = w ? w->common : 0;
    int64_t v[7] = {off, -off, count, -count, w && ok ? 0 : 1, kind, -kind}, m[7];
    int e = MPI_Allreduce(v, m, 7, MPI_INT64_T, MPI_MAX, s->nodes > 1 ? s->comm : s->node);
    if (e != MPI_SUCCESS) {
        *st = shm_fail(e, "MPI_Allreduce");
        return -1;
    }
    if (m[5] && (reduce || m[5] != -m[6])) {
        *st = kiln_error_setf(KILN_ERR_ARG, "shared memory: %s",
                              reduce ? REDUCE_COMMON
                                     : "an allgather into the buffer every rank shares as one "
                                       "on some ranks only");
        return -1;
    }
    return m[4] == 0 && m[0] == -m[1] && m[2] == -m[3];
}

/* Reductions too small for the entry's agreement never reach it: one of a common window's
 * buffer is refused here, on every rank alike (each passes the same kind of memory). */
static int small_common(const kiln__shm *s, const void *p, size_t bytes, kiln_status *st) {
    int64_t off;
    shm_win *w = s ? find(s, p, bytes, &off) : NULL;
    if (!w || !w->common)
        return 0;
    *st = kiln_error_setf(KILN_ERR_ARG, "shared memory: %s", REDUCE_COMMON);
    return 1;
}

static kiln_status barrier(const kiln__shm *s, const shm_win *w) {
    MPI_Win_sync(w->win); /* this rank's writes out before the others read them */
    int e = MPI_Barrier(s->node);
    MPI_Win_sync(w->win); /* and theirs in before this rank reads them */
    return e == MPI_SUCCESS ? KILN_OK : shm_fail(e, "MPI_Barrier");
}

/* Piece q of count elements: equal, edges on SHM_ALIGN elements. */
static void piece(int64_t count, int n, int q, int64_t *lo, int64_t *hi) {
    int64_t units = (count + SHM_ALIGN - 1) / SHM_ALIGN;
    int64_t a = units * q / n * SHM_ALIGN, b = units * (q + 1) / n * SHM_ALIGN;
    *lo = a < count ? a : count;
    *hi = b < count ? b : count;
}

/* dst[lo, hi) = op over ranks, in rank order, of every rank's buffer at byte offset off
 * (elements lo..hi of it). dst may be this rank's own buffer there. */
static void reduce_range(const kiln__shm *s, const shm_win *w, int64_t off, void *dst, int64_t lo,
                         int64_t hi, kiln_dtype dt, kiln_reduce_op op) {
    size_t es = kiln_dtype_size(dt);
    _Alignas(64) char tmp[SHM_CHUNK * sizeof(float)];
    for (int64_t a = lo; a < hi; a += SHM_CHUNK) {
        int64_t n = hi - a < SHM_CHUNK ? hi - a : SHM_CHUNK;
        size_t at = (size_t)off + (size_t)a * es;
        memcpy(tmp, w->peer[0] + at, (size_t)n * es);
        for (int q = 1; q < s->size; q++)
            kiln__comm_reduce_local(tmp, w->peer[q] + at, n, dt, op);
        memcpy((char *)dst + (size_t)(a - lo) * es, tmp, (size_t)n * es);
    }
}

/* Elements [lo, hi) at byte offset off from rank q's buffer into this rank's. */
static void copy_from(const shm_win *w, int q, int64_t off, int64_t lo, int64_t hi, size_t es) {
    if (hi > lo)
        memcpy(w->base + off + lo * (int64_t)es, w->peer[q] + off + lo * (int64_t)es,
               (size_t)(hi - lo) * es);
}

int kiln__shm_allreduce(kiln__shm *s, void *buf, int64_t count, kiln_dtype dt, kiln_reduce_op op,
                        kiln_status *st) {
    size_t es = kiln_dtype_size(dt);
    if (!s || (size_t)count * es < SHM_MIN_BYTES)
        return small_common(s, buf, (size_t)count * es, st);
    if (s->nodes > 1 && count > INT_MAX) /* MPI's counts are ints */
        return 0;
    int64_t off = -1;
    shm_win *w = find(s, buf, (size_t)count * es, &off);
    int go = agree(s, w, off, count, 1, 1, st);
    if (go <= 0) {
        if (go == 0)
            *st = KILN_OK;
        return go < 0;
    }
    shm_runs++;
    int64_t lo, hi;
    piece(count, s->size, s->rank, &lo, &hi);
    /* the rail's ring allreduce of piece l over the machines */
    uint64_t pb = (uint64_t)(hi - lo) * es, M = (uint64_t)s->nodes;
    s->net_bytes = 2 * (pb / M) * (M - 1);
    reduce_range(s, w, off, w->base + off + lo * (int64_t)es, lo, hi, dt, op);
    /* machines > 1: this machine's sum of piece l with every other machine's, over the rail
     * of local index l (each machine's ranks send their pieces at once, one rail each) */
    if (s->rail != MPI_COMM_NULL) {
        int e = MPI_Allreduce(MPI_IN_PLACE, w->base + off + lo * (int64_t)es, (int)(hi - lo),
                              kiln__mpi_elem_type(dt), kiln__mpi_reduce_op(dt, op), s->rail);
        if (e != MPI_SUCCESS) {
            *st = shm_fail(e, "MPI_Allreduce across machines");
            return 1;
        }
    }
    *st = barrier(s, w);
    for (int q = 0; *st == KILN_OK && q < s->size; q++) {
        piece(count, s->size, q, &lo, &hi);
        if (q != s->rank)
            copy_from(w, q, off, lo, hi, es);
    }
    if (*st == KILN_OK)
        *st = barrier(s, w);
    return 1;
}

/* The elements before this rank's piece, and in all; 0 when shared memory is not for a
 * collective of counts (none, or too small to be worth its barriers). */
static int pieces(const kiln__shm *s, const int64_t *counts, size_t es, int64_t *before,
                  int64_t *total) {
    *before = *total = 0;
    for (int q = 0; s && q < s->gsize; q++) {
        if (q < s->grank)
            *before += counts[q];
        *total += counts[q];
    }
    /* across machines, MPI's counts and displacements are ints */
    return s && (size_t)*total * es >= SHM_MIN_BYTES && (s->nodes == 1 || *total <= INT_MAX);
}

/* ---- machines > 1: shared memory on each, MPI between them over the rails ---- */

/* Where each of the communicator's pieces starts (elements), and a rail's ints: for each
 * machine, the count (and start) of what local index l moves; NULL when out of memory. */
typedef struct {
    int64_t *at; /* [gsize + 1] */
    int *cnt, *disp;  /* [nodes] */
} layout;

static void layout_free(layout *y) {
    free(y->at);
    free(y->cnt);
    free(y->disp);
}

static kiln_status layout_make(const kiln__shm *s, const int64_t *counts, layout *y) {
    y->at = malloc(((size_t)s->gsize + 1) * sizeof *y->at);
    y->cnt = malloc((size_t)s->nodes * sizeof *y->cnt);
    y->disp = malloc((size_t)s->nodes * sizeof *y->disp);
    if (!y->at || !y->cnt || !y->disp) {
        layout_free(y);
        return kiln_error_setf(KILN_ERR_NOMEM, "shared memory: out of memory");
    }
    y->at[0] = 0;
    for (int g = 0; g < s->gsize; g++)
        y->at[g + 1] = y->at[g] + counts[g];
    return KILN_OK;
}

/* Reduce-scatter: for every machine n', this machine's sum of the piece of rank n' L + l
 * (this rank's rail), in local rank order, into the scratch one after another; then MPI's
 * reduce-scatter of those over the rail gives this rank's piece, summed over machines. */
static kiln_status reduce_scatter_machines(kiln__shm *s, const shm_win *w, int64_t off,
                                           void *recv, const int64_t *counts, kiln_dtype dt,
                                           kiln_reduce_op op) {
    size_t es = kiln_dtype_size(dt);
    layout y;
    KILN_CHECK(layout_make(s, counts, &y));
    int64_t mine = 0;
    for (int n = 0; n < s->nodes; n++) {
        int64_t c = counts[n * s->size + s->rank];
        y.cnt[n] = (int)c;
        mine += c;
    }
    if ((size_t)mine * es > s->scratch_bytes) {
        void *p = realloc(s->scratch, (size_t)mine * es);
        if (!p) {
            layout_free(&y);
            return kiln_error_setf(KILN_ERR_NOMEM, "shared memory: out of memory");
        }
        s->scratch = p;
        s->scratch_bytes = (size_t)mine * es;
    }
    /* the rail's ring reduce-scatter: every machine's piece but this one's */
    s->net_bytes = (uint64_t)(mine - y.cnt[s->node_id]) * es;
    char *sc = s->scratch;
    for (int n = 0; n < s->nodes; n++) {
        int g = n * s->size + s->rank;
        reduce_range(s, w, off, sc, y.at[g], y.at[g + 1], dt, op);
        sc += (size_t)counts[g] * es;
    }
    int e = MPI_Reduce_scatter(s->scratch, recv, y.cnt, kiln__mpi_elem_type(dt),
                               kiln__mpi_reduce_op(dt, op), s->rail);
    layout_free(&y);
    return e == MPI_SUCCESS ? KILN_OK : shm_fail(e, "MPI_Reduce_scatter across machines");
}

/* Rank q's elements [lo, hi) at byte offset off into this rank's, leaving out [skip_lo,
 * skip_hi) (this rank's own piece). */
static void copy_except(const shm_win *w, int q, int64_t off, int64_t lo, int64_t hi,
                        int64_t skip_lo, int64_t skip_hi, size_t es) {
    copy_from(w, q, off, lo, hi < skip_lo ? hi : skip_lo, es);
    copy_from(w, q, off, lo > skip_hi ? lo : skip_hi, hi, es);
}

/* Allgather: machine n's pieces (ranks n L .. n L + L - 1) are one block, cut in L parts;
 * rank l gathers part l of its own machine's block from the ranks that own it, MPI's
 * allgather over the rail brings part l of every other machine's block, and the other
 * parts come from the machine's other ranks. A common window holds every machine's block
 * in one buffer already: only the rail's part moves. */
static kiln_status allgather_machines(kiln__shm *s, const shm_win *w, int64_t off,
                                      const int64_t *counts, kiln_dtype dt) {
    size_t es = kiln_dtype_size(dt);
    int L = s->size, l = s->rank;
    layout y;
    KILN_CHECK(layout_make(s, counts, &y));
    int64_t my_lo = y.at[s->grank], my_hi = y.at[s->grank + 1];
    MPI_Win_sync(w->win); /* the other ranks' pieces, written before the entry */
    for (int n = 0; n < s->nodes; n++) {
        int64_t b0 = y.at[n * L], size = y.at[n * L + L] - b0, a, b;
        piece(size, L, l, &a, &b);
        y.cnt[n] = (int)(b - a);
        y.disp[n] = (int)(b0 + a);
    }
    if (!w->common) /* part l of this machine's block, from its owners */
        for (int q = 0; q < L; q++) {
            int g = s->node_id * L + q;
            int64_t lo = y.at[g], hi = y.at[g + 1];
            int64_t plo = y.disp[s->node_id], phi = plo + y.cnt[s->node_id];
            if (q != l && hi > plo && lo < phi)
                copy_from(w, q, off, lo > plo ? lo : plo, hi < phi ? hi : phi, es);
        }
    /* the rail's ring allgather: every machine's part but the next one's */
    s->net_bytes = 0;
    for (int n = 0; n < s->nodes; n++)
        if (n != (s->node_id + 1) % s->nodes)
            s->net_bytes += (uint64_t)y.cnt[n] * es;
    int e = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, w->base + off, y.cnt, y.disp,
                           kiln__mpi_elem_type(dt), s->rail);
    kiln_status st = e == MPI_SUCCESS ? barrier(s, w)
                                      : shm_fail(e, "MPI_Allgatherv across machines");
    for (int n = 0; st == KILN_OK && !w->common && n < s->nodes; n++) {
        int64_t b0 = y.at[n * L], size = y.at[n * L + L] - b0;
        for (int q = 0; q < L; q++) {
            int64_t a, b;
            piece(size, L, q, &a, &b);
            if (q != l)
                copy_except(w, q, off, b0 + a, b0 + b, my_lo, my_hi, es);
        }
    }
    if (st == KILN_OK && !w->common)
        st = barrier(s, w);
    layout_free(&y);
    return st;
}

int kiln__shm_reduce_scatter(kiln__shm *s, const void *send, void *recv, const int64_t *counts,
                             kiln_dtype dt, kiln_reduce_op op, kiln_status *st) {
    size_t es = kiln_dtype_size(dt);
    int64_t total, before;
    if (!pieces(s, counts, es, &before, &total))
        return s && small_common(s, send, (size_t)total * es, st);
    int64_t off = -1, roff = -1;
    shm_win *w = find(s, send, (size_t)total * es, &off);
    /* the result lands in this rank's own piece of send (NCCL's layout), or in memory that
     * no rank reads (outside every window) */
    int ok = recv == (const char *)send + before * (int64_t)es ||
             !find(s, recv, (size_t)counts[s->grank] * es, &roff);
    int go = agree(s, w, off, total, ok, 1, st);
    if (go <= 0) {
        if (go == 0)
            *st = KILN_OK;
        return go < 0;
    }
    shm_runs++;
    *st = KILN_OK;
    s->net_bytes = 0;
    if (s->nodes > 1)
        *st = reduce_scatter_machines(s, w, off, recv, counts, dt, op);
    else
        reduce_range(s, w, off, recv, before, before + counts[s->grank], dt, op);
    if (*st == KILN_OK)
        *st = barrier(s, w);
    return 1;
}

int kiln__shm_allgather(kiln__shm *s, const void *send, void *recv, const int64_t *counts,
                        kiln_dtype dt, kiln_status *st) {
    size_t es = kiln_dtype_size(dt);
    int64_t total, before;
    if (!pieces(s, counts, es, &before, &total))
        return 0;
    int64_t off = -1;
    shm_win *w = find(s, recv, (size_t)total * es, &off);
    int go = agree(s, w, off, total, send == (const char *)recv + before * (int64_t)es, 0,
                   st);
    if (go <= 0) {
        if (go == 0)
            *st = KILN_OK;
        return go < 0;
    }
    shm_runs++;
    s->net_bytes = 0;
    if (s->nodes > 1) {
        *st = allgather_machines(s, w, off, counts, dt);
        return 1;
    }
    for (int64_t q = 0, at = 0; !w->common && q < s->size; at += counts[q], q++)
        if (q != s->rank)
            copy_from(w, (int)q, off, at, at + counts[q], es);
    *st = barrier(s, w);
    return 1;
}

#else
#include <stdint.h>

uint64_t kiln__comm_shm_runs(void);
uint64_t kiln__comm_shm_runs(void) {
    return 0;
}
#endif

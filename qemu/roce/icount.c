/*
 * A QEMU TCG plugin for qemu/roce/lab.sh: counts every instruction the guest's vCPUs execute
 * (kernel and user alike) and, each time the guest executes a marker, appends the running
 * count to a file. The lab reads a case's window as the difference between two marks.
 *
 * The marker is a no-op the guest runs on purpose: `nopl 0x4256XXXX(%rax)`, the bytes
 * 0f 1f 80 XX XX 56 42. Compilers pad with zero displacements, so the high half 0x4256 ("BV")
 * names it; the low half XXXX is the mark's code (qemu/roce/mark.c for a Linux guest, the
 * unikernel's `roce_peer::mark`). Every mark is one line, `mark XXXX <count>`, and QEMU's
 * exit adds `total <count>`.
 *
 *   -plugin $cache/icount.so,out=PATH[,prof=PATH,from=XXXX,to=YYYY]
 *
 * With prof=, the plugin also profiles one window, from the mark XXXX to the mark YYYY (hex):
 * the instructions executed in each translated block, by the block's first guest address.
 * At the mark YYYY it writes `<address hex> <instructions>` lines to the prof file (the lab
 * maps the addresses to the unikernel's symbols). Outside the window a block costs an inline
 * test; inside, a callback.
 *
 * Counting is one inline add per translated block (its instruction count, in a per-vCPU
 * scoreboard), so a block left early by an exception counts whole: an error of a few
 * instructions per exception. The count at a mark is the sum over the vCPUs.
 *
 * Built against QEMU 10.0's qemu-plugin.h (plugin API version 2 or later: the per-vCPU inline
 * operations and the copying qemu_plugin_insn_data of version 3).
 */
#include <glib.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

/* The marker's fixed bytes: opcode 0f 1f, ModRM 80 (disp32 off rax), then disp32 whose high
 * half is 0x4256 (little-endian: the last two bytes). */
#define MARK_LEN 7

/* Per vCPU: the instruction count, and whether the profiled window is open (1). */
struct vcpu_board {
    uint64_t insns;
    uint64_t active;
};
static struct qemu_plugin_scoreboard *board;
static qemu_plugin_u64 insns;
static qemu_plugin_u64 active;
/* The profile: a block's first address -> its entry, kept across retranslations. */
struct block {
    uint64_t vaddr;
    uint64_t n_insns;
    uint64_t execs;
};
static GHashTable *blocks;
static FILE *prof;
static int prof_from = -1, prof_to = -1;
static FILE *out;
/* Marks and the exit line come from vCPU threads and the main thread. */
static GMutex lock;

static uint64_t count_now(void)
{
    return qemu_plugin_u64_sum(insns);
}

static void set_active(uint64_t v)
{
    for (int i = 0; i < qemu_plugin_num_vcpus(); i++) {
        qemu_plugin_u64_set(active, i, v);
    }
}

static void write_profile(gpointer key, gpointer value, gpointer data)
{
    struct block *b = value;
    (void)key;
    (void)data;
    uint64_t e = __atomic_load_n(&b->execs, __ATOMIC_RELAXED);
    if (e) {
        fprintf(prof, "%016" PRIx64 " %" PRIu64 "\n", b->vaddr, e * b->n_insns);
    }
}

static void on_mark(unsigned int vcpu, void *code)
{
    uint64_t n = count_now();
    int c = (int)GPOINTER_TO_UINT(code);
    (void)vcpu;
    g_mutex_lock(&lock);
    fprintf(out, "mark %04x %" PRIu64 "\n", (unsigned)c, n);
    fflush(out);
    if (prof && c == prof_from) {
        set_active(1);
    } else if (prof && c == prof_to) {
        set_active(0);
        g_hash_table_foreach(blocks, write_profile, NULL);
        fclose(prof);
        prof = NULL;
    }
    g_mutex_unlock(&lock);
}

static void on_block(unsigned int vcpu, void *udata)
{
    struct block *b = udata;
    (void)vcpu;
    __atomic_fetch_add(&b->execs, 1, __ATOMIC_RELAXED);
}

/* The mark's code if `insn` is a marker, else -1. */
static int mark_code(const struct qemu_plugin_insn *insn)
{
    uint8_t b[MARK_LEN];
    if (qemu_plugin_insn_size(insn) != MARK_LEN ||
        qemu_plugin_insn_data(insn, b, sizeof b) != MARK_LEN) {
        return -1;
    }
    if (b[0] != 0x0f || b[1] != 0x1f || b[2] != 0x80 || b[5] != 0x56 || b[6] != 0x42) {
        return -1;
    }
    return b[3] | b[4] << 8;
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline_per_vcpu(tb, QEMU_PLUGIN_INLINE_ADD_U64, insns, n);
    if (blocks) {
        uint64_t vaddr = qemu_plugin_tb_vaddr(tb);
        struct block *b;
        g_mutex_lock(&lock);
        b = g_hash_table_lookup(blocks, &vaddr);
        if (!b || b->n_insns != n) {
            /* (A block retranslated with another length counts as a new entry.) */
            b = g_new0(struct block, 1);
            b->vaddr = vaddr;
            b->n_insns = n;
            g_hash_table_replace(blocks, &b->vaddr, b);
        }
        g_mutex_unlock(&lock);
        qemu_plugin_register_vcpu_tb_exec_cond_cb(tb, on_block, QEMU_PLUGIN_CB_NO_REGS,
                                                  QEMU_PLUGIN_COND_EQ, active, 1, b);
    }
    for (size_t i = 0; i < n; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        int code = mark_code(insn);
        if (code >= 0) {
            qemu_plugin_register_vcpu_insn_exec_cb(insn, on_mark, QEMU_PLUGIN_CB_NO_REGS,
                                                   GUINT_TO_POINTER((unsigned)code));
        }
    }
}

static void at_qemu_exit(qemu_plugin_id_t id, void *data)
{
    (void)id;
    (void)data;
    g_mutex_lock(&lock);
    fprintf(out, "total %" PRIu64 "\n", count_now());
    fclose(out);
    out = NULL;
    if (prof) {
        /* A window that never closed: what it ran so far. */
        g_hash_table_foreach(blocks, write_profile, NULL);
        fclose(prof);
        prof = NULL;
    }
    g_mutex_unlock(&lock);
    qemu_plugin_scoreboard_free(board);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    const char *path = NULL, *prof_path = NULL;
    for (int i = 0; i < argc; i++) {
        if (g_str_has_prefix(argv[i], "out=")) {
            path = argv[i] + strlen("out=");
        } else if (g_str_has_prefix(argv[i], "prof=")) {
            prof_path = argv[i] + strlen("prof=");
        } else if (g_str_has_prefix(argv[i], "from=")) {
            prof_from = (int)(strtoul(argv[i] + strlen("from="), NULL, 16) & 0xffff);
        } else if (g_str_has_prefix(argv[i], "to=")) {
            prof_to = (int)(strtoul(argv[i] + strlen("to="), NULL, 16) & 0xffff);
        } else {
            fprintf(stderr, "icount: unknown argument %s (takes out=PATH[,prof=PATH,from=XXXX,to=YYYY])\n",
                    argv[i]);
            return -1;
        }
    }
    if (prof_path && (prof_from < 0 || prof_to < 0)) {
        fprintf(stderr, "icount: prof= needs from= and to=\n");
        return -1;
    }
    if (!path || !info->system_emulation) {
        fprintf(stderr, "icount: needs out=PATH and full-system emulation\n");
        return -1;
    }
    out = fopen(path, "w");
    if (!out) {
        fprintf(stderr, "icount: cannot write %s\n", path);
        return -1;
    }
    if (prof_path) {
        prof = fopen(prof_path, "w");
        if (!prof) {
            fprintf(stderr, "icount: cannot write %s\n", prof_path);
            return -1;
        }
        blocks = g_hash_table_new(g_int64_hash, g_int64_equal);
    }
    g_mutex_init(&lock);
    board = qemu_plugin_scoreboard_new(sizeof(struct vcpu_board));
    insns = qemu_plugin_scoreboard_u64_in_struct(board, struct vcpu_board, insns);
    active = qemu_plugin_scoreboard_u64_in_struct(board, struct vcpu_board, active);
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, at_qemu_exit, NULL);
    return 0;
}

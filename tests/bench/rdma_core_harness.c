/*
 * Instruction-count harness for rdma-core's vmw_pvrdma userspace provider, the C counterpart of
 * tests/bench/ops.rs. tests/bench/rdma_core.sh builds it and runs it under valgrind's callgrind,
 * counting only inside the `bench_<key>` functions.
 *
 * How the provider gets here: Debian's libibverbs-dev ships the provider's object code as a
 * static archive (libvmw_pvrdma-rdmav34.a, members qp.c.o, cq.c.o, ...), compiled by Debian's
 * own build of the rdma-core source package (gcc -O2 with Debian's hardening flags). Its
 * post_send/post_recv/poll_cq are instruction for instruction those of the shared provider the
 * package ibverbs-providers ships (libvmw_pvrdma-rdmav34.so); only an error path differs, in
 * how it reaches `stderr`. The script links this program with the archive's qp.c.o and cq.c.o
 * and nothing else of rdma-core: no libibverbs, no kernel, no device. (Compiling qp.c/cq.c
 * ourselves from `apt-get source rdma-core` was the first plan, but the mirror available here
 * serves the package's .dsc and debian.tar.xz and answers 404 for rdma-core_44.0.orig.tar.gz.)
 *
 * The provider's objects are built here by hand instead of by pvrdma_create_qp/_cq, which
 * would need the kernel: a QP and a CQ whose rings are plain heap memory, a context whose UAR
 * page is plain heap memory too (a doorbell costs one store, as the Rust bench makes doorbells
 * free), and the QP table the poll path looks QPs up in. The structures below are written for
 * this harness; their members and layout follow rdma-core 44's providers/vmw_pvrdma/pvrdma.h
 * and pvrdma_ring.h, and every offset the provider's code uses is checked (_Static_assert)
 * against the displacements in Debian's object code. The WQE and CQE formats come from the
 * kernel's <rdma/vmw_pvrdma-abi.h>. Each scenario's effects (WQE contents, ring indices,
 * doorbell values, work completions) are checked after every call, outside the count, so a
 * layout mismatch fails the run instead of producing a figure.
 *
 * Scenarios (RC QP, 1 SGE per WR, every WR signaled; 64 send and 64 recv slots; a CQ of 4096
 * entries): post_send_1, post_send_16, post_recv_1, post_recv_16, poll_1, poll_16, poll_empty,
 * post_send_ud_1 (UD QP, with an address handle), write_16 (RDMA WRITE), and empty (a function
 * with the same argument that returns at once: the harness overhead the script subtracts).
 * Between calls, outside the count, the harness plays the device: it consumes the posted WQEs
 * (cons_head = prod_tail) and writes the CQEs a poll will find.
 *
 *   rdma_core_harness <key>   runs one scenario REPS times (what callgrind measures)
 *   rdma_core_harness all     runs every scenario REPS times (a self-check)
 *
 * Build: gcc -O2 -fno-optimize-sibling-calls -DPROVIDER_PREFIX=rdmacore44_0_ this.c qp.c.o
 * cq.c.o -Wl,-z,now, with every other rdma-core symbol those objects name bound to
 * harness_unexpected_call (see rdma_core.sh). The provider's exported names carry rdma-core's
 * version prefix; PROVIDER_PREFIX is that prefix. No sibling calls: each bench_* function
 * calls the provider and returns, so callgrind sees the provider as its callee.
 */
#include <infiniband/verbs.h>
#include <rdma/vmw_pvrdma-abi.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef PROVIDER_PREFIX
#error "define PROVIDER_PREFIX, the version prefix of the provider's symbols (e.g. rdmacore44_0_)"
#endif
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define PROVIDER(name) CAT(PROVIDER_PREFIX, name)

int PROVIDER(pvrdma_post_send)(struct ibv_qp *qp, struct ibv_send_wr *wr,
			       struct ibv_send_wr **bad_wr);
int PROVIDER(pvrdma_post_recv)(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			       struct ibv_recv_wr **bad_wr);
int PROVIDER(pvrdma_poll_cq)(struct ibv_cq *cq, int num_entries, struct ibv_wc *wc);

#define REPS 1000
#define PAGE 4096u
#define SQ_SLOTS 64u
#define RQ_SLOTS 64u
#define CQ_SLOTS 4096u
#define QP_TABLE 0x10000u
#define RC_HANDLE 1u
#define UD_HANDLE 2u
#define CQ_NUMBER 5u
#define LKEY 0x1234u
#define RKEY 0x5678u
#define QKEY 0x1111u

/* The shared ring indices: the index runs over twice the slot count (the top bit is the wrap
 * generation); a queue page starts with these. */
struct ring {
	uint32_t prod_tail;
	uint32_t cons_head;
};

struct cq_ring_page {
	struct ring tx;
	struct ring rx; /* the device produces CQEs here, the driver consumes them */
};

struct heap_buf {
	void *buf;
	size_t length;
};

/* One work queue of a QP, as the provider keeps it. */
struct work_queue {
	uint64_t *wrid;
	pthread_spinlock_t lock;
	int wqe_cnt;
	int wqe_size;
	struct ring *ring;
	int max_gs;
	int wqe_shift;
	int offset; /* of the first WQE in its buffer */
};

struct fake_qp {
	struct ibv_qp ibv_qp;
	struct heap_buf rbuf;
	struct heap_buf sbuf; /* ring-state page, then the send WQEs */
	int max_inline_data;
	int buf_size;
	uint32_t sq_signal_bits;
	int sq_spare_wqes;
	struct work_queue sq;
	struct work_queue rq;
	int is_srq;
	uint32_t qp_handle;
};

struct fake_cq {
	struct ibv_cq ibv_cq;
	struct heap_buf buf; /* ring-state page, then the CQEs */
	struct heap_buf resize_buf;
	pthread_spinlock_t lock;
	struct cq_ring_page *ring_page;
	uint32_t cqe_cnt;
	uint32_t offset;
	uint32_t cqn;
};

/* The provider's context is rdma-core's verbs_context (which ends with the ibv_context) followed
 * by these members; the provider only reaches them from the ibv_context, at positive offsets, so
 * the part of verbs_context before the ibv_context is left out. */
struct fake_ctx {
	struct ibv_context ibv_ctx;
	void *uar;
	pthread_spinlock_t uar_lock;
	int max_qp_wr;
	int max_sge;
	int max_cqe;
	struct fake_qp **qp_tbl;
};

struct fake_ah {
	struct ibv_ah ibv_ah;
	struct pvrdma_av av;
};

/* The displacements the provider's code (Debian rdma-core 44.0-2) uses. */
_Static_assert(offsetof(struct ibv_qp, context) == 0x0, "qp context");
_Static_assert(offsetof(struct ibv_qp, state) == 0x38, "qp state");
_Static_assert(offsetof(struct ibv_qp, qp_type) == 0x3c, "qp type");
_Static_assert(offsetof(struct fake_qp, sbuf) == 0xb0, "qp sbuf");
_Static_assert(offsetof(struct fake_qp, sq.wrid) == 0xd0, "sq wrid");
_Static_assert(offsetof(struct fake_qp, sq.lock) == 0xd8, "sq lock");
_Static_assert(offsetof(struct fake_qp, sq.wqe_cnt) == 0xdc, "sq wqe_cnt");
_Static_assert(offsetof(struct fake_qp, sq.wqe_size) == 0xe0, "sq wqe_size");
_Static_assert(offsetof(struct fake_qp, sq.ring) == 0xe8, "sq ring");
_Static_assert(offsetof(struct fake_qp, sq.max_gs) == 0xf0, "sq max_gs");
_Static_assert(offsetof(struct fake_qp, sq.offset) == 0xf8, "sq offset");
_Static_assert(offsetof(struct fake_qp, rq.lock) == 0x108, "rq lock");
_Static_assert(offsetof(struct fake_qp, rq.wqe_cnt) == 0x10c, "rq wqe_cnt");
_Static_assert(offsetof(struct fake_qp, rq.ring) == 0x118, "rq ring");
_Static_assert(offsetof(struct fake_qp, is_srq) == 0x130, "qp is_srq");
_Static_assert(offsetof(struct fake_qp, qp_handle) == 0x134, "qp handle");
_Static_assert(offsetof(struct ibv_qp, qp_num) == 0x34, "qp number");
_Static_assert(offsetof(struct fake_cq, buf) == 0x80, "cq buf");
_Static_assert(offsetof(struct fake_cq, lock) == 0xa0, "cq lock");
_Static_assert(offsetof(struct fake_cq, ring_page) == 0xa8, "cq ring");
_Static_assert(offsetof(struct fake_cq, cqe_cnt) == 0xb0, "cq cqe_cnt");
_Static_assert(offsetof(struct fake_cq, offset) == 0xb4, "cq offset");
_Static_assert(offsetof(struct fake_cq, cqn) == 0xb8, "cq cqn");
_Static_assert(offsetof(struct fake_ctx, uar) == 0x148, "ctx uar");
_Static_assert(offsetof(struct fake_ctx, qp_tbl) == 0x160, "ctx qp_tbl");
_Static_assert(offsetof(struct fake_ah, av) == 0x18, "ah av");
_Static_assert(sizeof(struct pvrdma_sq_wqe_hdr) == 0x50, "send WQE header");
_Static_assert(offsetof(struct pvrdma_sq_wqe_hdr, wr.ud.av) == 0x28, "UD av in WQE");
_Static_assert(sizeof(struct pvrdma_cqe) == 64, "CQE");
_Static_assert(sizeof(struct ibv_wc) == 0x30, "work completion");

/* The provider sizes WQEs as the next power of two of header + SGEs (here 1 SGE). */
#define SQ_WQE_SIZE 128u
#define RQ_WQE_SIZE 32u
_Static_assert(sizeof(struct pvrdma_sq_wqe_hdr) + sizeof(struct ibv_sge) <= SQ_WQE_SIZE &&
		       sizeof(struct pvrdma_sq_wqe_hdr) + sizeof(struct ibv_sge) > SQ_WQE_SIZE / 2,
	       "send WQE size");
_Static_assert(sizeof(struct pvrdma_rq_wqe_hdr) + sizeof(struct ibv_sge) == RQ_WQE_SIZE,
	       "recv WQE size");

struct bench {
	struct fake_ctx ctx;
	struct fake_cq cq;
	struct fake_qp rc;
	struct fake_qp ud;
	struct fake_ah ah;
	struct ibv_sge sge[16];
	struct ibv_send_wr send1;
	struct ibv_send_wr send16[16];
	struct ibv_send_wr write16[16];
	struct ibv_send_wr ud_send1;
	struct ibv_recv_wr recv1;
	struct ibv_recv_wr recv16[16];
	struct ibv_wc wc[16];
	struct ibv_send_wr *bad_send;
	struct ibv_recv_wr *bad_recv;
	uint32_t cq_prod; /* the device's CQ producer index */
	uint64_t next_cqe_id;
	char *mr;
};

/* ---- The measured functions: one provider call each, nothing else. ---- */

#define MEASURED __attribute__((noinline, noipa))

MEASURED int bench_empty(struct bench *b)
{
	(void)b;
	return 0;
}

MEASURED int bench_post_send_1(struct bench *b)
{
	return PROVIDER(pvrdma_post_send)(&b->rc.ibv_qp, &b->send1, &b->bad_send);
}

MEASURED int bench_post_send_16(struct bench *b)
{
	return PROVIDER(pvrdma_post_send)(&b->rc.ibv_qp, b->send16, &b->bad_send);
}

MEASURED int bench_write_16(struct bench *b)
{
	return PROVIDER(pvrdma_post_send)(&b->rc.ibv_qp, b->write16, &b->bad_send);
}

MEASURED int bench_post_send_ud_1(struct bench *b)
{
	return PROVIDER(pvrdma_post_send)(&b->ud.ibv_qp, &b->ud_send1, &b->bad_send);
}

MEASURED int bench_post_recv_1(struct bench *b)
{
	return PROVIDER(pvrdma_post_recv)(&b->rc.ibv_qp, &b->recv1, &b->bad_recv);
}

MEASURED int bench_post_recv_16(struct bench *b)
{
	return PROVIDER(pvrdma_post_recv)(&b->rc.ibv_qp, b->recv16, &b->bad_recv);
}

MEASURED int bench_poll_1(struct bench *b)
{
	return PROVIDER(pvrdma_poll_cq)(&b->cq.ibv_cq, 1, b->wc);
}

MEASURED int bench_poll_16(struct bench *b)
{
	return PROVIDER(pvrdma_poll_cq)(&b->cq.ibv_cq, 16, b->wc);
}

MEASURED int bench_poll_empty(struct bench *b)
{
	return PROVIDER(pvrdma_poll_cq)(&b->cq.ibv_cq, 16, b->wc);
}

/* ---- Everything below runs outside the count. ---- */

/* The script binds every rdma-core symbol the provider objects need but the data path never
 * calls (ibv_cmd_*, buffer allocation, CQ cleaning) to this. */
void harness_unexpected_call(void)
{
	fputs("rdma_core_harness: the provider called a function outside the data path\n", stderr);
	abort();
}

static void fail(const char *scenario, const char *what)
{
	fprintf(stderr, "rdma_core_harness: %s: %s\n", scenario, what);
	exit(1);
}

#define CHECK(scenario, cond) \
	do { \
		if (!(cond)) \
			fail(scenario, "check failed: " #cond); \
	} while (0)

static void *zalloc_pages(size_t length)
{
	void *p = aligned_alloc(PAGE, (length + PAGE - 1) / PAGE * PAGE);

	if (!p)
		fail("setup", "out of memory");
	memset(p, 0, length);
	return p;
}

static void init_qp(struct bench *b, struct fake_qp *qp, enum ibv_qp_type type, uint32_t handle)
{
	qp->ibv_qp.context = &b->ctx.ibv_ctx;
	qp->ibv_qp.send_cq = &b->cq.ibv_cq;
	qp->ibv_qp.recv_cq = &b->cq.ibv_cq;
	qp->ibv_qp.handle = handle;
	qp->ibv_qp.qp_num = handle;
	qp->ibv_qp.state = IBV_QPS_RTS;
	qp->ibv_qp.qp_type = type;
	pthread_mutex_init(&qp->ibv_qp.mutex, NULL);
	pthread_cond_init(&qp->ibv_qp.cond, NULL);

	/* [ring-state page][send WQEs]; the receive WQEs in their own buffer. */
	qp->sbuf.length = PAGE + SQ_SLOTS * SQ_WQE_SIZE;
	qp->sbuf.buf = zalloc_pages(qp->sbuf.length);
	qp->rbuf.length = RQ_SLOTS * RQ_WQE_SIZE;
	qp->rbuf.buf = zalloc_pages(qp->rbuf.length);
	qp->buf_size = (int)(qp->sbuf.length + qp->rbuf.length);

	qp->sq.wrid = calloc(SQ_SLOTS, sizeof(uint64_t));
	qp->sq.wqe_cnt = SQ_SLOTS;
	qp->sq.wqe_size = SQ_WQE_SIZE;
	qp->sq.ring = qp->sbuf.buf;
	qp->sq.max_gs = 1;
	qp->sq.wqe_shift = 7;
	qp->sq.offset = PAGE;
	qp->rq.wrid = calloc(RQ_SLOTS, sizeof(uint64_t));
	qp->rq.wqe_cnt = RQ_SLOTS;
	qp->rq.wqe_size = RQ_WQE_SIZE;
	qp->rq.ring = (struct ring *)qp->sbuf.buf + 1;
	qp->rq.max_gs = 1;
	qp->rq.wqe_shift = 5;
	qp->rq.offset = 0;
	if (!qp->sq.wrid || !qp->rq.wrid)
		fail("setup", "out of memory");
	if (pthread_spin_init(&qp->sq.lock, PTHREAD_PROCESS_PRIVATE) ||
	    pthread_spin_init(&qp->rq.lock, PTHREAD_PROCESS_PRIVATE))
		fail("setup", "pthread_spin_init");
	qp->qp_handle = handle;
	b->ctx.qp_tbl[handle & 0xffff] = qp;
}

static struct bench *setup(void)
{
	struct bench *b = calloc(1, sizeof(*b));

	if (!b)
		fail("setup", "out of memory");
	b->ctx.uar = zalloc_pages(PAGE);
	b->ctx.max_qp_wr = 1024;
	b->ctx.max_sge = 16;
	b->ctx.max_cqe = 65536;
	b->ctx.qp_tbl = calloc(QP_TABLE, sizeof(*b->ctx.qp_tbl));
	if (!b->ctx.qp_tbl || pthread_spin_init(&b->ctx.uar_lock, PTHREAD_PROCESS_PRIVATE))
		fail("setup", "context");
	b->ctx.ibv_ctx.num_comp_vectors = 1;
	pthread_mutex_init(&b->ctx.ibv_ctx.mutex, NULL);

	b->cq.ibv_cq.context = &b->ctx.ibv_ctx;
	b->cq.ibv_cq.cqe = CQ_SLOTS;
	b->cq.ibv_cq.handle = CQ_NUMBER;
	b->cq.buf.length = PAGE + CQ_SLOTS * sizeof(struct pvrdma_cqe);
	b->cq.buf.buf = zalloc_pages(b->cq.buf.length);
	b->cq.ring_page = b->cq.buf.buf;
	b->cq.cqe_cnt = CQ_SLOTS;
	b->cq.offset = PAGE;
	b->cq.cqn = CQ_NUMBER;
	if (pthread_spin_init(&b->cq.lock, PTHREAD_PROCESS_PRIVATE))
		fail("setup", "pthread_spin_init");

	init_qp(b, &b->rc, IBV_QPT_RC, RC_HANDLE);
	init_qp(b, &b->ud, IBV_QPT_UD, UD_HANDLE);

	/* An address handle as pvrdma_create_ah would fill it (port 1, PD 3, a link-local GID). */
	b->ah.ibv_ah.context = &b->ctx.ibv_ctx;
	b->ah.av.port_pd = 3u | (1u << 24);
	b->ah.av.dgid[0] = 0xfe;
	b->ah.av.dgid[1] = 0x80;
	b->ah.av.dgid[15] = 0x01;
	b->ah.av.hop_limit = 1;
	b->ah.av.dmac[0] = 0x02;
	b->ah.av.dmac[5] = 0x01;

	b->mr = zalloc_pages(PAGE);
	for (unsigned i = 0; i < 16; i++) {
		b->sge[i].addr = (uintptr_t)(b->mr + i * 64);
		b->sge[i].length = 64;
		b->sge[i].lkey = LKEY;

		b->send16[i].wr_id = i;
		b->send16[i].next = i + 1 < 16 ? &b->send16[i + 1] : NULL;
		b->send16[i].sg_list = &b->sge[i];
		b->send16[i].num_sge = 1;
		b->send16[i].opcode = IBV_WR_SEND;
		b->send16[i].send_flags = IBV_SEND_SIGNALED;

		b->write16[i] = b->send16[i];
		b->write16[i].next = i + 1 < 16 ? &b->write16[i + 1] : NULL;
		b->write16[i].opcode = IBV_WR_RDMA_WRITE;
		b->write16[i].wr.rdma.remote_addr = 0x100000 + i * 64;
		b->write16[i].wr.rdma.rkey = RKEY;

		b->recv16[i].wr_id = i;
		b->recv16[i].next = i + 1 < 16 ? &b->recv16[i + 1] : NULL;
		b->recv16[i].sg_list = &b->sge[i];
		b->recv16[i].num_sge = 1;
	}
	b->send1 = b->send16[0];
	b->send1.next = NULL;
	b->recv1 = b->recv16[0];
	b->recv1.next = NULL;
	b->ud_send1 = b->send1;
	b->ud_send1.wr.ud.ah = &b->ah.ibv_ah;
	b->ud_send1.wr.ud.remote_qpn = UD_HANDLE; /* to itself, as in ops.rs */
	b->ud_send1.wr.ud.remote_qkey = QKEY;
	return b;
}

static uint32_t ring_next(uint32_t idx, uint32_t slots)
{
	return (idx + 1) & (2 * slots - 1);
}

/* The device takes every posted WQE; the doorbell page is cleared so the next check sees only
 * what the next call writes. */
static void consume(struct bench *b)
{
	b->rc.sq.ring->cons_head = b->rc.sq.ring->prod_tail;
	b->rc.rq.ring->cons_head = b->rc.rq.ring->prod_tail;
	b->ud.sq.ring->cons_head = b->ud.sq.ring->prod_tail;
	b->ud.rq.ring->cons_head = b->ud.rq.ring->prod_tail;
	memset(b->ctx.uar, 0, 16);
}

static uint32_t uar_word(struct bench *b, unsigned offset)
{
	uint32_t v;

	memcpy(&v, (char *)b->ctx.uar + offset, sizeof(v));
	return v;
}

/* The device completes a send WR of the RC QP: one CQE, then the producer index. */
static void push_cqe(struct bench *b)
{
	uint32_t slot = b->cq_prod & (CQ_SLOTS - 1);
	struct pvrdma_cqe *cqe =
		(struct pvrdma_cqe *)((char *)b->cq.buf.buf + PAGE) + slot;

	memset(cqe, 0, sizeof(*cqe));
	cqe->wr_id = b->next_cqe_id++;
	cqe->qp = RC_HANDLE;
	cqe->opcode = PVRDMA_WC_SEND;
	cqe->status = PVRDMA_WC_SUCCESS;
	cqe->byte_len = 64;
	cqe->port_num = 1;
	b->cq_prod = ring_next(b->cq_prod, CQ_SLOTS);
	b->cq.ring_page->rx.prod_tail = b->cq_prod;
}

static void check_send(const char *key, struct bench *b, struct fake_qp *qp, uint32_t prod0,
		       const struct ibv_send_wr *wr, unsigned n)
{
	CHECK(key, qp->sq.ring->prod_tail == ((prod0 + n) & (2 * SQ_SLOTS - 1)));
	CHECK(key, uar_word(b, PVRDMA_UAR_QP_OFFSET) == (PVRDMA_UAR_QP_SEND | qp->qp_handle));
	for (unsigned i = 0; i < n; i++, wr = wr->next) {
		uint32_t slot = (prod0 + i) & (SQ_SLOTS - 1);
		const char *w = (const char *)qp->sbuf.buf + PAGE + slot * SQ_WQE_SIZE;
		const struct pvrdma_sq_wqe_hdr *hdr = (const void *)w;
		const struct pvrdma_sge *sge = (const void *)(hdr + 1);

		CHECK(key, wr != NULL);
		CHECK(key, hdr->wr_id == wr->wr_id && qp->sq.wrid[slot] == wr->wr_id);
		CHECK(key, hdr->num_sge == 1 && hdr->opcode == (uint32_t)wr->opcode);
		CHECK(key, hdr->send_flags == IBV_SEND_SIGNALED);
		CHECK(key, sge->addr == wr->sg_list->addr && sge->length == 64 && sge->lkey == LKEY);
		if (wr->opcode == IBV_WR_RDMA_WRITE)
			CHECK(key, hdr->wr.rdma.remote_addr == wr->wr.rdma.remote_addr &&
					   hdr->wr.rdma.rkey == RKEY);
		if (qp->ibv_qp.qp_type == IBV_QPT_UD)
			CHECK(key, hdr->wr.ud.remote_qpn == UD_HANDLE &&
					   hdr->wr.ud.remote_qkey == QKEY &&
					   !memcmp(&hdr->wr.ud.av, &b->ah.av, sizeof(b->ah.av)));
	}
	CHECK(key, wr == NULL);
}

static void check_recv(const char *key, struct bench *b, uint32_t prod0,
		       const struct ibv_recv_wr *wr, unsigned n)
{
	struct fake_qp *qp = &b->rc;

	CHECK(key, qp->rq.ring->prod_tail == ((prod0 + n) & (2 * RQ_SLOTS - 1)));
	CHECK(key, uar_word(b, PVRDMA_UAR_QP_OFFSET) == (PVRDMA_UAR_QP_RECV | qp->qp_handle));
	for (unsigned i = 0; i < n; i++, wr = wr->next) {
		uint32_t slot = (prod0 + i) & (RQ_SLOTS - 1);
		const char *w = (const char *)qp->rbuf.buf + slot * RQ_WQE_SIZE;
		const struct pvrdma_rq_wqe_hdr *hdr = (const void *)w;
		const struct pvrdma_sge *sge = (const void *)(hdr + 1);

		CHECK(key, wr != NULL);
		CHECK(key, hdr->wr_id == wr->wr_id && qp->rq.wrid[slot] == wr->wr_id);
		CHECK(key, hdr->num_sge == 1);
		CHECK(key, sge->addr == wr->sg_list->addr && sge->length == 64 && sge->lkey == LKEY);
	}
	CHECK(key, wr == NULL);
}

static void check_poll(const char *key, struct bench *b, int got, int want, uint64_t first_id)
{
	CHECK(key, got == want);
	CHECK(key, b->cq.ring_page->rx.cons_head == b->cq_prod);
	for (int i = 0; i < got; i++) {
		const struct ibv_wc *wc = &b->wc[i];

		CHECK(key, wc->wr_id == first_id + (uint64_t)i);
		CHECK(key, wc->status == IBV_WC_SUCCESS && wc->opcode == IBV_WC_SEND);
		CHECK(key, wc->qp_num == RC_HANDLE && wc->byte_len == 64);
	}
	if (want == 0)
		CHECK(key, uar_word(b, PVRDMA_UAR_CQ_OFFSET) == (PVRDMA_UAR_CQ_POLL | CQ_NUMBER));
}

/* One repetition of a scenario: the device's part, the measured call, the checks. */
static void run_once(const char *key, struct bench *b)
{
	uint32_t sprod = b->rc.sq.ring->prod_tail;
	uint32_t uprod = b->ud.sq.ring->prod_tail;
	uint32_t rprod = b->rc.rq.ring->prod_tail;
	uint64_t first_id = b->next_cqe_id;
	int r;

	if (!strcmp(key, "empty")) {
		CHECK(key, bench_empty(b) == 0);
	} else if (!strcmp(key, "post_send_1")) {
		CHECK(key, bench_post_send_1(b) == 0);
		check_send(key, b, &b->rc, sprod, &b->send1, 1);
	} else if (!strcmp(key, "post_send_16")) {
		CHECK(key, bench_post_send_16(b) == 0);
		check_send(key, b, &b->rc, sprod, b->send16, 16);
	} else if (!strcmp(key, "write_16")) {
		CHECK(key, bench_write_16(b) == 0);
		check_send(key, b, &b->rc, sprod, b->write16, 16);
	} else if (!strcmp(key, "post_send_ud_1")) {
		CHECK(key, bench_post_send_ud_1(b) == 0);
		check_send(key, b, &b->ud, uprod, &b->ud_send1, 1);
	} else if (!strcmp(key, "post_recv_1")) {
		CHECK(key, bench_post_recv_1(b) == 0);
		check_recv(key, b, rprod, &b->recv1, 1);
	} else if (!strcmp(key, "post_recv_16")) {
		CHECK(key, bench_post_recv_16(b) == 0);
		check_recv(key, b, rprod, b->recv16, 16);
	} else if (!strcmp(key, "poll_1")) {
		push_cqe(b);
		r = bench_poll_1(b);
		check_poll(key, b, r, 1, first_id);
	} else if (!strcmp(key, "poll_16")) {
		for (int i = 0; i < 16; i++)
			push_cqe(b);
		r = bench_poll_16(b);
		check_poll(key, b, r, 16, first_id);
	} else if (!strcmp(key, "poll_empty")) {
		r = bench_poll_empty(b);
		check_poll(key, b, r, 0, first_id);
	} else {
		fail(key, "unknown scenario");
	}
	consume(b);
}

static const char *const keys[] = {
	"post_send_1", "post_send_16", "post_recv_1", "post_recv_16", "poll_1", "poll_16",
	"poll_empty", "post_send_ud_1", "write_16", "empty",
};

int main(int argc, char **argv)
{
	const char *which = argc > 1 ? argv[1] : "all";
	int all = !strcmp(which, "all");
	int known = all;
	struct bench *b = setup();

	/* One uncounted round trip through each provider function first (bench_* is counted on
	 * every call, so the warm-up calls the provider directly). */
	CHECK("warm-up", PROVIDER(pvrdma_post_send)(&b->rc.ibv_qp, &b->send1, &b->bad_send) == 0);
	CHECK("warm-up", PROVIDER(pvrdma_post_recv)(&b->rc.ibv_qp, &b->recv1, &b->bad_recv) == 0);
	push_cqe(b);
	CHECK("warm-up", PROVIDER(pvrdma_poll_cq)(&b->cq.ibv_cq, 16, b->wc) == 1);
	consume(b);

	for (size_t k = 0; k < sizeof(keys) / sizeof(keys[0]); k++) {
		if (!all && strcmp(which, keys[k]))
			continue;
		known = 1;
		for (int rep = 0; rep < REPS; rep++)
			run_once(keys[k], b);
	}
	if (!known)
		fail(which, "unknown scenario");
	printf("scenario %s: ok\n", which);
	return 0;
}

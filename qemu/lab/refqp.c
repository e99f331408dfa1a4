/* The reference side of the lab: what Linux's own vmw_pvrdma driver (with rdma-core's
 * provider) reports for the same device, printed in the bareverbs unikernel's format so the
 * two can be compared line by line (qemu/lab/compare.sh). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

static const unsigned cap_sets[4][4] = {
    {1, 1, 1, 1}, {16, 16, 2, 2}, {100, 50, 4, 3}, {2048, 1, 4, 1}};

static int create(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
                  enum ibv_qp_type type, const char *name, const unsigned c[4]) {
    struct ibv_qp_init_attr a = {0};
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.qp_type = type;
    a.cap.max_send_wr = c[0];
    a.cap.max_recv_wr = c[1];
    a.cap.max_send_sge = c[2];
    a.cap.max_recv_sge = c[3];
    struct ibv_qp *qp = ibv_create_qp(pd, &a);
    if (!qp) {
        printf("%s QP: create failed (wr %u/%u sge %u/%u)\n", name, c[0], c[1], c[2], c[3]);
        return 1;
    }
    /* The same line as the unikernel, without the QP number (numbers differ by run). */
    printf("%s QP: asked wr %u/%u sge %u/%u -> got wr %u/%u sge %u/%u inline %u\n", name, c[0],
           c[1], c[2], c[3], a.cap.max_send_wr, a.cap.max_recv_wr, a.cap.max_send_sge,
           a.cap.max_recv_sge, a.cap.max_inline_data);
    ibv_destroy_qp(qp);
    return 0;
}

int main(void) {
    int n = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list || n == 0) {
        printf("reference: no RDMA device\n");
        return 1;
    }
    struct ibv_context *ctx = ibv_open_device(list[0]);
    if (!ctx) {
        printf("reference: cannot open %s\n", ibv_get_device_name(list[0]));
        return 1;
    }
    struct ibv_device_attr d;
    struct ibv_port_attr p;
    if (ibv_query_device(ctx, &d) || ibv_query_port(ctx, 1, &p)) {
        printf("reference: query failed\n");
        return 1;
    }
    unsigned char *g = (unsigned char *)&d.node_guid;
    printf("device %s\n", ibv_get_device_name(list[0]));
    printf("caps: fw_ver %llu node_guid %02x%02x:%02x%02x:%02x%02x:%02x%02x max_mr_size %#llx\n",
           (unsigned long long)strtoull(d.fw_ver + (strrchr(d.fw_ver, '.') ? strrchr(d.fw_ver, '.') - d.fw_ver + 1 : 0), NULL, 10),
           g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], (unsigned long long)d.max_mr_size);
    printf("caps: max_qp %d max_qp_wr %d max_sge %d max_cq %d max_cqe %d max_mr %d max_pd %d\n",
           d.max_qp, d.max_qp_wr, d.max_sge, d.max_cq, d.max_cqe, d.max_mr, d.max_pd);
    printf("caps: max_srq %d max_srq_wr %d max_srq_sge %d max_ah %d gid_tbl_len %d max_pkeys %d ports %d\n",
           d.max_srq, d.max_srq_wr, d.max_srq_sge, d.max_ah, p.gid_tbl_len, d.max_pkeys,
           d.phys_port_cnt);
    static const char *states[] = {"Nop", "Down", "Init", "Armed", "Active", "ActiveDefer"};
    printf("port 1: state %s, max_mtu %d, active_mtu %d, gid_tbl_len %d, max_msg_sz %u\n",
           p.state <= 5 ? states[p.state] : "?", 128 << p.max_mtu, 128 << p.active_mtu,
           p.gid_tbl_len, p.max_msg_sz);
    struct ibv_pd *pd = ibv_alloc_pd(ctx);
    struct ibv_cq *scq = ibv_create_cq(ctx, 4096, NULL, NULL, 0);
    struct ibv_cq *rcq = ibv_create_cq(ctx, 100, NULL, NULL, 0);
    if (!pd || !scq || !rcq) {
        printf("reference: PD/CQ creation failed\n");
        return 1;
    }
    printf("CQs of %d and %d entries (asked 4096, 100)\n", scq->cqe, rcq->cqe);
    int bad = 0;
    for (int i = 0; i < 4; i++) {
        bad |= create(pd, scq, rcq, IBV_QPT_RC, "RC", cap_sets[i]);
        bad |= create(pd, scq, rcq, IBV_QPT_UD, "UD", cap_sets[i]);
    }
    struct ibv_qp_init_attr uc = {.send_cq = scq, .recv_cq = rcq, .qp_type = IBV_QPT_UC,
                                  .cap = {1, 1, 1, 1, 0}};
    struct ibv_qp *q = ibv_create_qp(pd, &uc);
    printf("UC: %s\n", q ? "created" : "refused");
    if (q)
        ibv_destroy_qp(q);
    printf("reference: done\n");
    return bad;
}

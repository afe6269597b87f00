// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//
// netdev-qstats [--lines] [--napi] IFNAME: per-queue packet/byte counters of a network device, read through
// the "netdev" generic netlink family (NETDEV_CMD_QSTATS_GET, scope queue; Linux >= 6.10).
// virtio_net in 6.12 reports its per-queue packet counts only this way (its `ethtool -S`
// no longer has rx_queue_N_packets); 6.1 has no netdev family, so the tool prints
// {"supported":false,...} there and guest init falls back to ethtool -S.
//
// --napi: instead, the NAPI id of each RX queue (NETDEV_CMD_QUEUE_GET), to map the
// SO_INCOMING_NAPI_ID values arfs-echo records to queues:
//   {"supported":true,"rx_napi_ids":[{"queue":0,"napi_id":N},...]}   (--lines: "rx QUEUE NAPI_ID")
//
// Output (one line of JSON on stdout; with --lines: "supported" then "rx|tx QUEUE PACKETS BYTES"
// lines, or "unsupported REASON"):
//   {"supported":true,"rx":[{"queue":0,"packets":N,"bytes":N},...],"tx":[...]}
//   {"supported":false,"error":"..."}
// Exit status 0 in both cases; 2 on usage errors.

#define _GNU_SOURCE
#include <errno.h>
#include <linux/genetlink.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

// include/uapi/linux/netdev.h (6.12); defined here so the tool builds with older headers.
#define NETDEV_CMD_QSTATS_GET 12
#define NETDEV_A_QSTATS_IFINDEX 1
#define NETDEV_A_QSTATS_QUEUE_TYPE 2
#define NETDEV_A_QSTATS_QUEUE_ID 3
#define NETDEV_A_QSTATS_SCOPE 4
#define NETDEV_A_QSTATS_RX_PACKETS 8
#define NETDEV_A_QSTATS_RX_BYTES 9
#define NETDEV_A_QSTATS_TX_PACKETS 10
#define NETDEV_A_QSTATS_TX_BYTES 11
#define NETDEV_QSTATS_SCOPE_QUEUE 1
#define NETDEV_QUEUE_TYPE_RX 0
#define NETDEV_QUEUE_TYPE_TX 1
#define NETDEV_CMD_QUEUE_GET 10
#define NETDEV_A_QUEUE_ID 1
#define NETDEV_A_QUEUE_IFINDEX 2
#define NETDEV_A_QUEUE_TYPE 3
#define NETDEV_A_QUEUE_NAPI_ID 4

#define MAXQ 1024

struct qs {
	int seen;
	uint64_t packets, bytes;
	uint32_t napi_id;
};
static struct qs rxq[MAXQ], txq[MAXQ];

static int lines_mode;

static void unsupported(const char *why)
{
	if (lines_mode)
		printf("unsupported %s\n", why);
	else
		printf("{\"supported\":false,\"error\":\"%s\"}\n", why);
	exit(0);
}

static int nl_open(void)
{
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_GENERIC);
	if (fd < 0)
		unsupported("socket(NETLINK_GENERIC) failed");
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		unsupported("bind failed");
	return fd;
}

struct req {
	struct nlmsghdr n;
	struct genlmsghdr g;
	char buf[256];
};

static void add_attr(struct req *r, uint16_t type, const void *data, uint16_t len)
{
	struct nlattr *a = (struct nlattr *)((char *)r + NLMSG_ALIGN(r->n.nlmsg_len));
	a->nla_type = type;
	a->nla_len = (uint16_t)(NLA_HDRLEN + len);
	memcpy((char *)a + NLA_HDRLEN, data, len);
	r->n.nlmsg_len = NLMSG_ALIGN(r->n.nlmsg_len) + NLA_ALIGN(a->nla_len);
}

static uint64_t nla_uint(const struct nlattr *a)
{
	size_t len = a->nla_len - NLA_HDRLEN;
	const char *d = (const char *)a + NLA_HDRLEN;
	if (len == 8) {
		uint64_t v;
		memcpy(&v, d, 8);
		return v;
	}
	if (len == 4) {
		uint32_t v;
		memcpy(&v, d, 4);
		return v;
	}
	return 0;
}

// Walk attributes in [p, p+len) calling cb for each well-formed one.
#define FOR_EACH_ATTR(a, p, len)                                                            \
	for (struct nlattr *a = (struct nlattr *)(p); (char *)a + NLA_HDRLEN <= (char *)(p) + (len) && \
	     a->nla_len >= NLA_HDRLEN && (char *)a + a->nla_len <= (char *)(p) + (len);        \
	     a = (struct nlattr *)((char *)a + NLA_ALIGN(a->nla_len)))

static int resolve_family(int fd)
{
	struct req r;
	memset(&r, 0, sizeof(r));
	r.n.nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN);
	r.n.nlmsg_type = GENL_ID_CTRL;
	r.n.nlmsg_flags = NLM_F_REQUEST;
	r.n.nlmsg_seq = 1;
	r.g.cmd = CTRL_CMD_GETFAMILY;
	r.g.version = 1;
	add_attr(&r, CTRL_ATTR_FAMILY_NAME, "netdev", 7);
	if (send(fd, &r, r.n.nlmsg_len, 0) < 0)
		unsupported("send GETFAMILY failed");
	static char buf[16384];
	ssize_t got = recv(fd, buf, sizeof(buf), 0);
	if (got < (ssize_t)NLMSG_HDRLEN)
		unsupported("recv GETFAMILY failed");
	int n = (int)got;
	for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
		if (h->nlmsg_type == NLMSG_ERROR)
			unsupported("no netdev netlink family (kernel < 6.10?)");
		if (h->nlmsg_type != GENL_ID_CTRL || h->nlmsg_len < NLMSG_LENGTH(GENL_HDRLEN))
			continue;
		char *p = (char *)NLMSG_DATA(h) + GENL_HDRLEN;
		size_t len = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);
		FOR_EACH_ATTR(a, p, len) {
			if (a->nla_type == CTRL_ATTR_FAMILY_ID && a->nla_len >= NLA_HDRLEN + 2) {
				uint16_t id;
				memcpy(&id, (char *)a + NLA_HDRLEN, 2);
				return id;
			}
		}
	}
	unsupported("netdev family id not found");
	return -1;
}

int main(int argc, char **argv)
{
	int napi_mode = 0;
	while (argc > 2 && argv[1][0] == '-') {
		if (strcmp(argv[1], "--lines") == 0)
			lines_mode = 1;
		else if (strcmp(argv[1], "--napi") == 0)
			napi_mode = 1;
		else
			break;
		argv++;
		argc--;
	}
	if (argc != 2) {
		fprintf(stderr, "usage: netdev-qstats [--lines] [--napi] IFNAME\n");
		return 2;
	}
	unsigned ifindex = if_nametoindex(argv[1]);
	if (!ifindex)
		unsupported("no such interface");
	int fd = nl_open();
	int fam = resolve_family(fd);

	struct req r;
	memset(&r, 0, sizeof(r));
	r.n.nlmsg_len = NLMSG_LENGTH(GENL_HDRLEN);
	r.n.nlmsg_type = (uint16_t)fam;
	r.n.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	r.n.nlmsg_seq = 2;
	uint32_t ifi = ifindex, scope = NETDEV_QSTATS_SCOPE_QUEUE;
	r.g.version = 1;
	if (napi_mode) {
		r.g.cmd = NETDEV_CMD_QUEUE_GET;
		add_attr(&r, NETDEV_A_QUEUE_IFINDEX, &ifi, 4);
	} else {
		r.g.cmd = NETDEV_CMD_QSTATS_GET;
		add_attr(&r, NETDEV_A_QSTATS_IFINDEX, &ifi, 4);
		add_attr(&r, NETDEV_A_QSTATS_SCOPE, &scope, 4);
	}
	if (send(fd, &r, r.n.nlmsg_len, 0) < 0)
		unsupported("send failed");

	static char buf[65536];
	int done = 0;
	while (!done) {
		ssize_t got = recv(fd, buf, sizeof(buf), 0);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			unsupported("recv QSTATS_GET failed");
		}
		if (got == 0)
			break;
		int n = (int)got;
		for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, n); h = NLMSG_NEXT(h, n)) {
			if (h->nlmsg_type == NLMSG_DONE) {
				done = 1;
				break;
			}
			if (h->nlmsg_type == NLMSG_ERROR) {
				struct nlmsgerr *e = NLMSG_DATA(h);
				if (h->nlmsg_len >= NLMSG_LENGTH(sizeof(*e)) && e->error == 0)
					continue;
				unsupported(napi_mode ? "QUEUE_GET rejected" : "QSTATS_GET rejected (driver without queue stats?)");
			}
			if (h->nlmsg_type != fam || h->nlmsg_len < NLMSG_LENGTH(GENL_HDRLEN))
				continue;
			char *p = (char *)NLMSG_DATA(h) + GENL_HDRLEN;
			size_t len = h->nlmsg_len - NLMSG_LENGTH(GENL_HDRLEN);
			int64_t type = -1, qid = -1;
			uint64_t v[4] = { 0, 0, 0, 0 };
			if (napi_mode) {
				uint32_t napi = 0;
				FOR_EACH_ATTR(a, p, len) {
					switch (a->nla_type) {
					case NETDEV_A_QUEUE_ID: qid = (int64_t)nla_uint(a); break;
					case NETDEV_A_QUEUE_TYPE: type = (int64_t)nla_uint(a); break;
					case NETDEV_A_QUEUE_NAPI_ID: napi = (uint32_t)nla_uint(a); break;
					}
				}
				if (qid >= 0 && qid < MAXQ && type == NETDEV_QUEUE_TYPE_RX)
					rxq[qid] = (struct qs){ 1, 0, 0, napi };
				else if (qid >= 0 && qid < MAXQ && type == NETDEV_QUEUE_TYPE_TX)
					txq[qid] = (struct qs){ 1, 0, 0, napi };
				continue;
			}
			FOR_EACH_ATTR(a, p, len) {
				switch (a->nla_type) {
				case NETDEV_A_QSTATS_QUEUE_TYPE: type = (int64_t)nla_uint(a); break;
				case NETDEV_A_QSTATS_QUEUE_ID: qid = (int64_t)nla_uint(a); break;
				case NETDEV_A_QSTATS_RX_PACKETS: v[0] = nla_uint(a); break;
				case NETDEV_A_QSTATS_RX_BYTES: v[1] = nla_uint(a); break;
				case NETDEV_A_QSTATS_TX_PACKETS: v[2] = nla_uint(a); break;
				case NETDEV_A_QSTATS_TX_BYTES: v[3] = nla_uint(a); break;
				}
			}
			if (qid < 0 || qid >= MAXQ)
				continue;
			if (type == NETDEV_QUEUE_TYPE_RX) {
				rxq[qid] = (struct qs){ 1, v[0], v[1], 0 };
			} else if (type == NETDEV_QUEUE_TYPE_TX) {
				txq[qid] = (struct qs){ 1, v[2], v[3], 0 };
			}
		}
	}
	if (napi_mode) {
		if (lines_mode)
			printf("supported\n");
		else
			printf("{\"supported\":true,\"rx_napi_ids\":[");
		int k = 0;
		for (int q = 0; q < MAXQ; q++) {
			if (!rxq[q].seen)
				continue;
			if (lines_mode)
				printf("rx %d %u\n", q, rxq[q].napi_id);
			else
				printf("%s{\"queue\":%d,\"napi_id\":%u}", k++ ? "," : "", q, rxq[q].napi_id);
		}
		if (!lines_mode)
			printf("]}\n");
		close(fd);
		return 0;
	}
	if (lines_mode) {
		printf("supported\n");
		for (int q = 0; q < MAXQ; q++)
			if (rxq[q].seen)
				printf("rx %d %llu %llu\n", q, (unsigned long long)rxq[q].packets,
				       (unsigned long long)rxq[q].bytes);
		for (int q = 0; q < MAXQ; q++)
			if (txq[q].seen)
				printf("tx %d %llu %llu\n", q, (unsigned long long)txq[q].packets,
				       (unsigned long long)txq[q].bytes);
		return 0;
	}
	printf("{\"supported\":true,\"rx\":[");
	int k = 0;
	for (int q = 0; q < MAXQ; q++)
		if (rxq[q].seen)
			printf("%s{\"queue\":%d,\"packets\":%llu,\"bytes\":%llu}", k++ ? "," : "", q,
			       (unsigned long long)rxq[q].packets, (unsigned long long)rxq[q].bytes);
	printf("],\"tx\":[");
	k = 0;
	for (int q = 0; q < MAXQ; q++)
		if (txq[q].seen)
			printf("%s{\"queue\":%d,\"packets\":%llu,\"bytes\":%llu}", k++ ? "," : "", q,
			       (unsigned long long)txq[q].packets, (unsigned long long)txq[q].bytes);
	printf("]}\n");
	close(fd);
	return 0;
}

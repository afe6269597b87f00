// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
//
// arfs-echo: UDP echo server for arfsnic guests.
//
// One *connected* UDP socket per flow (RFS only records flows of connected UDP /
// established TCP sockets), flows spread over W worker threads, each worker with its own
// epoll set. Workers can be made to migrate between CPUs on a schedule, which is what makes
// RFS (and aRFS, via ndo_rx_flow_steer) move flows. In the work-stealing pattern the
// workers instead share one epoll set of one-shot flow sockets, so a flow is served by
// whichever worker (CPU) is free when its next request arrives.
//
// Request payload (>= 16 bytes):
//   0..4   magic "ARFS"
//   4..8   flow index (u32, big endian)
//   8..12  sequence number (u32, big endian)
//   12..16 reserved
// The reply echoes the payload with bytes 12..16 replaced by the CPU that served the
// request (sched_getcpu(), u32 big endian). Requests that are too short or carry a wrong
// magic are counted and dropped.
//
// --proto tcp: one listening socket; the link partner connects (one connection per flow
// slot, or a connection per request/response with tcp-crr) and sends messages of exactly
// --msg-size bytes in the same layout; each is answered the same way (--tcp-mode echo) or
// read and discarded (--tcp-mode sink). The flow index in a message picks the flow record
// its counters go to. Workers and patterns as for UDP; with work-stealing the listening
// socket and every connection sit one-shot in the shared epoll set.
//
// At the end one JSON object is printed on stdout between the lines
// ARFS-ECHO-JSON-BEGIN and ARFS-ECHO-JSON-END (format: guest-tests/workload/README.md).

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define MAX_FLOWS 65536
#define MAX_WORKERS 1024
#define MAX_CPUS 1024
#define RX_BUF 65536
#define BATCH 64
#define HOP_LOG 4096 // hop times kept per worker (41 s of 10 ms periods)
// Delivery tables (count_delivery()): open addressing, at most half full, so a probe
// always ends at a free slot. Per worker while serving, merged into one at the end.
#define DELIV_SLOTS 1024
#define DELIV_MAX (DELIV_SLOTS / 2)
#define DELIV_OUT_SLOTS 4096
#define DELIV_OUT_MAX (DELIV_OUT_SLOTS / 2)

enum pattern {
	PAT_NONE, PAT_SCHEDULER, PAT_HOP_WITHIN_LLC, PAT_HOP_ACROSS_LLC, PAT_WORK_STEALING,
	NR_PATTERNS
};
static const char *pattern_names[NR_PATTERNS] = {
	"none", "scheduler", "hop-within-llc", "hop-across-llc", "work-stealing",
};
#define PATTERN_LIST "none|scheduler|hop-within-llc|hop-across-llc|work-stealing"

#define MAX_MSG 65536
#define MAX_CONNS 65536
// epoll data of the listening socket; a connection's is (generation << 32) | index.
#define LISTEN_EV UINT64_MAX

enum proto { PROTO_UDP, PROTO_TCP };
enum tcp_mode { TCP_ECHO, TCP_SINK };

struct flow {
	int fd;
	uint32_t idx;
	uint64_t requests;   // valid requests received
	uint64_t replies;    // replies sent successfully
	uint64_t send_errors;
	uint64_t flow_mismatch; // payload flow index != socket's flow index (still answered)
	int last_cpu;
	uint64_t cpu_changes; // reads on another CPU than the flow's previous read
	uint64_t *cpu_counts; // [ncpu_ids]
	// Sampled once per wakeup of the socket (not per packet): SO_INCOMING_CPU is the CPU
	// that ran the protocol receive for the last datagram (after RPS/RFS steering),
	// SO_INCOMING_NAPI_ID identifies the RX queue's NAPI context it arrived on.
	uint64_t samples;
	int last_incoming_cpu;
	unsigned last_napi_id;
	uint64_t *incoming_cpu_counts; // [ncpu_ids], per sample
	uint64_t napi_changes;         // samples whose NAPI id differs from the previous one
	int last_worker;               // worker that served the last request (-1: none)
	unsigned peer_port;            // TCP: peer port of the last connection that used it
};

// A TCP connection. Under work stealing one worker at a time owns it (EPOLLONESHOT);
// otherwise the worker whose epoll set holds it. The generation tells a stale event of a
// closed connection from one of the connection that reuses the slot.
struct conn {
	int fd;               // -1: free
	uint32_t gen;
	uint32_t slot;        // flow record of the last message
	unsigned peer_port;
	uint32_t fill;        // bytes of the message being read
	uint32_t out_off;     // reply bytes sent so far; pending while out_off < out_len
	uint32_t out_len;
	int epfd;             // the set it is registered in
	unsigned char *buf;   // msg_size bytes
};

// How requests were delivered: the NAPI (RX queue) and the CPU whose softirq queued the
// datagram to the socket (SO_INCOMING_NAPI_ID, SO_INCOMING_CPU: after RPS/RFS), and the
// CPU that served it (sched_getcpu()). count == 0 marks a free slot.
struct delivery {
	unsigned napi_id;
	int incoming_cpu;
	int app_cpu;
	uint64_t count;
};

struct deliv_table {
	struct delivery *slot; // [nslots], nslots a power of two
	uint32_t nslots;
	uint32_t max;          // distinct triples kept at most (<= nslots / 2)
	uint32_t used;
	uint64_t overflow;     // requests whose triple found the table full
};

struct worker {
	pthread_t thr;
	int id;
	int epfd;       // work-stealing: the shared epoll set
	int start_cpu;  // -1: not pinned
	int cur_cpu;    // CPU it is pinned to now (-1: not pinned)
	int last_seen_cpu;
	uint64_t migrations;      // successful pin changes
	uint64_t migrate_errors;
	uint64_t hops;
	uint32_t *hop_us; // when each of the first HOP_LOG hops was done, µs after the epoch
	uint64_t bad_short;
	uint64_t bad_magic;
	uint64_t recv_errors;
	uint64_t served;
	uint32_t nflows; // work-stealing: every flow (all are in the shared set)
	uint32_t *flows; // flow indices (unused with work-stealing)
	struct deliv_table deliv;
	char pad[64];
};

static struct {
	uint32_t flows;
	uint32_t base_port;
	uint32_t peer_base_port;
	char peer[64];
	char bind_addr[64];
	uint32_t workers;
	enum pattern pattern;
	uint32_t period_ms;
	double duration_s;
	int quiet;
	enum proto proto;
	uint32_t msg_size;
	enum tcp_mode tcp_mode;
	uint32_t max_conns;
} cfg = {
	.flows = 16, .base_port = 5000, .peer_base_port = 6000, .peer = "", .bind_addr = "",
	.workers = 0, .pattern = PAT_NONE, .period_ms = 100, .duration_s = 10,
	.proto = PROTO_UDP, .msg_size = 64, .tcp_mode = TCP_ECHO, .max_conns = 4096,
};

// TCP: the listening socket, the connections and their free list, the counters.
static int listen_fd = -1;
static struct conn *conns;
static uint32_t *conn_free;
static uint32_t nconn_free;
static pthread_mutex_t conn_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
	uint64_t accepted, closed, conn_errors, refused, bytes_in, bytes_out, accept_errors;
	uint64_t open;
} tcp_st; // updated under conn_lock (accept/close) or with __atomic adds (bytes)

static int ncpu_ids;                  // highest possible CPU id + 1
static int online[MAX_CPUS], nonline; // online CPUs in ascending order
static int llc_of[MAX_CPUS];          // group index per CPU id, -1 if offline/unknown
static int ngroups;
static int group_cpus[MAX_CPUS][256];
static int group_size[MAX_CPUS];
static const char *llc_source = "none";

static struct flow *flows;
static struct worker *workers;
static volatile sig_atomic_t stop_flag;
static double hop_epoch; // hop-* patterns: the workers' common start (now_s())
// When the first request was read, in µs after hop_epoch (+1, so 0 means none yet): the
// link partner starts sending after "ready", and model mode starts its traffic that late.
static uint64_t first_request_us;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "arfs-echo: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	exit(1);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void note_first_request(void)
{
	if (__atomic_load_n(&first_request_us, __ATOMIC_RELAXED))
		return;
	double dt = now_s() - hop_epoch;
	uint64_t us = dt > 0 ? (uint64_t)(dt * 1e6) + 1 : 1;
	uint64_t none = 0;
	__atomic_compare_exchange_n(&first_request_us, &none, us, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}

// Parse a Linux cpu list ("0-3,8,10-11") into a bitmap; returns number of CPUs set.
static int parse_cpulist(const char *s, unsigned char *bits, int nbits)
{
	int n = 0;
	while (*s && *s != '\n') {
		char *end;
		long a = strtol(s, &end, 10), b;
		if (end == s)
			break;
		b = a;
		s = end;
		if (*s == '-') {
			b = strtol(s + 1, &end, 10);
			if (end == s + 1)
				break;
			s = end;
		}
		for (long c = a; c <= b && c < nbits; c++)
			if (c >= 0 && !bits[c]) {
				bits[c] = 1;
				n++;
			}
		if (*s == ',')
			s++;
		else
			break;
	}
	return n;
}

static int read_small(const char *path, char *buf, size_t len)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	size_t n = fread(buf, 1, len - 1, f);
	fclose(f);
	buf[n] = 0;
	return (int)n;
}

static long read_long(const char *path, long dflt)
{
	char buf[64];
	if (read_small(path, buf, sizeof(buf)) <= 0)
		return dflt;
	return strtol(buf, NULL, 10);
}

static void discover_cpus(void)
{
	static unsigned char bits[MAX_CPUS];
	char buf[4096];
	memset(bits, 0, sizeof(bits));
	if (read_small("/sys/devices/system/cpu/online", buf, sizeof(buf)) > 0 &&
	    parse_cpulist(buf, bits, MAX_CPUS) > 0) {
		for (int c = 0; c < MAX_CPUS; c++)
			if (bits[c])
				online[nonline++] = c;
	} else {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		if (n < 1)
			n = 1;
		if (n > MAX_CPUS)
			n = MAX_CPUS;
		for (int c = 0; c < n; c++)
			online[nonline++] = c;
	}
	ncpu_ids = online[nonline - 1] + 1;
	long conf = sysconf(_SC_NPROCESSORS_CONF);
	if (conf > ncpu_ids && conf <= MAX_CPUS)
		ncpu_ids = (int)conf;
}

// LLC groups: the cache index whose level is 3 (normally index3), shared_cpu_list;
// fallback: same (physical_package_id, die_id).
static void discover_llc(void)
{
	char path[256], buf[4096];
	static char keys[MAX_CPUS][1024];
	int have_cache = 1;

	for (int i = 0; i < nonline; i++) {
		int c = online[i];
		keys[c][0] = 0;
		int found = 0;
		for (int idx = 0; idx < 8 && !found; idx++) {
			snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/cache/index%d/level", c, idx);
			long lvl = read_long(path, -1);
			if (lvl < 0 && idx > 3)
				break;
			if (lvl != 3)
				continue;
			snprintf(path, sizeof(path),
				 "/sys/devices/system/cpu/cpu%d/cache/index%d/shared_cpu_list", c, idx);
			if (read_small(path, buf, sizeof(buf)) > 0) {
				buf[strcspn(buf, "\n")] = 0;
				snprintf(keys[c], sizeof(keys[c]), "L3:%.1000s", buf);
				found = 1;
			}
		}
		if (!found) {
			snprintf(path, sizeof(path),
				 "/sys/devices/system/cpu/cpu%d/cache/index3/shared_cpu_list", c);
			if (read_small(path, buf, sizeof(buf)) > 0) {
				buf[strcspn(buf, "\n")] = 0;
				snprintf(keys[c], sizeof(keys[c]), "L3:%.1000s", buf);
				found = 1;
			}
		}
		if (!found)
			have_cache = 0;
	}
	if (have_cache) {
		llc_source = "cache/index3/shared_cpu_list";
	} else {
		llc_source = "topology/physical_package_id+die_id";
		for (int i = 0; i < nonline; i++) {
			int c = online[i];
			snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/physical_package_id", c);
			long pkg = read_long(path, 0);
			snprintf(path, sizeof(path), "/sys/devices/system/cpu/cpu%d/topology/die_id", c);
			long die = read_long(path, 0);
			snprintf(keys[c], sizeof(keys[c]), "P%ld:D%ld", pkg, die);
		}
	}
	for (int c = 0; c < MAX_CPUS; c++)
		llc_of[c] = -1;
	ngroups = 0;
	for (int i = 0; i < nonline; i++) {
		int c = online[i], g;
		for (g = 0; g < ngroups; g++)
			if (strcmp(keys[group_cpus[g][0]], keys[c]) == 0)
				break;
		if (g == ngroups)
			ngroups++;
		if (group_size[g] < (int)(sizeof(group_cpus[0]) / sizeof(group_cpus[0][0])))
			group_cpus[g][group_size[g]++] = c;
		llc_of[c] = g;
	}
}

static int pin_self(int cpu)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	return sched_setaffinity(0, sizeof(set), &set); // 0 = calling thread
}

// Next CPU for a hopping worker.
static int next_cpu(struct worker *w)
{
	int cur = w->cur_cpu >= 0 ? w->cur_cpu : w->start_cpu;
	int g = llc_of[cur];
	if (g < 0)
		return cur;
	if (cfg.pattern == PAT_HOP_WITHIN_LLC || ngroups < 2) {
		// stay inside the starting CPU's LLC, round-robin over its CPUs
		int sg = llc_of[w->start_cpu];
		int pos = 0;
		for (int i = 0; i < group_size[sg]; i++)
			if (group_cpus[sg][i] == cur)
				pos = i;
		return group_cpus[sg][(pos + 1) % group_size[sg]];
	}
	// hop-across-llc: go to the next LLC group; rotate the position inside it so that
	// successive visits use different CPUs of that group.
	int ng = (g + 1) % ngroups;
	int pos = (int)((w->hops + (uint64_t)w->id) % (uint64_t)group_size[ng]);
	return group_cpus[ng][pos];
}

static void sample_incoming(struct flow *f, int fd)
{
	int cpu = -1;
	unsigned napi = 0;
	socklen_t l = sizeof(cpu);
	if (getsockopt(fd, SOL_SOCKET, SO_INCOMING_CPU, &cpu, &l) < 0)
		cpu = -1;
	l = sizeof(napi);
	if (getsockopt(fd, SOL_SOCKET, SO_INCOMING_NAPI_ID, &napi, &l) < 0)
		napi = 0;
	if (f->samples && napi != f->last_napi_id)
		f->napi_changes++;
	f->samples++;
	f->last_incoming_cpu = cpu;
	f->last_napi_id = napi;
	if (cpu >= 0 && cpu < ncpu_ids)
		f->incoming_cpu_counts[cpu]++;
}

static int deliv_init(struct deliv_table *t, uint32_t nslots, uint32_t max)
{
	t->slot = calloc(nslots, sizeof(*t->slot));
	t->nslots = nslots;
	t->max = max;
	t->used = 0;
	t->overflow = 0;
	return t->slot ? 0 : -1;
}

static void deliv_add(struct deliv_table *t, unsigned napi, int in_cpu, int app_cpu, uint64_t n)
{
	uint32_t h = napi * 0x9e3779b1u;
	uint32_t mask = t->nslots - 1;

	h = (h ^ (uint32_t)in_cpu) * 0x85ebca6bu;
	h = (h ^ (uint32_t)app_cpu) * 0xc2b2ae35u;
	h ^= h >> 16;
	for (uint32_t i = 0; i < t->nslots; i++) {
		struct delivery *d = &t->slot[(h + i) & mask];

		if (!d->count) {
			if (t->used >= t->max)
				break;
			d->napi_id = napi;
			d->incoming_cpu = in_cpu;
			d->app_cpu = app_cpu;
			d->count = n;
			t->used++;
			return;
		}
		if (d->napi_id == napi && d->incoming_cpu == in_cpu && d->app_cpu == app_cpu) {
			d->count += n;
			return;
		}
	}
	t->overflow += n;
}

// Per request: count its (NAPI id, incoming CPU, app CPU) triple. The socket options
// describe the newest datagram queued to the socket, which is this request only when it
// was alone in the receive queue (docs/measuring.md, "Trade-off columns").
static void count_delivery(struct worker *w, int fd, int app_cpu)
{
	int in_cpu = -1;
	unsigned napi = 0;
	socklen_t l = sizeof(in_cpu);

	if (getsockopt(fd, SOL_SOCKET, SO_INCOMING_CPU, &in_cpu, &l) < 0)
		in_cpu = -1;
	l = sizeof(napi);
	if (getsockopt(fd, SOL_SOCKET, SO_INCOMING_NAPI_ID, &napi, &l) < 0)
		napi = 0;
	deliv_add(&w->deliv, napi, in_cpu, app_cpu, 1);
}

static void serve_flow(struct worker *w, struct flow *f, unsigned char *buf)
{
	for (int n = 0; n < BATCH; n++) {
		ssize_t len = recv(f->fd, buf, RX_BUF, MSG_DONTWAIT);
		if (len < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				w->recv_errors++; // e.g. ECONNREFUSED from an ICMP error
			// Sample once per batch, after the last packet read: the socket's
			// NAPI id/CPU then belong to the newest packet it received, so the
			// final sample of a run is the flow's last packet.
			if (n > 0)
				sample_incoming(f, f->fd);
			return;
		}
		if (len < 16) {
			w->bad_short++;
			continue;
		}
		if (memcmp(buf, "ARFS", 4) != 0) {
			w->bad_magic++;
			continue;
		}
		uint32_t fidx;
		memcpy(&fidx, buf + 4, 4);
		if (ntohl(fidx) != f->idx)
			f->flow_mismatch++;
		int cpu = sched_getcpu();
		count_delivery(w, f->fd, cpu);
		uint32_t be = htonl((uint32_t)cpu);
		memcpy(buf + 12, &be, 4);
		note_first_request();
		f->requests++;
		w->served++;
		if (cpu >= 0 && cpu < ncpu_ids)
			f->cpu_counts[cpu]++;
		if (f->last_cpu >= 0 && cpu != f->last_cpu)
			f->cpu_changes++;
		f->last_cpu = cpu;
		w->last_seen_cpu = cpu;
		f->last_worker = w->id;
		if (send(f->fd, buf, (size_t)len, MSG_DONTWAIT) == len)
			f->replies++;
		else
			f->send_errors++;
	}
	sample_incoming(f, f->fd);
}

// ---------------------------------------------------------------- TCP

static void conn_close(struct conn *c, int error)
{
	close(c->fd);
	pthread_mutex_lock(&conn_lock);
	c->fd = -1;
	c->gen++;
	conn_free[nconn_free++] = (uint32_t)(c - conns);
	tcp_st.open--;
	if (error)
		tcp_st.conn_errors++;
	else
		tcp_st.closed++;
	pthread_mutex_unlock(&conn_lock);
}

// (Re-)register a connection: reading, or only writing while a reply is pending.
static int conn_arm(struct conn *c, int op)
{
	uint32_t idx = (uint32_t)(c - conns);
	struct epoll_event ev = {
		.events = c->out_off < c->out_len ? EPOLLOUT : EPOLLIN,
		.data.u64 = ((uint64_t)c->gen << 32) | idx,
	};

	if (cfg.pattern == PAT_WORK_STEALING)
		ev.events |= EPOLLONESHOT;
	return epoll_ctl(c->epfd, op, c->fd, &ev);
}

// Accept what is waiting (up to a batch); connections go to the shared set (work
// stealing) or round robin to the workers' sets.
static void tcp_accept(struct worker *w)
{
	static uint64_t next_worker;

	for (int n = 0; n < BATCH; n++) {
		struct sockaddr_storage peer;
		socklen_t plen = sizeof(peer);
		int fd = accept4(listen_fd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
				__atomic_add_fetch(&tcp_st.accept_errors, 1, __ATOMIC_RELAXED);
			return;
		}
		pthread_mutex_lock(&conn_lock);
		if (!nconn_free) {
			tcp_st.refused++;
			pthread_mutex_unlock(&conn_lock);
			close(fd);
			continue;
		}
		struct conn *c = &conns[conn_free[nconn_free - 1]];
		if (!c->buf && !(c->buf = malloc(cfg.msg_size))) {
			tcp_st.refused++;
			pthread_mutex_unlock(&conn_lock);
			close(fd);
			continue;
		}
		nconn_free--;
		tcp_st.accepted++;
		tcp_st.open++;
		uint64_t k = next_worker++;
		pthread_mutex_unlock(&conn_lock);

		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c->fd = fd;
		c->fill = 0;
		c->out_off = c->out_len = 0;
		c->peer_port = peer.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&peer)->sin6_port)
							  : ntohs(((struct sockaddr_in *)&peer)->sin_port);
		// sink: nothing names a flow, so connections take the records in accept order
		c->slot = (uint32_t)(k % cfg.flows);
		c->epfd = cfg.pattern == PAT_WORK_STEALING ? w->epfd : workers[k % cfg.workers].epfd;
		if (conn_arm(c, EPOLL_CTL_ADD) < 0)
			conn_close(c, 1);
	}
}

// Send what is left of the pending reply. Returns -1 when the connection broke.
static int conn_flush(struct conn *c)
{
	while (c->out_off < c->out_len) {
		ssize_t n = send(c->fd, c->buf + c->out_off, c->out_len - c->out_off, MSG_DONTWAIT | MSG_NOSIGNAL);

		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? 0 : -1;
		c->out_off += (uint32_t)n;
		__atomic_add_fetch(&tcp_st.bytes_out, (uint64_t)n, __ATOMIC_RELAXED);
	}
	c->out_off = c->out_len = 0;
	return 0;
}

// One whole message in c->buf: count it in its flow record and answer it.
static int tcp_message(struct worker *w, struct conn *c)
{
	uint32_t fidx;

	if (memcmp(c->buf, "ARFS", 4) != 0) {
		w->bad_magic++; // the stream is out of step: nothing after this is a message
		return -1;
	}
	memcpy(&fidx, c->buf + 4, 4);
	fidx = ntohl(fidx);
	struct flow *f = &flows[fidx < cfg.flows ? fidx : c->slot];
	if (fidx >= cfg.flows)
		f->flow_mismatch++;
	else
		c->slot = fidx;
	f->peer_port = c->peer_port;
	int cpu = sched_getcpu();
	count_delivery(w, c->fd, cpu);
	uint32_t be = htonl((uint32_t)cpu);
	memcpy(c->buf + 12, &be, 4);
	note_first_request();
	f->requests++;
	w->served++;
	if (cpu >= 0 && cpu < ncpu_ids)
		f->cpu_counts[cpu]++;
	if (f->last_cpu >= 0 && cpu != f->last_cpu)
		f->cpu_changes++;
	f->last_cpu = cpu;
	w->last_seen_cpu = cpu;
	f->last_worker = w->id;
	c->out_off = 0;
	c->out_len = cfg.msg_size;
	if (conn_flush(c) < 0) {
		f->send_errors++;
		return -1;
	}
	f->replies++; // sent, or its rest queued until the socket has room
	return 0;
}

// Serve a ready connection: finish a pending reply, then read up to a batch of messages
// (echo) or of 64 KiB reads (sink). Returns 0 to keep the connection, -1 when it was closed.
static int tcp_serve(struct worker *w, struct conn *c, unsigned char *sinkbuf)
{
	int got = 0;

	if (conn_flush(c) < 0) {
		conn_close(c, 1);
		return -1;
	}
	for (int n = 0; n < BATCH && c->out_off >= c->out_len; n++) {
		unsigned char *dst = cfg.tcp_mode == TCP_SINK ? sinkbuf : c->buf + c->fill;
		size_t want = cfg.tcp_mode == TCP_SINK ? RX_BUF : cfg.msg_size - c->fill;
		ssize_t len = recv(c->fd, dst, want, MSG_DONTWAIT);

		if (len == 0) {
			conn_close(c, 0); // the peer closed first
			return -1;
		}
		if (len < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
				break;
			conn_close(c, 1); // reset, timeout
			return -1;
		}
		got = 1;
		__atomic_add_fetch(&tcp_st.bytes_in, (uint64_t)len, __ATOMIC_RELAXED);
		if (cfg.tcp_mode == TCP_SINK) {
			struct flow *f = &flows[c->slot];
			uint64_t before = c->fill;

			c->fill = (uint32_t)((before + (uint64_t)len) % cfg.msg_size);
			uint64_t msgs = (before + (uint64_t)len) / cfg.msg_size;
			int cpu = sched_getcpu();

			if (msgs)
				note_first_request();
			f->requests += msgs;
			w->served += msgs;
			if (cpu >= 0 && cpu < ncpu_ids)
				f->cpu_counts[cpu] += msgs;
			if (f->last_cpu >= 0 && cpu != f->last_cpu)
				f->cpu_changes++;
			f->last_cpu = cpu;
			f->last_worker = w->id;
			f->peer_port = c->peer_port;
			continue;
		}
		c->fill += (uint32_t)len;
		if (c->fill < cfg.msg_size)
			continue;
		c->fill = 0;
		if (tcp_message(w, c) < 0) {
			conn_close(c, 1);
			return -1;
		}
	}
	if (got)
		sample_incoming(&flows[c->slot], c->fd);
	return 0;
}

static void tcp_listen(void)
{
	struct sockaddr_storage local;
	socklen_t len;
	int family = AF_INET, one = 1;

	memset(&local, 0, sizeof(local));
	if (cfg.bind_addr[0] && strchr(cfg.bind_addr, ':')) {
		struct sockaddr_in6 *l6 = (struct sockaddr_in6 *)&local;

		family = AF_INET6;
		l6->sin6_family = AF_INET6;
		l6->sin6_port = htons((uint16_t)cfg.base_port);
		if (inet_pton(AF_INET6, cfg.bind_addr, &l6->sin6_addr) != 1)
			die("bad --bind address '%s'", cfg.bind_addr);
		len = sizeof(*l6);
	} else {
		struct sockaddr_in *l4 = (struct sockaddr_in *)&local;

		l4->sin_family = AF_INET;
		l4->sin_port = htons((uint16_t)cfg.base_port);
		if (cfg.bind_addr[0] && inet_pton(AF_INET, cfg.bind_addr, &l4->sin_addr) != 1)
			die("bad --bind address '%s'", cfg.bind_addr);
		len = sizeof(*l4);
	}
	listen_fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (listen_fd < 0)
		die("socket: %s", strerror(errno));
	setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(listen_fd, (struct sockaddr *)&local, len) < 0)
		die("bind TCP port %u: %s", cfg.base_port, strerror(errno));
	if (listen(listen_fd, 4096) < 0)
		die("listen: %s", strerror(errno));
	conns = calloc(cfg.max_conns, sizeof(*conns));
	conn_free = calloc(cfg.max_conns, sizeof(*conn_free));
	if (!conns || !conn_free)
		die("out of memory");
	// Message buffers are allocated when a connection first uses the slot.
	for (uint32_t i = 0; i < cfg.max_conns; i++) {
		conns[i].fd = -1;
		conn_free[nconn_free++] = cfg.max_conns - 1 - i;
	}
}

// One epoll event of the TCP server: the listening socket or a connection.
static void serve_tcp_event(struct worker *w, uint64_t data, unsigned char *buf)
{
	int stealing = cfg.pattern == PAT_WORK_STEALING;

	if (data == LISTEN_EV) {
		tcp_accept(w);
		if (stealing) {
			struct epoll_event ev = { .events = EPOLLIN | EPOLLONESHOT, .data.u64 = LISTEN_EV };

			if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, listen_fd, &ev) < 0)
				die("epoll_ctl(MOD) listening socket: %s", strerror(errno));
		}
		return;
	}
	uint32_t idx = (uint32_t)data;
	if (idx >= cfg.max_conns)
		return;
	struct conn *c = &conns[idx];
	// A closed connection's stale event, or its slot already reused by a new one that
	// another worker owns.
	if (c->fd < 0 || c->gen != (uint32_t)(data >> 32) || c->epfd != w->epfd)
		return;
	int was_pending = c->out_off < c->out_len;
	if (tcp_serve(w, c, buf) < 0)
		return;
	// One-shot: re-arm (re-checks readiness, so nothing that arrived meanwhile is missed).
	// Otherwise switch between reading and writing when a reply starts or stops pending.
	if ((stealing || was_pending != (c->out_off < c->out_len)) && conn_arm(c, EPOLL_CTL_MOD) < 0)
		conn_close(c, 1);
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	unsigned char *buf = malloc(RX_BUF);
	struct epoll_event evs[BATCH];
	if (!buf)
		die("out of memory");

	if (w->start_cpu >= 0) {
		if (pin_self(w->start_cpu) == 0)
			w->cur_cpu = w->start_cpu;
		else
			w->migrate_errors++;
	}
	int hopping = cfg.pattern == PAT_HOP_WITHIN_LLC || cfg.pattern == PAT_HOP_ACROSS_LLC;
	// work-stealing: take one ready flow per wakeup, so the other ready flows stay in the
	// shared set for the other (idle) workers.
	int stealing = cfg.pattern == PAT_WORK_STEALING;
	int maxevents = stealing ? 1 : BATCH;
	double period = cfg.period_ms / 1000.0;
	// Worker i first hops (1 + i / W) periods after the common start: the workers hop
	// evenly spread over a period, not in lockstep (lockstep queued every worker's filter
	// updates at once, and how close the threads happened to start varied per boot).
	double next_hop = hop_epoch + period * (1.0 + (double)w->id / (double)cfg.workers);

	while (!stop_flag) {
		int timeout = 100;
		if (hopping) {
			double t = now_s();
			if (t >= next_hop) {
				int c = next_cpu(w);
				if (w->hop_us && w->hops < HOP_LOG) {
					double us = (t - hop_epoch) * 1e6;

					w->hop_us[w->hops] = us < 4e9 ? (uint32_t)us : 4000000000u;
				}
				w->hops++;
				if (c != w->cur_cpu) {
					if (pin_self(c) == 0) {
						w->cur_cpu = c;
						w->migrations++;
					} else {
						w->migrate_errors++;
					}
				}
				next_hop += period;
				if (next_hop < t) // fell behind (e.g. period shorter than a tick): resync
					next_hop = t + period;
			}
			int ms = (int)((next_hop - now_s()) * 1000.0) + 1;
			if (ms < timeout)
				timeout = ms < 0 ? 0 : ms;
		}
		int n = epoll_wait(w->epfd, evs, maxevents, timeout);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			die("epoll_wait: %s", strerror(errno));
		}
		for (int i = 0; i < n; i++) {
			if (cfg.proto == PROTO_TCP) {
				serve_tcp_event(w, evs[i].data.u64, buf);
				continue;
			}
			uint32_t fi = evs[i].data.u32;
			if (fi >= cfg.flows)
				continue;
			serve_flow(w, &flows[fi], buf);
			if (stealing) {
				// EPOLLONESHOT disarmed the socket when this worker got it, so no
				// other worker touches the flow meanwhile. Re-arming re-checks
				// readiness: a request that came in after the last recv() is not lost.
				struct epoll_event ev = { .events = EPOLLIN | EPOLLONESHOT, .data.u32 = fi };
				if (epoll_ctl(w->epfd, EPOLL_CTL_MOD, flows[fi].fd, &ev) < 0)
					die("epoll_ctl(MOD) flow %u: %s", fi, strerror(errno));
			}
		}
	}
	w->last_seen_cpu = sched_getcpu();
	free(buf);
	return NULL;
}

static void on_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

static void usage(FILE *o)
{
	fprintf(o,
		"usage: arfs-echo --peer IP [options]\n"
		"  --flows N            number of flows / sockets (default 16)\n"
		"  --base-port P        guest local port of flow i = P+i (default 5000)\n"
		"  --peer IP            peer address every flow socket is connected to (IPv4 or IPv6)\n"
		"  --peer-base-port Q   peer port of flow i = Q+i (default 6000)\n"
		"  --bind IP            local address to bind (default: any)\n"
		"  --workers W          worker threads (default: number of online CPUs)\n"
		"  --pattern P          how workers and flows meet CPUs (default none):\n"
		"                         none            worker w pinned to the w-th online CPU, flow i served by worker i %% W\n"
		"                         scheduler       as none, but workers not pinned\n"
		"                         hop-within-llc  pinned workers move to the next CPU of their LLC every period\n"
		"                         hop-across-llc  pinned workers move to a CPU of the next LLC every period\n"
		"                         work-stealing   pinned workers (round-robin over online CPUs) share one epoll\n"
		"                                         set of EPOLLONESHOT flow sockets: whichever worker is free\n"
		"                                         serves a flow, then re-arms it (brpc-like)\n"
		"  --period-ms M        hop period for hop-* patterns (default 100)\n"
		"  --duration-s D       run time in seconds, fractions allowed; 0 = until SIGINT/SIGTERM (default 10)\n"
		"  --quiet              no progress lines on stderr\n"
		"  --proto udp|tcp      tcp: listen on --base-port, one connection per flow slot; --peer optional\n"
		"  --msg-size S         tcp: message size in bytes (16..65536, default 64)\n"
		"  --tcp-mode echo|sink tcp: answer every message (default) or read and discard\n"
		"  --max-conns N        tcp: open connections at most (default 4096; more are accepted and closed)\n");
}

static unsigned long parse_num(const char *opt, const char *s, unsigned long max)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > max)
		die("bad value for %s: '%s' (0..%lu)", opt, s, max);
	return v;
}

static void parse_args(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "flows", required_argument, 0, 'f' },
		{ "base-port", required_argument, 0, 'p' },
		{ "peer", required_argument, 0, 'P' },
		{ "peer-base-port", required_argument, 0, 'q' },
		{ "bind", required_argument, 0, 'b' },
		{ "workers", required_argument, 0, 'w' },
		{ "pattern", required_argument, 0, 't' },
		{ "period-ms", required_argument, 0, 'm' },
		{ "duration-s", required_argument, 0, 'd' },
		{ "quiet", no_argument, 0, 'Q' },
		{ "proto", required_argument, 0, 'R' },
		{ "msg-size", required_argument, 0, 'S' },
		{ "tcp-mode", required_argument, 0, 'M' },
		{ "max-conns", required_argument, 0, 'C' },
		{ "help", no_argument, 0, 'h' },
		{ 0, 0, 0, 0 },
	};
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'f': cfg.flows = (uint32_t)parse_num("--flows", optarg, MAX_FLOWS); break;
		case 'p': cfg.base_port = (uint32_t)parse_num("--base-port", optarg, 65535); break;
		case 'q': cfg.peer_base_port = (uint32_t)parse_num("--peer-base-port", optarg, 65535); break;
		case 'P': snprintf(cfg.peer, sizeof(cfg.peer), "%s", optarg); break;
		case 'b': snprintf(cfg.bind_addr, sizeof(cfg.bind_addr), "%s", optarg); break;
		case 'w': cfg.workers = (uint32_t)parse_num("--workers", optarg, MAX_WORKERS); break;
		case 'm': cfg.period_ms = (uint32_t)parse_num("--period-ms", optarg, 3600 * 1000); break;
		case 'Q': cfg.quiet = 1; break;
		case 'S': cfg.msg_size = (uint32_t)parse_num("--msg-size", optarg, MAX_MSG); break;
		case 'C': cfg.max_conns = (uint32_t)parse_num("--max-conns", optarg, MAX_CONNS); break;
		case 'R':
			if (strcmp(optarg, "udp") == 0)
				cfg.proto = PROTO_UDP;
			else if (strcmp(optarg, "tcp") == 0)
				cfg.proto = PROTO_TCP;
			else
				die("bad --proto '%s' (udp|tcp)", optarg);
			break;
		case 'M':
			if (strcmp(optarg, "echo") == 0)
				cfg.tcp_mode = TCP_ECHO;
			else if (strcmp(optarg, "sink") == 0)
				cfg.tcp_mode = TCP_SINK;
			else
				die("bad --tcp-mode '%s' (echo|sink)", optarg);
			break;
		case 'd': {
			char *end;
			cfg.duration_s = strtod(optarg, &end);
			if (end == optarg || *end || !(cfg.duration_s >= 0) || cfg.duration_s > 1e7)
				die("bad value for --duration-s: '%s'", optarg);
			break;
		}
		case 't': {
			int i;
			for (i = 0; i < NR_PATTERNS; i++)
				if (strcmp(optarg, pattern_names[i]) == 0)
					break;
			if (i == NR_PATTERNS)
				die("bad --pattern '%s' (" PATTERN_LIST ")", optarg);
			cfg.pattern = (enum pattern)i;
			break;
		}
		case 'h': usage(stdout); exit(0);
		default: usage(stderr); exit(2);
		}
	}
	if (optind != argc) {
		usage(stderr);
		exit(2);
	}
	if (cfg.flows == 0)
		die("--flows must be >= 1");
	if (cfg.proto == PROTO_TCP) {
		if (cfg.base_port == 0)
			die("--base-port must be > 0");
		if (cfg.msg_size < 16)
			die("--msg-size must be >= 16 (the message header)");
		if (cfg.max_conns == 0)
			die("--max-conns must be >= 1");
		if ((uint64_t)cfg.max_conns * cfg.msg_size > (1ull << 30))
			die("--max-conns x --msg-size exceeds 1 GiB of message buffers");
		return;
	}
	if (!cfg.peer[0])
		die("--peer is required");
	if (cfg.base_port + cfg.flows - 1 > 65535 || cfg.base_port == 0)
		die("--base-port + --flows exceeds the port range");
	if (cfg.peer_base_port + cfg.flows - 1 > 65535 || cfg.peer_base_port == 0)
		die("--peer-base-port + --flows exceeds the port range");
	if ((cfg.pattern == PAT_HOP_WITHIN_LLC || cfg.pattern == PAT_HOP_ACROSS_LLC) && cfg.period_ms == 0)
		die("--period-ms must be > 0 for hop patterns");
}

static int open_flow_socket(uint32_t i)
{
	struct sockaddr_storage local, peer;
	socklen_t len;
	int family;
	memset(&local, 0, sizeof(local));
	memset(&peer, 0, sizeof(peer));
	struct sockaddr_in *p4 = (struct sockaddr_in *)&peer, *l4 = (struct sockaddr_in *)&local;
	struct sockaddr_in6 *p6 = (struct sockaddr_in6 *)&peer, *l6 = (struct sockaddr_in6 *)&local;

	if (inet_pton(AF_INET, cfg.peer, &p4->sin_addr) == 1) {
		family = AF_INET;
		p4->sin_family = AF_INET;
		p4->sin_port = htons((uint16_t)(cfg.peer_base_port + i));
		l4->sin_family = AF_INET;
		l4->sin_port = htons((uint16_t)(cfg.base_port + i));
		if (cfg.bind_addr[0] && inet_pton(AF_INET, cfg.bind_addr, &l4->sin_addr) != 1)
			die("bad --bind address '%s'", cfg.bind_addr);
		len = sizeof(struct sockaddr_in);
	} else if (inet_pton(AF_INET6, cfg.peer, &p6->sin6_addr) == 1) {
		family = AF_INET6;
		p6->sin6_family = AF_INET6;
		p6->sin6_port = htons((uint16_t)(cfg.peer_base_port + i));
		l6->sin6_family = AF_INET6;
		l6->sin6_port = htons((uint16_t)(cfg.base_port + i));
		if (cfg.bind_addr[0] && inet_pton(AF_INET6, cfg.bind_addr, &l6->sin6_addr) != 1)
			die("bad --bind address '%s'", cfg.bind_addr);
		len = sizeof(struct sockaddr_in6);
	} else {
		die("bad --peer address '%s'", cfg.peer);
	}
	int fd = socket(family, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		die("socket: %s", strerror(errno));
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&local, len) < 0)
		die("bind port %u: %s", cfg.base_port + i, strerror(errno));
	if (connect(fd, (struct sockaddr *)&peer, len) < 0)
		die("connect %s:%u: %s", cfg.peer, cfg.peer_base_port + i, strerror(errno));
	return fd;
}

static int deliv_cmp(const void *a, const void *b)
{
	const struct delivery *x = a, *y = b;

	if (x->napi_id != y->napi_id)
		return x->napi_id < y->napi_id ? -1 : 1;
	if (x->incoming_cpu != y->incoming_cpu)
		return x->incoming_cpu < y->incoming_cpu ? -1 : 1;
	if (x->app_cpu != y->app_cpu)
		return x->app_cpu < y->app_cpu ? -1 : 1;
	return 0;
}

// The workers' delivery tables merged, sorted, as "deliveries":[[napi,incoming_cpu,
// app_cpu,count],...] and "deliveries_overflow" (requests not in the list).
static void print_deliveries(FILE *o)
{
	struct deliv_table all;
	uint32_t n = 0;

	if (deliv_init(&all, DELIV_OUT_SLOTS, DELIV_OUT_MAX) < 0)
		die("out of memory");
	for (uint32_t w = 0; w < cfg.workers; w++) {
		struct deliv_table *t = &workers[w].deliv;

		for (uint32_t i = 0; i < t->nslots; i++) {
			struct delivery *d = &t->slot[i];

			if (d->count)
				deliv_add(&all, d->napi_id, d->incoming_cpu, d->app_cpu, d->count);
		}
		all.overflow += t->overflow;
	}
	// compact the used slots to the front, then sort them
	for (uint32_t i = 0; i < all.nslots; i++)
		if (all.slot[i].count)
			all.slot[n++] = all.slot[i];
	qsort(all.slot, n, sizeof(*all.slot), deliv_cmp);
	fprintf(o, "\"deliveries\":[");
	for (uint32_t i = 0; i < n; i++) {
		struct delivery *d = &all.slot[i];

		fprintf(o, "%s[%u,%d,%d,%llu]", i ? "," : "", d->napi_id, d->incoming_cpu, d->app_cpu,
			(unsigned long long)d->count);
	}
	fprintf(o, "],\"deliveries_overflow\":%llu,", (unsigned long long)all.overflow);
	free(all.slot);
}

static void print_json(double elapsed)
{
	uint64_t bad_short = 0, bad_magic = 0, recv_errors = 0, treq = 0, trep = 0, tsend_err = 0, tmis = 0;
	for (uint32_t w = 0; w < cfg.workers; w++) {
		bad_short += workers[w].bad_short;
		bad_magic += workers[w].bad_magic;
		recv_errors += workers[w].recv_errors;
	}
	for (uint32_t i = 0; i < cfg.flows; i++) {
		treq += flows[i].requests;
		trep += flows[i].replies;
		tsend_err += flows[i].send_errors;
		tmis += flows[i].flow_mismatch;
	}
	FILE *o = stdout;
	fprintf(o, "ARFS-ECHO-JSON-BEGIN\n");
	fprintf(o, "{\"tool\":\"arfs-echo\",\"version\":1,");
	fprintf(o, "\"config\":{\"flows\":%u,\"base_port\":%u,\"peer\":\"%s\",\"peer_base_port\":%u,"
		   "\"workers\":%u,\"pattern\":\"%s\",\"period_ms\":%u,\"duration_s\":%.3f,\"proto\":\"%s\"},",
		cfg.flows, cfg.base_port, cfg.peer, cfg.peer_base_port, cfg.workers,
		pattern_names[cfg.pattern], cfg.period_ms, cfg.duration_s,
		cfg.proto == PROTO_TCP ? "tcp" : "udp");
	if (cfg.proto == PROTO_TCP)
		fprintf(o, "\"tcp\":{\"accepted\":%llu,\"closed\":%llu,\"conn_errors\":%llu,\"refused\":%llu,"
			   "\"accept_errors\":%llu,\"open_at_end\":%llu,\"bytes_in\":%llu,\"bytes_out\":%llu,"
			   "\"msg_size\":%u,\"mode\":\"%s\",\"max_conns\":%u},",
			(unsigned long long)tcp_st.accepted, (unsigned long long)tcp_st.closed,
			(unsigned long long)tcp_st.conn_errors, (unsigned long long)tcp_st.refused,
			(unsigned long long)tcp_st.accept_errors, (unsigned long long)tcp_st.open,
			(unsigned long long)tcp_st.bytes_in, (unsigned long long)tcp_st.bytes_out, cfg.msg_size,
			cfg.tcp_mode == TCP_SINK ? "sink" : "echo", cfg.max_conns);
	uint64_t first_us = __atomic_load_n(&first_request_us, __ATOMIC_RELAXED);

	if (first_us)
		fprintf(o, "\"first_request_s\":%.6f,", (double)(first_us - 1) / 1e6);
	fprintf(o, "\"elapsed_s\":%.3f,\"ncpus\":%d,\"online_cpus\":[", elapsed, ncpu_ids);
	for (int i = 0; i < nonline; i++)
		fprintf(o, "%s%d", i ? "," : "", online[i]);
	fprintf(o, "],\"llc_source\":\"%s\",\"llc_groups\":[", llc_source);
	for (int g = 0; g < ngroups; g++) {
		fprintf(o, "%s[", g ? "," : "");
		for (int i = 0; i < group_size[g]; i++)
			fprintf(o, "%s%d", i ? "," : "", group_cpus[g][i]);
		fprintf(o, "]");
	}
	fprintf(o, "],\"requests\":%llu,\"replies\":%llu,\"send_errors\":%llu,\"recv_errors\":%llu,"
		   "\"flow_mismatch\":%llu,\"bad_requests\":%llu,\"bad_short\":%llu,\"bad_magic\":%llu,",
		(unsigned long long)treq, (unsigned long long)trep, (unsigned long long)tsend_err,
		(unsigned long long)recv_errors, (unsigned long long)tmis,
		(unsigned long long)(bad_short + bad_magic), (unsigned long long)bad_short,
		(unsigned long long)bad_magic);
	print_deliveries(o);
	fprintf(o, "\"workers\":[");
	for (uint32_t w = 0; w < cfg.workers; w++) {
		struct worker *wk = &workers[w];
		fprintf(o, "%s{\"worker\":%u,\"flows\":%u,\"start_cpu\":%d,\"last_cpu\":%d,\"served\":%llu,"
			   "\"hops\":%llu,\"migrations\":%llu,\"migrate_errors\":%llu",
			w ? "," : "", w, wk->nflows, wk->start_cpu, wk->last_seen_cpu,
			(unsigned long long)wk->served, (unsigned long long)wk->hops,
			(unsigned long long)wk->migrations, (unsigned long long)wk->migrate_errors);
		if (wk->hop_us) {
			uint64_t n = wk->hops < HOP_LOG ? wk->hops : HOP_LOG;

			fprintf(o, ",\"hop_us\":[");
			for (uint64_t i = 0; i < n; i++)
				fprintf(o, "%s%u", i ? "," : "", wk->hop_us[i]);
			fprintf(o, "]");
		}
		fprintf(o, "}");
	}
	fprintf(o, "],\"flows\":[");
	for (uint32_t i = 0; i < cfg.flows; i++) {
		struct flow *f = &flows[i];
		// work-stealing has no home worker: report the one that served the last request
		int home = cfg.pattern == PAT_WORK_STEALING ? f->last_worker : (int)(i % cfg.workers);
		fprintf(o, "%s\n{\"flow\":%u,\"local_port\":%u,\"peer_port\":%u,\"worker\":%d,"
			   "\"requests\":%llu,\"replies\":%llu,\"send_errors\":%llu,\"last_cpu\":%d,\"cpu_changes\":%llu,\"cpu_counts\":[",
			i ? "," : "", i, cfg.proto == PROTO_TCP ? cfg.base_port : cfg.base_port + i,
			cfg.proto == PROTO_TCP ? f->peer_port : cfg.peer_base_port + i, home,
			(unsigned long long)f->requests, (unsigned long long)f->replies,
			(unsigned long long)f->send_errors, f->last_cpu, (unsigned long long)f->cpu_changes);
		for (int c = 0; c < ncpu_ids; c++)
			fprintf(o, "%s%llu", c ? "," : "", (unsigned long long)f->cpu_counts[c]);
		fprintf(o, "],\"samples\":%llu,\"last_incoming_cpu\":%d,\"last_napi_id\":%u,\"napi_changes\":%llu,"
			   "\"incoming_cpu_counts\":[",
			(unsigned long long)f->samples, f->last_incoming_cpu, f->last_napi_id,
			(unsigned long long)f->napi_changes);
		for (int c = 0; c < ncpu_ids; c++)
			fprintf(o, "%s%llu", c ? "," : "", (unsigned long long)f->incoming_cpu_counts[c]);
		fprintf(o, "]}");
	}
	fprintf(o, "\n]}\nARFS-ECHO-JSON-END\n");
	fflush(o);
}

int main(int argc, char **argv)
{
	parse_args(argc, argv);
	discover_cpus();
	discover_llc();
	if (cfg.workers == 0)
		cfg.workers = (uint32_t)nonline;
	if (cfg.workers > cfg.flows && cfg.proto == PROTO_UDP)
		cfg.workers = cfg.flows; // a worker without flows would only hop around

	fprintf(stderr, "arfs-echo: %d online CPUs, %d LLC group(s) from %s:", nonline, ngroups, llc_source);
	for (int g = 0; g < ngroups; g++) {
		fprintf(stderr, " {");
		for (int i = 0; i < group_size[g]; i++)
			fprintf(stderr, "%s%d", i ? "," : "", group_cpus[g][i]);
		fprintf(stderr, "}");
	}
	fprintf(stderr, "\n");
	if (cfg.pattern == PAT_HOP_ACROSS_LLC && ngroups < 2)
		fprintf(stderr, "arfs-echo: warning: only one LLC group; hop-across-llc behaves like hop-within-llc\n");

	int stealing = cfg.pattern == PAT_WORK_STEALING;
	int shared_epfd = -1;
	if (stealing) {
		shared_epfd = epoll_create1(EPOLL_CLOEXEC);
		if (shared_epfd < 0)
			die("epoll_create1: %s", strerror(errno));
	}
	flows = calloc(cfg.flows, sizeof(*flows));
	workers = calloc(cfg.workers, sizeof(*workers));
	if (!flows || !workers)
		die("out of memory");
	for (uint32_t w = 0; w < cfg.workers; w++) {
		struct worker *wk = &workers[w];
		wk->id = (int)w;
		wk->start_cpu = cfg.pattern == PAT_SCHEDULER ? -1 : online[w % (uint32_t)nonline];
		wk->cur_cpu = -1;
		wk->last_seen_cpu = -1;
		wk->flows = calloc(cfg.flows / cfg.workers + 1, sizeof(uint32_t));
		if (cfg.pattern == PAT_HOP_WITHIN_LLC || cfg.pattern == PAT_HOP_ACROSS_LLC) {
			wk->hop_us = calloc(HOP_LOG, sizeof(uint32_t));
			if (!wk->hop_us)
				die("out of memory");
		}
		wk->epfd = stealing ? shared_epfd : epoll_create1(EPOLL_CLOEXEC);
		if (!wk->flows || wk->epfd < 0)
			die("worker setup: %s", strerror(errno));
		if (deliv_init(&wk->deliv, DELIV_SLOTS, DELIV_MAX) < 0)
			die("out of memory");
		if (stealing)
			wk->nflows = cfg.flows;
	}
	for (uint32_t i = 0; i < cfg.flows; i++) {
		struct flow *f = &flows[i];
		f->idx = i;
		f->last_cpu = -1;
		f->last_incoming_cpu = -1;
		f->last_worker = -1;
		f->cpu_counts = calloc((size_t)ncpu_ids, sizeof(uint64_t));
		f->incoming_cpu_counts = calloc((size_t)ncpu_ids, sizeof(uint64_t));
		if (!f->cpu_counts || !f->incoming_cpu_counts)
			die("out of memory");
		f->fd = -1;
		if (cfg.proto == PROTO_TCP)
			continue;
		f->fd = open_flow_socket(i);
		struct worker *wk = &workers[i % cfg.workers];
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = i };
		if (stealing)
			ev.events |= EPOLLONESHOT; // one worker at a time; re-armed after serving
		else
			wk->flows[wk->nflows++] = i;
		if (epoll_ctl(wk->epfd, EPOLL_CTL_ADD, f->fd, &ev) < 0)
			die("epoll_ctl: %s", strerror(errno));
	}

	if (cfg.proto == PROTO_TCP) {
		tcp_listen();
		// Work stealing: one-shot in the shared set, any worker accepts. Otherwise worker
		// 0 accepts and deals the connections out round robin.
		struct epoll_event ev = { .events = EPOLLIN, .data.u64 = LISTEN_EV };
		if (stealing)
			ev.events |= EPOLLONESHOT;
		if (epoll_ctl(workers[0].epfd, EPOLL_CTL_ADD, listen_fd, &ev) < 0)
			die("epoll_ctl(listening socket): %s", strerror(errno));
		for (uint32_t w = 0; w < cfg.workers && !stealing; w++)
			workers[w].nflows = 0;
	}

	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	if (cfg.proto == PROTO_TCP)
		fprintf(stderr, "arfs-echo: TCP on port %u (%s, %u-byte messages, %u flow records, at most %u connections), %u workers, pattern %s, period %u ms, duration %.3f s\n",
			cfg.base_port, cfg.tcp_mode == TCP_SINK ? "sink" : "echo", cfg.msg_size, cfg.flows,
			cfg.max_conns, cfg.workers, pattern_names[cfg.pattern], cfg.period_ms, cfg.duration_s);
	else
		fprintf(stderr, "arfs-echo: %u flows on ports %u..%u -> %s:%u..%u, %u workers, pattern %s, period %u ms, duration %.3f s\n",
			cfg.flows, cfg.base_port, cfg.base_port + cfg.flows - 1, cfg.peer, cfg.peer_base_port,
			cfg.peer_base_port + cfg.flows - 1, cfg.workers, pattern_names[cfg.pattern], cfg.period_ms,
			cfg.duration_s);
	fprintf(stderr, "arfs-echo: ready\n");

	double t0 = now_s();
	hop_epoch = t0;
	for (uint32_t w = 0; w < cfg.workers; w++) {
		int rc = pthread_create(&workers[w].thr, NULL, worker_main, &workers[w]);
		if (rc)
			die("pthread_create: %s", strerror(rc));
	}
	double end = cfg.duration_s > 0 ? t0 + cfg.duration_s : 0;
	double next_report = t0 + 1.0;
	uint64_t last_req = 0;
	while (!stop_flag) {
		double t = now_s();
		if (end && t >= end)
			break;
		double wait = 0.2;
		if (end && end - t < wait)
			wait = end - t;
		struct timespec ts = { (time_t)wait, (long)((wait - (time_t)wait) * 1e9) };
		nanosleep(&ts, NULL);
		if (!cfg.quiet && now_s() >= next_report) {
			uint64_t req = 0;
			for (uint32_t i = 0; i < cfg.flows; i++)
				req += flows[i].requests; // racy read, progress only
			if (cfg.proto == PROTO_TCP)
				fprintf(stderr, "arfs-echo: t=%.0fs requests=%llu (+%llu/s) connections=%llu accepted=%llu\n",
					now_s() - t0, (unsigned long long)req, (unsigned long long)(req - last_req),
					(unsigned long long)tcp_st.open, (unsigned long long)tcp_st.accepted);
			else
				fprintf(stderr, "arfs-echo: t=%.0fs requests=%llu (+%llu/s)\n", now_s() - t0,
					(unsigned long long)req, (unsigned long long)(req - last_req));
			last_req = req;
			next_report += 1.0;
		}
	}
	stop_flag = 1;
	for (uint32_t w = 0; w < cfg.workers; w++)
		pthread_join(workers[w].thr, NULL);
	double elapsed = now_s() - t0;
	print_json(elapsed);
	return 0;
}

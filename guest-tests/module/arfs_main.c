// SPDX-License-Identifier: GPL-2.0
/*
 * arfs_virtio - accelerated RFS (ndo_rx_flow_steer) for a virtio_net
 * interface backed by the arfsnic emulated NIC.
 *
 * The stock virtio_net driver has no ndo_rx_flow_steer, so the kernel never
 * asks it to steer a flow.  This module attaches to one virtio_net netdev and
 * gives it an aRFS path with the shape of the mlx5 driver (en_arfs.c):
 *
 *  - a CPU reverse map (dev->rx_cpu_rmap) built from the per-RX-queue MSI-X
 *    interrupts, NETIF_F_NTUPLE, and a copy of the device's net_device_ops
 *    with .ndo_rx_flow_steer added;
 *  - ndo_rx_flow_steer takes arfs_lock, looks the 5-tuple up in per-type hash
 *    tables (IPv4/IPv6 x TCP/UDP, hashed by ports), and either returns the
 *    existing filter id, updates the rule's queue, or allocates a new rule,
 *    queueing the rule's work on an ordered workqueue;
 *  - the work sends ADD or MOD to the device's filter engine and waits for the
 *    completion (the device emulates firmware latency), keeps the rule in the
 *    software table when the command fails, and then expires up to a quota of
 *    idle rules (rps_may_expire_flow) with DEL.
 *
 * The device is reached through in-band control frames on EtherType 0x88B5;
 * arfs_proto.h holds the protocol's numbers and docs/control-protocol.md in
 * the arfsnic repository describes it.
 *
 * This file: module parameters, attach/detach, IRQ discovery and the CPU
 * rmap, the netdev notifier, debugfs, module init/exit.  arfs.h lists the
 * other parts.
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/cpu_rmap.h>
#include <linux/cpumask.h>
#include <linux/debugfs.h>
#include <linux/err.h>
#include <linux/interrupt.h>
#include <linux/irq.h>
#include <linux/irqdesc.h>
#include <linux/irqnr.h>
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/math64.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/netdevice.h>
#include <linux/rcupdate.h>
#include <linux/rtnetlink.h>
#include <linux/seq_file.h>
#include <linux/slab.h>
#include <linux/string.h>
#include <linux/workqueue.h>
#ifdef ARFS_HAVE_NAPI_IRQ_LOCKED
#include <net/netdev_rx_queue.h>
#endif

#include "arfs.h"

/* ---- module parameters ------------------------------------------------ */

static char ifname[IFNAMSIZ] = "eth0";
module_param_string(ifname, ifname, sizeof(ifname), 0444);
MODULE_PARM_DESC(ifname, "virtio_net interface to attach to (default eth0)");

/* a string, not an int array, so that guest init may pass irqs= empty */
static char irqs[512];
module_param_string(irqs, irqs, sizeof(irqs), 0444);
MODULE_PARM_DESC(irqs,
		 "Linux IRQ numbers of the RX queues in queue order (comma list); empty: find the virtioN-input.Q interrupts");

unsigned int arfs_buckets = 256;
module_param_named(buckets, arfs_buckets, uint, 0444);
MODULE_PARM_DESC(buckets, "hash buckets per rule table (rounded up to a power of two, default 256)");

unsigned int arfs_expire_quota = 60;
module_param_named(expire_quota, arfs_expire_quota, uint, 0644);
MODULE_PARM_DESC(expire_quota, "rules expired per expiry pass at most (default 60)");

unsigned int arfs_expire_interval_ms = 1000;
module_param_named(expire_interval_ms, arfs_expire_interval_ms, uint, 0644);
MODULE_PARM_DESC(expire_interval_ms,
		 "also run an expiry pass every N ms (0: only after rule work, as mlx5; default 1000)");

bool arfs_disabled;
module_param_named(disabled, arfs_disabled, bool, 0644);
MODULE_PARM_DESC(disabled, "refuse steering requests with -EPERM (also in debugfs)");

unsigned long arfs_hold_ns;
module_param_named(hold_ns, arfs_hold_ns, ulong, 0644);
MODULE_PARM_DESC(hold_ns, "extra busy time (ns) inside arfs_lock per steer call, capped at 1 ms (default 0)");

/*
 * Not in mlx5: a steer whose rule already points at the queue, or whose
 * command is still pending, is answered from an RCU lookup without arfs_lock.
 * Under emulation every such packet taking the lock convoys the vCPUs
 * (docs/measuring.md, "Run health"); 0 restores mlx5's locked path.
 */
bool arfs_same_lockless = true;
module_param_named(same_lockless, arfs_same_lockless, bool, 0644);
MODULE_PARM_DESC(same_lockless,
		 "answer steer_same calls without arfs_lock (RCU lookup; 0: lock every call, as mlx5; default 1)");

unsigned int arfs_cmd_timeout_ms = 2000;
module_param_named(cmd_timeout_ms, arfs_cmd_timeout_ms, uint, 0644);
MODULE_PARM_DESC(cmd_timeout_ms, "command completion timeout in ms (default 2000)");

/*
 * The attached instances, for module exit and the netdev notifier only; both
 * the list and arfs_exiting are changed under RTNL.  The data paths find
 * their instance without it (see struct arfs_priv): arfs_detach() gives the
 * device its original ops back and removes the packet handler, each followed
 * by an RCU grace period, and cancels the works before the instance is freed.
 */
static LIST_HEAD(arfs_list);
static bool arfs_exiting;

/* ---- debugfs ---------------------------------------------------------- */

static const char * const arfs_ctr_names[ARFS_CTR_NR] = {
	[ARFS_CTR_STEER_CALLS] = "steer_calls",
	[ARFS_CTR_STEER_NEW] = "steer_new",
	[ARFS_CTR_STEER_UPDATE] = "steer_update",
	[ARFS_CTR_STEER_SAME] = "steer_same",
	[ARFS_CTR_ADDS_OK] = "adds_ok",
	[ARFS_CTR_MODS_OK] = "mods_ok",
	[ARFS_CTR_DELS_OK] = "dels_ok",
	[ARFS_CTR_LOCK_ACQUIRED] = "lock_acquired",
	[ARFS_CTR_LOCK_CONTENDED] = "lock_contended",
	[ARFS_CTR_LOCK_WAIT_NS_TOTAL] = "lock_wait_ns_total",
	[ARFS_CTR_LOCK_WAIT_NS_MAX] = "lock_wait_ns_max",
	[ARFS_CTR_RULES_NOW] = "rules_now",
	[ARFS_CTR_RULES_PEAK] = "rules_peak",
	[ARFS_CTR_EXPIRE_SCANS] = "expire_scans",
	[ARFS_CTR_EXPIRE_SCANNED] = "expire_scanned",
	[ARFS_CTR_CMD_TIMEOUTS] = "cmd_timeouts",
	[ARFS_CTR_STEER_EPERM] = "steer_eperm",
	[ARFS_CTR_STEER_ENOMEM] = "steer_enomem",
	[ARFS_CTR_STEER_EPROTONOSUPPORT] = "steer_eprotonosupport",
	[ARFS_CTR_HOLD_NS] = "hold_ns",
	[ARFS_CTR_LOCK_HOLD_NS_TOTAL] = "lock_hold_ns_total",
	[ARFS_CTR_LOCK_HOLD_NS_MAX] = "lock_hold_ns_max",
	[ARFS_CTR_WORK_RUNS] = "work_runs",
	[ARFS_CTR_WORK_DELAY_NS_TOTAL] = "work_delay_ns_total",
	[ARFS_CTR_WORK_DELAY_NS_MAX] = "work_delay_ns_max",
};

static const char * const arfs_err_prefix[ARFS_ERR_KIND_NR] = {
	[ARFS_ERR_KIND_ADD] = "add_err",
	[ARFS_ERR_KIND_MOD] = "mod_err",
	[ARFS_ERR_KIND_DEL] = "del_err",
};

static const char * const arfs_diag_names[ARFS_DIAG_NR] = {
	[ARFS_DIAG_RX_FRAMES] = "rx_ctrl_frames",
	[ARFS_DIAG_RX_COMPLETIONS] = "rx_completions",
	[ARFS_DIAG_RX_EVENTS] = "rx_events",
	[ARFS_DIAG_RX_DROP_NOT_HOST] = "rx_drop_not_host",
	[ARFS_DIAG_RX_DROP_SRC] = "rx_drop_src_mac",
	[ARFS_DIAG_RX_DROP_SHORT] = "rx_drop_short",
	[ARFS_DIAG_RX_DROP_VERSION] = "rx_drop_version",
	[ARFS_DIAG_RX_DROP_LEN] = "rx_drop_length",
	[ARFS_DIAG_RX_DROP_RESERVED] = "rx_drop_reserved",
	[ARFS_DIAG_RX_DROP_OP] = "rx_drop_op",
	[ARFS_DIAG_RX_DROP_STATUS] = "rx_drop_status",
	[ARFS_DIAG_RX_DROP_SEQ] = "rx_drop_seq",
	[ARFS_DIAG_RX_DROP_OP_MISMATCH] = "rx_drop_op_mismatch",
	[ARFS_DIAG_RX_DROP_BODY] = "rx_drop_body",
	[ARFS_DIAG_EV_RULE_AGED] = "ev_rule_aged",
	[ARFS_DIAG_EV_RULE_AGED_UNKNOWN] = "ev_rule_aged_unknown",
	[ARFS_DIAG_EV_TABLE_FLUSHED] = "ev_table_flushed",
	[ARFS_DIAG_EV_ENGINE_STATE] = "ev_engine_state",
	[ARFS_DIAG_EV_LOST] = "ev_lost",
	[ARFS_DIAG_TX_FRAMES] = "tx_ctrl_frames",
	[ARFS_DIAG_TX_ERRORS] = "tx_ctrl_errors",
	[ARFS_DIAG_STATS_FRAMES] = "stats_frames_sent",
	[ARFS_DIAG_STEER_EINVAL] = "steer_einval",
	[ARFS_DIAG_CMD_CANCELED] = "cmd_canceled",
};

static const char * const arfs_dev_ctr_names[ARFS_DEV_CTR_NR] = {
	[ARFS_DEV_CTR_RX_SPOOFED_DROPPED] = "rx_spoofed_dropped",
	[ARFS_DEV_CTR_CTRL_REQUESTS] = "ctrl_requests",
	[ARFS_DEV_CTR_CTRL_BAD] = "ctrl_bad",
	[ARFS_DEV_CTR_FILTER_ADDS] = "filter_adds",
	[ARFS_DEV_CTR_FILTER_MODS] = "filter_mods",
	[ARFS_DEV_CTR_FILTER_DELS] = "filter_dels",
	[ARFS_DEV_CTR_FILTER_REJECTS] = "filter_rejects",
	[ARFS_DEV_CTR_FILTER_RULES] = "filter_rules",
	[ARFS_DEV_CTR_EVENTS_SENT] = "events_sent",
	[ARFS_DEV_CTR_RX_PACKETS] = "rx_packets",
	[ARFS_DEV_CTR_RX_NOT_READY] = "rx_not_ready",
	[ARFS_DEV_CTR_USER_RULES] = "user_rules",
	[ARFS_DEV_CTR_USER_RULE_HITS] = "user_rule_hits",
};

static const char * const arfs_type_names[ARFS_NUM_TYPES] = {
	"ipv4/tcp", "ipv4/udp", "ipv6/tcp", "ipv6/udp"
};

static void arfs_print_err_lines(struct seq_file *s, struct arfs_priv *p)
{
	char name[24];
	u64 v;
	int k, e;

	for (k = 0; k < ARFS_ERR_KIND_NR; k++) {
		for (e = 1; e < ARFS_ERR_SLOTS; e++) {
			v = atomic64_read(&p->err[k][e]);
			if (!v)
				continue;
			if (e == ARFS_ERR_SLOTS - 1)
				strscpy(name, "other", sizeof(name));
			else
				/* "%pe" prints "-ENOSPC" (or "-28") */
				snprintf(name, sizeof(name), "%pe", ERR_PTR(-e));
			seq_printf(s, "%s_%s: %llu\n", arfs_err_prefix[k],
				   name[0] == '-' ? name + 1 : name, v);
		}
	}
}

static int arfs_stats_show(struct seq_file *s, void *unused)
{
	struct arfs_priv *p = s->private;
	int i;

	for (i = 1; i < ARFS_CTR_NR; i++)
		seq_printf(s, "%s: %llu\n", arfs_ctr_names[i], arfs_ctr_read(p, i));
	for (i = 0; i < ARFS_HIST_BUCKETS; i++)
		seq_printf(s, "cmd_latency_us_log2_%d: %lld\n", i,
			   atomic64_read(&p->hist[i]));
	arfs_print_err_lines(s, p);
	for (i = 0; i < ARFS_DIAG_NR; i++)
		seq_printf(s, "%s: %lld\n", arfs_diag_names[i],
			   atomic64_read(&p->diag[i]));
	for (i = 1; i < ARFS_DEV_CTR_NR; i++)
		seq_printf(s, "dev_%s: %lld\n", arfs_dev_ctr_names[i],
			   atomic64_read(&p->dev_ctr[i]));
	seq_printf(s, "engine_disabled: %d\n", READ_ONCE(p->engine_disabled));
	seq_printf(s, "rx_queues: %u\n", p->dev->real_num_rx_queues);
	seq_printf(s, "rmap_queues: %u\n", p->nr_rmap);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(arfs_stats);

static const char * const arfs_hw_names[] = { "none", "installed", "unknown" };

static void arfs_seq_tuple(struct seq_file *s, const struct arfs_tuple *t)
{
	if (t->etype == htons(ETH_P_IP))
		seq_printf(s, "%pI4 %u %pI4 %u", &t->src_ipv4, ntohs(t->src_port),
			   &t->dst_ipv4, ntohs(t->dst_port));
	else
		seq_printf(s, "%pI6c %u %pI6c %u", &t->src_ipv6, ntohs(t->src_port),
			   &t->dst_ipv6, ntohs(t->dst_port));
}

static int arfs_rules_show(struct seq_file *s, void *unused)
{
	struct arfs_priv *p = s->private;
	u64 now = ktime_get_ns();
	struct arfs_rule *rule;
	int t, j;

	seq_puts(s, "filter_id type src sport dst dport rxq hw hw_rxq hw_age_ms flow_id\n");
	arfs_lock_bh(p);
	for (t = 0; t < ARFS_NUM_TYPES; t++) {
		for (j = 0; j < (1 << p->hash_bits); j++) {
			hlist_for_each_entry(rule, &p->tables[t][j], hlist) {
				seq_printf(s, "%u %s ", rule->filter_id, arfs_type_names[t]);
				arfs_seq_tuple(s, &rule->tuple);
				seq_printf(s, " %u %s %u %llu %u\n", rule->rxq,
					   arfs_hw_names[rule->hw], rule->hw_rxq,
					   rule->hw == ARFS_HW_INSTALLED ?
					   div_u64(now - rule->hw_since_ns, NSEC_PER_MSEC) : 0,
					   rule->flow_id);
			}
		}
	}
	arfs_unlock_bh(p);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(arfs_rules);

/* the last ARFS_GONE_MAX rules expiry removed, oldest first */
static int arfs_expired_show(struct seq_file *s, void *unused)
{
	struct arfs_priv *p = s->private;
	unsigned int i, n, first;

	seq_puts(s, "filter_id type src sport dst dport rxq flow_id\n");
	arfs_lock_bh(p);
	n = min_t(unsigned int, p->gone_next, ARFS_GONE_MAX);
	first = p->gone_next - n;
	for (i = 0; i < n; i++) {
		const struct arfs_gone *g = &p->gone[(first + i) % ARFS_GONE_MAX];

		seq_printf(s, "%u %s ", g->filter_id, arfs_type_names[g->type]);
		arfs_seq_tuple(s, &g->tuple);
		seq_printf(s, " %u %u\n", g->rxq, g->flow_id);
	}
	arfs_unlock_bh(p);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(arfs_expired);

/*
 * per ARFS_DELAY_BIN_MS since the first queued work: its works' longest delay,
 * how many there were and the sum of their delays
 */
static int arfs_work_delays_show(struct seq_file *s, void *unused)
{
	struct arfs_priv *p = s->private;
	struct arfs_delay_bin *b;
	unsigned int i;

	seq_printf(s, "bin_start_ms max_delay_ms works sum_delay_us (bins of %u ms; 0 ms bins left out)\n",
		   ARFS_DELAY_BIN_MS);
	arfs_lock_bh(p);
	for (i = 0; i < ARFS_DELAY_BINS; i++) {
		b = &p->delays[i];
		if (b->max_ms)
			seq_printf(s, "%u %u %u %u\n", i * ARFS_DELAY_BIN_MS,
				   b->max_ms, b->works, b->sum_us);
	}
	arfs_unlock_bh(p);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(arfs_work_delays);

static void arfs_debugfs_init(struct arfs_priv *p)
{
	p->dbg = debugfs_create_dir(KBUILD_MODNAME, NULL);
	if (IS_ERR_OR_NULL(p->dbg)) {
		p->dbg = NULL;
		return;
	}
	debugfs_create_file("stats", 0444, p->dbg, p, &arfs_stats_fops);
	debugfs_create_file("rules", 0444, p->dbg, p, &arfs_rules_fops);
	debugfs_create_file("expired", 0444, p->dbg, p, &arfs_expired_fops);
	debugfs_create_file("work_delays", 0444, p->dbg, p, &arfs_work_delays_fops);
	debugfs_create_bool("disabled", 0644, p->dbg, &arfs_disabled);
	debugfs_create_ulong("hold_ns", 0644, p->dbg, &arfs_hold_ns);
}

/* ---- IRQs and the CPU reverse map ------------------------------------- */

/* does IRQ @irq carry an action named @name? */
static bool arfs_irq_has_name(unsigned int irq, const char *name)
{
	struct irqaction *action;
	struct irq_data *d;
	struct irq_desc *desc;
	unsigned long flags;
	bool found = false;

	rcu_read_lock();
	d = irq_get_irq_data(irq);
	if (d) {
		desc = irq_data_to_desc(d);
		raw_spin_lock_irqsave(&desc->lock, flags);
		for (action = desc->action; action; action = action->next) {
			if (action->name && !strcmp(action->name, name)) {
				found = true;
				break;
			}
		}
		raw_spin_unlock_irqrestore(&desc->lock, flags);
	}
	rcu_read_unlock();
	return found;
}

/* nr_irqs became private in 6.13; irq_get_nr_irqs() replaced it (Kbuild probes) */
static unsigned int arfs_nr_irqs(void)
{
#ifdef ARFS_HAVE_IRQ_GET_NR_IRQS
	return irq_get_nr_irqs();
#else
	return nr_irqs;
#endif
}

static int arfs_find_irq(const char *name)
{
	unsigned int irq, n = arfs_nr_irqs();

	for (irq = 1; irq < n; irq++)
		if (arfs_irq_has_name(irq, name))
			return irq;
	return -ENOENT;
}

/* parse the irqs= comma list; *n = 0 when it is empty */
static int arfs_parse_irqs(struct net_device *dev, int *list, unsigned int *n)
{
	char buf[sizeof(irqs)];
	char *s = buf, *tok;
	int rc;

	*n = 0;
	strscpy(buf, irqs, sizeof(buf));
	while ((tok = strsep(&s, ",")) != NULL) {
		tok = strim(tok);
		if (!*tok)
			continue;
		if (*n >= ARFS_MAX_QUEUES) {
			arfs_err(dev, "irqs=: more than %d entries\n", ARFS_MAX_QUEUES);
			return -EINVAL;
		}
		rc = kstrtoint(tok, 10, &list[*n]);
		if (rc) {
			arfs_err(dev, "irqs=: '%s' is not a number\n", tok);
			return rc;
		}
		(*n)++;
	}
	return 0;
}

static int arfs_collect_irqs(struct arfs_priv *p)
{
	struct net_device *dev = p->dev;
	const char *vname = dev_name(dev->dev.parent);
	unsigned int nrxq = dev->real_num_rx_queues;
	int list[ARFS_MAX_QUEUES];
	unsigned int q, n;
	char name[64];
	int irq, rc;

	rc = arfs_parse_irqs(dev, list, &n);
	if (rc)
		return rc;
	if (n) {
		if (n > nrxq)
			arfs_warn(dev, "irqs= names %u IRQs but only %u RX queues are enabled; using the first %u\n",
				  n, nrxq, nrxq);
		else if (n < nrxq)
			arfs_warn(dev, "irqs= names %u IRQs for %u RX queues; steering targets only queues 0-%u\n",
				  n, nrxq, n - 1);
		p->nr_rmap = min(n, nrxq);
		for (q = 0; q < p->nr_rmap; q++) {
			if (list[q] <= 0 || !irq_get_irq_data(list[q])) {
				arfs_err(dev, "irqs=: %d is not an IRQ\n", list[q]);
				return -EINVAL;
			}
			snprintf(name, sizeof(name), "%s-input.%u", vname, q);
			if (!arfs_irq_has_name(list[q], name))
				arfs_warn(dev, "IRQ %d is not named %s; using it for RX queue %u anyway\n",
					  list[q], name, q);
			p->rmap_irqs[q] = list[q];
		}
		return 0;
	}

	if (nrxq > ARFS_MAX_QUEUES) {
		arfs_err(dev, "%u RX queues, at most %d supported\n",
			 nrxq, ARFS_MAX_QUEUES);
		return -EINVAL;
	}
	for (q = 0; q < nrxq; q++) {
		snprintf(name, sizeof(name), "%s-input.%u", vname, q);
		irq = arfs_find_irq(name);
		if (irq < 0) {
			arfs_err(dev, "no IRQ named %s (per-queue MSI-X vectors needed: QEMU virtio-net-pci vectors=2N+2); pass irqs=\n",
				 name);
			return -ENOENT;
		}
		p->rmap_irqs[q] = irq;
	}
	p->nr_rmap = nrxq;
	return 0;
}

/*
 * The IRQ's affinity as the rmap notifier would see it: on x86 a new MSI
 * affinity stays pending until the next interrupt, so virtio_net's per-queue
 * affinity may not have reached irq_common_data yet.
 */
static void arfs_irq_affinity(unsigned int irq, struct cpumask *out)
{
	struct irq_desc *desc;
	struct irq_data *d;
	unsigned long flags;

	cpumask_clear(out);
	rcu_read_lock();
	d = irq_get_irq_data(irq);
	if (d) {
		desc = irq_data_to_desc(d);
		raw_spin_lock_irqsave(&desc->lock, flags);
#ifdef CONFIG_GENERIC_PENDING_IRQ
		if (irqd_is_setaffinity_pending(d))
			cpumask_copy(out, desc->pending_mask);
		else
#endif
			cpumask_copy(out, irq_data_get_affinity_mask(d));
		raw_spin_unlock_irqrestore(&desc->lock, flags);
	}
	rcu_read_unlock();
}

/*
 * virtio_net does not tell the core which IRQ serves an RX queue's NAPI
 * instance (mlx5 does, with netif_napi_set_irq()): netlink's napi-get, which
 * toeplitz.py maps queues to CPUs with, then has no irq. Set it for the RX
 * queues that have a NAPI instance at attach (the enabled queues of a running
 * device; the instance and its irq outlive a link down and a channel change),
 * from the IRQs the rmap uses. @set false clears the ones we set.
 */
static void arfs_napi_irqs(struct arfs_priv *p, bool set)
{
#ifdef ARFS_HAVE_NAPI_IRQ_LOCKED
	struct net_device *dev = p->dev;
	struct napi_struct *napi;
	unsigned int i;

	netdev_lock(dev);
	if (set) {
		for (i = 0; i < p->nr_rmap && i < dev->real_num_rx_queues; i++) {
			napi = __netif_get_rx_queue(dev, i)->napi;
			if (napi && napi->irq < 0)
				netif_napi_set_irq_locked(napi, p->rmap_irqs[i]);
		}
	} else {
		list_for_each_entry(napi, &dev->napi_list, dev_list)
			for (i = 0; i < p->nr_rmap; i++)
				if (napi->irq == p->rmap_irqs[i])
					netif_napi_set_irq_locked(napi, -1);
	}
	netdev_unlock(dev);
#endif
}

static int arfs_build_rmap(struct arfs_priv *p)
{
	cpumask_var_t mask;
	unsigned int i, j;
	int rc;

	if (!zalloc_cpumask_var(&mask, GFP_KERNEL))
		return -ENOMEM;
	p->rmap = alloc_irq_cpu_rmap(p->nr_rmap);
	if (!p->rmap) {
		free_cpumask_var(mask);
		return -ENOMEM;
	}
	for (i = 0; i < p->nr_rmap; i++) {
		rc = irq_cpu_rmap_add(p->rmap, p->rmap_irqs[i]);
		if (rc) {
			arfs_err(p->dev, "irq_cpu_rmap_add(IRQ %d): %d\n",
				 p->rmap_irqs[i], rc);
			/* undo by hand: older free_irq_cpu_rmap() trips over
			 * the failed slot
			 */
			for (j = 0; j < i; j++)
				irq_set_affinity_notifier(p->rmap_irqs[j], NULL);
			cpu_rmap_put(p->rmap);
			p->rmap = NULL;
			free_cpumask_var(mask);
			return rc;
		}
		/* the notifier only fires on later changes: seed the map */
		arfs_irq_affinity(p->rmap_irqs[i], mask);
		if (!cpumask_empty(mask))
			cpu_rmap_update(p->rmap, i, mask);
		arfs_info(p->dev, "RX queue %u: IRQ %d, affinity %*pbl\n", i,
			  p->rmap_irqs[i], cpumask_pr_args(mask));
	}
	free_cpumask_var(mask);
	return 0;
}

/* ---- attach / detach -------------------------------------------------- */

static bool arfs_is_virtio_net(struct net_device *dev)
{
	struct device *parent = dev->dev.parent;

	return parent && parent->driver && parent->driver->name &&
	       !strcmp(parent->driver->name, "virtio_net");
}

/* turn steering off; RTNL held.  The caller waits for RCU afterwards. */
static void arfs_steering_off_features(struct arfs_priv *p)
{
	struct net_device *dev = p->dev;

	dev->hw_features &= ~p->added_hw_features;
	dev->wanted_features &= ~p->added_wanted_features;
	if (dev->features & p->added_features) {
		dev->features &= ~p->added_features;
		netdev_features_change(dev);
	}
}

/*
 * ethtool -S: virtio_net's counters, then the driver's (arfs_*) and the
 * device's (dev_*, from DEV_STATS).  ethtool calls these under RTNL, and the
 * ops are swapped under RTNL, so no call runs on a stale copy.
 */
#define ARFS_ETH_NSTATS	((ARFS_CTR_NR - 1) + ARFS_DIAG_NR + (ARFS_DEV_CTR_NR - 1))

static int arfs_orig_sset_count(struct arfs_priv *p, struct net_device *dev,
				int sset)
{
	if (!p->orig_eops->get_sset_count)
		return sset == ETH_SS_STATS ? 0 : -EOPNOTSUPP;
	return p->orig_eops->get_sset_count(dev, sset);
}

static int arfs_get_sset_count(struct net_device *dev, int sset)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	int n = arfs_orig_sset_count(p, dev, sset);

	if (sset != ETH_SS_STATS || n < 0)
		return n;
	return n + ARFS_ETH_NSTATS;
}

static void arfs_get_strings(struct net_device *dev, u32 sset, u8 *data)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	char *s;
	int i;

	if (p->orig_eops->get_strings)
		p->orig_eops->get_strings(dev, sset, data);
	if (sset != ETH_SS_STATS)
		return;
	s = (char *)data + max(arfs_orig_sset_count(p, dev, sset), 0) *
			   ETH_GSTRING_LEN;
	for (i = 1; i < ARFS_CTR_NR; i++, s += ETH_GSTRING_LEN)
		snprintf(s, ETH_GSTRING_LEN, "arfs_%s", arfs_ctr_names[i]);
	for (i = 0; i < ARFS_DIAG_NR; i++, s += ETH_GSTRING_LEN)
		snprintf(s, ETH_GSTRING_LEN, "arfs_%s", arfs_diag_names[i]);
	for (i = 1; i < ARFS_DEV_CTR_NR; i++, s += ETH_GSTRING_LEN)
		snprintf(s, ETH_GSTRING_LEN, "dev_%s", arfs_dev_ctr_names[i]);
}

static void arfs_get_ethtool_stats(struct net_device *dev,
				   struct ethtool_stats *stats, u64 *data)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	int i;

	if (p->orig_eops->get_ethtool_stats)
		p->orig_eops->get_ethtool_stats(dev, stats, data);
	data += max(arfs_orig_sset_count(p, dev, ETH_SS_STATS), 0);
	for (i = 1; i < ARFS_CTR_NR; i++)
		*data++ = arfs_ctr_read(p, i);
	for (i = 0; i < ARFS_DIAG_NR; i++)
		*data++ = atomic64_read(&p->diag[i]);
	for (i = 1; i < ARFS_DEV_CTR_NR; i++)
		*data++ = atomic64_read(&p->dev_ctr[i]);
}

/*
 * ethtool -x / -X: the device's RSS through RSS_GET / RSS_SET, each a
 * synchronous command bounded by cmd_timeout_ms (-ETIMEDOUT).  The ethtool
 * core calls these under RTNL.  The sizes come from the latest RSS_GET; the
 * first call asks the device (0 while it has not answered: ethtool then says
 * the operation is not supported).
 */
static u32 arfs_get_rxfh_key_size(struct net_device *dev)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);

	if (!p->rss_valid)
		arfs_rss_get(p, NULL, NULL, NULL);
	return p->rss_valid ? p->rss_key_size : 0;
}

static u32 arfs_get_rxfh_indir_size(struct net_device *dev)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);

	if (!p->rss_valid)
		arfs_rss_get(p, NULL, NULL, NULL);
	return p->rss_valid ? p->rss_indir_size : 0;
}

/* Kbuild probes for struct ethtool_rxfh_param (the ops take it since 6.8) */
#ifdef ARFS_HAVE_ETHTOOL_RXFH_PARAM
static int arfs_get_rxfh(struct net_device *dev,
			 struct ethtool_rxfh_param *rxfh)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	int rc;

	rc = arfs_rss_get(p, rxfh->indir, rxfh->key, &rxfh->hfunc);
#ifdef ARFS_HAVE_INPUT_XFRM
	/* a version 2 device has no input-xfrm: none */
	if (!rc && arfs_hash_xfrm_get(p, &rxfh->input_xfrm))
		rxfh->input_xfrm = 0;
#endif
	return rc;
}

static int arfs_set_rxfh(struct net_device *dev,
			 struct ethtool_rxfh_param *rxfh,
			 struct netlink_ext_ack *extack)
{
	struct arfs_priv *p = arfs_from_ethtool(dev);
	int rc = 0;

	if (rxfh->rss_context)
		return -EOPNOTSUPP;
#ifdef ARFS_HAVE_INPUT_XFRM
	/* the core checked the fields suit it (ethtool_check_xfrm_rxfh) */
	rc = arfs_hash_xfrm_set(p, rxfh->input_xfrm);
	if (rc)
		return rc;
#endif
	if (rxfh->indir || rxfh->key || rxfh->hfunc != ETH_RSS_HASH_NO_CHANGE)
		rc = arfs_rss_set(p, rxfh->indir, rxfh->key, rxfh->hfunc);
	return rc;
}
#else
static int arfs_get_rxfh(struct net_device *dev, u32 *indir, u8 *key,
			 u8 *hfunc)
{
	return arfs_rss_get(arfs_from_ethtool(dev), indir, key, hfunc);
}

static int arfs_set_rxfh(struct net_device *dev, const u32 *indir,
			 const u8 *key, const u8 hfunc)
{
	return arfs_rss_set(arfs_from_ethtool(dev), indir, key, hfunc);
}
#endif

static void arfs_steering_off_ops(struct arfs_priv *p)
{
	struct net_device *dev = p->dev;

	arfs_napi_irqs(p, false);
	WRITE_ONCE(dev->rx_cpu_rmap, NULL);
	WRITE_ONCE(dev->netdev_ops, p->orig_ops);
	if (p->orig_eops) {
		/* the core must not call the driver's ops for our contexts */
		arfs_ctx_detach(p);
		WRITE_ONCE(dev->ethtool_ops, p->orig_eops);
	}
	p->steering = false;
}

static void arfs_detach(struct arfs_priv *p, bool rtnl_held)
{
	struct net_device *dev = p->dev;
	bool was_steering = p->steering;
	HLIST_HEAD(del_list);

	debugfs_remove_recursive(p->dbg);
	p->dbg = NULL;

	if (p->steering) {
		/* 1. the core stops calling us once NTUPLE is gone and the
		 * RCU readers in get_rps_cpu() are done; only then may the
		 * rmap and the ops go (set_rps_cpu() reads both unchecked).
		 */
		if (!rtnl_held)
			rtnl_lock();
		arfs_steering_off_features(p);
		if (!rtnl_held)
			rtnl_unlock();
		synchronize_net();
		if (!rtnl_held)
			rtnl_lock();
		arfs_steering_off_ops(p);
		if (!rtnl_held)
			rtnl_unlock();
		synchronize_net();
	}

	/* 2. stop the works and fail commands still waiting */
	spin_lock_bh(&p->arfs_lock);
	WRITE_ONCE(p->stopping, true);
	spin_unlock_bh(&p->arfs_lock);
	arfs_cmd_close(p);
	if (p->works_started) {
		cancel_delayed_work_sync(&p->stats_work);
		cancel_delayed_work_sync(&p->expire_work);
	}

	arfs_rules_take_all(p, &del_list);
	arfs_rules_cancel_work(&del_list);
	if (p->wq) {
		destroy_workqueue(p->wq);
		p->wq = NULL;
	}

	/* 3. empty the device table with one FLUSH (it keeps the user
	 * rules: RULE_DEL ALL), free the ntuple rule store
	 */
	if (p->pt_added && netif_running(dev))
		arfs_cmd_flush(p);
	arfs_nfc_detach(p, p->pt_added && netif_running(dev));

	/* 4. stop receiving, free the rules and the rmap */
	if (p->pt_added) {
		dev_remove_pack(&p->pt);
		p->pt_added = false;
	}
	arfs_rules_free(&del_list);
	if (p->rmap) {
		free_irq_cpu_rmap(p->rmap);
		p->rmap = NULL;
	}
	arfs_free_tables(p);
	if (was_steering)
		arfs_info(dev, "aRFS detached\n");
	netdev_put(dev, &p->dev_tracker);
	p->dev = NULL;
}

static int arfs_netdev_event(struct notifier_block *nb, unsigned long event,
			     void *ptr)
{
	struct net_device *dev = netdev_notifier_info_to_dev(ptr);
	struct arfs_priv *p, *tmp;

	/* runs under RTNL, as do attach's final section and exit's check */
	if (arfs_exiting)
		return NOTIFY_DONE;
	if (event == NETDEV_UP) {
		list_for_each_entry(p, &arfs_list, node)
			if (p->dev == dev) {
				arfs_hash_dev_up(p);
				arfs_nfc_dev_up(p);
			}
		return NOTIFY_DONE;
	}
	if (event != NETDEV_UNREGISTER)
		return NOTIFY_DONE;
	list_for_each_entry_safe(p, tmp, &arfs_list, node) {
		if (p->dev != dev)
			continue;
		arfs_info(dev, "interface is going away, detaching aRFS\n");
		list_del(&p->node);
		arfs_detach(p, true);
		kvfree(p);
	}
	return NOTIFY_DONE;
}

static struct notifier_block arfs_netdev_nb = {
	.notifier_call = arfs_netdev_event,
};

/*
 * Attach to the interface @name.  Returns 0 with the instance on arfs_list,
 * or a negative errno with nothing left behind.
 */
static int arfs_attach(const char *name)
{
	struct net_device *dev;
	struct arfs_priv *p;
	int rc = 0;

	p = kvzalloc(sizeof(*p), GFP_KERNEL);
	if (!p)
		return -ENOMEM;
	spin_lock_init(&p->arfs_lock);
	spin_lock_init(&p->cmd_lock);
	INIT_LIST_HEAD(&p->cmd_pending);
	INIT_LIST_HEAD(&p->nfc_rules);
	p->proto_version = ARFS_PROTO_VERSION;
	INIT_DELAYED_WORK(&p->stats_work, arfs_stats_work);
	INIT_DELAYED_WORK(&p->expire_work, arfs_expire_work);

	rtnl_lock();
	dev = __dev_get_by_name(&init_net, name);
	if (!dev) {
		pr_err("interface %s not found (ifname=)\n", name);
		rc = -ENODEV;
	} else if (!arfs_is_virtio_net(dev)) {
		pr_err("%s is not a virtio_net interface\n", name);
		rc = -EINVAL;
	} else if (dev->netdev_ops->ndo_rx_flow_steer || dev->rx_cpu_rmap) {
		pr_err("%s already has an aRFS implementation\n", name);
		rc = -EEXIST;
	} else {
		netdev_hold(dev, &p->dev_tracker, GFP_KERNEL);
		p->dev = dev;
	}
	rtnl_unlock();
	if (rc) {
		kvfree(p);
		return rc;
	}

	rc = arfs_collect_irqs(p);
	if (rc)
		goto err;
	rc = arfs_build_rmap(p);
	if (rc)
		goto err;
	rc = arfs_alloc_tables(p);
	if (rc)
		goto err;
	p->wq = alloc_ordered_workqueue("%s", 0, KBUILD_MODNAME);
	if (!p->wq) {
		rc = -ENOMEM;
		goto err;
	}

	p->pt.type = htons(ARFS_ETH_P);
	p->pt.dev = dev;
	p->pt.func = arfs_rcv;
	dev_add_pack(&p->pt);
	p->pt_added = true;

	arfs_hello(p);

	arfs_debugfs_init(p);
	p->works_started = true;
	schedule_delayed_work(&p->stats_work, msecs_to_jiffies(ARFS_STATS_PERIOD_MS));
	queue_delayed_work(p->wq, &p->expire_work,
			   msecs_to_jiffies(arfs_expire_interval_ms ?
					    arfs_expire_interval_ms : 1000));

	/* after this section the netdev notifier may detach and free p */
	rtnl_lock();
	if (dev->reg_state != NETREG_REGISTERED) {
		rtnl_unlock();
		rc = -ENODEV;
		goto err;
	}
	p->orig_ops = dev->netdev_ops;
	p->ops = *dev->netdev_ops;
	p->ops.ndo_rx_flow_steer = arfs_rx_flow_steer;
	/* ntuple-filters off also removes the ethtool ntuple rules */
	p->ops.ndo_set_features = arfs_nfc_set_features;
	if (dev->ethtool_ops) {
		p->orig_eops = dev->ethtool_ops;
		p->eops = *dev->ethtool_ops;
		p->eops.get_sset_count = arfs_get_sset_count;
		p->eops.get_strings = arfs_get_strings;
		p->eops.get_ethtool_stats = arfs_get_ethtool_stats;
		p->eops.get_rxfh_key_size = arfs_get_rxfh_key_size;
		p->eops.get_rxfh_indir_size = arfs_get_rxfh_indir_size;
		p->eops.get_rxfh = arfs_get_rxfh;
		p->eops.set_rxfh = arfs_set_rxfh;
		p->eops.get_rxnfc = arfs_get_rxnfc;
		p->eops.set_rxnfc = arfs_set_rxnfc;
		if (p->orig_eops->set_channels)
			p->eops.set_channels = arfs_set_channels;
#ifdef ARFS_HAVE_RXFH_FIELDS
		p->eops.get_rxfh_fields = arfs_get_rxfh_fields;
		p->eops.set_rxfh_fields = arfs_set_rxfh_fields;
#endif
#ifdef ARFS_HAVE_INPUT_XFRM
		p->eops.supported_input_xfrm = RXH_XFRM_SYM_XOR;
#endif
#ifdef ARFS_HAVE_RXFH_CONTEXT
		p->eops.create_rxfh_context = arfs_create_rxfh_context;
		p->eops.modify_rxfh_context = arfs_modify_rxfh_context;
		p->eops.remove_rxfh_context = arfs_remove_rxfh_context;
		p->eops.rxfh_max_num_contexts = ARFS_RSS_CTX_MAX;
		p->eops.rxfh_per_ctx_key = 1;
		/* context N action Q: the device adds Q to the context's queue */
		p->eops.cap_rss_rxnfc_adds = 1;
#endif
		WRITE_ONCE(dev->ethtool_ops, &p->eops);
	}
	list_add_tail(&p->node, &arfs_list);
	WRITE_ONCE(dev->netdev_ops, &p->ops);
	WRITE_ONCE(dev->rx_cpu_rmap, p->rmap);
	/* ops and rmap must be visible before the core sees NTUPLE */
	smp_wmb();
	p->added_hw_features = NETIF_F_NTUPLE & ~dev->hw_features;
	p->added_wanted_features = NETIF_F_NTUPLE & ~dev->wanted_features;
	p->added_features = NETIF_F_NTUPLE & ~dev->features;
	dev->hw_features |= NETIF_F_NTUPLE;
	dev->wanted_features |= NETIF_F_NTUPLE;
	dev->features |= NETIF_F_NTUPLE;
	p->steering = true;
	netdev_features_change(dev);
	arfs_napi_irqs(p, true);
	arfs_info(dev, "aRFS attached: %u RX queues in the rmap, %u buckets per table, ntuple on\n",
		  p->nr_rmap, 1U << p->hash_bits);
	rtnl_unlock();
	return 0;

err:
	/* p never was on arfs_list on this path: the notifier ignores it */
	arfs_detach(p, false);
	kvfree(p);
	return rc;
}

static int __init arfs_init(void)
{
	int rc;

	/*
	 * Registered first so that an unregistration racing with the load is
	 * never missed: until an instance is on arfs_list the handler ignores
	 * it, and attach's final RTNL section re-checks the device's state.
	 */
	rc = register_netdevice_notifier(&arfs_netdev_nb);
	if (rc)
		return rc;
	rc = arfs_attach(ifname);
	if (rc)
		unregister_netdevice_notifier(&arfs_netdev_nb);
	return rc;
}

static void __exit arfs_exit(void)
{
	struct arfs_priv *p, *tmp;
	LIST_HEAD(list);

	rtnl_lock();
	arfs_exiting = true;
	list_splice_init(&arfs_list, &list);
	rtnl_unlock();
	unregister_netdevice_notifier(&arfs_netdev_nb);

	list_for_each_entry_safe(p, tmp, &list, node) {
		list_del(&p->node);
		arfs_detach(p, false);
		kvfree(p);
	}
}

module_init(arfs_init);
module_exit(arfs_exit);

MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("aRFS (ndo_rx_flow_steer) for virtio_net on the arfsnic emulated NIC");
MODULE_AUTHOR("arfsnic developers");

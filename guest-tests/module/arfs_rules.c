// SPDX-License-Identifier: GPL-2.0
/*
 * arfs_virtio rule tables, with the shape of mlx5's en_arfs.c: per-type hash
 * tables of 5-tuples, ndo_rx_flow_steer, the per-rule work that installs or
 * moves the device filter, and expiry through rps_may_expire_flow().
 */

#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/hash.h>
#include <linux/kernel.h>
#include <linux/ktime.h>
#include <linux/log2.h>
#include <linux/mm.h>
#include <linux/netdevice.h>
#include <linux/skbuff.h>
#include <linux/slab.h>
#include <net/flow_dissector.h>
#include <net/ipv6.h>
/* Kbuild probes the tree for <net/rps.h> (since 6.10) */
#ifdef ARFS_HAVE_NET_RPS_H
#include <net/rps.h>
#endif

#include "arfs.h"

#ifndef RPS_NO_FILTER
#define RPS_NO_FILTER 0xffff
#endif

/* ---- instrumented arfs_lock ------------------------------------------- */

/* raise a *_MAX counter; callers hold arfs_lock, so compare-and-set is enough */
static void arfs_ctr_max(struct arfs_priv *p, int id, u64 v)
{
	if (v > atomic64_read(&p->ctr[id]))
		atomic64_set(&p->ctr[id], v);
}

void arfs_lock_bh(struct arfs_priv *p)
{
	u64 t0, wait;

	if (spin_trylock_bh(&p->arfs_lock)) {
		atomic64_inc(&p->ctr[ARFS_CTR_LOCK_ACQUIRED]);
		p->lock_t0 = ktime_get_ns();
		return;
	}
	t0 = ktime_get_ns();
	spin_lock_bh(&p->arfs_lock);
	p->lock_t0 = ktime_get_ns();
	wait = p->lock_t0 - t0;
	atomic64_inc(&p->ctr[ARFS_CTR_LOCK_ACQUIRED]);
	atomic64_inc(&p->ctr[ARFS_CTR_LOCK_CONTENDED]);
	atomic64_add(wait, &p->ctr[ARFS_CTR_LOCK_WAIT_NS_TOTAL]);
	arfs_ctr_max(p, ARFS_CTR_LOCK_WAIT_NS_MAX, wait);
}

void arfs_unlock_bh(struct arfs_priv *p)
{
	u64 hold = ktime_get_ns() - p->lock_t0;

	atomic64_add(hold, &p->ctr[ARFS_CTR_LOCK_HOLD_NS_TOTAL]);
	arfs_ctr_max(p, ARFS_CTR_LOCK_HOLD_NS_MAX, hold);
	spin_unlock_bh(&p->arfs_lock);
}

static void arfs_hold(void)
{
	unsigned long ns = READ_ONCE(arfs_hold_ns);
	u64 end;

	if (!ns)
		return;
	end = ktime_get_ns() + min(ns, ARFS_HOLD_NS_MAX);
	while (ktime_get_ns() < end)
		cpu_relax();
}

/* ---- rule tables (mlx5 en_arfs.c shape) ------------------------------- */

static struct hlist_head *arfs_hash_bucket(struct arfs_priv *p, int type,
					   __be16 src_port, __be16 dst_port)
{
	/* same key mix as mlx5: only the ports select the bucket */
	unsigned long l = (__force unsigned long)src_port |
			  ((__force unsigned long)dst_port << 2);

	return &p->tables[type][hash_long(l, p->hash_bits)];
}

static int arfs_get_type(__be16 etype, u8 ip_proto)
{
	if (etype == htons(ETH_P_IP) && ip_proto == IPPROTO_TCP)
		return ARFS_IPV4_TCP;
	if (etype == htons(ETH_P_IP) && ip_proto == IPPROTO_UDP)
		return ARFS_IPV4_UDP;
	if (etype == htons(ETH_P_IPV6) && ip_proto == IPPROTO_TCP)
		return ARFS_IPV6_TCP;
	if (etype == htons(ETH_P_IPV6) && ip_proto == IPPROTO_UDP)
		return ARFS_IPV6_UDP;
	return -1;
}

static bool arfs_tuple_eq(const struct arfs_tuple *a, const struct arfs_tuple *b)
{
	if (a->src_port != b->src_port || a->dst_port != b->dst_port)
		return false;
	if (a->etype == htons(ETH_P_IP))
		return a->src_ipv4 == b->src_ipv4 && a->dst_ipv4 == b->dst_ipv4;
	return ipv6_addr_equal(&a->src_ipv6, &b->src_ipv6) &&
	       ipv6_addr_equal(&a->dst_ipv6, &b->dst_ipv6);
}

static struct arfs_rule *arfs_find_rule(struct arfs_priv *p, int type,
					const struct arfs_tuple *t)
{
	struct arfs_rule *rule;

	hlist_for_each_entry(rule, arfs_hash_bucket(p, type, t->src_port, t->dst_port),
			     hlist) {
		if (arfs_tuple_eq(&rule->tuple, t))
			return rule;
	}
	return NULL;
}

/*
 * The steer_same answer without arfs_lock: the rule exists and points at
 * @rxq, or its command is pending.  A reader may follow a rule that expiry
 * just moved to its private list; it then misses and takes the locked path.
 * Expiry frees rules after a grace period, so the walk stays safe.
 */
static int arfs_steer_same_rcu(struct arfs_priv *p, int type,
			       const struct arfs_tuple *t, u16 rxq)
{
	struct arfs_rule *rule;
	int id = -ENOENT;

	rcu_read_lock();
	hlist_for_each_entry_rcu(rule, arfs_hash_bucket(p, type, t->src_port, t->dst_port),
				 hlist) {
		if (!arfs_tuple_eq(&rule->tuple, t))
			continue;
		if (READ_ONCE(rule->rxq) == rxq || work_busy(&rule->arfs_work))
			id = rule->filter_id;
		break;
	}
	rcu_read_unlock();
	return id;
}

static void arfs_rule_work(struct work_struct *work);

static struct arfs_rule *arfs_alloc_rule(struct arfs_priv *p, int type,
					 const struct arfs_tuple *t,
					 u16 rxq, u32 flow_id)
{
	struct arfs_rule *rule;
	s64 now;

	rule = kzalloc(sizeof(*rule), GFP_ATOMIC);
	if (!rule)
		return NULL;
	INIT_WORK(&rule->arfs_work, arfs_rule_work);
	rule->priv = p;
	rule->tuple = *t;
	rule->type = type;
	rule->rxq = rxq;
	rule->flow_id = flow_id;
	rule->hw = ARFS_HW_NONE;
	rule->filter_id = p->last_filter_id++ % RPS_NO_FILTER;
	hlist_add_head_rcu(&rule->hlist, arfs_hash_bucket(p, type, t->src_port, t->dst_port));
	hlist_add_head(&rule->id_node, &p->id_hash[hash_32(rule->filter_id, p->hash_bits)]);

	now = atomic64_inc_return(&p->ctr[ARFS_CTR_RULES_NOW]);
	if (now > atomic64_read(&p->ctr[ARFS_CTR_RULES_PEAK]))
		atomic64_set(&p->ctr[ARFS_CTR_RULES_PEAK], now);
	return rule;
}

/* caller holds arfs_lock */
static void arfs_unlink_rule(struct arfs_priv *p, struct arfs_rule *rule)
{
	hlist_del_init_rcu(&rule->hlist);
	hlist_del_init(&rule->id_node);
	atomic64_dec(&p->ctr[ARFS_CTR_RULES_NOW]);
}

/*
 * The instance whose ops copy @dev uses, or NULL once the original ops are
 * back.  Only those copies point at arfs_rx_flow_steer, and an instance
 * outlives the RCU readers that may still see its ops (see arfs_detach()).
 */
static struct arfs_priv *arfs_from_netdev(const struct net_device *dev)
{
	const struct net_device_ops *ops = READ_ONCE(dev->netdev_ops);

	if (ops->ndo_rx_flow_steer != arfs_rx_flow_steer)
		return NULL;
	return container_of(ops, struct arfs_priv, ops);
}

int arfs_rx_flow_steer(struct net_device *dev, const struct sk_buff *skb,
		       u16 rxq_index, u32 flow_id)
{
	struct arfs_priv *p = arfs_from_netdev(dev);
	struct arfs_tuple t = {};
	struct arfs_rule *rule;
	struct flow_keys fk;
	int type, id;

	if (unlikely(!p))
		return -EPERM;
	arfs_ctr_inc(p, ARFS_CTR_STEER_CALLS);

	if (!skb_flow_dissect_flow_keys(skb, &fk, 0))
		goto noproto;
	if (fk.basic.n_proto != htons(ETH_P_IP) &&
	    fk.basic.n_proto != htons(ETH_P_IPV6))
		goto noproto;
	if (skb->encapsulation || (fk.control.flags & FLOW_DIS_ENCAPSULATION) ||
	    (fk.control.flags & FLOW_DIS_IS_FRAGMENT))
		goto noproto;
	type = arfs_get_type(fk.basic.n_proto, fk.basic.ip_proto);
	if (type < 0)
		goto noproto;

	t.etype = fk.basic.n_proto;
	t.ip_proto = fk.basic.ip_proto;
	if (t.etype == htons(ETH_P_IP)) {
		if (fk.control.addr_type != FLOW_DISSECTOR_KEY_IPV4_ADDRS)
			goto noproto;
		t.src_ipv4 = fk.addrs.v4addrs.src;
		t.dst_ipv4 = fk.addrs.v4addrs.dst;
	} else {
		if (fk.control.addr_type != FLOW_DISSECTOR_KEY_IPV6_ADDRS)
			goto noproto;
		t.src_ipv6 = fk.addrs.v6addrs.src;
		t.dst_ipv6 = fk.addrs.v6addrs.dst;
	}
	t.src_port = fk.ports.src;
	t.dst_port = fk.ports.dst;

	/* the rmap may name a queue the guest disabled with ethtool -L */
	if (rxq_index >= dev->real_num_rx_queues) {
		arfs_diag_inc(p, ARFS_DIAG_STEER_EINVAL);
		return -EINVAL;
	}

	if (READ_ONCE(arfs_same_lockless) && !READ_ONCE(arfs_disabled) &&
	    !READ_ONCE(p->engine_disabled) && !READ_ONCE(p->stopping)) {
		id = arfs_steer_same_rcu(p, type, &t, rxq_index);
		if (id >= 0) {
			arfs_ctr_inc(p, ARFS_CTR_STEER_SAME);
			return id;
		}
	}

	arfs_lock_bh(p);
	arfs_hold();
	if (READ_ONCE(arfs_disabled) || p->engine_disabled || p->stopping) {
		arfs_unlock_bh(p);
		arfs_ctr_inc(p, ARFS_CTR_STEER_EPERM);
		return -EPERM;
	}
	rule = arfs_find_rule(p, type, &t);
	if (rule) {
		if (rule->rxq == rxq_index || work_busy(&rule->arfs_work)) {
			id = rule->filter_id;
			arfs_unlock_bh(p);
			arfs_ctr_inc(p, ARFS_CTR_STEER_SAME);
			return id;
		}
		WRITE_ONCE(rule->rxq, rxq_index);
		arfs_ctr_inc(p, ARFS_CTR_STEER_UPDATE);
	} else {
		rule = arfs_alloc_rule(p, type, &t, rxq_index, flow_id);
		if (!rule) {
			arfs_unlock_bh(p);
			arfs_ctr_inc(p, ARFS_CTR_STEER_ENOMEM);
			return -ENOMEM;
		}
		arfs_ctr_inc(p, ARFS_CTR_STEER_NEW);
	}
	if (queue_work(p->wq, &rule->arfs_work)) {
		rule->queued_ns = ktime_get_ns();
		if (!p->first_queued_ns)
			p->first_queued_ns = rule->queued_ns;
	}
	id = rule->filter_id;
	arfs_unlock_bh(p);
	return id;

noproto:
	arfs_ctr_inc(p, ARFS_CTR_STEER_EPROTONOSUPPORT);
	return -EPROTONOSUPPORT;
}

/* remember an expired rule for debugfs "expired"; caller holds arfs_lock */
static void arfs_note_gone(struct arfs_priv *p, const struct arfs_rule *rule)
{
	struct arfs_gone *g = &p->gone[p->gone_next++ % ARFS_GONE_MAX];

	g->tuple = rule->tuple;
	g->flow_id = rule->flow_id;
	g->filter_id = rule->filter_id;
	g->rxq = rule->rxq;
	g->type = rule->type;
}

/* a work queued at @queued_ns ran @delay late; caller holds arfs_lock */
static void arfs_note_delay(struct arfs_priv *p, u64 queued_ns, u64 delay)
{
	u64 since = queued_ns > p->first_queued_ns ? queued_ns - p->first_queued_ns : 0;
	u64 bin = div_u64(since, ARFS_DELAY_BIN_MS * NSEC_PER_MSEC);
	u16 ms = min_t(u64, div_u64(delay, NSEC_PER_MSEC), U16_MAX);
	u32 us = min_t(u64, div_u64(delay, NSEC_PER_USEC), U32_MAX);
	struct arfs_delay_bin *b;

	if (bin >= ARFS_DELAY_BINS)
		return;
	b = &p->delays[bin];
	b->max_ms = max(b->max_ms, ms);
	if (b->works < U16_MAX) {
		b->works++;
		b->sum_us = min_t(u64, (u64)b->sum_us + us, U32_MAX);
	}
}

static void arfs_may_expire_flow(struct arfs_priv *p)
{
	unsigned int quota = READ_ONCE(arfs_expire_quota), n = 0;
	struct arfs_rule *rule;
	struct hlist_node *tmp;
	u64 scanned = 0;
	int t, j, rc;
	HLIST_HEAD(del_list);

	arfs_lock_bh(p);
	if (p->stopping) {
		arfs_unlock_bh(p);
		return;
	}
	arfs_ctr_inc(p, ARFS_CTR_EXPIRE_SCANS);
	for (t = 0; t < ARFS_NUM_TYPES && n < quota; t++) {
		for (j = 0; j < (1 << p->hash_bits) && n < quota; j++) {
			hlist_for_each_entry_safe(rule, tmp, &p->tables[t][j], hlist) {
				scanned++;
				if (work_pending(&rule->arfs_work) ||
				    !rps_may_expire_flow(p->dev, rule->rxq,
							 rule->flow_id,
							 rule->filter_id))
					continue;
				arfs_unlink_rule(p, rule);
				arfs_note_gone(p, rule);
				hlist_add_head_rcu(&rule->hlist, &del_list);
				if (++n >= quota)
					break;
			}
		}
	}
	atomic64_add(scanned, &p->ctr[ARFS_CTR_EXPIRE_SCANNED]);
	arfs_unlock_bh(p);

	hlist_for_each_entry_safe(rule, tmp, &del_list, hlist) {
		/* keeps ->next for a lockless reader that followed the rule here */
		hlist_del_rcu(&rule->hlist);
		if (rule->hw != ARFS_HW_NONE) {
			rc = arfs_cmd_del(p, rule->filter_id);
			if (!rc)
				arfs_ctr_inc(p, ARFS_CTR_DELS_OK);
			else
				arfs_count_err(p, ARFS_ERR_KIND_DEL, rc);
		}
		kfree_rcu(rule, rcu);
	}
}

static void arfs_rule_work(struct work_struct *work)
{
	struct arfs_rule *rule = container_of(work, struct arfs_rule, arfs_work);
	struct arfs_priv *p = rule->priv;
	struct arfs_tuple t;
	u32 filter_id;
	u64 delay;
	u16 rxq;
	u8 hw;
	int rc;

	arfs_lock_bh(p);
	if (p->stopping) {
		arfs_unlock_bh(p);
		return;
	}
	t = rule->tuple;
	rxq = rule->rxq;
	hw = rule->hw;
	filter_id = rule->filter_id;
	/* from the steer that queued this work to the command about to be sent */
	delay = ktime_get_ns() - rule->queued_ns;
	atomic64_inc(&p->ctr[ARFS_CTR_WORK_RUNS]);
	atomic64_add(delay, &p->ctr[ARFS_CTR_WORK_DELAY_NS_TOTAL]);
	arfs_ctr_max(p, ARFS_CTR_WORK_DELAY_NS_MAX, delay);
	arfs_note_delay(p, rule->queued_ns, delay);
	arfs_unlock_bh(p);

	if (hw == ARFS_HW_NONE) {
		rc = arfs_cmd_add(p, filter_id, rxq, &t);
		arfs_lock_bh(p);
		if (!rc) {
			rule->hw = ARFS_HW_INSTALLED;
			rule->hw_rxq = rxq;
			rule->hw_since_ns = ktime_get_ns();
		} else if (rc == -ETIMEDOUT) {
			rule->hw = ARFS_HW_UNKNOWN;
		}
		arfs_unlock_bh(p);
		if (!rc)
			arfs_ctr_inc(p, ARFS_CTR_ADDS_OK);
		else
			arfs_count_err(p, ARFS_ERR_KIND_ADD, rc);
		/* on error the rule stays in the table without a filter (mlx5) */
	} else {
		rc = arfs_cmd_mod(p, filter_id, rxq);
		arfs_lock_bh(p);
		if (!rc) {
			rule->hw = ARFS_HW_INSTALLED;
			rule->hw_rxq = rxq;
		} else if (rc == -ENOENT) {
			rule->hw = ARFS_HW_NONE;
		}
		arfs_unlock_bh(p);
		if (!rc)
			arfs_ctr_inc(p, ARFS_CTR_MODS_OK);
		else
			arfs_count_err(p, ARFS_ERR_KIND_MOD, rc);
	}

	arfs_may_expire_flow(p);
}

void arfs_expire_work(struct work_struct *work)
{
	struct arfs_priv *p = container_of(to_delayed_work(work),
					   struct arfs_priv, expire_work);
	unsigned int ms = READ_ONCE(arfs_expire_interval_ms);

	arfs_may_expire_flow(p);
	if (!READ_ONCE(p->stopping))
		queue_delayed_work(p->wq, &p->expire_work,
				   msecs_to_jiffies(ms ? ms : 1000));
}

/* ---- events and teardown ---------------------------------------------- */

/* RULE_AGED: the device dropped @filter_id; caller holds arfs_lock */
bool arfs_rules_aged(struct arfs_priv *p, u32 filter_id)
{
	struct arfs_rule *rule;
	bool hit = false;

	hlist_for_each_entry(rule, &p->id_hash[hash_32(filter_id, p->hash_bits)],
			     id_node) {
		if (rule->filter_id == filter_id) {
			rule->hw = ARFS_HW_NONE;
			hit = true;
		}
	}
	return hit;
}

/* TABLE_FLUSHED: no rule has a device filter any more; caller holds arfs_lock */
void arfs_rules_flushed(struct arfs_priv *p)
{
	struct arfs_rule *rule;
	int t, j;

	for (t = 0; t < ARFS_NUM_TYPES; t++)
		for (j = 0; j < (1 << p->hash_bits); j++)
			hlist_for_each_entry(rule, &p->tables[t][j], hlist)
				rule->hw = ARFS_HW_NONE;
}

int arfs_alloc_tables(struct arfs_priv *p)
{
	unsigned int n = roundup_pow_of_two(clamp_val(arfs_buckets, 2, 65536));
	int t;

	p->hash_bits = ilog2(n);
	for (t = 0; t < ARFS_NUM_TYPES; t++) {
		p->tables[t] = kvcalloc(n, sizeof(struct hlist_head), GFP_KERNEL);
		if (!p->tables[t])
			return -ENOMEM;
	}
	p->id_hash = kvcalloc(n, sizeof(struct hlist_head), GFP_KERNEL);
	return p->id_hash ? 0 : -ENOMEM;
}

void arfs_free_tables(struct arfs_priv *p)
{
	int t;

	for (t = 0; t < ARFS_NUM_TYPES; t++)
		kvfree(p->tables[t]);
	kvfree(p->id_hash);
}

/* detach: move every rule from the tables to @list (stopping is set) */
void arfs_rules_take_all(struct arfs_priv *p, struct hlist_head *list)
{
	struct arfs_rule *rule;
	struct hlist_node *tmp;
	int t, j;

	spin_lock_bh(&p->arfs_lock);
	for (t = 0; t < ARFS_NUM_TYPES; t++) {
		if (!p->tables[t])
			continue;
		for (j = 0; j < (1 << p->hash_bits); j++) {
			hlist_for_each_entry_safe(rule, tmp, &p->tables[t][j], hlist) {
				arfs_unlink_rule(p, rule);
				hlist_add_head(&rule->hlist, list);
			}
		}
	}
	spin_unlock_bh(&p->arfs_lock);
}

void arfs_rules_cancel_work(struct hlist_head *list)
{
	struct arfs_rule *rule;

	hlist_for_each_entry(rule, list, hlist)
		cancel_work_sync(&rule->arfs_work);
}

void arfs_rules_free(struct hlist_head *list)
{
	struct arfs_rule *rule;
	struct hlist_node *tmp;

	hlist_for_each_entry_safe(rule, tmp, list, hlist) {
		hlist_del(&rule->hlist);
		kfree(rule);
	}
}

/* SPDX-License-Identifier: GPL-2.0 */
/*
 * arfs_virtio internals: the per-netdev state, the rules and commands, and
 * what the parts of the module call of each other.
 *
 *  arfs_main.c   module parameters, attach/detach, IRQs and the CPU rmap,
 *                netdev notifier, debugfs, module init/exit
 *  arfs_rules.c  rule hash tables, ndo_rx_flow_steer, rule work, expiry
 *  arfs_proto.c  control frames: build and transmit, commands and their
 *                completions, events, HELLO/CAPS, the STATS push
 *  arfs_nfc.c    ethtool ntuple rules (get_rxnfc/set_rxnfc, RULE_SET/DEL)
 *  arfs_hash.c   RSS hash fields and input-xfrm (HASH_GET/HASH_SET), the
 *                get/set_rxfh_fields ops
 *  arfs_ctx.c    RSS contexts (CTX_SET/CTX_DEL), the rxfh_context ops
 *  arfs_proto.h  the wire protocol, shared with the device
 */
#ifndef ARFS_H
#define ARFS_H

#include <linux/types.h>
#include <linux/atomic.h>
#include <linux/completion.h>
#include <linux/list.h>
#include <linux/ethtool.h>
#include <linux/netdevice.h>
#include <linux/printk.h>
#include <linux/spinlock.h>
#include <linux/workqueue.h>
#include <linux/in6.h>

#include "arfs_proto.h"

#ifndef CONFIG_RFS_ACCEL
#error "arfs_virtio needs a kernel with CONFIG_RFS_ACCEL"
#endif

/* ethtool's input transformations, in the uAPI since 6.8 */
#ifndef RXH_XFRM_SYM_XOR
#define RXH_XFRM_SYM_XOR	BIT(0)
#endif
#ifndef RXH_XFRM_NO_CHANGE
#define RXH_XFRM_NO_CHANGE	0xff
#endif

#define ARFS_MAX_QUEUES		64
#define ARFS_HOLD_NS_MAX	1000000UL
#define ARFS_STATS_PERIOD_MS	100
/* device counters are fetched every this many STATS periods */
#define ARFS_DEV_STATS_EVERY	10
/* largest completion body: timestamps + a full DEV_STATS or RSS_GET reply */
#define ARFS_DEV_STATS_REPLY_MAX	(ARFS_DEV_STATS_OFF_ENTRIES + \
					 ARFS_DEV_STATS_MAX_ENTRIES * ARFS_STATS_ENTRY_LEN)
#define ARFS_RSS_REPLY_MAX	(ARFS_RSS_OFF_KEY + ARFS_RSS_KEY_MAX + \
				 ARFS_RSS_INDIR_MAX * ARFS_RSS_INDIR_ENTRY_LEN)
#define ARFS_MAX_REPLY		ARFS_RSS_REPLY_MAX	/* the larger: arfs_proto.c */

/* module parameters (arfs_main.c), read with READ_ONCE() where writable */
extern unsigned int arfs_buckets;
extern unsigned int arfs_expire_quota;
extern unsigned int arfs_expire_interval_ms;
extern bool arfs_disabled;
extern unsigned long arfs_hold_ns;
extern bool arfs_same_lockless;
extern unsigned int arfs_cmd_timeout_ms;

/* the command kinds with error counters (ARFS_*_ERR_ID_BASE on the wire) */
enum arfs_err_kind {
	ARFS_ERR_KIND_ADD,
	ARFS_ERR_KIND_MOD,
	ARFS_ERR_KIND_DEL,
	ARFS_ERR_KIND_NR,
};

/* driver-only diagnostics, debugfs only */
enum arfs_diag {
	ARFS_DIAG_RX_FRAMES,
	ARFS_DIAG_RX_COMPLETIONS,
	ARFS_DIAG_RX_EVENTS,
	ARFS_DIAG_RX_DROP_NOT_HOST,
	ARFS_DIAG_RX_DROP_SRC,
	ARFS_DIAG_RX_DROP_SHORT,
	ARFS_DIAG_RX_DROP_VERSION,
	ARFS_DIAG_RX_DROP_LEN,
	ARFS_DIAG_RX_DROP_RESERVED,
	ARFS_DIAG_RX_DROP_OP,
	ARFS_DIAG_RX_DROP_STATUS,
	ARFS_DIAG_RX_DROP_SEQ,
	ARFS_DIAG_RX_DROP_OP_MISMATCH,
	ARFS_DIAG_RX_DROP_BODY,
	ARFS_DIAG_EV_RULE_AGED,
	ARFS_DIAG_EV_RULE_AGED_UNKNOWN,
	ARFS_DIAG_EV_TABLE_FLUSHED,
	ARFS_DIAG_EV_ENGINE_STATE,
	ARFS_DIAG_EV_LOST,
	ARFS_DIAG_TX_FRAMES,
	ARFS_DIAG_TX_ERRORS,
	ARFS_DIAG_STATS_FRAMES,
	ARFS_DIAG_STEER_EINVAL,
	ARFS_DIAG_CMD_CANCELED,
	ARFS_DIAG_NR,
};

enum arfs_type {
	ARFS_IPV4_TCP,
	ARFS_IPV4_UDP,
	ARFS_IPV6_TCP,
	ARFS_IPV6_UDP,
	ARFS_NUM_TYPES,
};

struct arfs_tuple {
	__be16 etype;
	u8 ip_proto;
	union {
		__be32 src_ipv4;
		struct in6_addr src_ipv6;
	};
	union {
		__be32 dst_ipv4;
		struct in6_addr dst_ipv6;
	};
	__be16 src_port;
	__be16 dst_port;
};

/* what the driver believes about the rule's hardware filter */
enum arfs_hw_state {
	ARFS_HW_NONE,		/* never installed, ADD failed, aged or flushed */
	ARFS_HW_INSTALLED,	/* last ADD/MOD completed with status 0 */
	ARFS_HW_UNKNOWN,	/* ADD timed out: the device may hold it */
};

struct arfs_priv;

struct arfs_rule {
	struct hlist_node hlist;	/* tuple hash (RCU readers), or a private list */
	struct hlist_node id_node;	/* filter id hash */
	struct work_struct arfs_work;
	struct arfs_priv *priv;
	struct arfs_tuple tuple;
	u8 type;
	u8 hw;
	u16 rxq;
	u16 hw_rxq;
	u32 flow_id;
	u32 filter_id;
	u64 hw_since_ns;
	u64 queued_ns;		/* when the steer queued arfs_work */
	struct rcu_head rcu;
};

/* an expired rule, kept for debugfs "expired" (which flows shared an RFS slot) */
#define ARFS_GONE_MAX 128

struct arfs_gone {
	struct arfs_tuple tuple;
	u32 flow_id;
	u32 filter_id;
	u16 rxq;
	u8 type;
};

/*
 * How late the rule works ran (debugfs "work_delays"): per ARFS_DELAY_BIN_MS
 * since the first steer that queued a work, the works queued in it, their
 * longest delay in ms and the sum of their delays in us.  Model mode replays
 * them (docs/model.md).
 */
#define ARFS_DELAY_BINS 4096
#define ARFS_DELAY_BIN_MS 10

struct arfs_delay_bin {
	u16 max_ms;
	u16 works;
	u32 sum_us;
};

/* one ethtool ntuple rule (arfs_nfc.c), as the user gave it */
struct arfs_nfc_rule {
	struct list_head node;		/* arfs_priv.nfc_rules, by location */
	struct ethtool_rx_flow_spec fs;
	u32 rss_context;		/* with FLOW_RSS in fs.flow_type */
};

struct arfs_cmd {
	struct list_head node;
	struct completion done;
	u32 seq;
	u8 op;
	int status;		/* positive device errno, or negative local error */
	u64 sent_ns;
	u64 rcvd_ns;
	u16 reply_len;
	u8 reply[ARFS_MAX_REPLY];	/* completion body, from its timestamps */
};

/*
 * One attached netdev.  The data paths reach it without a reference:
 * ndo_rx_flow_steer through the embedded ops copy (arfs_from_netdev()), the
 * packet handler through the embedded packet_type, works by container_of().
 * arfs_detach() makes sure none of them can run any more before it is freed.
 */
struct arfs_priv {
	struct list_head node;		/* arfs_main.c's instance list, under RTNL */
	struct net_device *dev;
	netdevice_tracker dev_tracker;
	const struct net_device_ops *orig_ops;
	/* virtio_net's ops plus ndo_rx_flow_steer: writable by design */
	struct net_device_ops ops;
	netdev_features_t added_features;
	netdev_features_t added_hw_features;
	netdev_features_t added_wanted_features;
	bool steering;		/* ops/rmap/features installed */

	struct cpu_rmap *rmap;
	int rmap_irqs[ARFS_MAX_QUEUES];
	unsigned int nr_rmap;

	struct packet_type pt;
	bool pt_added;

	spinlock_t arfs_lock;	/* rule tables, rule state, stopping */
	u64 lock_t0;		/* when the holder of arfs_lock took it */
	struct hlist_head *tables[ARFS_NUM_TYPES];
	struct hlist_head *id_hash;
	struct arfs_gone gone[ARFS_GONE_MAX];	/* last expired rules, under arfs_lock */
	unsigned int gone_next;
	u64 first_queued_ns;	/* the first steer that queued a work, under arfs_lock */
	struct arfs_delay_bin delays[ARFS_DELAY_BINS];	/* under arfs_lock */
	unsigned int hash_bits;
	u32 last_filter_id;
	bool stopping;
	bool engine_disabled;

	struct workqueue_struct *wq;
	struct delayed_work expire_work;
	struct delayed_work stats_work;
	bool works_started;

	spinlock_t cmd_lock;	/* cmd_pending, cmd_closed */
	struct list_head cmd_pending;
	bool cmd_closed;
	atomic_t seq;

	u32 last_event_seq;
	bool have_event_seq;

	u8 proto_version;	/* 3, or what an older device speaks (HELLO) */
	/* the device's RSS sizes from the latest RSS_GET (valid when set) */
	bool rss_valid;
	u16 rss_key_size;
	u16 rss_indir_size;
	/* the device's hash fields (HASH_GET body, arfs_hash.c), when valid */
	bool hash_valid;
	u8 hash_body[ARFS_HASH_BODY_LEN];

	u16 caps_queue_pairs;
	u16 caps_layout;
	u32 caps_capacity[ARFS_CAPS_CAPACITY_NR];
	char caps_profile[ARFS_PROFILE_LEN + 1];
	bool caps_valid;

	struct dentry *dbg;

	atomic64_t ctr[ARFS_CTR_NR];
	atomic64_t hist[ARFS_HIST_BUCKETS];
	atomic64_t err[ARFS_ERR_KIND_NR][ARFS_ERR_SLOTS];
	atomic64_t diag[ARFS_DIAG_NR];

	/* the device's counters (DEV_STATS), shown by ethtool -S as dev_* */
	atomic64_t dev_ctr[ARFS_DEV_CTR_NR];
	unsigned int stats_rounds;
	/* virtio_net's ethtool ops plus our counters in -S */
	const struct ethtool_ops *orig_eops;
	struct ethtool_ops eops;

	/*
	 * ethtool ntuple rules (arfs_nfc.c), sorted by location; under RTNL
	 * only, freed by arfs_detach() once the ops copies are gone.
	 */
	struct list_head nfc_rules;
	unsigned int nfc_count;
	bool nfc_flush_pending;	/* RULE_DEL ALL owed: ntuple went off while down */
};

/* messages name the module and the interface, not the virtio_net driver */
#define arfs_info(dev, fmt, ...) pr_info("%s: " fmt, netdev_name(dev), ##__VA_ARGS__)
#define arfs_warn(dev, fmt, ...) pr_warn("%s: " fmt, netdev_name(dev), ##__VA_ARGS__)
#define arfs_err(dev, fmt, ...) pr_err("%s: " fmt, netdev_name(dev), ##__VA_ARGS__)

/* the instance of an ethtool call: dev->ethtool_ops is its copy (RTNL) */
static inline struct arfs_priv *arfs_from_ethtool(struct net_device *dev)
{
	return container_of(dev->ethtool_ops, struct arfs_priv, eops);
}

static inline void arfs_ctr_inc(struct arfs_priv *p, int id)
{
	atomic64_inc(&p->ctr[id]);
}

static inline void arfs_diag_inc(struct arfs_priv *p, int id)
{
	atomic64_inc(&p->diag[id]);
}

/* arfs_rules.c */
void arfs_lock_bh(struct arfs_priv *p);
void arfs_unlock_bh(struct arfs_priv *p);
int arfs_alloc_tables(struct arfs_priv *p);
void arfs_free_tables(struct arfs_priv *p);
int arfs_rx_flow_steer(struct net_device *dev, const struct sk_buff *skb,
		       u16 rxq_index, u32 flow_id);
void arfs_expire_work(struct work_struct *work);
bool arfs_rules_aged(struct arfs_priv *p, u32 filter_id);
void arfs_rules_flushed(struct arfs_priv *p);
void arfs_rules_take_all(struct arfs_priv *p, struct hlist_head *list);
void arfs_rules_cancel_work(struct hlist_head *list);
void arfs_rules_free(struct hlist_head *list);

/* arfs_proto.c */
void arfs_hello(struct arfs_priv *p);
int arfs_cmd_add(struct arfs_priv *p, u32 filter_id, u16 rxq,
		 const struct arfs_tuple *t);
int arfs_cmd_mod(struct arfs_priv *p, u32 filter_id, u16 rxq);
int arfs_cmd_del(struct arfs_priv *p, u32 filter_id);
void arfs_cmd_flush(struct arfs_priv *p);
void arfs_cmd_close(struct arfs_priv *p);
void arfs_count_err(struct arfs_priv *p, int kind, int rc);
u64 arfs_ctr_read(struct arfs_priv *p, int id);
int arfs_dev_stats_fetch(struct arfs_priv *p);
void arfs_stats_work(struct work_struct *work);
int arfs_rss_get(struct arfs_priv *p, u32 *indir, u8 *key, u8 *hfunc);
int arfs_rss_set_ctx(struct arfs_priv *p, u32 ctx, const u32 *indir,
		     const u8 *key, u8 hfunc);
int arfs_rss_set(struct arfs_priv *p, const u32 *indir, const u8 *key,
		 u8 hfunc);
int arfs_rcv(struct sk_buff *skb, struct net_device *dev,
	     struct packet_type *pt, struct net_device *orig_dev);
int arfs_cmd_exec(struct arfs_priv *p, struct arfs_cmd *cmd, u8 op,
		  const u8 *body, unsigned int body_len, bool force);
int arfs_cmd_config(struct arfs_priv *p, u8 op, const u8 *body,
		    unsigned int body_len, bool force);

/* arfs_hash.c */
int arfs_hash_fields_get(struct arfs_priv *p, u32 flow_type, u64 *data);
int arfs_hash_fields_set(struct arfs_priv *p, u32 flow_type, u64 data);
int arfs_hash_xfrm_get(struct arfs_priv *p, u8 *xfrm);
int arfs_hash_xfrm_set(struct arfs_priv *p, u8 xfrm);
void arfs_hash_dev_up(struct arfs_priv *p);
#ifdef ARFS_HAVE_RXFH_FIELDS
int arfs_get_rxfh_fields(struct net_device *dev, struct ethtool_rxfh_fields *f);
int arfs_set_rxfh_fields(struct net_device *dev,
			 const struct ethtool_rxfh_fields *f,
			 struct netlink_ext_ack *extack);
#endif

/* arfs_ctx.c */
/* context IDs the core may hand out: 1 .. ARFS_RSS_CTX_MAX - 1 (as mlx5) */
#define ARFS_RSS_CTX_MAX	16
void arfs_ctx_detach(struct arfs_priv *p);
int arfs_ctx_check_rule(struct arfs_priv *p, u32 ctx, u32 offset, u32 nq);
#ifdef ARFS_HAVE_RXFH_CONTEXT
int arfs_create_rxfh_context(struct net_device *dev,
			     struct ethtool_rxfh_context *ctx,
			     const struct ethtool_rxfh_param *rxfh,
			     struct netlink_ext_ack *extack);
int arfs_modify_rxfh_context(struct net_device *dev,
			     struct ethtool_rxfh_context *ctx,
			     const struct ethtool_rxfh_param *rxfh,
			     struct netlink_ext_ack *extack);
int arfs_remove_rxfh_context(struct net_device *dev,
			     struct ethtool_rxfh_context *ctx, u32 rss_context,
			     struct netlink_ext_ack *extack);
#endif

/* arfs_nfc.c */
int arfs_get_rxnfc(struct net_device *dev, struct ethtool_rxnfc *info,
		   u32 *rule_locs);
int arfs_set_rxnfc(struct net_device *dev, struct ethtool_rxnfc *info);
int arfs_nfc_set_features(struct net_device *dev, netdev_features_t features);
int arfs_set_channels(struct net_device *dev, struct ethtool_channels *ch);
void arfs_nfc_dev_up(struct arfs_priv *p);
void arfs_nfc_detach(struct arfs_priv *p, bool tell_device);

#endif /* ARFS_H */

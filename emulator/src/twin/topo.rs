//! The guest's CPUs as the kernel sees them: LLC groups (`cpus_share_cache`), SMT
//! siblings and packages (what `cpu_rmap` walks), the RX queues' IRQ CPUs and the reverse
//! map `cpu_rmap_lookup_index()` answers from (lib/cpu_rmap.c).

use super::TwinError;

/// `RPS_NO_CPU`: an `rps_dev_flow` that never had a CPU.
pub const NO_CPU: u16 = 0xffff;

#[derive(Clone, Debug)]
pub struct Topology {
    /// Per CPU: its LLC group, its core (SMT siblings share it), its package.
    pub llc: Vec<u32>,
    core: Vec<u32>,
    package: Vec<u32>,
    /// Per CPU: its NUMA node (0 everywhere, or its package).
    node: Vec<u32>,
    /// LLC group → its CPUs in ascending order.
    pub groups: Vec<Vec<u16>>,
    /// RX queue → the CPU its IRQ is bound to.
    pub irq_cpu: Vec<u16>,
    /// CPU → the RX queue `cpu_rmap_lookup_index()` returns.
    rmap: Vec<u16>,
}

/// Where the L3 is shared, as QEMU's `-smp …` and the scenario's `vm.l3_per`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L3Per {
    Thread,
    Core,
    Die,
    Socket,
}

impl L3Per {
    pub fn parse(field: &str, s: Option<&str>) -> Result<L3Per, TwinError> {
        Ok(match s {
            None | Some("die") => L3Per::Die,
            Some("socket") => L3Per::Socket,
            Some("core") => L3Per::Core,
            Some("thread") => L3Per::Thread,
            Some(o) => {
                return Err(TwinError::field(field, format!("{o:?} is not modelled (thread, core, die or socket)")))
            }
        })
    }
}

impl Topology {
    /// `sockets × dies × cores × threads` CPUs numbered as QEMU numbers them (threads of a
    /// core adjacent, then cores, dies, sockets), one IRQ per RX queue, queue q on CPU q;
    /// one NUMA node, or one per socket (`node_per_socket`).
    pub fn new(
        sockets: u32,
        dies: u32,
        cores: u32,
        threads: u32,
        l3: L3Per,
        queues: u16,
        node_per_socket: bool,
    ) -> Result<Self, TwinError> {
        let n = u64::from(sockets) * u64::from(dies) * u64::from(cores) * u64::from(threads);
        if n == 0 || n > 4096 {
            return Err(TwinError::field("vm.vcpus", format!("{n} CPUs: the twin takes 1 to 4096")));
        }
        if queues == 0 {
            return Err(TwinError::field("nic.queues", "must be at least 1"));
        }
        if u64::from(queues) > n {
            return Err(TwinError::field(
                "nic.queues",
                format!("{queues} queues on {n} CPUs: more queues than CPUs needs an explicit IRQ map, which the twin does not take"),
            ));
        }
        let n = n as usize;
        let (mut llc, mut core, mut package) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
        for cpu in 0..n as u32 {
            let c = cpu / threads; // global core number
            let d = c / cores; // global die number
            let s = d / dies; // socket
            core.push(c);
            package.push(s);
            llc.push(match l3 {
                L3Per::Thread => cpu,
                L3Per::Core => c,
                L3Per::Die => d,
                L3Per::Socket => s,
            });
        }
        // LLC ids in order of first appearance, 0-based.
        let mut ids: Vec<u32> = Vec::new();
        let mut groups: Vec<Vec<u16>> = Vec::new();
        for (cpu, l) in llc.iter_mut().enumerate() {
            let g = match ids.iter().position(|x| x == l) {
                Some(g) => g,
                None => {
                    ids.push(*l);
                    groups.push(Vec::new());
                    ids.len() - 1
                }
            };
            groups[g].push(cpu as u16);
            *l = g as u32;
        }
        let irq_cpu: Vec<u16> = (0..queues).collect();
        let node = if node_per_socket { package.clone() } else { vec![0; n] };
        let mut t = Topology { llc, core, package, node, groups, irq_cpu, rmap: Vec::new() };
        t.rmap = t.build_rmap();
        Ok(t)
    }

    pub fn cpus(&self) -> usize {
        self.llc.len()
    }

    pub fn share_cache(&self, a: u16, b: u16) -> bool {
        self.llc[usize::from(a)] == self.llc[usize::from(b)]
    }

    /// `cpu_rmap_lookup_index()`: the RX queue whose IRQ is nearest to `cpu`.
    pub fn rmap(&self, cpu: u16) -> u16 {
        self.rmap[usize::from(cpu)]
    }

    /// `alloc_cpu_rmap()`'s rota (CPU c starts on queue c mod queues at infinite distance),
    /// then `cpu_rmap_update()` once per queue in queue order, as `irq_cpu_rmap_add()` and
    /// the affinity notifiers leave it: the CPUs that had this queue are invalidated, the
    /// IRQ's CPU gets distance 0, and those CPUs plus the IRQ CPU's node take the first
    /// neighbour found among SMT siblings (1), the package (2), the node (3). A CPU whose
    /// node has no IRQ keeps its rota queue.
    fn build_rmap(&self) -> Vec<u16> {
        const INF: u16 = u16::MAX;
        let n = self.cpus();
        let queues = self.irq_cpu.len();
        let mut near: Vec<(u16, u16)> = (0..n).map(|c| ((c % queues) as u16, INF)).collect(); // (index, dist)
        for (q, &a) in self.irq_cpu.iter().enumerate() {
            let q = q as u16;
            let mut update: Vec<bool> = near.iter().map(|&(i, _)| i == q).collect();
            for (cpu, u) in update.iter_mut().enumerate() {
                if *u {
                    near[cpu].1 = INF;
                }
                *u |= self.node[cpu] == self.node[usize::from(a)];
            }
            near[usize::from(a)] = (q, 0);
            for cpu in (0..n).filter(|&c| update[c]) {
                let masks: [(u16, &dyn Fn(usize) -> bool); 3] = [
                    (1, &|x| self.core[x] == self.core[cpu]),
                    (2, &|x| self.package[x] == self.package[cpu]),
                    (3, &|x| self.node[x] == self.node[cpu]),
                ];
                for (dist, in_mask) in masks {
                    let found = (0..n).find(|&x| in_mask(x) && near[cpu].1 > dist && near[x].1 <= dist);
                    if let Some(x) = found {
                        near[cpu] = (near[x].0, dist);
                        break;
                    }
                }
            }
        }
        near.into_iter().map(|(i, _)| i).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_sockets_of_two_cores_are_two_llcs_and_queue_q_is_cpu_q() {
        let t = Topology::new(2, 1, 2, 1, L3Per::Die, 4, false).unwrap();
        assert_eq!(t.groups, vec![vec![0, 1], vec![2, 3]]);
        assert!(t.share_cache(0, 1) && !t.share_cache(1, 2));
        assert_eq!((0..4).map(|c| t.rmap(c)).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_cpu_without_a_queue_takes_its_sibling_then_its_package() {
        // 2 sockets x 2 cores x 2 threads, 2 queues on CPUs 0 and 1 (both socket 0).
        let t = Topology::new(2, 1, 2, 2, L3Per::Socket, 2, false).unwrap();
        assert_eq!(t.rmap(1), 1);
        // CPU 2 and 3 (socket 0, core 1): package distance to queue 0 first.
        assert_eq!(t.rmap(2), 0);
        // Socket 1 has no IRQ: node distance, the first queue found.
        assert_eq!(t.rmap(5), 0);
    }

    #[test]
    fn a_node_without_an_irq_keeps_the_rota() {
        // The same box with one NUMA node per socket: socket 1 (CPUs 4-7) has no IRQ in
        // its node, so its CPUs keep alloc_cpu_rmap()'s CPU mod queues.
        let t = Topology::new(2, 1, 2, 2, L3Per::Socket, 2, true).unwrap();
        assert_eq!((0..8).map(|c| t.rmap(c)).collect::<Vec<_>>(), vec![0, 1, 0, 0, 0, 1, 0, 1]);
    }

    #[test]
    fn more_queues_than_cpus_is_an_error_naming_the_field() {
        let e = Topology::new(1, 1, 2, 1, L3Per::Die, 4, false).unwrap_err();
        assert!(e.to_string().starts_with("nic.queues:"), "{e}");
    }
}

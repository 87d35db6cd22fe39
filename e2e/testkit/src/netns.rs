//! A private network for a test's voters, for real partitions: each voter runs in its own
//! network namespace with two links to the test's namespace, one on a client network (its
//! client and admin listeners) and one on a cluster network (its Raft listener), each link a
//! veth pair whose outer end is on a bridge. Taking an outer end down cuts the voter off that
//! network: its packets go nowhere in either direction, while the process runs on (unlike
//! SIGSTOP, under which the kernel still answers for a frozen process).
//!
//! Needs `ip` (iproute2) and the right to create namespaces (root or CAP_NET_ADMIN).

use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

/// Which of a voter's links.
#[derive(Debug, Clone, Copy)]
pub enum Link {
    Client,
    Cluster,
}

pub struct Network {
    tag: String,
    pub client_ips: Vec<Ipv4Addr>,
    pub cluster_ips: Vec<Ipv4Addr>,
    /// The test namespace's own address on the cluster network: what a relay between the
    /// voters listens on.
    pub host_cluster_ip: Ipv4Addr,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Network {
    /// Creates namespaces and links for `voters` voters.
    pub fn create(voters: usize) -> Result<Self, String> {
        static NEXT: AtomicU8 = AtomicU8::new(0);
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // Unique among tests of this process (k) and, very likely, among processes (pid).
        let tag = format!("{:x}{k}", pid % 0xfff);
        let second = 100 + (pid % 100) as u8;
        let subnet = |net: u8| [10, second, 2 * (k % 100) + net];
        let mut network = Self {
            tag,
            client_ips: Vec::new(),
            cluster_ips: Vec::new(),
            host_cluster_ip: {
                let [a, b, c] = subnet(1);
                Ipv4Addr::new(a, b, c, 1)
            },
        };
        for (net, bridge) in [
            (0, network.bridge(Link::Client)),
            (1, network.bridge(Link::Cluster)),
        ] {
            let [a, b, c] = subnet(net);
            ip(&["link", "add", "name", &bridge, "type", "bridge"])?;
            ip(&["addr", "add", &format!("{a}.{b}.{c}.1/24"), "dev", &bridge])?;
            ip(&["link", "set", &bridge, "up"])?;
        }
        for i in 0..voters {
            let ns = network.namespace(i);
            ip(&["netns", "add", &ns])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            for (net, link) in [(0, Link::Client), (1, Link::Cluster)] {
                let [a, b, c] = subnet(net);
                let address = Ipv4Addr::new(a, b, c, i as u8 + 2);
                let outer = network.outer(i, link);
                let inner = format!("un{}{}{i}", network.tag, net);
                ip(&[
                    "link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &ns,
                ])?;
                ip(&["link", "set", &outer, "master", &network.bridge(link)])?;
                ip(&["link", "set", &outer, "up"])?;
                ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{address}/24"),
                    "dev",
                    &inner,
                ])?;
                ip(&["-n", &ns, "link", "set", &inner, "up"])?;
                match link {
                    Link::Client => network.client_ips.push(address),
                    Link::Cluster => network.cluster_ips.push(address),
                }
            }
        }
        Ok(network)
    }

    fn bridge(&self, link: Link) -> String {
        match link {
            Link::Client => format!("ubc{}", self.tag),
            Link::Cluster => format!("ubr{}", self.tag),
        }
    }

    fn outer(&self, voter: usize, link: Link) -> String {
        let net = match link {
            Link::Client => 0,
            Link::Cluster => 1,
        };
        format!("uh{}{net}{voter}", self.tag)
    }

    pub fn namespace(&self, voter: usize) -> String {
        format!("ursula-test-{}-{voter}", self.tag)
    }

    /// Takes the voter's link down: nothing passes it until `reconnect`.
    pub fn cut(&self, voter: usize, link: Link) {
        ip(&["link", "set", &self.outer(voter, link), "down"]).expect("cut a link");
    }

    pub fn reconnect(&self, voter: usize, link: Link) {
        ip(&["link", "set", &self.outer(voter, link), "up"]).expect("reconnect a link");
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth pairs with an end in it.
        for voter in 0..self.client_ips.len() {
            let _ = ip(&["netns", "del", &self.namespace(voter)]);
        }
        for link in [Link::Client, Link::Cluster] {
            let _ = ip(&["link", "del", &self.bridge(link)]);
        }
    }
}

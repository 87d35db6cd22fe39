//! Loopback ports for servers the tests start as child processes.

use std::net::{Ipv4Addr, TcpListener};
use std::sync::atomic::{AtomicU32, Ordering};

/// `count` distinct loopback ports, free now and below the kernel's ephemeral port range.
///
/// Ports from `bind(0)` are ephemeral ones: once released for a voter to bind, one can be taken
/// first as the source port of another voter's outgoing connection, and that voter then
/// cannot start. Ports below the range are never handed out that way.
pub fn free_ports(count: usize) -> Vec<u16> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const FLOOR: u32 = 10_000;
    let ceiling = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .filter(|&low| low > FLOOR + 1_000)
        .unwrap_or(32_768);
    let span = ceiling - FLOOR;
    // Each test binary starts elsewhere, so that two run at once rarely try the same ports;
    // tests of one binary share the counter, so they never do.
    let _ = NEXT.compare_exchange(
        0,
        std::process::id() % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    let ports: Vec<u16> =
        std::iter::repeat_with(|| (FLOOR + NEXT.fetch_add(1, Ordering::Relaxed) % span) as u16)
            .take(span as usize)
            .filter(|&port| TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok())
            .take(count)
            .collect();
    assert_eq!(ports.len(), count, "free loopback ports below {ceiling}");
    ports
}

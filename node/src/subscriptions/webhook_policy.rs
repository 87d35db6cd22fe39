//! Which webhook URLs a node will call: a guard against server-side request forgery. A
//! subscription must not turn the node into a client of what only the node can reach: its own
//! admin port, the pod network, a cloud's metadata service.
//!
//! A URL is `https` (or `http` to a loopback host where loopback is allowed), without user
//! information, and every address its host has is public: not private, loopback, link-local
//! (which holds the metadata services at 169.254.169.254 and fd00:ec2::254), shared, reserved,
//! documentation, benchmarking, multicast or broadcast; IPv4 inside IPv6 is checked as IPv4.
//! `subscriptions.webhook_allow` lists ranges that are allowed all the same. The check runs
//! when a subscription is created and again on every connection the deliverer makes (its
//! resolver drops forbidden addresses), so a name that later resolves elsewhere gains nothing.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

#[derive(Debug, Clone, Default)]
pub struct WebhookPolicy {
    pub allow: Vec<IpNet>,
    /// `http://127.0.0.1:…` and `http://localhost:…` webhooks: on by default only on a single
    /// node, where a developer runs the receiver beside it.
    pub allow_loopback: bool,
}

impl WebhookPolicy {
    /// The URL, if it is one a subscription may name; otherwise why not.
    pub fn check_url(&self, text: &str) -> Result<url::Url, String> {
        let url = url::Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err("a webhook URL must not carry credentials".into());
        }
        let host = url.host().ok_or("a webhook URL needs a host")?;
        let loopback_host = match &host {
            url::Host::Domain(name) => name.eq_ignore_ascii_case("localhost"),
            url::Host::Ipv4(ip) => ip.is_loopback(),
            url::Host::Ipv6(ip) => ip.is_loopback(),
        };
        match url.scheme() {
            "https" => {}
            "http" if loopback_host && self.allow_loopback => {}
            "http" => {
                return Err(
                    "a webhook URL must be https (http only to a loopback host on a single node)"
                        .into(),
                );
            }
            other => return Err(format!("a webhook URL must be https, not {other}")),
        }
        let literal = match host {
            url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
            url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
            url::Host::Domain(name) if name.eq_ignore_ascii_case("localhost") => {
                Some(IpAddr::V4(Ipv4Addr::LOCALHOST))
            }
            url::Host::Domain(_) => None,
        };
        if let Some(ip) = literal {
            self.check_address(ip)?;
        }
        Ok(url)
    }

    /// Checks every address the URL's host resolves to, as the deliverer will connect.
    pub async fn check_resolved(&self, url: &url::Url) -> Result<(), String> {
        let Some(url::Host::Domain(name)) = url.host() else {
            return Ok(());
        };
        let port = url.port_or_known_default().unwrap_or(443);
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name, port))
            .await
            .map_err(|e| format!("the webhook host {name} does not resolve: {e}"))?
            .collect();
        if addrs.is_empty() {
            return Err(format!("the webhook host {name} has no address"));
        }
        for addr in addrs {
            self.check_address(addr.ip())
                .map_err(|why| format!("the webhook host {name} resolves to {why}"))?;
        }
        Ok(())
    }

    pub fn check_address(&self, ip: IpAddr) -> Result<(), String> {
        if self.allow.iter().any(|net| net.contains(&ip)) {
            return Ok(());
        }
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
            v4 => v4,
        };
        if ip.is_loopback() && self.allow_loopback {
            return Ok(());
        }
        match forbidden_range(ip) {
            Some(range) => Err(format!("{ip}, a {range} address")),
            None => Ok(()),
        }
    }
}

/// The kind of range a forbidden address is in.
fn forbidden_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => forbidden_v4(v4),
        IpAddr::V6(v6) => forbidden_v6(v6),
    }
}

fn forbidden_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip.is_unspecified() || a == 0 => "this-network",
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_private() => "private",
        _ if ip.is_link_local() => "link-local (metadata service)",
        (100, 64..=127, _) => "shared (carrier-grade NAT)",
        (192, 0, 0) => "IETF protocol assignment",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        _ if ip.is_broadcast() => "broadcast",
        _ if ip.is_multicast() => "multicast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn forbidden_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    Some(match first {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        0xfc00..=0xfdff => "unique local (private)",
        0xfe80..=0xfebf => "link-local",
        0xff00..=0xffff => "multicast",
        0x2001 if ip.segments()[1] == 0x0db8 => "documentation",
        // NAT64 (64:ff9b::/96) reaches the IPv4 address in its last 32 bits.
        0x0064 if ip.segments()[1] == 0xff9b => {
            let [.., a, b, c, d] = ip.octets();
            return forbidden_v4(Ipv4Addr::new(a, b, c, d));
        }
        _ => return None,
    })
}

/// The deliverer's resolver: a name's forbidden addresses are dropped, and a name with no
/// other address fails to resolve.
pub struct GuardedResolver(pub Arc<WebhookPolicy>);

impl reqwest::dns::Resolve for GuardedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.0.clone();
        let name = name.as_str().to_owned();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0))
                .await?
                .filter(|addr| policy.check_address(addr.ip()).is_ok())
                .collect();
            if addrs.is_empty() {
                return Err(format!("{name} resolves to no address a webhook may use").into());
            }
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_forbidden_range_is_refused_and_public_hosts_pass() {
        let strict = WebhookPolicy::default();
        let refused = [
            "http://10.0.0.1/hook",
            "https://10.0.0.1/hook",
            "https://172.16.5.4/",
            "https://192.168.1.1/",
            "https://127.0.0.1/",
            "https://localhost/",
            "https://169.254.169.254/latest/meta-data",
            "https://100.64.0.1/",
            "https://0.0.0.0/",
            "https://192.0.2.1/",
            "https://198.18.0.1/",
            "https://224.0.0.1/",
            "https://255.255.255.255/",
            "https://240.0.0.1/",
            "https://[::1]/",
            "https://[::]/",
            "https://[fd00:ec2::254]/",
            "https://[fc00::1]/",
            "https://[fe80::1]/",
            "https://[ff02::1]/",
            "https://[::ffff:10.0.0.1]/",
            "https://[64:ff9b::a00:1]/",
            "https://[2001:db8::1]/",
            "http://hooks.example.com/",
            "ftp://hooks.example.com/",
            "https://user:pw@hooks.example.com/",
            "not a url",
        ];
        for url in refused {
            assert!(strict.check_url(url).is_err(), "{url} passed");
        }
        for url in [
            "https://hooks.example.com/x",
            "https://8.8.8.8/",
            "https://[2606:4700::1111]/",
        ] {
            assert!(strict.check_url(url).is_ok(), "{url} refused");
        }
        // Loopback over http, on a single node; a listed range, anywhere.
        let dev = WebhookPolicy {
            allow_loopback: true,
            ..Default::default()
        };
        assert!(dev.check_url("http://127.0.0.1:9999/webhook").is_ok());
        assert!(dev.check_url("http://localhost:9999/webhook").is_ok());
        assert!(dev.check_url("http://10.0.0.1/hook").is_err());
        let listed = WebhookPolicy {
            allow: vec!["10.1.0.0/16".parse().unwrap()],
            ..Default::default()
        };
        assert!(listed.check_url("https://10.1.2.3/").is_ok());
        assert!(listed.check_url("https://10.2.0.1/").is_err());
    }
}

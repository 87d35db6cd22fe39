//! What a node needs to serve subscriptions beyond the replicated state: the signing key, the
//! webhook policy, the HTTP client that delivers webhooks, and the public URL they point back
//! to. The state itself is in the state machine (`machine::subscription`).

pub mod change;
pub mod delivery;
pub mod metrics;
pub mod signing;
pub mod view;
pub mod webhook_policy;

use std::sync::Arc;

use crate::config::Config;
use metrics::SubscriptionMetrics;
use signing::SigningKey;
use webhook_policy::{GuardedResolver, WebhookPolicy};

pub struct Subscriptions {
    pub key: SigningKey,
    pub policy: Arc<WebhookPolicy>,
    /// `server.public_url`, without a trailing `/`.
    pub public_url: Option<String>,
    pub metrics: SubscriptionMetrics,
    client: reqwest::Client,
}

impl Subscriptions {
    pub fn open(config: &Config) -> Result<Arc<Self>, String> {
        let (key_file, create) = match &config.subscriptions.signing_key_file {
            Some(file) => (file.clone(), false),
            None => {
                if config.is_replicated() {
                    tracing::warn!(
                        "subscriptions.signing_key_file is not set: this voter signs webhooks and \
                         wake tokens with a key of its own, so a wake's token stops working when \
                         the group's leadership moves; give every voter the same key \
                         (ursula-node signing-key)"
                    );
                }
                (config.data_dir.join("subscriptions/signing-key.pem"), true)
            }
        };
        let key = SigningKey::load(&key_file, create).map_err(|e| e.to_string())?;
        let policy = Arc::new(
            config
                .subscriptions
                .policy(config.is_replicated())
                .map_err(|e| e.to_string())?,
        );
        let client = webhook_client(&policy, config.subscriptions.webhook_timeout)?;
        Ok(Arc::new(Self {
            key,
            policy,
            public_url: config
                .server
                .public_url
                .as_ref()
                .map(|url| url.trim_end_matches('/').to_owned()),
            metrics: SubscriptionMetrics::default(),
            client,
        }))
    }
}

/// No redirects (a receiver must not send the node elsewhere), no proxy from the environment,
/// the system's roots for https, and the policy's resolver.
fn webhook_client(
    policy: &Arc<WebhookPolicy>,
    timeout: std::time::Duration,
) -> Result<reqwest::Client, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots)
    .with_no_client_auth();
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .dns_resolver(Arc::new(GuardedResolver(policy.clone())))
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(timeout)
        .build()
        .map_err(|e| format!("cannot build the webhook client: {e}"))
}

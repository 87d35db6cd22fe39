//! `[subscriptions]`: the protocol's `__ds` subscription APIs.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::ConfigError;
use crate::subscriptions::webhook_policy::WebhookPolicy;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SubscriptionsConfig {
    /// The Ed25519 key (PKCS#8 PEM) that signs webhooks and wake tokens. Every voter of a
    /// cluster needs the same one. Unset: `<data_dir>/subscriptions/signing-key.pem`, made at
    /// first start.
    pub signing_key_file: Option<PathBuf>,
    /// Address ranges (CIDR) a webhook may reach although the SSRF rules forbid them, such as a
    /// receiver inside the cluster network.
    pub webhook_allow: Vec<String>,
    /// `http` webhooks to loopback hosts. Unset: allowed on a single node only.
    pub allow_loopback_webhooks: Option<bool>,
    /// How long one webhook request may take.
    #[serde(deserialize_with = "super::duration")]
    pub webhook_timeout: Duration,
}

impl Default for SubscriptionsConfig {
    fn default() -> Self {
        Self {
            signing_key_file: None,
            webhook_allow: Vec::new(),
            allow_loopback_webhooks: None,
            webhook_timeout: Duration::from_secs(10),
        }
    }
}

impl SubscriptionsConfig {
    /// The webhook policy, for a node that is (`replicated`) or is not part of a cluster.
    pub fn policy(&self, replicated: bool) -> Result<WebhookPolicy, ConfigError> {
        let allow = self
            .webhook_allow
            .iter()
            .map(|range| {
                range.parse().map_err(|_| ConfigError::Invalid {
                    key: "subscriptions.webhook_allow",
                    message: format!("{range:?} is not a CIDR range such as 10.1.0.0/16"),
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(WebhookPolicy {
            allow,
            allow_loopback: self.allow_loopback_webhooks.unwrap_or(!replicated),
        })
    }

    pub fn validate(&self, replicated: bool) -> Result<(), ConfigError> {
        self.policy(replicated)?;
        if self.webhook_timeout.is_zero() {
            return Err(ConfigError::Invalid {
                key: "subscriptions.webhook_timeout",
                message: "must be above zero".into(),
            });
        }
        Ok(())
    }
}

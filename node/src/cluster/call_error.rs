//! How a call to a peer failed, over its link (`peer_link`) or as an HTTP/2 request
//! (`network`): a leaf both use.

use std::time::Duration;

#[derive(Debug, Clone)]
pub(super) enum PostError {
    /// No connection to the peer: nothing was sent.
    Connect(String),
    TimedOut,
    Other(String),
}

impl PostError {
    pub(super) fn describe(&self, timeout: Duration) -> String {
        match self {
            Self::Connect(message) | Self::Other(message) => message.clone(),
            Self::TimedOut => format!("no answer within {timeout:?}"),
        }
    }
}

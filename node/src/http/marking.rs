//! The one decision of whether a node's refusal carries the marker `x-ursula-not-applied`,
//! exactly as the API overview's two tables say, as a pure function of what was refused (the
//! write), how far it got (the stage) and why (the token). `ApiError::into_response` is the
//! only caller; nothing else writes the header.
//!
//! The tables (`shared/spec/ursula-api-overview.txt`, "The server sets the marker ..."):
//! - every refusal of write admission: `WalDiskPressure`, `RaftLogPressure`,
//!   `IngressBodyBytesLimitReached`, `RequestBodyTooLarge`;
//! - after admission and before proposing: `NotLeader` for appends, closes and creates (not
//!   creates whose body is staged in object storage or that a node with a hot cap of 0 takes),
//!   `GroupNotHosted` for creates, appends, closes and deletes, `RaftUncommittedBackpressure`
//!   and `ColdBackpressure` for creates and appends whose body is not staged.
//!
//! Every other refusal is unmarked, even when nothing was proposed (a bad header, a refusal
//! of a bucket create, a redirect of a delete). Snapshot and retention PUTs are never marked,
//! not even by admission: the spec says they "carry no marker", and repeating one is harmless.

use ursula_wire::ErrorToken;

/// How far a request got before it was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Write admission refused it (`crate::admission`), or its body outgrew the limits while
    /// it was read.
    Admission,
    /// Refused after admission, before anything of it was proposed.
    BeforeProposal,
    /// Proposed, or handed to Raft, which may have proposed it: the write may still apply.
    Proposed,
    /// A failure that proves nothing either way (an internal error, a timeout).
    Unknown,
}

/// What a write request asks for, as the spec's tables name writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    CreateBucket,
    /// `staged`: its body is staged in object storage (which includes every create on a node
    /// whose hot cap is 0). Such a create goes to Raft without a leadership check.
    CreateStream {
        staged: bool,
    },
    Append {
        staged: bool,
    },
    /// A `POST` with `Stream-Closed: true` and no body.
    Close,
    DeleteStream,
    PublishSnapshot,
    AdvanceRetention,
    /// A change of the `__ds` subscription APIs: in neither of the spec's tables, so never
    /// marked.
    Subscription,
}

impl Write {
    /// The same write, knowing now whether its body is staged in object storage.
    pub fn staged(self, staged: bool) -> Self {
        match self {
            Self::CreateStream { .. } => Self::CreateStream { staged },
            Self::Append { .. } => Self::Append { staged },
            other => other,
        }
    }

    /// Whether the node checks leadership itself before proposing. Deletes and staged creates
    /// go to Raft unchecked (its redirect may come after the proposal); the other writes are
    /// checked, and a refusal is marked only where the table says.
    pub fn checks_leadership(self) -> bool {
        !matches!(
            self,
            // A subscription change is carried to the leader by the voter it reached
            // (`handlers::subscriptions`): a redirect would lose a wake's bearer token, which
            // clients drop when a redirect leaves the origin.
            Self::DeleteStream | Self::CreateStream { staged: true } | Self::Subscription
        )
    }
}

/// The marker's value for a refusal: its token, or `None` for an unmarked refusal.
pub fn marker(write: Option<Write>, stage: Stage, token: ErrorToken) -> Option<ErrorToken> {
    use ErrorToken as T;
    use Write as W;
    let write = write?;
    let marked = match stage {
        Stage::Admission => {
            matches!(
                token,
                T::WalDiskPressure
                    | T::RaftLogPressure
                    | T::IngressBodyBytesLimitReached
                    | T::RequestBodyTooLarge
            ) && !matches!(write, W::PublishSnapshot | W::AdvanceRetention)
        }
        Stage::BeforeProposal => match token {
            T::NotLeader => matches!(
                write,
                W::Append { .. } | W::Close | W::CreateStream { staged: false }
            ),
            T::GroupNotHosted => matches!(
                write,
                W::CreateStream { .. } | W::Append { .. } | W::Close | W::DeleteStream
            ),
            T::RaftUncommittedBackpressure | T::ColdBackpressure => matches!(
                write,
                W::CreateStream { staged: false } | W::Append { staged: false }
            ),
            _ => false,
        },
        Stage::Proposed | Stage::Unknown => false,
    };
    marked.then_some(token)
}

#[cfg(test)]
mod tests;
